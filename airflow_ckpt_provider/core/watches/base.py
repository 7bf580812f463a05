"""The ``Watch`` protocol the triggers, the sensors and the operators poll, and what the watches share."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobStatus, read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.views.jobview import JobView


class Watch(Protocol):
    """What the triggers and sensors poll."""

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        """None while undecided, else the terminal event."""

    def waiting_for(self) -> str:
        """One line: what is awaited and what was last seen (for timeout events and logs)."""


log = logging.getLogger(__name__)

#: The status of the event ``wait_for`` makes when the watch decided nothing in time (the triggers' too).
TIMEOUT = "timeout"


def wait_for(
    watch: Watch, *, timeout: float | None, poll_interval: float, what: str = "",
    sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll ``watch`` in this process until it decides, every ``poll_interval`` s; after ``timeout`` s (None: no
    limit) a ``timeout`` event saying what it last saw. Job store read errors (StorageError) are logged and
    retried until then, as the triggers do: the store may be back before the deadline. ``what`` prefixes the
    log lines (e.g. the job)."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        try:
            event = watch.poll()
        except StorageError as err:
            log.warning("%scannot read the job store, will retry: %s", f"{what}: " if what else "", err)
            event = None
        if event is not None:
            return event
        if deadline is not None and clock() >= deadline:
            return {"status": TIMEOUT, "message": f"no outcome within {timeout:.0f} s: {watch.waiting_for()}"}
        sleep(poll_interval)


def current_time(now: float | None) -> float:
    """``now``, or the wall clock when the caller passed none."""
    return time.time() if now is None else now


def look(store: JobStore, now: float) -> JobView:
    """Status and lease; unlike jobview.observe, a job that does not exist yet is a view of nothing
    (observe lists the whole store to name the other jobs: too much for every poll)."""
    return JobView(store, read_status(store), read_lease(store), now)


def why(s: JobStatus) -> str:
    """The status's reason, as a parenthesis for a message ('' without one)."""
    return f" (reason: {s.reason})" if s.reason else ""


def ui(s: JobStatus) -> str:
    """The driver's Spark UI, as a parenthesis for a message ('' without one)."""
    return f" (Spark UI {s.ui_url})" if s.ui_url else ""
