"""What a running job driver tells the world: status.json and the acks of control requests.

Runs in the Spark driver's Python process, for runtime/driver.py and runtime/controlhandler.py.
Writes go to the job store; a failed write is logged, never fatal (the next heartbeat retries the
status). The final report releases the lease, so the next driver may start at once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.outage import Outage
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, write_ack
from airflow_ckpt_provider.core.records.lease import Lease
from airflow_ckpt_provider.core.records.status import (
    SAMPLES_KEPT,
    JobState,
    JobStatus,
    RestartOwner,
    Sample,
    StatusWriter,
    read_status,
)
from airflow_ckpt_provider.core.snapshots.catalog import SnapshotResult
from airflow_ckpt_provider.core.store import requestcount
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.failures import Failure, Recovery

log = logging.getLogger(__name__)

#: Seconds of requests the store rates in status.json are taken over (at most).
RATE_WINDOW = 600.0


class DriverReporter:
    """The status and the acks of one driver (``lease`` gives its epoch); ``status`` is the last one written."""

    def __init__(self, config: RuntimeConfig, store: JobStore, lease: Lease, *, outage: Outage | None = None,
                 sampler: Callable[[], tuple[int, int, float] | None] | None = None) -> None:
        self.config = config
        self.store = store
        self.lease = lease
        self.outage = outage or Outage(config.job, "the job store")
        self.started_at = time.time()
        self.status: JobStatus | None = None
        self.writer = StatusWriter(store)  # one PUT per report: it keeps the tag of its last write
        self.rates = RequestRates()
        self.clock: Callable[[], float] = time.monotonic
        self.reported_at = self.clock()  # the last report's time (written or not: a failed write retries at the pace)
        self.noted = False  # changes kept by note() and not written yet
        self.answered: Callable[[str], None] | None = None  # told each request id once its ack is written (the door)
        self.sampler = sampler  # the batches, rows and seconds since the last write (runtime/metrics.py)
        self.carried: list[Sample] = []  # the previous drivers' samples, kept in this one's status
        self.restarted_for: str | None = None  # this driver is its supervisor's restart after that cause

    def carry_over(self) -> None:
        """Read the job's status before this driver's first report replaces it (one GET): keep its samples, so that
        the page's charts span drivers, and note the cause when it says the supervisor restarts the job (this
        driver is that restart; runtime/metrics.py). An unreadable status is logged and leaves both out."""
        try:
            before = read_status(self.store)
        except StorageError as err:
            log.warning("job %s: the previous status is unreadable, its samples are left out of the charts: %s",
                        self.config.job, err)
            return
        if before is None or before.job != self.config.job:
            return
        self.carried = list(before.samples[-SAMPLES_KEPT:])
        restart = before.restart or {}
        if before.state is JobState.RESTARTING and restart.get("by") == RestartOwner.SUPERVISOR.value:
            self.restarted_for = str(restart.get("cause") or "unknown")

    def state(self) -> JobState:
        """The state last reported (RUNNING before the first report)."""
        return self.status.state if self.status else JobState.RUNNING

    def reason(self) -> str:
        """The reason last reported."""
        return self.status.reason if self.status else "running"

    def ack(self, request_id: str, action: RequestAction, result: SnapshotResult | None, error: str | None,
             outcome: Outcome | None = None) -> None:
        """Answer request ``request_id``: with the snapshot ``result`` took, else ``error``."""
        m = result.manifest if result else None
        self.answer(Ack(
            request_id, action, outcome or (Outcome.COMPLETED if m else Outcome.FAILED),
            error or f"{m.kind.value if m else ''} {m.snapshot_id if m else ''} at batch {m.batch_id if m else ''}",
            self.lease.epoch, time.time(), snapshot_id=m.snapshot_id if m else None,
            snapshot_uri=result.uri if result else None, batch_id=m.batch_id if m else None,
        ))

    def answer(self, ack: Ack) -> None:
        """Write ``ack``, the answer to a control request; a failed write is logged."""
        log.info("job %s epoch %d: request %s %s: %s", self.config.job, ack.epoch, ack.id, ack.outcome.value,
                 ack.message)
        try:
            write_ack(self.store, ack)
        except StorageError as err:
            log.error("job %s: cannot write the ack of request %s: %s", self.config.job, ack.id, err)
            return
        if self.answered is not None:
            self.answered(ack.id)

    def report(self, state: JobState, reason: str, **changes: Any) -> None:
        """Write status.json; a failed write is logged, never fatal (the next heartbeat retries)."""
        base = self.status or JobStatus(
            job=self.config.job, state=state, epoch=self.lease.epoch, updated_at=0.0, started_at=self.started_at,
            pid=os.getpid(), host=socket.gethostname(), code_version=self.config.code_version,
            heartbeat_interval=self.config.heartbeat_interval, samples=self.carried,
        )
        now = time.time()
        self.status = replace(base, state=state, reason=reason, updated_at=now, **self.rates.sample(), **changes)
        taken = self.sampler() if self.sampler is not None else None
        if taken is not None:
            batches, rows, seconds = taken
            sample = Sample(round(now, 3), self.status.batch_id, batches, rows,
                            round(seconds / batches, 4) if seconds else None, self.status.lag)
            self.status = replace(self.status, samples=[*self.status.samples[-(SAMPLES_KEPT - 1):], sample])
        self.reported_at, self.noted = self.clock(), False
        try:
            self.writer.write(self.status)
        except StorageError as err:  # one line per outage, not per heartbeat (core/policy/outage.py)
            self.outage.failed(err)
        else:
            self.outage.ok()

    def report_final(self, state: JobState, reason: str, **changes: Any) -> None:
        """Report this driver's last status and release the lease (the next driver need not wait)."""
        self.report(state, reason, **changes)
        if self.lease.record is not None and not self.lease.release():
            log.warning("job %s: the lease was no longer ours at exit", self.config.job)

    def end_failed(self, failure: Failure) -> int:
        """End the driver for ``failure`` (runtime/failures.py): one line, FAILED in the status, its exit code."""
        job, epoch = self.config.job, self.lease.epoch
        if failure.recovery is Recovery.NONE:
            log.error("job %s epoch %d: %s, no restart can fix it: %s", job, epoch, failure.what, failure.message)
        else:
            log.error("job %s epoch %d: %s: %s", job, epoch, failure.what, failure.message)
        self.report_final(JobState.FAILED, f"{failure.what}: {failure.message}", restart=None)
        return failure.exit_code

    def update(self, **changes: Any) -> None:
        """Write status.json with ``changes``, keeping the state and the reason (a heartbeat without any)."""
        self.report(self.state(), self.reason(), **changes)

    def note(self, **changes: Any) -> None:
        """Keep ``changes`` for the next write of status.json (the next batch's report or heartbeat) instead of
        writing it now: two requests fewer for what no reader waits on (a checkpoint after every batch)."""
        if self.status is None:
            self.update(**changes)
        else:
            self.status = replace(self.status, **changes)
            self.noted = True

    def due(self) -> bool:
        """Whether the running driver reports now: a heartbeat ``heartbeat_interval`` after the last report, or noted
        changes (completed batches, a periodic checkpoint) half of it after (docs/scale.md): a status PUT per half a
        heartbeat at most while batches complete, one per heartbeat while idle."""
        age, beat = self.clock() - self.reported_at, self.config.heartbeat_interval
        return age >= beat or (self.noted and age >= beat / 2)


class RequestRates:
    """The process's store requests per second over the last ``window`` s (at most), sampled at each report: what
    status.json says this job's driver costs now, its start's burst aged out."""

    def __init__(self, window: float = RATE_WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.samples: deque[tuple[float, dict[str, int]]] = deque()

    def sample(self) -> dict[str, Any]:
        now, counts = self.clock(), requestcount.counts()
        self.samples.append((now, counts))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:  # keep one older
            self.samples.popleft()
        start, first = self.samples[0]
        elapsed = now - start
        if elapsed <= 0:
            return {}
        rates = {op: round((n - first.get(op, 0)) / elapsed, 4) for op, n in counts.items() if n > first.get(op, 0)}
        return {"store_rates": rates, "store_window": round(elapsed, 1)}


def snapshot_info(result: SnapshotResult) -> dict[str, Any]:
    """The ``last_snapshot`` of status.json: {"id", "kind", "batch_id", "uri", "created_at"}."""
    m = result.manifest
    return {"id": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id, "uri": result.uri,
            "created_at": m.created_at}
