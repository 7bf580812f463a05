"""The job lease: at most one driver runs a job. Each driver takes the lease with a higher epoch
(compare-and-swap on ``lease.json``); a driver that sees a newer epoch is fenced and stops itself,
as a Kafka transactional producer is fenced by a newer one with the same id."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Self

import msgspec

from airflow_ckpt_provider.core.errors import ConflictError, StorageError
from airflow_ckpt_provider.core.records.base import Record, RecordError
from airflow_ckpt_provider.core.store.jobstore import LEASE, JobStore

log = logging.getLogger(__name__)


class FencedError(ConflictError):
    """A newer driver holds the job's lease: this one must not commit another batch."""


class LeaseRecord(Record, frozen=True):
    """Who holds the job: the driver of ``epoch`` (``owner``, its process ``pid`` on ``host``), since
    ``acquired_at``, until it ``released`` it; how often it looks at the lease and how long it commits on while the
    store does not answer, which a newer driver waits out before it starts; where askers knock after a control
    request (``door``), as Flink's leader record names the leader's address. Written by each driver when it starts
    (compare-and-swap: the next epoch) and once when it stops (released); read by every driver's lease watch and
    by the job view."""

    WHAT = "lease"
    KEY = "lease.json"

    job: str
    epoch: int
    owner: str
    host: str
    pid: int
    acquired_at: float
    released: bool = False
    poll_interval: float = 1.0  # how often this driver looks at the lease: a newer one waits for that
    outage_tolerance: float = 0.0  # seconds it commits on while the store does not answer: a newer one waits that
    door: str | None = None  # where an asker knocks after a control request (runtime/controldoor.py); None: none

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Self:
        try:
            return super().from_bytes(data, where)
        except RecordError as err:
            raise RecordError(f"{err}; expected the JSON a ckpt driver writes. Delete it only if no driver of this "
                              "job is running") from err


def read_lease(store: JobStore) -> LeaseRecord | None:
    """The current lease of the job, or None if no driver ever took it."""
    found = store.storage.read_versioned(LEASE)
    return LeaseRecord.from_bytes(found.data, store.storage.uri(LEASE)) if found else None


class Lease:
    """One driver's hold on a job: ``acquire()`` once, ``check()`` or ``confirm()`` often, ``release()`` at a
    clean stop.

    ``outage_tolerance``: seconds since the last confirmation during which ``confirm()`` rides out a store that
    does not answer. It is recorded in lease.json, and a newer driver waits at least that long after taking
    the lease (``grace``), so a driver that cannot see it was fenced stops committing before the newer starts.
    """

    def __init__(
        self, store: JobStore, *, poll_interval: float = 1.0, outage_tolerance: float = 0.0,
        clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
        door: str | None = None,
    ) -> None:
        self.store = store
        self.door = door
        self.poll_interval = poll_interval
        self.outage_tolerance = outage_tolerance
        self.clock = clock
        self.monotonic = monotonic
        self.confirmed_at = monotonic()  # the last successful check
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.record: LeaseRecord | None = None
        self.previous: LeaseRecord | None = None
        self.lost: FencedError | None = None  # set once any look found a newer driver: nothing confirms it again
        self.read_since_start = False  # the first confirm() after acquire() or a query's start reads (recent)

    @property
    def epoch(self) -> int:
        if self.record is None:
            raise AssertionError("lease not acquired")
        return self.record.epoch

    def acquire(self, attempts: int = 20) -> LeaseRecord:
        """Take the lease with the next epoch, whoever holds it now (the newest driver wins)."""
        for _ in range(attempts):
            current = self.store.storage.read_versioned(LEASE)
            previous = LeaseRecord.from_bytes(current.data, self.store.storage.uri(LEASE)) if current else None
            mine = LeaseRecord(
                job=self.store.job, epoch=(previous.epoch if previous else 0) + 1, owner=self.owner,
                host=socket.gethostname(), pid=os.getpid(), acquired_at=self.clock(),
                poll_interval=self.poll_interval, outage_tolerance=self.outage_tolerance, door=self.door,
            )
            if self.store.storage.write_if(LEASE, mine.to_bytes(), current.tag if current else None):
                self.record, self.previous = mine, previous
                self.confirmed_at, self.read_since_start = self.monotonic(), False
                held = "released" if previous is None or previous.released else f"held by {previous.owner}"
                log.info(
                    "job %s: lease taken at epoch %d by %s (previous epoch %s, %s)",
                    self.store.job, mine.epoch, self.owner, previous.epoch if previous else "-", held,
                )
                return mine
        raise ConflictError(
            f"job {self.store.job}: could not take the lease in {attempts} attempts: other drivers keep "
            "taking it; check that only one supervisor or Airflow task starts this job"
        )

    def previous_may_run(self) -> bool:
        """True if the driver we took the lease from may still be running: it did not release the
        lease, and it is not a process of this host that is known to be gone (a supervisor's restart)."""
        prev = self.previous
        if prev is None or prev.released:
            return False
        return prev.host != socket.gethostname() or pid_alive(prev.pid)

    def grace(self, minimum: float) -> float:
        """Seconds to wait before the first commit: long enough for the previous driver to notice."""
        if not self.previous_may_run():
            return 0.0
        assert self.previous is not None
        prev = self.previous
        return max(minimum, 2 * prev.poll_interval + 1.0, prev.outage_tolerance + prev.poll_interval + 1.0)

    def check(self) -> LeaseRecord:
        """Raise FencedError unless the lease still names this driver at its epoch.

        A confirmation counts from when the read was sent, not when it was answered: a newer driver may have taken
        the lease right after the store answered, and its grace counts from then."""
        asked = self.monotonic()
        current = read_lease(self.store)
        if current is None or current.epoch != self.epoch or current.owner != self.owner:
            found = f"epoch {current.epoch} held by {current.owner}" if current else "no lease"
            self.lost = FencedError(
                f"job {self.store.job}: this driver ({self.owner}, epoch {self.epoch}) was fenced: the lease "
                f"now shows {found}. Another driver runs the job; this one stops without committing"
            )
            raise self.lost
        self.confirmed_at = max(self.confirmed_at, asked)  # two threads confirm (runtime/leasewatch.py)
        self.read_since_start = True
        return current

    def read_before_next_commit(self) -> None:
        """The next ``confirm()`` reads whatever ``recent()`` says: a query (re)starts, and two drivers started at
        once learn at their first commit which one took the lease last."""
        self.read_since_start = False

    def recent(self) -> bool:
        """Whether a look confirmed the lease less than a poll interval ago (the lease watch reads it every poll) and
        no look found it lost. Then ``confirm()`` needs no read of its own: a newer driver waits its grace after taking
        the lease, longer than the outage tolerance and than a poll interval, so a commit on a confirmation this
        young comes before any commit of the newer driver, as one riding out an outage does (docs/scale.md). Taking the
        lease is no look, nor is a query's start: until a read confirmed it since, the first commit reads (two drivers
        started at once: the one whose write came first learns at its first commit that the other took it after)."""
        return (self.lost is None and self.read_since_start and
                self.monotonic() - self.confirmed_at < min(self.poll_interval, self.outage_tolerance))

    def confirm(self) -> bool:
        """``check()``, riding out a store outage: True if confirmed now (or ``recent()``ly), False if the store did
        not answer but the last confirmation is younger than ``outage_tolerance``; StorageError beyond it,
        FencedError if fenced (at once, without a read, once any look found it so)."""
        try:
            self.check_unless_recent()
        except FencedError:
            raise
        except StorageError:
            if self.tolerating():
                return False
            raise
        return True

    def check_unless_recent(self) -> None:
        """FencedError at once if any look found the lease lost; nothing if ``recent()``; else ``check()`` (a read,
        StorageError if the store does not answer)."""
        if self.lost is not None:
            raise self.lost
        if not self.recent():
            self.check()

    def tolerating(self) -> bool:
        """Whether the last confirmation is younger than ``outage_tolerance`` (an outage may be ridden out)."""
        return self.monotonic() - self.confirmed_at < self.outage_tolerance

    def release(self) -> bool:
        """Mark the lease released so the next driver need not wait; False if we no longer hold it."""
        found = self.store.storage.read_versioned(LEASE)
        if found is None or self.record is None:
            return False
        current = LeaseRecord.from_bytes(found.data, self.store.storage.uri(LEASE))
        if current.owner != self.owner or current.epoch != self.epoch:
            return False
        released = msgspec.structs.replace(current, released=True)
        return self.store.storage.write_if(LEASE, released.to_bytes(), found.tag)


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists on this host (also when another user owns it) and is not a zombie.

    The one probe of a local process (leases, pending markers, drivers, supervisors). A supervisor whose
    launching process died (the Airflow worker) is reparented to pid 1; when it is killed in turn, a pid 1 that
    does not reap orphans (a container's init without a subreaper) leaves it a zombie, which ``kill(pid, 0)``
    still finds."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """State Z in /proc/<pid>/stat (Linux); False where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] == "Z"  # the command name in parentheses may hold spaces
