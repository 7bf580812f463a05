"""What every job operator shares: the job store, and waiting on a watch (deferred, or in the worker)."""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.watches.base import wait_for
from airflow_ckpt_provider.hooks.job_store import JobStoreHook
from airflow_ckpt_provider.triggers.base import min_deferral

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.triggers.base import WatchTrigger


#: Seconds after a trigger's own timeout at which Airflow's deferral timeout gives up on it.
DEFER_GRACE = 60.0


class JobOperator(BaseOperator):
    """Base of the job operators: ``job`` in the store of ``ckpt_store_conn_id`` (or ``store_url``).

    ``deferrable`` (default: Airflow's ``[operators] default_deferrable``, False unless set, as for Airflow's own
    operators) frees the worker slot while waiting; ``poll_interval`` is the seconds
    between looks at the job store while waiting; ``min_deferral`` (s; default ``[ckpt] min_deferral``, 30 s)
    is how long a deferral lasts at least:
    an outcome that comes sooner is held in the triggerer until then, so the task never resumes while Airflow
    may still take the report of its exit after ``defer()`` for a task killed from outside.
    """

    template_fields: tuple[str, ...] = ("job", "store_url")

    def __init__(
        self,
        *,
        job: str,
        ckpt_store_conn_id: str = JobStoreHook.default_conn_name,
        store_url: str | None = None,
        deferrable: bool | None = None,
        poll_interval: float = 2.0,
        min_deferral: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.poll_interval = poll_interval
        self.min_deferral = min_deferral

    @cached_property
    def store_hook(self) -> JobStoreHook:
        return JobStoreHook(self.ckpt_store_conn_id, store_url=self.store_url)

    def job_store(self) -> JobStore:
        return self.store_hook.job_store(self.job)

    @property
    def _store_args(self) -> dict[str, Any]:
        """The job store arguments every trigger takes."""
        return {"job": self.job, "ckpt_store_conn_id": self.ckpt_store_conn_id, "store_url": self.store_url,
                "poll_interval": self.poll_interval}

    def who(self, context: Context) -> str:
        """Who asks, for the records: ``airflow:DAG.TASK run RUN try N``."""
        ti = context.get("ti")
        who = f"airflow:{self.dag_id}.{self.task_id}"
        if ti is not None and getattr(ti, "run_id", None):
            who += f" run {ti.run_id} try {getattr(ti, 'try_number', 1)}"
        return who

    def run_key(self, context: Context) -> str:
        """This task's run, the same for each of its tries: a retry finds the operation or the control request its
        first try asked for ("" outside a task run)."""
        ti = context.get("ti")
        run_id = getattr(ti, "run_id", None) if ti is not None else None
        if not run_id:
            return ""
        index = getattr(ti, "map_index", -1)
        return f"airflow:{self.dag_id}.{self.task_id} run {run_id}" + (f" map {index}" if index not in (-1, None)
                                                                       else "")

    def wait(
        self, context: Context, *, trigger: WatchTrigger, method_name: str, kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Defer to ``trigger``, or (not deferrable) poll its watch here; either way ``method_name`` gets the
        event. The trigger's own timeout yields a "timeout" event the method handles (a rollback, a clear
        message); Airflow's deferral timeout is only the backstop, a grace period later. Both count from now."""
        if self.deferrable:
            backstop = None if trigger.timeout is None else timedelta(seconds=trigger.timeout + DEFER_GRACE)
            # The next step and its arguments travel in the trigger's event: dag.test drops defer's kwargs.
            trigger.resume_with = {"method": method_name, "kwargs": kwargs or {}}
            trigger.waiting_since = time.time()
            trigger.min_wait = min_deferral(self.min_deferral)
            self.defer(trigger=trigger, method_name="resume", timeout=backstop)
        event = wait_for(trigger.build_watch(), timeout=trigger.timeout, poll_interval=self.poll_interval,
                         what=f"job {self.job}")
        return getattr(self, method_name)(context, event, **(kwargs or {}))

    def resume(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Where Airflow resumes a deferred step: the trigger's event names the method to continue with."""
        return resume_step(self, context, event)


def default_deferrable() -> bool:
    """``deferrable`` when a task does not say: Airflow's ``[operators] default_deferrable`` (env
    AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE), False when unset, as Airflow's own operators and sensors take it.

    Read when the task is constructed, not when this module is imported (Airflow's operators put the lookup in
    the argument's default), so a DAG file parsed after the setting changed follows it."""
    from airflow.sdk.configuration import conf  # the module's __getattr__ makes it: typed Any

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def resume_step(op: JobOperator, context: Context, event: dict[str, Any] | None) -> Any:
    """Continue with the step the trigger carried back (``resume_with``)."""
    step = (event or {}).pop("resume_with", None) if isinstance(event, dict) else None
    if not isinstance(step, dict) or not isinstance(step.get("method"), str):
        raise AirflowException(f"job {op.job}: the trigger's event does not say how to resume: {event!r:.300}")
    return getattr(op, step["method"])(context, event, **(step.get("kwargs") or {}))


def check_event(event: dict[str, Any] | None, allowed: Collection[str], what: str) -> dict[str, Any]:
    """The trigger's event if its status is one of ``allowed``; AirflowException (with the trigger's
    message and traceback) for an error, a timeout or a status outside the closed set."""
    if not isinstance(event, dict) or "status" not in event:
        raise AirflowException(f"{what}: expected a trigger event with a status, found {event!r}")
    status = event["status"]
    if status == "error":
        raise AirflowException(f"{what}: the trigger failed: {event.get('message')}\n{event.get('traceback', '')}")
    if status == "timeout":
        raise AirflowException(f"{what}: timed out: {event.get('message', '')}")
    if status not in allowed:
        raise AirflowException(f"{what}: unexpected event status {status!r} (expected one of {sorted(allowed)})")
    return event
