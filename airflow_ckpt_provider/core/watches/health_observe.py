"""The health watch's observation: every job store record its judgement reads, read once per poll at most.

``observe`` reads status.json and the lease, the deployments/ records of the watched deployment (each record once
in the watch's life: they are never rewritten), spec/last.json and supervisors/ only when the judgement may need
them, each at most once. While the same driver runs and reports, a poll reads status.json alone (``steady``); the
lease and deployments/ again at least every ``FULL_LOOK_EVERY`` s. The judgement (health_judge.py) never reads the
store. Design notes: docs/scale.md#design-notes-corewatcheshealth_observepy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.outage import ReadableAgain
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord, read_lease
from airflow_ckpt_provider.core.records.start import epoch_of, read_start
from airflow_ckpt_provider.core.records.status import (
    TERMINAL_STATES,
    JobState,
    JobStatus,
    RestartOwner,
    driver_live,
    read_status,
)
from airflow_ckpt_provider.core.records.supervision import Supervision, observe_supervision
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, JobStore
from airflow_ckpt_provider.core.views.jobview import JobView, on_its_way

log = logging.getLogger(__name__)

#: Seconds between full looks (the lease and deployments/) while a poll finds the same driver running (``steady``).
FULL_LOOK_EVERY = 300.0

#: One driver start of the watched deployment (a deployments/<epoch>.json record): (epoch, at, launch id).
Start = tuple[int, float, str | None]


@dataclass(frozen=True)
class Observation:
    """What the job store said at ``now``, for one poll of the health watch."""

    now: float
    found: JobStatus | None  # status.json as found: maybe an older deployment's
    lease: LeaseRecord | None
    status: JobStatus | None  # the watched deployment's current driver (``found`` if it qualifies), or None
    starts: tuple[Start, ...] = ()  # every driver start of the watched deployment, by epoch
    launch: Launch | None = None  # spec/last.json when the judgement needs it (None: absent, unreadable or unread)
    supervision: Supervision | None = None  # the job's supervisor when the judgement needs it (None: unread)
    readable_since: float | None = None  # the store answered again then, after reads failed (None: no outage)
    full_at: float | None = None  # when the lease and deployments/ were last read (``now``, or an earlier poll's)

    @property
    def newer_lease(self) -> LeaseRecord | None:
        """The lease when a driver newer than the one that wrote status.json took it."""
        if self.lease is not None and self.found is not None and self.lease.epoch > self.found.epoch:
            return self.lease
        return None


def qualifies(status: JobStatus, criteria: HealthCriteria) -> bool:
    """Whether ``status`` is of the watched deployment (epoch and start time), not of an older one."""
    return (criteria.min_epoch is None or status.epoch >= criteria.min_epoch) and (
        criteria.started_after is None or status.started_at >= criteria.started_after)


class StartRecords:
    """The deployments/ records of the watched deployment, each read once (a record is never rewritten): the
    observer's cache across polls, not the judgement's memory."""

    def __init__(self) -> None:
        self._read: dict[int, Start | None] = {}  # by epoch; None: below min_epoch, or unreadable

    def starts(self, store: JobStore, criteria: HealthCriteria) -> tuple[Start, ...]:
        """(epoch, at, launch id) of every driver start of the watched deployment, by epoch: one listing of
        deployments/, a read of each record not seen before (core/records/start.py, the one reader)."""
        for info in store.storage.list(DEPLOYMENTS):
            epoch = epoch_of(info.key)
            if epoch is None or epoch in self._read:
                continue
            if criteria.min_epoch is not None and epoch < criteria.min_epoch:
                self._read[epoch] = None
                continue
            record = read_start(store, epoch)  # None: unreadable (logged once: never read again)
            self._read[epoch] = (record.epoch, record.at, record.launch_id) if record is not None else None
        starts = [r for r in self._read.values() if r is not None]
        return tuple(sorted(s for s in starts if criteria.started_after is None or s[1] >= criteria.started_after))


def observe(store: JobStore, criteria: HealthCriteria, now: float, *, records: StartRecords,
            reads: ReadableAgain, last: Observation | None = None) -> Observation:
    """One poll's reads. ``reads`` learns that the store answered (status.json read) before the rest is read,
    so a later failure in this poll counts as a new outage; StorageError propagates. ``last``: the previous poll's
    observation, whose lease and starts a steady poll keeps."""
    found = read_status(store)
    reads.worked(now)
    if last is not None and steady(last, found, criteria, now):
        return replace(last, now=now, found=found, status=found, launch=None, supervision=None,
                       readable_since=reads.since)
    view = JobView(store, found, read_lease(store), now)
    status = view.status
    if status is not None and (not qualifies(status, criteria) or view.newer_lease is not None):
        status = None
    starts = records.starts(store, criteria)
    launch = _LaunchRecord(store)
    if (status is None and criteria.started_after is not None) or (
            status is not None and status.state is not JobState.RUNNING):
        launch.read()  # a launch that ended before its driver reported; a newer launch on its way
    supervision = None
    if _supervision_matters(status, criteria, launch, now):
        supervision = _supervision(store, launch, now)
    return Observation(now, view.status, view.lease, status, starts, launch.record, supervision, reads.since, now)


def steady(last: Observation, found: JobStatus | None, criteria: HealthCriteria, now: float) -> bool:
    """Whether status.json alone is this poll's observation: the driver the last poll judged runs on, reporting (its
    epoch and start unchanged, RUNNING, its heartbeat within the limit, no restart), and the lease and deployments/
    were read less than ``FULL_LOOK_EVERY`` s ago. What the skipped reads would show changes only with a new driver,
    which takes the lease and writes its deployments/ record right before its first report (a new epoch here), or
    fences this one, which then stops reporting or reports its end; either makes the next poll a full one."""
    before = last.status
    return (found is not None and before is not None and last.newer_lease is None and last.full_at is not None
            and now - last.full_at < FULL_LOOK_EVERY and (found.epoch, found.started_at) == (before.epoch,
                                                                                          before.started_at)
            and found.state is JobState.RUNNING is before.state and qualifies(found, criteria)
            and driver_live(found, now, heartbeat_timeout=criteria.heartbeat_timeout,
                            busy_timeout=criteria.start_timeout))


class _LaunchRecord:
    """spec/last.json, read at most once per poll: unreadable counts as none for the judgement (as in
    jobview.starting_launch), but the supervisor's liveness, which needs it, fails on it (as observe_supervision)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.done = False
        self.record: Launch | None = None
        self.error: StorageError | None = None

    def read(self) -> Launch | None:
        if not self.done:
            self.done = True
            try:
                self.record = read_launch(self.store)
            except StorageError as err:
                self.error = err
        return self.record

    def required(self) -> Launch | None:
        self.read()
        if self.error is not None:
            raise self.error
        return self.record


def _supervision_matters(status: JobStatus | None, criteria: HealthCriteria, launch: _LaunchRecord,
                         now: float) -> bool:
    """Whether the judgement may ask about the supervisor: a FAILED driver (its supervisor may restart it), a
    restart by a supervisor, or an active driver that stopped reporting. Not for a driver a newer launch
    replaces, nor for a STOPPED one."""
    if status is None:
        return False
    if status.state is not JobState.RUNNING and on_its_way(launch.read(), status, now, criteria.start_timeout):
        return False
    if status.state is JobState.FAILED:
        return True
    if status.state in TERMINAL_STATES:
        return False
    restart = status.current_restart()
    if restart is not None and restart.by is RestartOwner.SUPERVISOR:
        return True
    return not driver_live(status, now, heartbeat_timeout=criteria.heartbeat_timeout,
                           busy_timeout=criteria.start_timeout)


def _supervision(store: JobStore, launch: _LaunchRecord, now: float) -> Supervision:
    """The newest supervisor and whether it is live, on this poll's spec/last.json."""
    return observe_supervision(store, now, last_launch=launch.required)
