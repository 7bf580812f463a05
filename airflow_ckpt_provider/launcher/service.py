"""The supervision service: long-lived instances that own the jobs handed to them and keep their supervisors running.

``hand_over`` (launcher/handover.py) records a job's launch and marks the job as the service's. Each instance renews
its lease, claims the handed jobs that no live instance owns (core/records/ownership.py) and, for each job it owns,
acts on its operation in progress (launcher/upgrade.py), observes its launch and supervisor, decides (``decide``) and
acts: start the recorded launch here, or relaunch it from its latest state when its supervisor is lost. The supervisor
(launcher/supervisor.py) still restarts the driver; the service owns only the supervisor's restarts. What it starts
does not die with it: another instance takes the job over and finds the supervisor running.
Design notes: docs/service.md#design-notes-launcherservicepy.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch, record_end
from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.records.operations import actor_alive, read_operation
from airflow_ckpt_provider.core.records.ownership import (
    Membership,
    NotOwner,
    Observer,
    OwnerRecord,
    Timings,
    claim,
    confirm,
    read_rings,
    release,
)
from airflow_ckpt_provider.core.records.status import driver_live, read_status
from airflow_ckpt_provider.core.records.supervision import (
    Supervision,
    SupervisorRecord,
    SupervisorState,
    read_supervisor,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, Storage
from airflow_ckpt_provider.launcher.deploy import check_deployment, launch, start_launch
from airflow_ckpt_provider.launcher.handover import handed_jobs
from airflow_ckpt_provider.launcher.servicemetrics import ServiceMetrics
from airflow_ckpt_provider.launcher.upgrade import JobUpgrade

log = logging.getLogger(__name__)

#: Seconds a launch started by another instance gets to write its supervisor's first heartbeat (on this clock).
START_TIMEOUT = 60.0
#: Seconds between an instance's looks at a settled job: the bell, a silent owner or a step in progress bring a look
#: at the next renewal instead (docs/scale.md: 1,000 jobs at every 2 s renewal were 2,000 GETs a second).
LOOK_EVERY = 30.0
#: Seconds between full looks at a settled job (its owner record, operation, launch and supervisor: 4 GETs); the
#: paced looks between are glances (``Glance``: its supervisor's record alone, or nothing).
FULL_LOOK_EVERY = 300.0
#: The operation record's actor name of an instance (``ACTOR_PREFIX`` + its id).
ACTOR_PREFIX = "supervision service instance "
#: At most this many relaunches of one job by one instance within RELAUNCH_WINDOW seconds; then it gives up.
RELAUNCHES = 5
RELAUNCH_WINDOW = 3600.0


# -- decide: one function, every case -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Keep:
    """Nothing to do now, and why."""

    why: str


@dataclass(frozen=True)
class Start:
    """The recorded launch was never started: start its supervisor here."""

    launch: Launch


@dataclass(frozen=True)
class Relaunch:
    """The launch's supervisor is gone without having ended: a new launch of its deployment from the latest state."""

    why: str


@dataclass(frozen=True)
class Adopt:
    """The launch's supervisor is gone but its driver of ``epoch`` runs: a new supervisor of the same launch here,
    watching that driver first (launcher/adoption.py), so the takeover restarts nothing."""

    launch: Launch
    epoch: int
    why: str


Action = Keep | Start | Relaunch | Adopt


class Look(Enum):
    """How a job is looked at: fully (observe, decide, act), or at its pace (a glance between full looks)."""

    FULL = "full"
    PACED = "paced"


@dataclass(frozen=True)
class Glance:
    """What a paced look between full looks reads of a settled job: the record of the supervisor of ``launch_id``,
    which the last full look (at ``at``) found live in ``state``; nothing for ``launch_id`` None (another instance's
    job, whose owner's silence the instance records show; a launch that ended or was never recorded, which only an
    operation or a hand-over changes, and both ring the bell). A glance never acts: whatever it finds changed brings a
    full look at once."""

    at: float
    launch_id: str | None = None
    state: SupervisorState | None = None


@dataclass(frozen=True)
class DriverSeen:
    """The job's driver as status.json shows it: its epoch, whether it runs (core/records/status.driver_live), and
    whether it outlived its supervisor: its process runs on this host, or it reported more than one of the
    supervisor's polls after the supervisor's last heartbeat (both by the store's clock). A driver that died with its
    supervisor (their host lost) last reported about when the supervisor did, and goes stale within its own limit."""

    epoch: int
    live: bool
    outlived: bool = True


def decide(last: Launch | None, seen: Supervision, *, starting_here: bool, waited: float,
           start_timeout: float = START_TIMEOUT, driver: DriverSeen | None = None) -> Action:
    """What the owner of a handed job does: ``last`` is spec/last.json, ``seen`` the newest supervisor,
    ``starting_here`` whether this instance started ``last`` and its process still runs, ``waited`` the seconds this
    instance has seen ``last`` started elsewhere without a supervisor record, ``driver`` the job's driver (read only
    once the supervisor is judged gone)."""
    if last is None:
        return Keep("no launch is recorded (spec/last.json): hand the job over again with its deployment")
    if last.ending:
        return Keep(f"launch {last.launch_id} ended ({last.ending}): {last.end_reason or 'no reason recorded'}")
    record = seen.record
    if record is None or record.launch_id != last.launch_id:
        return _no_supervisor_yet(last, starting_here=starting_here, waited=waited, start_timeout=start_timeout)
    if seen.live:
        return Keep(f"its {record.describe()} runs")
    if record.state is SupervisorState.ENDED:
        return Keep(f"its {record.describe()} {seen.why_not}")
    return _supervisor_lost(last, seen, driver, starting_here=starting_here)


def _supervisor_lost(last: Launch, seen: Supervision, driver: DriverSeen | None, *, starting_here: bool) -> Action:
    """``decide`` for a launch whose supervisor is gone without having ended: adopt its driver if that still runs
    (the epoch the supervisor last saw it at), else relaunch."""
    record = seen.record
    assert record is not None
    if starting_here:  # this instance started a new supervisor of the launch (an adoption) that has not reported yet
        return Keep(f"launch {last.launch_id}: its new supervisor is starting on this host")
    why = f"its {record.describe()} {seen.why_not}"
    if driver is None or not driver.live or record.epoch is None or driver.epoch != record.epoch:
        return Relaunch(why)
    if not driver.outlived:
        return Keep(f"{why}; its driver of epoch {driver.epoch} reported since: waiting to see whether it outlives its "
                    "supervisor (adopted) or went with it (relaunched once its heartbeat is stale)")
    return Adopt(last, driver.epoch, f"{why}, but its driver of epoch {driver.epoch} runs")


def _no_supervisor_yet(last: Launch, *, starting_here: bool, waited: float, start_timeout: float) -> Action:
    """``decide`` for a launch without a supervisor record: never started, starting here, or started elsewhere."""
    if starting_here:
        return Keep(f"launch {last.launch_id}: its supervisor is starting on this host")
    if last.pid is None:
        return Start(last)
    if waited < start_timeout:
        return Keep(f"launch {last.launch_id} was started by pid {last.pid} on {last.host}: waiting for its "
                    "supervisor's first heartbeat")
    return Relaunch(f"launch {last.launch_id}, started by pid {last.pid} on {last.host}, wrote no supervisor "
                    f"heartbeat within {start_timeout:g} s")


# -- act: the service loop ----------------------------------------------------------------------------------------


class SupervisionService:
    """One instance: ``run(stop)`` renews its lease every ``timings.renew_every`` s and reconciles each handed job it
    owns or may claim; at a clean stop it releases its jobs (another instance takes them at once) and records that it
    stopped. A launch starts as ``ckpt run --supervise``, detached, on this host."""

    def __init__(self, root: Storage, *, store_url: str, s3: S3Options | None = None, timings: Timings | None = None,
                 instance: str | None = None, start_timeout: float = START_TIMEOUT, look_every: float = LOOK_EVERY,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        timings = timings or Timings()
        self.root, self.store_url, self.s3 = root, store_url, s3
        self.timings, self.start_timeout, self.monotonic = timings, start_timeout, monotonic
        self.look_every = look_every
        self._jobs: list[str] = []  # the handed jobs, listed every look_every s or when the bell rang
        self._listed_at: float | None = None
        self._next_look: dict[str, float] = {}  # job -> when it is looked at next, unless something asks sooner
        self._owner_of: dict[str, str] = {}  # job -> the instance that owned it at the last look
        self._rings: set[tuple[str, float]] | None = None  # the bell's rings at the last renewal
        self._settled: set[str] = set()  # jobs whose last look found nothing to wait for: paced looks
        self._glances: dict[str, Glance] = {}  # settled job -> what its glances read, until its next full look
        self.me = Membership(root, timings, instance=instance, monotonic=monotonic)
        self.observer = Observer(root, monotonic=monotonic, per_look=True)
        self.owned: dict[str, OwnerRecord] = {}  # job -> its owner record
        self._started: dict[str, tuple[str, Callable[[], bool]]] = {}  # job -> (launch id, its process runs)
        self._elsewhere: dict[str, tuple[str, float]] = {}  # job -> (launch id, when first seen without a record)
        self._relaunches: dict[str, list[float]] = {}  # job -> when this instance relaunched it (its clock)
        self._store_down = False
        self._renewed = 0.0  # when the lease was last renewed (self.monotonic)
        self._operating: dict[str, threading.Thread] = {}  # job -> the thread acting on its operation
        self._operation_seen: dict[str, tuple[str, float]] = {}  # job -> (its operation record's tag, first seen)
        # What it owns and did (launcher/servicemetrics.py): served and exported only where `service run` says.
        self.metrics = ServiceMetrics(self.instance, owned=lambda: len(self.owned), handed=lambda: len(self._jobs))

    @property
    def instance(self) -> str:
        return self.me.instance

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set. The first renewal must succeed: a store this instance cannot write is refused
        (StorageError, nothing claimed)."""
        self.me.metrics_url = self.metrics.url  # served before the run (`ckpt service run --metrics-address`)
        try:
            self.me.renew()
        except (StorageError, OSError) as err:  # OSError: a store on a directory
            raise StorageError(f"supervision service instance {self.instance}: expected to write its lease to "
                               f"{self.root.uri(self.me.key)}, found: {err}; check the store URL and that these "
                               "credentials may write there") from err
        log.info("supervision service instance %s on %s: lease written (renewed every %g s, taken over %g s after "
                 "its last renewal)", self.instance, socket.gethostname(), self.timings.renew_every,
                 self.timings.lease_duration)
        while not stop.is_set():
            self.tick()
            stop.wait(self.timings.renew_every)
        self.shutdown()

    def tick(self) -> None:
        """One renewal and a look at each handed job that is due: every ``look_every`` s, and at once when the bell
        rang for it (handed over, an operation asked for) or its owner went silent (a takeover); renewed again
        between jobs whenever ``renew_every`` has passed, so a look at many jobs never lets the lease lapse
        (bench/service_capacity_bench.py: 300 jobs take about 6 s to look at). docs/scale.md says what it costs."""
        self._renew()
        if not self.me.may_act():
            return
        self.observer.new_look()
        rung = self._rung()
        now = self.monotonic()
        if rung or self._listed_at is None or now - self._listed_at >= self.look_every:
            try:
                self._jobs, self._listed_at = handed_jobs(self.root), now
            except (StorageError, OSError) as err:
                log.warning("supervision service instance %s: cannot list the handed jobs: %s", self.instance, err)
                return
        for job in self._jobs:
            look = self._due(job, now, rung)
            if look is None:
                continue
            self._next_look[job] = now + self.look_every
            if self.monotonic() - self._renewed >= self.timings.renew_every:
                self._renew()
            if not self.me.may_act():
                return
            try:
                if look is Look.FULL or not self._glance(job, now):
                    self.reconcile(job)
            except NotOwner as err:
                log.info("%s", err)
                self.owned.pop(job, None)
            except (StorageError, OSError) as err:
                log.warning("job %s: supervision service instance %s could not look at it: %s", job, self.instance,
                            err)

    def _rung(self) -> set[str]:
        """The jobs the bell rang for since the last renewal (one GET; none at the first, which looks at every job)."""
        try:
            rings = read_rings(self.root)
        except (StorageError, OSError) as err:  # the paced looks find what it would have said
            log.debug("supervision service instance %s: cannot read the bell: %s", self.instance, err)
            return set()
        before, self._rings = self._rings, rings
        return set() if before is None else {job for job, _at in rings - before}

    def _due(self, job: str, now: float, rung: set[str]) -> Look | None:
        """Whether to look at ``job`` now, and how: a full look when the bell rang for it, its last look was not
        settled (a start, a lost supervisor: each renewal, as before), an operation acts on it or just ended, or another
        instance owned it and is silent (a takeover); its paced look (a glance, unless a full one is due) when
        ``look_every`` has passed; None: not now."""
        if job in rung or job not in self._settled:
            return Look.FULL
        thread = self._operating.get(job)
        if thread is not None:
            if not thread.is_alive():
                del self._operating[job]  # its end looked at once, then paced
            return Look.FULL
        owner = self._owner_of.get(job)
        if owner is not None and owner != self.instance and self.observer.silent(owner):
            return Look.FULL
        return Look.PACED if now >= self._next_look.get(job, now) else None

    def _glance(self, job: str, now: float) -> bool:
        """A paced look between full looks (``Glance``): True if it found what the last full look did."""
        glance = self._glances.get(job)
        if glance is None or now - glance.at >= FULL_LOOK_EVERY:
            return False
        if glance.launch_id is None:
            return True
        seen = _supervision_of(JobStore(self.root, job), glance.launch_id)
        return seen.live and seen.record is not None and seen.record.state is glance.state

    def _renew(self) -> None:
        self._renewed = self.monotonic()
        try:
            self.me.renew()
            self.metrics.renewed(True)
            if self._store_down:
                log.info("supervision service instance %s: the job store answers again", self.instance)
            self._store_down = False
        except (StorageError, OSError) as err:
            self.metrics.renewed(False)
            if not self._store_down:
                log.warning("supervision service instance %s: cannot renew its lease (%s); it takes no step once its "
                            "last renewal is %g s old", self.instance, err, self.timings.renew_deadline)
            self._store_down = True

    def reconcile(self, job: str) -> Action | None:
        """Observe, decide, act for one handed job; None when another instance owns it."""
        store = JobStore(self.root, job)
        self._settled.discard(job)
        self._glances.pop(job, None)
        got = claim(store, self.me, self.observer)
        if got.owner is not None:
            self._owner_of[job] = got.owner.instance
        if not got.mine or got.owner is None:
            self._settled.add(job)  # its owner's: looked at again when that owner goes silent
            if got.owner is not None:  # a live owner's: its glances read nothing (its silence brings a full look)
                self._glances[job] = Glance(self.monotonic())
            if self.owned.pop(job, None) is not None:
                log.warning("job %s: supervision service instance %s no longer owns it (%s at epoch %s does): what "
                            "it started keeps running", job, self.instance, got.owner.instance if got.owner else "-",
                            got.owner.epoch if got.owner else "-")
            return None
        if job not in self.owned:
            took = f" from {got.took_from.instance} (epoch {got.took_from.epoch})" if got.took_from else ""
            log.info("job %s: supervised by service instance %s at epoch %d%s", job, self.instance, got.owner.epoch,
                     took)
            if got.took_from is not None:
                self.metrics.took_over(job)
        self.owned[job] = got.owner
        self._operate(store)
        last = read_launch(store)
        seen = _supervision(store, last)
        gone = seen.record is not None and not seen.live and seen.record.state is not SupervisorState.ENDED
        action = decide(last, seen, starting_here=self._starting_here(job, last),
                        waited=self._waited(job, last), start_timeout=self.start_timeout,
                        driver=_driver(store, seen.record) if gone and seen.record is not None else None)
        if isinstance(action, Keep):
            waiting = gone or (last is not None and last.ending is None and seen.record is None)
            if not waiting:  # its supervisor runs, or the launch ended: nothing changes until the bell or a pace
                self._settled.add(job)
                glance = _glance_of(self.monotonic(), last, seen)
                if glance is not None:
                    self._glances[job] = glance
            return action
        confirm(store, self.me, got.owner)  # the last look before acting: still ours, and our lease renewed
        assert last is not None
        return self._act(store, last, action)

    def _act(self, store: JobStore, last: Launch, action: Start | Adopt | Relaunch) -> Action:
        """Start, adopt or relaunch ``last`` as ``decide`` said, once the job's ownership was confirmed."""
        job = store.job
        try:
            if isinstance(action, Start):  # checked here too: a supervisor refused at its start writes no record
                check_deployment(action.launch.deployment, job, self.store_url, action.launch.restore, self.s3)
                started = start_launch(store, action.launch, store_url=self.store_url, s3=self.s3)
                log.info("job %s: service instance %s started launch %s (supervisor pid %s, restore %s)", job,
                         self.instance, started.launch_id, started.pid, started.restore)
                self.metrics.acted(job, "started")
            elif isinstance(action, Adopt):
                given_up = self._relaunch_budget(job)  # a supervisor that keeps dying is given up on either way
                if given_up:
                    log.error("job %s: %s", job, given_up)
                    record_end(store, last.launch_id, ending="gave-up", exit_code=1, reason=given_up)
                    self.metrics.acted(job, "gave-up")
                    return Keep(given_up)
                started = start_launch(store, action.launch, store_url=self.store_url, s3=self.s3,
                                       adopt_epoch=action.epoch)
                log.warning("job %s: service instance %s adopted the running driver of epoch %d with a new supervisor "
                            "of launch %s (pid %s): %s", job, self.instance, action.epoch, started.launch_id,
                            started.pid, action.why)
                self.metrics.acted(job, "adopted")
            else:
                given_up = self._relaunch_budget(job)
                if given_up:
                    log.error("job %s: %s", job, given_up)
                    record_end(store, last.launch_id, ending="gave-up", exit_code=1, reason=given_up)
                    self.metrics.acted(job, "gave-up")
                    return Keep(given_up)
                started = launch(store, last.deployment, restore=LATEST_STATE, store_url=self.store_url, s3=self.s3,
                                 launched_by=f"supervision service {self.instance}: {action.why}")
                log.warning("job %s: service instance %s relaunched it from the latest state as launch %s "
                            "(supervisor pid %s): %s", job, self.instance, started.launch_id, started.pid,
                            action.why)
                self.metrics.acted(job, "relaunched")
        except ConfigError as err:  # bad input (a restart cannot fix it): ended, not retried every tick
            reason = f"supervision service instance {self.instance} could not start it: {err}"
            log.error("job %s: %s", job, reason)
            record_end(store, last.launch_id, ending="refused", exit_code=2, reason=reason)
            self.metrics.acted(job, "refused")
            return action
        pid = started.pid
        self._started[job] = (started.launch_id, lambda: pid is not None and pid_alive(pid))
        return action

    @property
    def actor(self) -> str:
        return f"{ACTOR_PREFIX}{self.instance}"

    def _operate(self, store: JobStore) -> None:
        """Act on the job's operation in progress (an operation: launcher/upgrade.py) in a thread of its own,
        unless this instance does already or a live actor of its own acts on it (a ``ckpt`` command that began it).
        Another instance's operation is this one's once it owns the job: that instance's lease has lapsed."""
        job = store.job
        thread = self._operating.get(job)
        if thread is not None and thread.is_alive():
            return
        found = read_operation(store)
        if found is None or found.operation.state.final:
            self._operation_seen.pop(job, None)
            return
        op = found.operation
        seen = self._operation_seen.get(job)
        if seen is None or seen[0] != found.tag:
            seen = self._operation_seen[job] = (found.tag, self.monotonic())
        by_service = op.actor.startswith(ACTOR_PREFIX)
        if op.actor and not by_service and actor_alive(op, silent_for=self.monotonic() - seen[1]):
            return
        owner = self.owned[job]

        def may_act() -> bool:
            return self.me.may_act() and self.owned.get(job) == owner

        def act() -> None:
            try:
                ended = JobUpgrade(store, self.store_url, self.s3, say=lambda _line: None, actor=self.actor,
                                   may_act=may_act).run(found)
                log.info("job %s: %s", job, ended.describe())
            except Exception:  # logged, and the next tick resumes it (or another instance, if this one lost it)
                log.exception("job %s: service instance %s stopped acting on %s", job, self.instance, op.id)

        log.info("job %s: service instance %s %s %s", job, self.instance,
                 "resumes" if op.plan is not None else "acts on", op.describe())
        self.metrics.operated(job, op.kind)
        thread = self._operating[job] = threading.Thread(target=act, name=f"ckpt-operation-{job}", daemon=True)
        thread.start()

    def _relaunch_budget(self, job: str) -> str:
        """Why not to relaunch ``job`` again ('' to go on): at most RELAUNCHES in RELAUNCH_WINDOW s by this
        instance, so a supervisor that keeps dying (its host out of memory, a broken install) is not relaunched
        forever."""
        now = self.monotonic()
        recent = [t for t in self._relaunches.get(job, []) if now - t < RELAUNCH_WINDOW]
        if len(recent) >= RELAUNCHES:
            return (f"supervision service instance {self.instance}: its supervisor was lost {len(recent)} times in "
                    f"{RELAUNCH_WINDOW / 60:g} min and relaunched each time; not relaunching again: see the "
                    "supervisors' logs on their hosts, then hand the job over again")
        self._relaunches[job] = [*recent, now]
        return ""

    def _starting_here(self, job: str, last: Launch | None) -> bool:
        started = self._started.get(job)
        return last is not None and started is not None and started[0] == last.launch_id and started[1]()

    def _waited(self, job: str, last: Launch | None) -> float:
        """Seconds this instance has seen ``last`` started elsewhere without a supervisor record (on its clock)."""
        if last is None or last.pid is None:
            self._elsewhere.pop(job, None)
            return 0.0
        seen = self._elsewhere.get(job)
        if seen is None or seen[0] != last.launch_id:
            self._elsewhere[job] = (last.launch_id, self.monotonic())
            return 0.0
        return self.monotonic() - seen[1]

    def shutdown(self) -> None:
        """A clean stop: release every owned job and record the stop, so another instance takes them at once.
        The supervisors it started keep running."""
        for job, owned in list(self.owned.items()):
            try:
                release(JobStore(self.root, job), self.me, owned)
            except StorageError as err:
                log.warning("job %s: could not release it (%s): another instance takes it over after %g s", job,
                            err, self.timings.lease_duration)
        try:
            self.me.renew(stopped=True)
        except StorageError as err:
            log.warning("supervision service instance %s: could not record its stop: %s", self.instance, err)
        log.info("supervision service instance %s stopped; released %d jobs", self.instance, len(self.owned))


def _driver(store: JobStore, lost: SupervisorRecord) -> DriverSeen | None:
    """The job's driver (one GET of status.json), judged live by its heartbeat, or at once by its pid on this host,
    and whether it outlived the ``lost`` supervisor (DriverSeen)."""
    status = read_status(store)
    if status is None:
        return None
    host = socket.gethostname()
    here = status.host == host and status.pid is not None and pid_alive(status.pid)
    outlived = here or status.heard_at() > lost.heard_at() + lost.interval
    return DriverSeen(status.epoch, driver_live(status, time.time(), host=host, pid_alive=pid_alive), outlived)


def _supervision(store: JobStore, last: Launch | None) -> Supervision:
    """The supervisor of launch ``last`` and whether it is live: one GET of its record (no listing)."""
    return _supervision_of(store, last.launch_id) if last is not None else Supervision(None, False)


def _glance_of(at: float, last: Launch | None, seen: Supervision) -> Glance | None:
    """What the glances at a settled job read until its next full look; None: no glance (full looks at each pace)."""
    if last is None or last.ending:
        return Glance(at)
    record = seen.record
    if seen.live and record is not None and record.launch_id == last.launch_id:
        return Glance(at, last.launch_id, record.state)
    return None


def _supervision_of(store: JobStore, launch_id: str) -> Supervision:
    record = read_supervisor(store, launch_id)
    if record is None:
        return Supervision(None, False)
    live, why_not = record.liveness(time.time(), host=socket.gethostname(), pid_alive=pid_alive)
    return Supervision(record, live, why_not)
