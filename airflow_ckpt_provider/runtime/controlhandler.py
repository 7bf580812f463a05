"""Control handling of a running job driver: savepoint, stop with savepoint, cancel, and how a run ends.

Runs in the Spark driver's Python process, called by the driver loop (runtime/driver.py) once the
query runs. A savepoint request is answered when the snapshot completed or failed; stop with
savepoint closes the admission gate, waits for the batch in flight, stops the query and takes the
final savepoint; cancel stops at once. A failed query, a sink's refusal and a lost lease end the run
with their exit codes (runtime/exitcodes.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt_provider.core.errors import CkptError, StorageError
from airflow_ckpt_provider.core.policy import gate
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.records.control import Ack, Outcome, Request, RequestAction
from airflow_ckpt_provider.core.records.lease import FencedError, Lease
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.exitcodes import EXIT_FENCED, EXIT_STOPPED
from airflow_ckpt_provider.runtime.failures import classify
from airflow_ckpt_provider.runtime.reporting import DriverReporter, snapshot_info
from airflow_ckpt_provider.runtime.snapshotter import SnapshotJob, Snapshotter

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

STOP_BOUNDARY_TIMEOUT = 600.0


class ControlHandler:
    """Answers control requests for ``query`` and ends its run; every ending returns the driver's exit code.

    ``drain_events``/``drain_outcomes`` are the driver loop's: stopping reports the batches and
    snapshots that completed meanwhile. ``tick``: seconds between looks at the query while waiting.
    """

    def __init__(
        self,
        config: RuntimeConfig,
        lease: Lease,
        *,
        live: Storage,
        query: StreamingQuery,
        snapshotter: Snapshotter,
        reporter: DriverReporter,
        drain_events: Callable[[], None],
        drain_outcomes: Callable[[], None],
        clock: Callable[[], float],
        tick: float,
    ) -> None:
        self.config = config
        self.lease = lease
        self.live = live
        self.query = query
        self.snapshotter = snapshotter
        self.reporter = reporter
        self._drain_events = drain_events
        self._drain_outcomes = drain_outcomes
        self.clock = clock
        self.tick = tick

    def handle(self, request: Request) -> int | None:
        """Answer ``request``: None while the job runs on, else the exit code (stopped or canceled)."""
        epoch = self.lease.epoch
        log.info("job %s epoch %d: control request %s (%s) from %s", self.config.job, epoch, request.id,
                 request.action.value, request.requested_by)
        if request.epoch != epoch:
            self.reporter.ack(request.id, request.action, None,
                              f"rejected: the request was for the driver of epoch {request.epoch}, this driver runs "
                              f"epoch {epoch}; check `ckpt job status` and send it again", Outcome.REJECTED)
            return None
        if request.action is RequestAction.SAVEPOINT:  # answered when the snapshot completed or failed
            self.snapshotter.savepoint(Trigger.MANUAL, request.id)
            return None
        if request.action is RequestAction.STOP:
            return self._stop_with_savepoint(request)
        return self.cancel(request, "canceled on request")

    def _stop_with_savepoint(self, request: Request) -> int | None:
        """Finish the batch in flight, plan no new one, take a final savepoint, exit 0."""
        job, epoch = self.config.job, self.lease.epoch
        self.reporter.report(JobState.STOPPING, f"stop with savepoint ({request.id})")
        if not gate.close_gate(park=True):
            log.warning("job %s: no admission gate (CKPT_GATE_FILE unset): stopping at the next batch boundary "
                        "as seen from the driver; a batch planned in that instant is replayed after restore", job)
        try:
            if not self._wait_for_boundary(STOP_BOUNDARY_TIMEOUT):
                self.reporter.report(JobState.RUNNING, "running")
                self.reporter.ack(request.id, request.action, None,
                                  f"the batch in flight did not complete within {STOP_BOUNDARY_TIMEOUT:.0f} s; the "
                                  "job keeps running: check its progress, or cancel it", Outcome.FAILED)
                return None
            failure = self.query.exception() if not self.query.isActive else None
            self.query.stop()
        finally:
            gate.open_gate()
        self._drain_events()
        if failure is not None:
            self.reporter.ack(request.id, request.action, None, f"the query failed while stopping: {failure}",
                              Outcome.FAILED)
            return self.failed()
        offsets, commits = _last_entry(self.live, "offsets/"), _last_entry(self.live, "commits/")
        if offsets != commits:  # e.g. a no-data batch a watermark planned: it is replayed after a restore
            log.warning("job %s: stopped with offsets/%s not committed (last commit %s); a restore replays it",
                        job, offsets, commits)
        if not self.snapshotter.drain(timeout=300):
            log.warning("job %s: a background snapshot still runs after 300 s; taking the final savepoint anyway", job)
        self._drain_outcomes()
        crash_point("stop.before-savepoint")  # tests: a driver killed during stop with savepoint (query stopped)
        try:
            result = self.snapshotter.take(SnapshotJob(Kind.SAVEPOINT, Trigger.STOP, request.id))
        except FencedError as err:
            return fenced_exit(self.config.job, self.query, err)
        except CkptError as err:
            # The query is stopped at a completed batch: the live checkpoint is intact and a restart resumes.
            self.reporter.report_final(JobState.STOPPED, f"stopped; final savepoint failed: {err}")
            self.reporter.ack(request.id, request.action, None, f"stopped, but the final savepoint failed: {err}",
                              Outcome.FAILED)
            return EXIT_STOPPED
        log.info("job %s epoch %d: stopped with savepoint %s at batch %d", job, epoch,
                 result.manifest.snapshot_id, result.manifest.batch_id)
        # Status first, then the ack: whoever waits for the ack (an upgrade) may start the next driver.
        self.reporter.report_final(JobState.STOPPED, f"stopped with savepoint {result.manifest.snapshot_id}",
                                   last_snapshot=snapshot_info(result), batch_id=result.manifest.batch_id)
        self.reporter.ack(request.id, request.action, result, None)
        return EXIT_STOPPED

    def _wait_for_boundary(self, timeout: float) -> bool:
        """True once no trigger runs, or the one that runs is held at the gate before it planned a batch, and every
        offsets entry has its commit (heartbeats go on). A query Spark plans a batch for at every trigger (a
        processing-time transformWithState, whose timers and TTL may fire) has no instant without a trigger."""
        deadline = self.clock() + timeout
        next_beat = self.clock() + self.config.heartbeat_interval
        while self.clock() < deadline:
            if not self.query.isActive:
                return True
            idle = not self.query.status["isTriggerActive"] or gate.parked()
            if idle and _last_entry(self.live, "offsets/") == _last_entry(self.live, "commits/"):
                return True
            self._drain_events()
            if self.clock() >= next_beat:
                next_beat = self.clock() + self.config.heartbeat_interval
                self.reporter.update()
            time.sleep(self.tick)
        return False

    def cancel(self, request: Request | None, reason: str) -> int:
        """Stop now: a batch in flight is dropped and replayed after a restart."""
        self.reporter.report(JobState.STOPPING, reason)
        self.query.stop()
        self._drain_events()
        batch = _last_entry(self.live, "commits/")
        log.info("job %s epoch %d: %s; the latest completed batch is %s", self.config.job, self.lease.epoch,
                 reason, batch)
        self.reporter.report_final(JobState.STOPPED, reason)
        if request is not None:
            self.reporter.answer(Ack(request.id, request.action, Outcome.COMPLETED,
                                     f"canceled; the latest completed batch is {batch}", self.lease.epoch,
                                     time.time(), batch_id=batch))
        return EXIT_STOPPED

    def failed(self) -> int:
        """End a query that stopped while stopping with a savepoint: fenced, refused, or failed."""
        try:  # a batch refused by the fence fails the query: that is a fenced driver, not a failed job
            self.lease.check()
        except FencedError as err:
            return fenced_exit(self.config.job, self.query, err)
        except StorageError:
            pass
        return self.reporter.end_failed(classify(self.query.exception()))


def fenced_exit(job: str, query: StreamingQuery | None, err: FencedError) -> int:
    """A newer driver took the lease: stop the query, leave the status alone, exit EXIT_FENCED."""
    log.error("job %s: %s", job, err)
    if query is not None and query.isActive:
        query.stop()
    return EXIT_FENCED  # the status belongs to the newer driver now: leave it alone


def _last_entry(storage: Storage, prefix: str) -> int | None:
    """The highest batch id logged under ``offsets/`` or ``commits/``."""
    ids = [int(name) for o in storage.list(prefix) if (name := o.key[len(prefix):]).isdigit()]
    return max(ids, default=None)
