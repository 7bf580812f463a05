"""Which supervision service instance owns a job: one lease per instance, one owner record per job, no clocks compared.

Each instance renews its own record (``_service/instances/<id>.json``, one PUT per renewal however many jobs it owns);
a job's owner record (``<job>/service/owner.json``) changes only by compare-and-swap, when the job is first claimed and
on a takeover (epoch + 1). An instance acts on a job while the record names it and its last renewal, counted from
when it was sent, is younger than ``renew_deadline`` on its own monotonic clock. Another instance takes the job over
once the owner's record has not changed for ``lease_duration`` on the taker's monotonic clock, which the timings keep
longer than the owner's deadline: the old owner stops before a new one starts (Kubernetes' leader election).
Design notes: docs/service.md#design-notes-corerecordsownershippy.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError, StorageError
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.store.jobstore import JobStore, check_job_name
from airflow_ckpt_provider.core.store.storage import Storage

log = logging.getLogger(__name__)

#: At the store's root: a job name starts with a letter or digit, so no job's prefix is this.
INSTANCES = "_service/instances/"
#: At the store's root: one record per job handed to the service.
HANDED = "_service/jobs/"
#: Under a job's root.
OWNER = "service/owner.json"
#: At the store's root: rung by whoever hands a job over or asks for an operation, so an instance looks at that job
#: at its next renewal instead of at the job's next paced look (launcher/service.py).
SERVICE_BELL = "_service/bell.json"
#: The rings a bell keeps (the newest).
BELL_RINGS = 50


class NotOwner(ConflictError):
    """This instance does not own the job (another took it over) or may not act now (its lease is not renewed)."""


@dataclass(frozen=True)
class Timings:
    """How often an instance renews its lease, how long it acts on without a renewal, and how long the others wait
    for a silent instance before they take its jobs; the default takes a job over within 15 s of its owner's loss
    (``lease_duration`` plus one look at it)."""

    renew_every: float = 2.0
    renew_deadline: float = 8.0
    lease_duration: float = 12.0

    def __post_init__(self) -> None:
        needed = self.renew_deadline + self.renew_every + 1.0
        if self.renew_every <= 0 or self.renew_deadline < 2 * self.renew_every:
            todo = "renew more often, or raise renew_deadline (a cut-off instance then acts on longer)"
        elif self.lease_duration < needed:
            todo = "raise lease_duration (a takeover then takes longer)"
        else:
            return
        raise ConfigError(
            f"service lease timings: expected renew_every > 0, renew_deadline >= 2 x renew_every and "
            f"lease_duration >= renew_deadline + renew_every + 1 s ({needed:g} s), found renew_every "
            f"{self.renew_every:g} s, renew_deadline {self.renew_deadline:g} s, lease_duration "
            f"{self.lease_duration:g} s; {todo}")


class InstanceRecord(Record, frozen=True, kw_only=True):
    """One supervision service instance's lease: its process (``pid`` on ``host``), renewed every ``renew_every``
    s (``sequence`` + 1, ``renewed_at`` its wall clock, for people); ``lease_duration``: how long the others wait
    after its last change before they take its jobs over; ``stopped`` once it stopped cleanly (its jobs may be
    taken at once). Written only by the instance; read by the other instances and by ``ckpt service status``."""

    WHAT = "supervision service instance"
    KEY = "/_service/instances/<instance>.json"

    instance: str
    host: str
    pid: int
    started_at: float
    renewed_at: float
    sequence: int
    renew_every: float
    lease_duration: float
    stopped: bool = False
    metrics_url: str | None = None  # where it serves its metrics (`ckpt service run --metrics-address`)


class OwnerRecord(Record, frozen=True, kw_only=True):
    """The supervision service instance that owns the job, and the ownership's ``epoch`` (+ 1 at every takeover);
    ``released`` when the instance let the job go cleanly. Written by compare-and-swap by the instance that claims
    the job; read by that instance before each step it takes, and by the other instances."""

    WHAT = "service owner record"
    KEY = "service/owner.json"

    job: str
    instance: str
    epoch: int
    acquired_at: float
    released: bool = False


class ServiceJob(Record, frozen=True, kw_only=True):
    """A job handed to the supervision service: its instances claim it and keep its recorded launch (spec/last.json)
    running. Written by ``hand_over`` (launcher/handover.py) from a front-end; listed by every instance."""

    WHAT = "job handed to the supervision service"
    KEY = "/_service/jobs/<job>.json"

    job: str
    handed_at: float
    handed_by: str


class ServiceBell(Record, frozen=True):
    """The service's bell: the newest rings, each ``[job, at]`` (``at`` the ringer's clock, only compared for
    equality). Rewritten (compare-and-swap) by ``ring_service``: handing a job over, asking for an operation;
    read by every instance once a renewal (one GET for all jobs)."""

    WHAT = "supervision service bell"
    KEY = "/_service/bell.json"

    rings: list[tuple[str, float]]


def ring_service(root: Storage, job: str, *, attempts: int = 3) -> bool:
    """Ring the service's bell for ``job``; False (logged) if it could not be written: an instance then looks at the
    job at its next paced look instead (launcher/service.py LOOK_EVERY)."""
    for _ in range(attempts):
        try:
            found = root.read_versioned(SERVICE_BELL)
            rings = ServiceBell.from_bytes(found.data, root.uri(SERVICE_BELL)).rings if found else []
            bell = ServiceBell(rings=[*rings, (job, time.time())][-BELL_RINGS:])
            if root.write_if(SERVICE_BELL, bell.to_bytes(), found.tag if found else None):
                return True
        except (StorageError, OSError) as err:
            log.warning("job %s: the supervision service's bell could not be rung (%s): an instance looks at the job "
                        "within its paced look instead", job, err)
            return False
    log.warning("job %s: the supervision service's bell kept changing under %d attempts to ring it: an instance looks "
                "at the job within its paced look instead", job, attempts)
    return False


def ring_if_handed(store: JobStore) -> bool:
    """``ring_service`` for a job handed to the service (one look at its hand-over record first: a job the service
    does not own writes nothing outside its own prefix)."""
    try:
        handed = store.root.exists(handed_key(store.job))
    except (StorageError, OSError) as err:
        log.warning("job %s: could not tell whether it is handed to the supervision service (%s): the service's bell "
                    "was not rung; an instance looks at the job within its paced look", store.job, err)
        return False
    return handed and ring_service(store.root, store.job)


def read_rings(root: Storage) -> set[tuple[str, float]]:
    """The rings on the service's bell now (empty if it never rang)."""
    found = root.read_versioned(SERVICE_BELL)
    if found is None:
        return set()
    return {(job, at) for job, at in ServiceBell.from_bytes(found.data, root.uri(SERVICE_BELL)).rings}


def handed_key(job: str) -> str:
    return f"{HANDED}{check_job_name(job)}.json"


def instance_key(instance: str) -> str:
    return f"{INSTANCES}{check_job_name(instance)}.json"


class Membership:
    """This instance's own lease: ``renew()`` every ``timings.renew_every`` s, ``may_act()`` before every step."""

    def __init__(self, root: Storage, timings: Timings, *, instance: str | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.root, self.timings, self.clock, self.monotonic = root, timings, clock, monotonic
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.key = instance_key(self.instance)
        self.started_at = clock()
        self.sequence = 0
        self.metrics_url: str | None = None  # written with each renewal
        self.confirmed_at: float | None = None  # monotonic send time of the last renewal the store took

    def renew(self, *, stopped: bool = False) -> InstanceRecord:
        """Write the next renewal; a StorageError leaves ``confirmed_at`` as it was (``may_act`` runs out)."""
        sent = self.monotonic()
        record = InstanceRecord(instance=self.instance, host=socket.gethostname(), pid=os.getpid(),
                                started_at=self.started_at, renewed_at=self.clock(), sequence=self.sequence + 1,
                                renew_every=self.timings.renew_every, lease_duration=self.timings.lease_duration,
                                stopped=stopped, metrics_url=self.metrics_url)
        self.root.write(self.key, record.to_bytes())
        self.sequence = record.sequence
        self.confirmed_at = None if stopped else sent
        return record

    def may_act(self) -> bool:
        """Whether the last renewal is younger than ``renew_deadline`` (counted from when it was sent)."""
        return self.confirmed_at is not None and self.monotonic() - self.confirmed_at < self.timings.renew_deadline

    def require(self, job: str) -> None:
        """NotOwner unless ``may_act()``: the store did not take a renewal for ``renew_deadline`` s."""
        if not self.may_act():
            raise NotOwner(f"service instance {self.instance}: expected a renewal of its lease within "
                           f"{self.timings.renew_deadline:g} s, found none (the job store does not answer, or it "
                           f"stopped); it takes no step of job {job} until the store takes one again")


class Observer:
    """Which other instances are silent: an instance whose record did not change for its ``lease_duration`` on
    this observer's monotonic clock (no two hosts' clocks compared), stopped, or gone."""

    def __init__(self, root: Storage, monotonic: Callable[[], float] = time.monotonic, *,
                 per_look: bool = False) -> None:
        self.root, self.monotonic, self.per_look = root, monotonic, per_look
        self._seen: dict[str, tuple[int, float]] = {}  # instance -> (sequence, when this observer first saw it)
        self._looked: dict[str, bool] = {}  # with per_look, this look's answers (until ``new_look``)

    def new_look(self) -> None:
        """With ``per_look``: forget this look's answers, so the next ``silent`` reads each record again."""
        self._looked.clear()

    def silent(self, instance: str) -> bool:
        """Whether ``instance`` is silent; with ``per_look``, one GET per instance per look however many jobs it
        owns."""
        if not self.per_look:
            return self._silent(instance)
        if instance not in self._looked:
            self._looked[instance] = self._silent(instance)
        return self._looked[instance]

    def _silent(self, instance: str) -> bool:
        found = self.root.read_versioned(instance_key(instance))
        if found is None:
            return True  # never written, or deleted: an instance writes its record before it claims a job
        record = InstanceRecord.from_bytes(found.data, self.root.uri(instance_key(instance)))
        if record.stopped:
            return True
        now = self.monotonic()
        seen = self._seen.get(instance)
        if seen is None or seen[0] != record.sequence:
            self._seen[instance] = (record.sequence, now)
            return False
        return now - seen[1] >= record.lease_duration


def read_instances(root: Storage, *, unreadable: Callable[[str, CkptError], None] | None = None,
                   ) -> list[tuple[InstanceRecord, float]]:
    """Every instance's lease record with its age in seconds (the store's clock where it tells one, else the
    record's own ``renewed_at``). A record that cannot be read raises, or with ``unreadable`` is passed to it and
    left out."""
    found_records = []
    for info in root.list(INSTANCES):
        if not info.key.endswith(".json"):
            continue
        try:
            found = root.read_versioned(info.key)
            if found is None:
                continue
            record = InstanceRecord.from_bytes(found.data, root.uri(info.key))
        except CkptError as err:
            if unreadable is None:
                raise
            unreadable(info.key, err)
            continue
        found_records.append((record, found.age if found.age is not None else time.time() - record.renewed_at))
    return found_records


def read_owner(store: JobStore) -> OwnerRecord | None:
    found = store.storage.read_versioned(OWNER)
    return OwnerRecord.from_bytes(found.data, store.storage.uri(OWNER)) if found else None


@dataclass(frozen=True)
class Claim:
    """What ``claim`` found: the owner record now (``mine`` when this instance holds it), and whom it took it from."""

    owner: OwnerRecord | None
    mine: bool
    took_from: OwnerRecord | None = None


def claim(store: JobStore, me: Membership, observer: Observer) -> Claim:
    """Own ``store``'s job if nobody does, its owner released it, or its owner is silent: compare-and-swap, so two
    instances claiming at once get one owner. Refused (NotOwner) while ``me`` may not act."""
    me.require(store.job)
    found = store.storage.read_versioned(OWNER)
    current = OwnerRecord.from_bytes(found.data, store.storage.uri(OWNER)) if found else None
    if current is not None and current.instance == me.instance and not current.released:
        return Claim(current, True)
    if current is not None and not current.released and not observer.silent(current.instance):
        return Claim(current, False)
    mine = OwnerRecord(job=store.job, instance=me.instance, epoch=(current.epoch if current else 0) + 1,
                       acquired_at=me.clock())
    if not store.storage.write_if(OWNER, mine.to_bytes(), found.tag if found else None):
        return Claim(read_owner(store), False)  # another instance claimed it between our read and our write
    log.info("job %s: owned by service instance %s at epoch %d (before: %s)", store.job, me.instance, mine.epoch,
             "nobody" if current is None else f"{current.instance}, epoch {current.epoch}"
             + (", released" if current.released else ", silent"))
    return Claim(mine, True, current)


def confirm(store: JobStore, me: Membership, owned: OwnerRecord) -> OwnerRecord:
    """Before a step: NotOwner unless ``me`` may act and the job's owner record is still ``owned``."""
    me.require(store.job)
    current = read_owner(store)
    if current is None or (current.instance, current.epoch) != (owned.instance, owned.epoch) or current.released:
        found = "no owner" if current is None else f"{current.instance} at epoch {current.epoch}" + (
            ", released" if current.released else "")
        raise NotOwner(f"job {store.job}: service instance {me.instance} (epoch {owned.epoch}) no longer owns it: "
                       f"the owner record shows {found}; it takes no further step of this job")
    return current


def release(store: JobStore, me: Membership, owned: OwnerRecord) -> bool:
    """Let the job go at a clean stop (another instance may claim it at once); False if it was no longer ours."""
    found = store.storage.read_versioned(OWNER)
    if found is None:
        return False
    current = OwnerRecord.from_bytes(found.data, store.storage.uri(OWNER))
    if (current.instance, current.epoch) != (me.instance, owned.epoch):
        return False
    return store.storage.write_if(OWNER, msgspec.structs.replace(current, released=True).to_bytes(), found.tag)
