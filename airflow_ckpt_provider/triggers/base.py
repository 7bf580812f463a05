"""What every trigger of this provider shares: poll a core watch in a thread until it decides or times out.

Design notes: docs/airflow.md#design-notes-triggersbasepy."""

from __future__ import annotations

import asyncio
import time
import traceback
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_ckpt_provider.core.errors import StorageError

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.watches.base import Watch

TIMEOUT = "timeout"
ERROR = "error"
TRIGGER_EVENTS = frozenset({TIMEOUT, ERROR})
#: The job store connection the triggers use by default (JobStoreHook.default_conn_name, without importing it).
DEFAULT_STORE_CONN = "ckpt_store_default"
#: The operators' and sensors' ``min_deferral`` (s), which they pass as ``min_wait``: Airflow 3.3's scheduler
#: fails a task that resumes before the executor's report of its exit after defer() was processed, and that
#: report can come seconds late on a loaded worker (docs/airflow.md).
MIN_DEFERRAL = 30.0
#: Airflow configuration of the default: ``[ckpt] min_deferral`` (env AIRFLOW__CKPT__MIN_DEFERRAL).
MIN_DEFERRAL_OPTION = ("ckpt", "min_deferral")


def min_deferral(explicit: float | None) -> float:
    """The deferral's minimum: the task's own ``min_deferral``, else ``[ckpt] min_deferral``, else 30 s.

    ``airflow dags test`` runs triggers in-process, with no scheduler whose stale exit report could fail
    the resumed task: the demo and the example DAG tests set the option to 0 there.
    """
    if explicit is not None:
        return float(explicit)
    from airflow.configuration import conf

    return conf.getfloat(*MIN_DEFERRAL_OPTION, fallback=MIN_DEFERRAL)


class WatchTrigger(BaseTrigger):
    """Polls ``build_watch()``'s watch every ``poll_interval`` s until it decides, or until ``timeout`` s
    (None: none) after ``waiting_since``, which ends the wait with a ``timeout`` event saying what was last
    seen. ``waiting_since`` (epoch seconds; None: when the trigger starts) is when the task deferred: the
    timeout counts from there, not from when a (slow, or restarted) triggerer got to the trigger, so the
    trigger's own timeout still comes before Airflow's deferral timeout.

    ``min_wait``: the event is held until that many seconds after ``waiting_since``. Airflow 3.3's scheduler
    fails a task that resumes before the executor's report of its exit after ``defer()`` was processed (see
    docs/airflow.md, "A task that resumes too soon after deferring"); the operators and sensors pass their
    ``min_deferral`` here.

    ``resume_with`` comes back in the event, under that key: what the deferring operator needs to take its
    next step (``dag.test`` drops the kwargs of ``defer``, the event always arrives)."""

    #: The statuses this trigger's events can have.
    STATUSES: ClassVar[frozenset[str]] = TRIGGER_EVENTS

    def __init__(self, *, poll_interval: float = 5.0, timeout: float | None = None,
                 waiting_since: float | None = None, min_wait: float = 0.0,
                 resume_with: dict[str, Any] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__(**kwargs) is unannotated
        self.poll_interval = float(poll_interval)
        self.timeout = None if timeout is None else float(timeout)
        self.waiting_since = None if waiting_since is None else float(waiting_since)
        self.min_wait = float(min_wait)
        self.resume_with = resume_with
        self._watch: Watch | None = None

    @abstractmethod
    def arguments(self) -> dict[str, Any]:
        """The subclass's own constructor arguments, by name."""

    @abstractmethod
    def build_watch(self) -> Watch:
        """The watch to poll. Blocking IO and heavy imports belong here: the trigger calls it in a thread, a
        sensor in its worker."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self.arguments(), "poll_interval": self.poll_interval, "timeout": self.timeout,
                  "waiting_since": self.waiting_since, "min_wait": self.min_wait, "resume_with": self.resume_with}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        since = time.time() if self.waiting_since is None else self.waiting_since
        event = await self._outcome(since)
        held = since + self.min_wait - time.time()
        if held > 0:
            self.log.info("%s: held %.1f s, so the task resumes no sooner than %.0f s after it deferred",
                          event["status"], held, self.min_wait)
            await asyncio.sleep(held)
        if self.resume_with is not None:
            event["resume_with"] = self.resume_with
        yield TriggerEvent(event)  # type: ignore[no-untyped-call]  # unannotated in Airflow

    async def _outcome(self, since: float) -> dict[str, Any]:
        """The one terminal payload: the watch's event, a timeout, or an error."""
        try:
            # Connections, clients and the job store all block: never on the event loop's thread.
            watch = self._watch = await asyncio.to_thread(self.build_watch)
            seen = ""
            while True:
                try:
                    event = await asyncio.to_thread(watch.poll)
                except StorageError as err:  # the store is unreachable for now: keep trying until the timeout
                    if str(err) != seen:
                        seen = str(err)
                        self.log.warning("cannot read the job store, will retry: %s", err)
                    event = None
                if event is not None:
                    self.log.info("%s", event.get("message", event["status"]))
                    return event
                if watch.waiting_for() != seen:
                    seen = watch.waiting_for()
                    self.log.info("waiting: %s", seen)
                elapsed = time.time() - since
                if self.timeout is not None and elapsed >= self.timeout:
                    return {"status": TIMEOUT,
                            "message": f"no outcome within {self.timeout:.0f} s: {watch.waiting_for()}"}
                left = self.poll_interval if self.timeout is None else min(self.poll_interval, self.timeout - elapsed)
                await asyncio.sleep(max(0.0, left))
        except Exception as err:
            self.log.exception("%s failed", type(self).__name__)
            return {"status": ERROR, "message": f"{type(self).__name__} failed: {type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()}

    async def cleanup(self) -> None:
        """The watches hold no connection between polls; drop the one this trigger built."""
        self._watch = None


class JobStoreTrigger(WatchTrigger):
    """A trigger on ``job`` in the job store of connection ``ckpt_store_conn_id`` (or at ``store_url``)."""

    def __init__(
        self,
        *,
        job: str,
        ckpt_store_conn_id: str = DEFAULT_STORE_CONN,
        store_url: str | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        waiting_since: float | None = None,
        min_wait: float = 0.0,
        resume_with: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout, waiting_since=waiting_since,
                         min_wait=min_wait, resume_with=resume_with)
        self.job = job
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url

    def arguments(self) -> dict[str, Any]:
        return {"job": self.job, "ckpt_store_conn_id": self.ckpt_store_conn_id, "store_url": self.store_url}

    def job_store(self) -> JobStore:
        """Blocking (reads the connection, builds the S3 client): call it from build_watch."""
        from airflow_ckpt_provider.hooks.job_store import JobStoreHook

        return JobStoreHook(self.ckpt_store_conn_id, store_url=self.store_url).job_store(self.job)
