"""RestoreCheckWatch: waits for the verdict of one detached restore check (core/records/restore_check.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_ckpt_provider.core.policy.outcomes import CHECK_FAILED
from airflow_ckpt_provider.core.records.restore_check import (
    CheckEnded,
    CheckStarted,
    check_key,
    liveness,
    process_alive,
    read_end,
    read_start,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.base import current_time


class RestoreCheckWatch:
    """Waits for the verdict check ``check_id`` records (``checks/<id>.outcome.json``); only that id's records
    count, so an earlier check's verdict is never this one's.

    The event's status is the verdict (compatible, incompatible, inconclusive, bad-input), or ``failed`` when the
    check ended without one: its process is gone (on this host), its deadline passed, or its start record is
    missing. Like RequestWatch it polls once more after noticing, so a verdict written just before the process
    exited is not missed. ``host`` and ``pid_alive`` are this machine's unless given (tests).
    """

    def __init__(self, store: JobStore, check_id: str, *, host: str | None = None,
                 pid_alive: Callable[[int], bool] = process_alive) -> None:
        self.store = store
        self.check_id = check_id
        self.host = host
        self.pid_alive = pid_alive
        self._gone: str | None = None
        self._seen = "nothing polled yet"

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = current_time(now)
        ended = read_end(self.store, self.check_id)
        if ended is not None:
            return self._verdict(ended)
        started = read_start(self.store, self.check_id)
        gone = self._gone_reason(started, now)
        if gone is not None and self._gone is not None:  # gone on two polls in a row, no verdict in between
            return self._event(CHECK_FAILED, gone, None)
        self._gone = gone
        self._seen = gone or ("running: " + started.describe() if started else "no record")
        return None

    def _gone_reason(self, started: CheckStarted | None, now: float) -> str | None:
        job = self.store.job
        if started is None:
            return (f"job {job}: expected the record of restore check {self.check_id} "
                    f"({self.store.storage.uri(check_key(self.check_id))}, written before the check starts), found "
                    "none: it was removed, or the check was started against another job store; no verdict. Run "
                    "the upgrade again")
        live, why = liveness(started, now, host=self.host, pid_alive=self.pid_alive)
        if live:
            return None
        return (f"job {job}: expected a verdict from {started.describe()}, found none and {why}; no verdict. "
                f"Its log: {started.log_file or '(none)'} on {started.host}. Run the upgrade again")

    def _verdict(self, ended: CheckEnded) -> dict[str, Any]:
        snapshot = ended.report.get("snapshot_id")
        message = (f"job {self.store.job}: restore check {self.check_id} of snapshot {snapshot or '-'}: "
                   f"{ended.outcome.value}: {ended.reason}")
        return self._event(ended.outcome.value, message, ended)

    def waiting_for(self) -> str:
        return (f"job {self.store.job}: expected the verdict of restore check {self.check_id}; last seen: "
                f"{self._seen}")

    def _event(self, status: str, message: str, ended: CheckEnded | None) -> dict[str, Any]:
        report = ended.report if ended is not None else {}
        return {"status": status, "message": message, "job": self.store.job, "check_id": self.check_id,
                "reason": ended.reason if ended is not None else message,
                "snapshot_id": report.get("snapshot_id"), "batch_id": report.get("batch_id"),
                "seconds": report.get("seconds"), "state_partitions": report.get("state_partitions"),
                "rescaled_snapshot_id": report.get("rescaled_snapshot_id"),
                "rewritten_snapshot_id": report.get("rewritten_snapshot_id")}
