"""``StreamingJobNotifier``: an Airflow notifier whose message names the streaming job, its state, its latest
completed snapshot and what to run (core/views/alerting.py). It sends that text through another notifier (``then``:
Slack, SMTP, any whose text may use ``{{ ckpt_alert }}``), or logs it. Usable as a task or DAG callback
(``on_failure_callback``) and as a Deadline Alert's ``AsyncCallback``.

Design notes: docs/metrics.md#design-notes-coreviewsalertingpy."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.notifier import BaseNotifier

from airflow_ckpt_provider.core.views.alerting import alert_text
from airflow_ckpt_provider.hooks.job_store import JobStoreHook

if TYPE_CHECKING:
    from airflow.sdk.definitions.context import Context

log = logging.getLogger(__name__)


class StreamingJobNotifier(BaseNotifier):
    """Say what happened to ``job`` (``what``; default: the failed task and its error) with what the job store
    says about it; ``then`` sends it (its templated fields see ``{{ ckpt_alert }}``), else it is logged at ERROR.

    As a Deadline Alert's callback: ``AsyncCallback(StreamingJobNotifier, kwargs={"job": ..., "what": ...})``; its
    kwargs are stored as JSON, so there ``then`` is ``{"classpath": "...SlackWebhookNotifier", "kwargs": {...}}``
    (the next notifier's class and arguments), made in the triggerer."""

    template_fields: Sequence[str] = ("job", "what", "ckpt_store_conn_id")

    def __init__(self, *, job: str, what: str | None = None, ckpt_store_conn_id: str = "ckpt_store_default",
                 then: BaseNotifier | Mapping[str, Any] | None = None, context: Context | None = None) -> None:
        super().__init__(context=context)
        self.job, self.what, self.ckpt_store_conn_id = job, what, ckpt_store_conn_id
        self.then = _notifier(then) if isinstance(then, Mapping) else then
        self.message: str | None = None  # the last text sent

    def text(self, context: Context | dict[str, Any]) -> str:
        """The alert's text for ``context``."""
        what = self.what or _failure(context)
        return alert_text(JobStoreHook(self.ckpt_store_conn_id).job_store(self.job), what)

    def notify(self, context: Context) -> None:
        self.message = self.text(context)
        self._send(context)

    async def async_notify(self, context: Context) -> None:
        self.message = await asyncio.to_thread(self.text, context)  # the store's reads block
        if self.then is not None:
            context["ckpt_alert"] = self.message  # type: ignore[typeddict-unknown-key]  # for the next's templates
            self.then.render_template_fields(context)  # as awaiting it would (BaseNotifier.__await__)
            await self.then.async_notify(context)
        else:
            log.error("%s", self.message)

    def _send(self, context: Context) -> None:
        if self.then is None:
            log.error("%s", self.message)
            return
        context["ckpt_alert"] = self.message  # type: ignore[typeddict-unknown-key]  # for the next's templates
        self.then(context)  # renders its templated fields with ckpt_alert, then sends


def _notifier(given: Mapping[str, Any]) -> BaseNotifier:
    """The next notifier from ``{"classpath": ..., "kwargs": {...}}`` (a deadline's JSON kwargs)."""
    path = given.get("classpath")
    unknown = sorted(set(given) - {"classpath", "kwargs"})
    if not isinstance(path, str) or unknown or not isinstance(given.get("kwargs", {}), Mapping):
        raise ValueError(f"then: expected a notifier or {{'classpath': 'package.module.Notifier', 'kwargs': {{...}}}}, "
                         f"found {dict(given)!r}: give the next notifier's class path and its arguments")
    module, _, name = path.rpartition(".")
    made = getattr(importlib.import_module(module), name)(**given.get("kwargs", {}))
    if not isinstance(made, BaseNotifier):
        raise ValueError(f"then: expected the class path of an Airflow notifier (a BaseNotifier), found {path} "
                         f"that made a {type(made).__name__}")
    return made


def _failure(context: Context | dict[str, Any]) -> str:
    """``task T of DAG D (run R) failed: ERROR`` from a callback's context, or what a deadline's context holds."""
    ti = context.get("ti") or context.get("task_instance")
    dag = context.get("dag")
    error = context.get("exception")
    where = " of ".join(x for x in (f"task {ti.task_id}" if ti is not None else "",
                                    f"DAG {getattr(dag, 'dag_id', dag)}" if dag is not None else "") if x)
    run = context.get("run_id") or getattr(context.get("dag_run"), "run_id", None)
    said = f"{where or 'a run'}{f' (run {run})' if run else ''}"
    return f"{said} failed: {error}" if error else f"{said} missed its deadline or failed"
