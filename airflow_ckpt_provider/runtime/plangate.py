"""The driver's side of durable plans: as soon as Spark plans batch N, put it in the job store, then say so.

A thread watches the live checkpoint's ``offsets/`` (a local directory: a look costs no request) and, for
each new batch N, has the snapshotter store batch N-1 with the write-ahead entry ``offsets/N`` (batch 0: its
plan alone, ``FIRST_PLAN``), then records N in the live checkpoint's durable-plan file, which the ckpt-kafka
sink's tasks wait for before they commit. Design notes: docs/sink-kafka.md#design-notes-coresnapshotsdurableplanpy.
"""

from __future__ import annotations

import logging
import threading
import time

from airflow_ckpt_provider.core.errors import CkptError, StorageError
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint, checkpoint_query_id
from airflow_ckpt_provider.core.snapshots.durableplan import (
    DURABLE_FILE,
    FIRST_PLAN,
    DurablePlan,
    FirstPlan,
    first_plan_files,
    write_durable,
)
from airflow_ckpt_provider.core.snapshots.viewplan import numbered
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.runtime.snapshotter import Snapshotter

log = logging.getLogger(__name__)

#: How often the live checkpoint is looked at for the next batch's offsets/N: a stat of a local file, or (with
#: commitAfterSnapshot=true on an s3:// checkpoint, which outlives its host anyway) a HEAD request.
POLL_S = 0.01
REMOTE_POLL_S = 0.5
#: How long one attempt to store a plan may take before it is asked for again, and the pause after a failure.
ATTEMPT_S = 30.0
RETRY_S = 1.0


class PlanGate:
    """Makes each planned batch durable in the job store, in order, and records it for the sink's tasks."""

    def __init__(self, store: JobStore, live: Storage, snapshotter: Snapshotter, *, epoch: int) -> None:
        self.store = store
        self.live = live
        self.snapshotter = snapshotter
        self.epoch = epoch
        self.durable = -1
        self.poll = POLL_S if live.local_path("metadata") is not None else REMOTE_POLL_S
        self._lock = threading.Lock()  # guards durable and the record against a reset (a query start) meanwhile
        self._starts = 0  # query starts so far: a plan stored before the latest start is not recorded
        self._first_plan_kept = True  # one may be in the store (this driver's, or a predecessor's): drop it once
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ckpt-plans-{store.job}", daemon=True)

    @staticmethod
    def disable(live: Storage) -> None:
        """No durable plans for this run: a record left by an earlier run must not hold the sink's tasks."""
        live.delete([DURABLE_FILE])

    def start(self) -> PlanGate:
        self.reset()
        self._thread.start()
        log.info("job %s epoch %d: a batch's ckpt-kafka commits wait until the job store can replay it (durable "
                 "plans: the live checkpoint %s is on this host's disk)", self.store.job, self.epoch, self.live.url)
        return self

    def reset(self) -> None:
        """Before each start of the query: nothing counts until this start's plans are stored (an in-driver
        restart may have restored an older snapshot, whose batches Spark plans again with other offsets)."""
        with self._lock:
            self._starts += 1
            self.durable = -1
            write_durable(self.live, DurablePlan(None, -1, self.epoch))

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5.0)

    def _planned(self) -> int | None:
        """The newest batch Spark planned: one look for the next one (a stat), a listing only after a (re)start."""
        durable = self.durable
        if durable >= 0:
            return durable + 1 if self.live.exists(f"offsets/{durable + 1}") else None
        found = numbered({o.key: o.size for o in self.live.list("offsets/")}, "offsets")  # temp files: not digits
        return max(found) if found else None

    def _run(self) -> None:
        while not self._closed.is_set():
            starts = self._starts
            try:
                planned = self._planned()
                if planned is None or planned <= self.durable:
                    self._closed.wait(self.poll)
                    continue
                if not self._store(planned):
                    self._closed.wait(RETRY_S)
                    continue
            except (CkptError, OSError) as err:  # the next look tries again; the sink's tasks keep waiting
                log.warning("job %s epoch %d: could not store the plan of the newest batch: %s", self.store.job,
                            self.epoch, err)
                self._closed.wait(RETRY_S)
                continue
            with self._lock:
                if starts == self._starts:  # else the query started again meanwhile: look again
                    self.durable = planned
                    write_durable(self.live, DurablePlan(checkpoint_query_id(self.live), planned, self.epoch))

    def _store(self, planned: int) -> bool:
        """Store what a restart elsewhere needs to run ``planned`` as Spark planned it; False: try again later."""
        started = time.monotonic()
        completed = SparkCheckpoint(self.live).latest_completed_batch()
        if completed is None:
            self._store_first_plan()
        elif not self.snapshotter.durable_plan(min(planned, completed + 1), ATTEMPT_S):
            return False
        else:
            self._drop_first_plan()
        log.info("job %s epoch %d batch %d: planned batch stored in the job store in %.2f s (it may commit now)",
                 self.store.job, self.epoch, planned, time.monotonic() - started)
        return True

    def _store_first_plan(self) -> None:
        query_id = checkpoint_query_id(self.live)
        if query_id is None:
            raise CkptError(f"the live checkpoint {self.live.url} has offsets/0 but no metadata with a query id yet")
        self.store.storage.write(FIRST_PLAN, FirstPlan(query_id, self.epoch, first_plan_files(self.live)).to_bytes())
        self._first_plan_kept = True

    def _drop_first_plan(self) -> None:
        """Once a snapshot holds the query, its first batch's plan is no longer the way back: delete it, once."""
        if self._first_plan_kept:
            try:
                self.store.storage.delete([FIRST_PLAN])
                self._first_plan_kept = False
            except StorageError as err:
                log.debug("job %s: the first batch's plan stays for now: %s", self.store.job, err)

