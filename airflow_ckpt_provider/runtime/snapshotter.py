"""Snapshots in the background: checkpoints after batches, savepoints on a timer or on request.

One worker thread, so batches never wait for an upload. Checkpoint requests coalesce (only the
newest completed batch matters); savepoint requests queue, each answered through ``on_done``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import CkptError, UnreachableError
from airflow_ckpt_provider.core.policy.faults import checkpoints_paused
from airflow_ckpt_provider.core.policy.outage import Outage
from airflow_ckpt_provider.core.policy.settings import INLINE_MAX
from airflow_ckpt_provider.core.snapshots.catalog import SnapshotResult, apply_retention, create_snapshot
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.snapshots.snapshotwrite import drop_committed_markers
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotJob:
    kind: Kind
    trigger: Trigger
    request_id: str | None = None


@dataclass(frozen=True)
class SnapshotOutcome:
    """What one snapshot attempt produced: a result, or the error that stopped it."""

    job: SnapshotJob
    result: SnapshotResult | None = None
    error: str | None = None


#: Retention runs after every savepoint, and after a checkpoint at most this often: with a snapshot after every
#: batch (two a second with short batches) it would otherwise LIST, read and delete on every one (3 of a
#: snapshot's 9 requests). Meanwhile up to this many seconds' worth of checkpoints more than keep_checkpoints stay.
RETENTION_INTERVAL_S = 10.0

#: Committed snapshots' markers kept for deletion at most (a store refusing deletes must not grow the list forever).
MARKERS_MAX = 10_000


class Snapshotter:
    """Takes snapshots of ``checkpoint`` into ``store`` on its own thread.

    ``nice`` lowers that thread's CPU priority (the driver passes the job setting ``snapshot_nice``; Linux: per
    thread, and the upload threads it starts inherit it): a snapshot then takes the CPU the batches leave idle
    instead of slowing the next batch on a busy driver host; it may take longer, and checkpoint requests coalesce
    meanwhile. The cost: while this thread holds the GIL and waits for a core, the driver's other Python threads
    (foreachBatch) wait too. The final savepoint of a stop runs on the caller's thread, at the driver's priority.
    """

    def __init__(
        self,
        store: JobStore,
        checkpoint: Storage,
        *,
        retention: RetentionPolicy,
        fence: Callable[[], None],
        on_done: Callable[[SnapshotOutcome], None],
        code_version: str | None = None,
        spark_version: str | None = None,
        labels: dict[str, str] | None = None,
        outage: Outage | None = None,
        nice: int = 0,
        inline_max: int = INLINE_MAX,
    ) -> None:
        self.store = store
        self.outage = outage  # the job store's: a snapshot that failed for an outage is one of its failures
        self.checkpoint = checkpoint
        self.retention = retention
        self.fence = fence
        self.on_done = on_done
        self.meta = {"code_version": code_version, "spark_version": spark_version}
        self.labels = labels or {}
        self.nice = nice
        self.inline_max = inline_max
        self._cond = threading.Condition()
        self._savepoints: deque[SnapshotJob] = deque()
        self._checkpoint_due = False
        self._busy = False
        self._busy_checkpoint = False  # the running attempt is a checkpoint (a plan's waiter waits for the next one)
        self._closed = False
        self.last_checkpoint_batch: int | None = None
        self.last_savepoint_batch: int | None = None
        # The newest batch a snapshot of this driver lets a restart replay as planned: its batch, or the batch after
        # it when the snapshot holds that batch's write-ahead entry (runtime/plangate.py waits on it).
        self.durable_batch = -1
        self._plan_wanted = -1  # the batch a durable plan was asked for
        self._checkpoint_attempts = 0  # checkpoint attempts finished (a plan's waiter tells a failed one by it)
        self._retained_at: float | None = None  # time.monotonic() of the last retention that ran through
        # Committed snapshots whose pending markers are still to delete: one request with the next retention, not
        # one per snapshot (gc takes a marker whose manifest exists for finished).
        self._finished_markers: list[str] = []
        self._markers_lock = threading.Lock()  # the snapshot thread, and a stop's final savepoint on the caller's
        self._thread = threading.Thread(target=self._run, name=f"ckpt-snapshots-{store.job}", daemon=True)
        self._thread.start()

    def checkpoint_now(self) -> None:
        """Snapshot the latest completed batch as a checkpoint (coalesces with a pending one)."""
        with self._cond:
            self._checkpoint_due = True
            self._cond.notify()

    def durable_plan(self, batch_id: int, timeout: float) -> bool:
        """Snapshot the latest completed batch so that ``batch_id`` is durable, and wait for it; False when the attempt
        failed (the store unreachable, checkpoints paused) or ``timeout`` passed: the caller asks again later."""
        with self._cond:
            if self.durable_batch >= batch_id:
                return True
            self._plan_wanted = max(self._plan_wanted, batch_id)
            self._checkpoint_due = True
            # A checkpoint already running may have listed the checkpoint before offsets/N: wait for the next one.
            tried = self._checkpoint_attempts + (2 if self._busy_checkpoint else 1)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.durable_batch >= batch_id or self._closed
                                or self._checkpoint_attempts >= tried, timeout=timeout)
            return self.durable_batch >= batch_id

    def savepoint(self, trigger: Trigger, request_id: str | None = None) -> None:
        """Queue a savepoint; a periodic one is skipped while another waits or nothing new completed."""
        with self._cond:
            if trigger is Trigger.PERIODIC and (
                any(j.trigger is Trigger.PERIODIC for j in self._savepoints) or not self._new_since_savepoint()
            ):
                return
            self._savepoints.append(SnapshotJob(Kind.SAVEPOINT, trigger, request_id))
            self._cond.notify()

    def take(self, job: SnapshotJob) -> SnapshotResult:
        """One snapshot now, on the caller's thread (the final savepoint of a stop).

        The lease is checked right before the manifest, the commit point: a driver fenced meanwhile publishes
        nothing; and before retention deletes anything. A savepoint also checks it first, so that a fenced driver's
        savepoint fails before uploading; a checkpoint (after every batch) saves that request.
        """
        if job.kind is Kind.SAVEPOINT:
            self.fence()
        result = create_snapshot(
            self.store, self.checkpoint, kind=job.kind, trigger=job.trigger, labels=self.labels,
            on_step=lambda step: self.fence() if step == "manifest" else None, epoch=self._epoch(),
            code_version=self.meta["code_version"], spark_version=self.meta["spark_version"], keep_marker=True,
            inline_max=self.inline_max,
        )
        with self._markers_lock:
            self._finished_markers.append(result.manifest.snapshot_id)
            del self._finished_markers[:-MARKERS_MAX]  # while deletes fail: gc and disposal take what is let go
        if job.kind is Kind.CHECKPOINT:
            self.last_checkpoint_batch = result.manifest.batch_id
        else:
            self.last_savepoint_batch = result.manifest.batch_id
        covered = result.manifest.batch_id + (1 if result.manifest.next_offsets is not None else 0)
        with self._cond:
            self.durable_batch = max(self.durable_batch, covered)
            self._cond.notify_all()
        now = time.monotonic()
        if job.kind is Kind.SAVEPOINT or self._retained_at is None or now - self._retained_at >= RETENTION_INTERVAL_S:
            self._drop_finished_markers()  # before retention may dispose their snapshots
            self.fence()
            try:
                apply_retention(self.store, self.retention)
                self._retained_at = now
            except CkptError as err:  # retention is retried after the next snapshot
                log.warning("job %s: retention failed, will retry: %s", self.store.job, err)
        return result

    def _drop_finished_markers(self) -> None:
        """Delete the pending markers of the snapshots committed since the last time, in one request."""
        with self._markers_lock:
            ids = list(self._finished_markers)
        if ids and drop_committed_markers(self.store, ids):
            gone = set(ids)
            with self._markers_lock:
                self._finished_markers = [i for i in self._finished_markers if i not in gone]

    def _epoch(self) -> int | None:
        """The driver's lease epoch, which it passes as the ``epoch`` label (None outside a driver)."""
        text = self.labels.get("epoch", "")
        return int(text) if text.isdigit() else None

    def _latest(self) -> int | None:
        try:
            return SparkCheckpoint(self.checkpoint).latest_completed_batch()
        except CkptError:
            return -1  # let create_snapshot report what is wrong

    def _new_batch_completed(self) -> bool:
        latest = self._latest()
        return latest is not None and latest != self.last_checkpoint_batch

    def _new_since_savepoint(self) -> bool:
        latest = self._latest()
        return latest is not None and latest != self.last_savepoint_batch

    def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not (self._busy or self._checkpoint_due or self._savepoints), timeout=timeout
            )

    def close(self, timeout: float = 60.0) -> list[SnapshotJob]:
        """Stop the thread after the snapshot in progress; returns requested savepoints never taken."""
        with self._cond:
            self._closed = True
            dropped = [j for j in self._savepoints if j.request_id is not None]
            self._savepoints.clear()
            self._checkpoint_due = False
            self._cond.notify_all()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._drop_finished_markers()
        return dropped

    def _plan_pending(self) -> bool:
        with self._cond:
            return self._plan_wanted > self.durable_batch

    def _next(self) -> SnapshotJob | None:
        with self._cond:
            if self._busy_checkpoint:
                self._checkpoint_attempts += 1
            self._busy = self._busy_checkpoint = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._closed or self._checkpoint_due or bool(self._savepoints))
            if self._closed:
                return None
            self._busy = True
            if self._savepoints:
                return self._savepoints.popleft()
            self._checkpoint_due = False
            self._busy_checkpoint = True
            return SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC)

    def _store_down(self) -> bool:
        return self.outage is not None and self.outage.down

    def _run(self) -> None:
        if self.nice:
            _lower_priority(self.nice)
        while (job := self._next()) is not None:
            # A durable plan is tried even during an outage: the sink's commits wait on it, and it asks again.
            if job.kind is Kind.CHECKPOINT and not self._plan_pending() and (
                    self._store_down() or checkpoints_paused() or not self._new_batch_completed()):
                continue  # during a store outage the next batch after it asks again
            try:
                outcome = SnapshotOutcome(job, result=self.take(job))
                if self.outage is not None:
                    self.outage.ok()
            except CkptError as err:
                # Periodic snapshots retry at the next batch; requested ones report the failure.
                if self.outage is not None and _unreachable(err):
                    self.outage.failed(err)  # logged once per outage
                else:
                    log.warning("job %s: %s snapshot failed: %s", self.store.job, job.kind.value, err)
                outcome = SnapshotOutcome(job, error=str(err))
            except Exception as err:
                log.exception("job %s: %s snapshot failed unexpectedly", self.store.job, job.kind.value)
                outcome = SnapshotOutcome(job, error=f"{type(err).__name__}: {err}")
            self.on_done(outcome)


def _lower_priority(nice: int) -> None:
    """Raise this thread's nice value by ``nice`` (lower its CPU priority); where threads have none, do nothing."""
    if not sys.platform.startswith("linux"):  # elsewhere setpriority takes no thread id: it would name a process
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as err:  # not allowed: snapshots run at the driver's priority
        log.debug("snapshot thread keeps the driver's CPU priority: %s", err)


def _unreachable(err: BaseException) -> bool:
    """Whether ``err`` was caused by the store not answering (an UnreachableError in its chain)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, UnreachableError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
