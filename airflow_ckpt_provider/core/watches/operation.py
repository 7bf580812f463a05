"""Wait for a job's operation (upgrade, rescale, restart) acted on by another: the Airflow trigger, a re-run ``ckpt``
command or Dagster op while another actor acts, all through this one watch.

Design notes: docs/operations.md#design-notes-corerecordsoperationspy."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from airflow_ckpt_provider.core.records.operations import ACTOR_SILENCE, actor_alive, read_operation
from airflow_ckpt_provider.core.records.ownership import handed_key
from airflow_ckpt_provider.core.store.jobstore import JobStore

#: The event of an operation whose actor is gone while the job is not the supervision service's: the waiter starts
#: a new actor, which resumes the recorded step.
ORPHANED = "orphaned"
#: The event of an operation whose record was replaced or removed.
GONE = "gone"


class OperationWatch:
    """Polls ``operation.json`` until operation ``operation_id`` is final (the event's status is its state:
    succeeded, refused, failed, with ``result`` and ``message``), its actor is gone (``orphaned``; never for a job
    the supervision service owns: an instance resumes it) or its record is gone. New progress lines are kept for
    ``take_lines``. An actor on another host is gone once the record has not changed for ACTOR_SILENCE s on this
    watch's own clock."""

    def __init__(self, store: JobStore, operation_id: str, *, seen_lines: int = 0, host: str | None = None,
                 alive: Callable[[int], bool] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.operation_id, self.seen = store, operation_id, seen_lines
        self.host, self.alive, self.clock = host or socket.gethostname(), alive, clock
        self._lines: list[str] = []
        self._tag: tuple[str, float] | None = None  # the record's tag and when this watch first saw it
        self._seen = "nothing polled yet"

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        found = read_operation(self.store)
        if found is None or found.operation.id != self.operation_id:
            now_there = found.operation.describe() if found else "no operation record"
            return self._event(GONE, f"job {self.store.job}: expected operation {self.operation_id} in "
                               f"operation.json, found {now_there}", None)
        op = found.operation
        self._lines += op.lines[self.seen:] if len(op.lines) >= self.seen else op.lines[-1:]
        self.seen = len(op.lines)
        if op.state.final:
            return self._event(op.state.value, op.message or f"{op.describe()}", op.result)
        if self._tag is None or self._tag[0] != found.tag:
            self._tag = (found.tag, self.clock())
        silent = self.clock() - self._tag[1]
        self._seen = op.describe()
        if op.actor and actor_alive(op, silent_for=silent, host=self.host, alive=self.alive):
            return None
        if self.store.root.exists(handed_key(self.store.job)):
            self._seen += "; the supervision service resumes it"
            return None
        if not op.actor and silent < ACTOR_SILENCE:  # asked for, its actor starting
            return None
        why = "no actor took it" if not op.actor else f"its actor {op.actor} is gone"
        return self._event(ORPHANED, f"{op.describe()}: {why}; a new actor resumes it", None)

    def take_lines(self) -> list[str]:
        """The progress lines seen since the last call."""
        lines, self._lines = self._lines, []
        return lines

    def waiting_for(self) -> str:
        return f"job {self.store.job}: expected operation {self.operation_id} to end; last seen: {self._seen}"

    def _event(self, status: str, message: str, result: dict[str, Any] | None) -> dict[str, Any]:
        return {"status": status, "message": message, "job": self.store.job, "operation_id": self.operation_id,
                "result": result}
