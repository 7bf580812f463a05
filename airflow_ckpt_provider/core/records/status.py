"""The job's heartbeat in ``status.json``, and the one table of job states every waiter reads."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import msgspec

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records import heard
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.store.jobstore import STATUS, JobStore


class JobState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"  # ``restart`` says who restarts the job, the attempt, and by when it runs again
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


#: The state vocabulary as data: the CLI wait, the sensor and the trigger all read these sets.
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.RESTARTING, JobState.STOPPING})
TERMINAL_STATES = frozenset({JobState.STOPPED, JobState.FAILED})
FAILURE_STATES = frozenset({JobState.FAILED})
#: Seconds a STARTING, RESTARTING or STOPPING driver may go without a heartbeat (restore, final savepoint).
BUSY_ALLOWANCE = 300.0
#: Restarts of one driver kept in ``JobStatus.restarts`` (the newest; ``restart_count`` counts them all).
RESTARTS_KEPT = 20
#: Samples of a driver's batches kept in ``JobStatus.samples`` (one per status write with batches: 240 are about an
#: hour at the default heartbeat while batches complete), for the Streaming Jobs page's charts.
SAMPLES_KEPT = 240


class Sample(msgspec.Struct, frozen=True, array_like=True):
    """The batches a driver completed between two status writes: when written (``at``), the last batch id, how
    many, their rows, their mean duration (s) and the Kafka lag after the last. Written as a JSON array (compact)."""

    at: float
    batch_id: int | None
    batches: int
    rows: int
    seconds: float | None
    lag: int | None


class RestartOwner(StrEnum):
    """Who restarts a job: its driver (the query, in the same SparkSession) or its supervisor (the process)."""

    DRIVER = "driver"
    SUPERVISOR = "supervisor"


@dataclass(frozen=True)
class Restart:
    """One restart: who makes it, its attempt, why, the delay, from which batch, and by when the job should
    run again (wall clock). ``resumed_at``/``resumed_batch`` are set once the restarted query ran a batch."""

    by: RestartOwner
    attempt: int
    cause: str
    delay: float
    at: float
    expected_by: float
    from_batch: int | None = None
    resumed_at: float | None = None
    resumed_batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "by": self.by.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Restart:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known} | {"by": RestartOwner(d["by"])})


class JobStatus(Record, frozen=True):
    """What the driver of epoch ``epoch`` last reported: its state, its last batch (``batch_id``, completed at
    ``batch_at``) with the source offsets and lag, its last snapshot, the restart in progress and its earlier query
    restarts; ``updated_at`` is its heartbeat. Written by the driver (runtime/reporting.py) every
    ``heartbeat_interval`` s and at each change, unless a newer epoch reports there (``write_status``); ended by its
    supervisor when the driver died without saying so; read by every waiter (``driver_live``), the job view, the
    job report and the UI."""

    WHAT = "status"
    KEY = "status.json"

    job: str
    state: JobState
    epoch: int
    updated_at: float
    started_at: float
    reason: str = ""
    batch_id: int | None = None
    batch_at: float | None = None  # when batch_id completed
    offsets: dict[str, Any] = msgspec.field(default_factory=dict)
    lag: int | None = None  # Kafka records behind the latest offsets Spark saw for batch_id (0 once idle)
    lag_seconds: float | None = None  # how long ago the oldest of those records arrived (runtime/batchevents.py)
    data_waiting: bool = False
    idle: bool = False  # the query's last trigger found no new data (caught up with its sources)
    last_snapshot: dict[str, Any] | None = None
    restored_from: str | None = None
    pid: int | None = None
    host: str | None = None
    app_id: str | None = None
    ui_url: str | None = None
    metrics_url: str | None = None  # where the driver serves its metrics for Prometheus (metrics_address), if it does
    code_version: str | None = None
    heartbeat_interval: float = 5.0
    restart: dict[str, Any] | None = None  # the restart in progress (state RESTARTING): Restart.to_dict()
    restarts: list[dict[str, Any]] = msgspec.field(default_factory=list)  # this driver's query restarts, newest last
    restart_count: int = 0  # this driver's query restarts in all
    #: The driver process's store requests per second over the last ``store_window`` s, by S3 operation
    #: (core/store/requestcount.py); empty on a store that is no S3 (a directory) and before the first window.
    store_rates: dict[str, float] = msgspec.field(default_factory=dict)
    store_window: float = 0.0
    # The newest SAMPLES_KEPT, oldest first: this driver's, and its predecessors' carried at its start.
    samples: list[Sample] = msgspec.field(default_factory=list)

    def query_restarts(self) -> list[Restart]:
        """This driver's restarts of its query (the newest ``RESTARTS_KEPT``), oldest first; an entry that does
        not parse is left out."""
        found = []
        for entry in self.restarts:
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                found.append(Restart.from_dict(entry))
        return found

    def current_restart(self) -> Restart | None:
        """The restart in progress, when the state is RESTARTING."""
        if self.state is not JobState.RESTARTING or not self.restart:
            return None
        try:
            return Restart.from_dict(self.restart)
        except (KeyError, TypeError, ValueError):
            return None

    def heard_at(self) -> float:
        """When this heartbeat was written, on this process's clock: measured by the store's clock when read
        (``read_status``), else the writer's ``updated_at``. Liveness compares it with this process's clock only."""
        return heard.heard_at(("status", self.job, self.epoch), self.updated_at)

    def age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat, on this process's clock (``now``, default its wall clock); a ``now``
        taken just before the read, or a writer's clock ahead of this one, gives 0, never less."""
        return max(0.0, (time.time() if now is None else now) - self.heard_at())

    def local(self, at: float) -> float:
        """A time the writer of this status gave on its own clock (``batch_at``, a restart's ``at`` and
        ``expected_by``) on this process's clock, shifted as the heartbeat was."""
        return at + self.heard_at() - self.updated_at


def heartbeat_limit(status: JobStatus, *, heartbeat_timeout: float | None = None,
                    busy_timeout: float = BUSY_ALLOWANCE) -> float:
    """Seconds without a heartbeat after which the driver of ``status`` counts as dead: ``heartbeat_timeout``,
    by default three missed heartbeats + 5 s. A STARTING driver restores a snapshot and a STOPPING one uploads
    its final savepoint without reporting: they get ``busy_timeout`` at least; so does a RESTARTING job, and
    at least until its restart's ``expected_by`` plus ``heartbeat_timeout``."""
    limit = heartbeat_timeout if heartbeat_timeout is not None else 3 * status.heartbeat_interval + 5
    if status.state is JobState.RUNNING:
        return limit
    restart = status.current_restart()
    if restart is not None:  # a restart in progress: dead only once it is late by the whole allowance
        return max(limit, busy_timeout, restart.expected_by - status.updated_at + limit)
    return max(limit, busy_timeout)


def driver_live(
    status: JobStatus,
    now: float,
    *,
    heartbeat_timeout: float | None = None,
    busy_timeout: float = BUSY_ALLOWANCE,
    host: str | None = None,
    pid_alive: Callable[[int], bool] | None = None,
) -> bool:
    """Whether the driver that wrote ``status`` still runs: an active state and a heartbeat within
    ``heartbeat_limit`` at ``now``. The one definition the watches, the job view (CLI, operators) and the
    supervisor share.

    With ``pid_alive`` (a probe of a process id on this host, named ``host``), a driver that reported from
    this host and whose process is gone is dead at once: a kill -9 is seen without waiting out the limit.
    """
    if status.state not in ACTIVE_STATES:
        return False
    if pid_alive is not None and status.pid is not None and status.host == host and not pid_alive(status.pid):
        return False
    limit = heartbeat_limit(status, heartbeat_timeout=heartbeat_timeout, busy_timeout=busy_timeout)
    return status.age(now) <= limit


def read_status(store: JobStore) -> JobStatus | None:
    """The job's last reported status, or None if no driver ever ran it."""
    found = store.storage.read_versioned(STATUS)
    if found is None:
        return None
    status = JobStatus.from_bytes(found.data, store.storage.uri(STATUS))
    heard.note(("status", status.job, status.epoch), status.updated_at, found.age)
    return status


def write_status(store: JobStore, status: JobStatus, *, attempts: int = 5) -> bool:
    """Write the status unless a newer driver (higher epoch) already reports there; True if written.

    Compare-and-swap on what was read: an older driver that reads the status, stalls (a pause, a partition) and
    writes after a newer driver reported never replaces the newer one's report (issue 41). A write lost to a
    writer of the same or an older epoch (the driver's own heartbeat thread, its supervisor) is tried again."""
    return StatusWriter(store).write(status, attempts=attempts)


class StatusWriter:
    """``write_status`` for a writer that writes again and again (the driver's reporter): it keeps the version tag
    of its last write, so its next compare-and-swap needs no read first (one PUT per report instead of a GET and a
    PUT). When the status changed meanwhile (the supervisor wrote, or a newer driver), the swap fails and it reads
    and decides as ``write_status`` does."""

    _UNKNOWN = object()

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._tag: object = self._UNKNOWN  # the tag of the status as this writer last wrote it (None: absent)

    def write(self, status: JobStatus, *, attempts: int = 5) -> bool:
        storage = self.store.storage
        for _ in range(attempts):
            if self._tag is self._UNKNOWN:
                found = storage.read_versioned(STATUS)
                current = None
                if found is not None:
                    try:
                        current = JobStatus.from_bytes(found.data, storage.uri(STATUS))
                    except StorageError:  # unreadable: replace it
                        current = None
                if current is not None and current.epoch > status.epoch:
                    return False
                self._tag = None if found is None else found.tag
            tag = self._tag
            assert tag is None or isinstance(tag, str)
            written = storage.swap(STATUS, status.to_bytes(), tag)
            if written is not None:
                self._tag = written
                return True
            self._tag = self._UNKNOWN  # changed meanwhile: read it, and decide again
        return False
