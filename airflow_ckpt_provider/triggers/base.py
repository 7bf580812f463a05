"""What every trigger of this provider shares: poll a core watch in a thread until it decides or times out.

Subclasses name their arguments and build their watch; the loop, the timeout and the error event are
here. Each trigger yields exactly one event, whose status is from its ``STATUSES``: the watch's closed
set plus ``timeout`` and ``error`` (with a traceback).
"""

from __future__ import annotations

import asyncio
import traceback
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.watch import Watch
from airflow_ckpt_provider.hooks.job_store import JobStoreHook

TIMEOUT = "timeout"
ERROR = "error"
TRIGGER_EVENTS = frozenset({TIMEOUT, ERROR})


class WatchTrigger(BaseTrigger):
    """Polls ``build_watch()``'s watch every ``poll_interval`` s; ``timeout`` (s, None: none) ends the wait
    with a ``timeout`` event that says what was last seen. ``resume_with`` comes back in the event, under
    that key: what the deferring operator needs to take its next step (``dag.test`` drops the kwargs of
    ``defer``, the event always arrives)."""

    #: The statuses this trigger's events can have.
    STATUSES: ClassVar[frozenset[str]] = TRIGGER_EVENTS

    def __init__(self, *, poll_interval: float = 5.0, timeout: float | None = None,
                 resume_with: dict[str, Any] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__(**kwargs) is unannotated
        self.poll_interval = float(poll_interval)
        self.timeout = None if timeout is None else float(timeout)
        self.resume_with = resume_with
        self._watch: Watch | None = None

    @abstractmethod
    def arguments(self) -> dict[str, Any]:
        """The subclass's own constructor arguments, by name."""

    @abstractmethod
    def build_watch(self) -> Watch:
        """The watch to poll. Blocking IO is allowed: the trigger calls it in a thread, a sensor in its worker."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self.arguments(), "poll_interval": self.poll_interval, "timeout": self.timeout,
                  "resume_with": self.resume_with}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await self._outcome()
        if self.resume_with is not None:
            event["resume_with"] = self.resume_with
        yield TriggerEvent(event)  # type: ignore[no-untyped-call]  # unannotated in Airflow

    async def _outcome(self) -> dict[str, Any]:
        """The one terminal payload: the watch's event, a timeout, or an error."""
        loop = asyncio.get_running_loop()
        started = loop.time()
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
                elapsed = loop.time() - started
                if self.timeout is not None and elapsed >= self.timeout:
                    return {"status": TIMEOUT,
                            "message": f"no outcome within {self.timeout:.0f} s: {watch.waiting_for()}"}
                left = self.poll_interval if self.timeout is None else min(self.poll_interval, self.timeout - elapsed)
                await asyncio.sleep(left)
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
        ckpt_store_conn_id: str = JobStoreHook.default_conn_name,
        store_url: str | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        resume_with: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout, resume_with=resume_with)
        self.job = job
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url

    def arguments(self) -> dict[str, Any]:
        return {"job": self.job, "ckpt_store_conn_id": self.ckpt_store_conn_id, "store_url": self.store_url}

    def job_store(self) -> JobStore:
        """Blocking (reads the connection): call it from build_watch."""
        return JobStoreHook(self.ckpt_store_conn_id, store_url=self.store_url).job_store(self.job)
