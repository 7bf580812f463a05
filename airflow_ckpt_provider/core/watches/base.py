"""The ``Watch`` protocol the triggers, the sensors and the operators poll, and what the watches share."""

from __future__ import annotations

import time
from typing import Any, Protocol

from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.jobview import JobView
from airflow_ckpt_provider.core.lease import read_lease
from airflow_ckpt_provider.core.status import JobStatus, read_status


class Watch(Protocol):
    """What the triggers and sensors poll."""

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        """None while undecided, else the terminal event."""

    def waiting_for(self) -> str:
        """One line: what is awaited and what was last seen (for timeout events and logs)."""


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
