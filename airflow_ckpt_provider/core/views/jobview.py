"""What the store says about a job (status, lease, supervisor), and whether its driver can answer a request.

The CLI, the operators and the triggers observe a job into one ``JobView`` and decide from it; a request
no driver would answer (unknown job, stopped job, dead driver, a restart in progress) is refused before
anything is written. A job whose restart is in progress (RESTARTING by a live owner, or a dead driver whose
live supervisor restarts it) is neither live nor stale: ``restarter`` says who restarts it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError, StorageError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreSpec
from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    Request,
    RequestAction,
    keyed_request_id,
    keyed_requests,
    submit_request,
)
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord, pid_alive, read_lease
from airflow_ckpt_provider.core.records.status import (
    ACTIVE_STATES,
    FAILURE_STATES,
    JobStatus,
    Restart,
    RestartOwner,
    driver_live,
    read_status,
)
from airflow_ckpt_provider.core.records.supervision import (
    Supervision,
    observe_supervision,
    restarts_dead_driver,
)
from airflow_ckpt_provider.core.store.jobstore import LEASE, SNAPSHOTS, STATUS, JobStore, is_job_name
from airflow_ckpt_provider.core.store.storage import Storage

_VERB = {RequestAction.SAVEPOINT: "take a savepoint", RequestAction.STOP: "stop", RequestAction.CANCEL: "cancel"}


@dataclass(frozen=True)
class Restarter:
    """Who restarts the job now: ``by`` (the supervisor, or the driver in its own session), described by
    ``who``; the restart in progress (None: the supervisor has not written RESTARTING yet); the restart is
    done once a driver of ``min_epoch`` or newer runs."""

    by: RestartOwner
    who: str
    launch_id: str | None
    min_epoch: int
    restart: Restart | None
    status: JobStatus

    def describe(self) -> str:
        """'RESTARTING by the supervisor (pid P on H, launch L), attempt 2 (cause), expected running by T'."""
        r, s = self.restart, self.status
        if r is None:
            return (f"restarting: its driver (epoch {s.epoch}, pid {s.pid} on {s.host}) died and {self.who} "
                    "restarts it")
        return (f"RESTARTING by {self.who}, attempt {r.attempt} ({r.cause}), expected running by "
                f"{time.strftime('%H:%M:%SZ', time.gmtime(r.expected_by))}")


@dataclass(frozen=True)
class JobView:
    """What the store says about a job at ``now``: its last status and its lease (either may be None), and its
    supervisor (read by ``observe`` only when the driver is not live or a supervisor restarts it)."""

    store: JobStore
    status: JobStatus | None
    lease: LeaseRecord | None
    now: float
    supervision: Supervision | None = None

    @property
    def live(self) -> bool:
        """The driver that wrote the status runs (core/records/status.driver_live); on this host its process is
        probed too, so a kill -9 is seen at once. A job its supervisor restarts has no live driver."""
        s = self.status
        if s is None:
            return False
        restart = s.current_restart()
        if restart is not None and restart.by is RestartOwner.SUPERVISOR:
            return False
        return driver_live(s, self.now, host=socket.gethostname(), pid_alive=pid_alive)

    @property
    def restarter(self) -> Restarter | None:
        """Who restarts the job now: RESTARTING by an owner that is live (the supervisor's record, else the
        pid and heartbeat of the status); or a driver that stopped reporting or FAILED while its supervisor is
        live and has had less than its reaction time to act (core/records/supervision.restarts_dead_driver). None:
        nobody (a driver runs, or the job is down)."""
        s = self.status
        if s is None or s.state not in ACTIVE_STATES | FAILURE_STATES:
            return None
        restart = s.current_restart()
        if restart is not None:
            return self._restart_owner(s, restart)
        sup = self.supervision
        if sup is None or sup.record is None or self.live or not restarts_dead_driver(s, sup, self.now):
            return None
        return Restarter(RestartOwner.SUPERVISOR, f"the {sup.record.describe()}", _launch_of(sup), s.epoch + 1,
                         None, s)

    def _restart_owner(self, s: JobStatus, restart: Restart) -> Restarter | None:
        """The owner of the restart in progress, if it is live and the restart is not overdue."""
        if not driver_live(s, self.now, host=socket.gethostname(), pid_alive=pid_alive):
            return None  # overdue, or its process on this host is gone
        if restart.by is RestartOwner.DRIVER:
            return Restarter(restart.by, f"its driver (pid {s.pid} on {s.host})", None, s.epoch, restart, s)
        sup = self.supervision
        if sup is not None and not sup.live:
            return None
        record = sup.record if sup is not None else None
        who = f"the {record.describe()}" if record is not None else f"its supervisor (pid {s.pid} on {s.host})"
        return Restarter(restart.by, who, _launch_of(sup), s.epoch + 1, restart, s)

    @property
    def stale(self) -> bool:
        """The status says the job is active, but the driver that wrote it is gone (not ``live``) and nobody
        restarts it (no ``restarter``)."""
        return (self.status is not None and self.status.state in ACTIVE_STATES and not self.live
                and self.restarter is None)

    @property
    def newer_lease(self) -> LeaseRecord | None:
        """The lease when a driver newer than the one that wrote the status took it."""
        if self.lease is not None and self.status is not None and self.lease.epoch > self.status.epoch:
            return self.lease
        return None


def _launch_of(supervision: Supervision | None) -> str | None:
    """The Airflow launch id of the supervisor (None for a standalone `ckpt run --supervise`)."""
    record = supervision.record if supervision is not None else None
    return None if record is None or record.standalone else record.launch_id


def read_supervision(store: JobStore, status: JobStatus | None, now: float) -> Supervision | None:
    """The job's supervisor when it matters: the status is RESTARTING by a supervisor, or active and its driver
    not live, or FAILED (its supervisor may be about to restart it). None otherwise, or when the store cannot
    say (then nobody counts as restarting the job)."""
    if status is None or status.state not in ACTIVE_STATES | FAILURE_STATES:
        return None
    restart = status.current_restart()
    if restart is not None and restart.by is RestartOwner.DRIVER:
        return None
    if restart is None and driver_live(status, now, host=socket.gethostname(), pid_alive=pid_alive):
        return None
    try:
        return observe_supervision(store, now, pid_alive=pid_alive)
    except StorageError:
        return None


def starting_launch(store: JobStore, status: JobStatus | None, now: float, within: float) -> Launch | None:
    """The launch in spec/last.json made after the driver of ``status`` started, not ended and younger than
    ``within`` s: a new driver is on its way. Between a stop (or a crash) and the next driver's first
    report, waiters and submitters must not take the job for dead. An unreadable record counts as none."""
    try:
        last = read_launch(store)
    except StorageError:
        return None
    return on_its_way(last, status, now, within)


def on_its_way(launch: Launch | None, status: JobStatus | None, now: float, within: float) -> Launch | None:
    """``starting_launch`` on a launch already read."""
    if launch is None or launch.ended_at is not None or now - launch.launched_at >= within:
        return None
    return None if status is not None and launch.launched_at <= status.started_at else launch


class RestartDecision(StrEnum):
    """What a restart from outside the job (the DAG's restart task) does."""

    LEAVE_TO_OWNER = "leave-to-owner"  # its supervisor (or driver) restarts it already: wait for that
    STOP_THEN_LAUNCH = "stop-then-launch"  # a driver runs: stop it, then launch the deployment
    LAUNCH = "launch"  # nothing runs and nobody restarts it


def restart_decision(view: JobView | None, restore: RestoreSpec) -> tuple[RestartDecision, Restarter | None]:
    """One owner per restart. A restart in progress (``view.restarter``) is left to its owner when the restart
    asked for is the one the owner makes (``latest-state``); a restart from a chosen snapshot (or without
    state) is deliberate and replaces it, as an upgrade does (the new launch supersedes the supervisor and the
    lease fences its driver). Otherwise a driver that runs is stopped first; with none, the job is launched."""
    if view is None:
        return RestartDecision.LAUNCH, None
    restarter = view.restarter
    if restarter is not None and restore == LATEST_STATE:
        return RestartDecision.LEAVE_TO_OWNER, restarter
    if view.live:
        return RestartDecision.STOP_THEN_LAUNCH, None
    return RestartDecision.LAUNCH, None


def job_names(root: Storage) -> list[str]:
    """The jobs under a store root: the top-level folders holding a status.json, a lease or snapshots (one
    listing of the root's folders, then a look into each; never a listing of every object)."""
    names = []
    for job in root.folders():
        if is_job_name(job) and (root.exists(f"{job}/{STATUS}") or root.exists(f"{job}/{LEASE}")
                                     or SNAPSHOTS.rstrip("/") in root.folders(f"{job}/")):
            names.append(job)
    return names


def observe(store: JobStore, now: float | None = None) -> JobView:
    """Read the job's status and lease; ConfigError naming the jobs that do exist if it has neither."""
    at = time.time() if now is None else now
    status = read_status(store)
    view = JobView(store, status, read_lease(store), at, read_supervision(store, status, at))
    if view.status is None and view.lease is None:
        names = job_names(store.root)
        found = (f"jobs in this store: {', '.join(names)}" if names
                 else "this store holds no jobs (no status.json or snapshots under it)")
        raise ConfigError(
            f"job {store.job!r} not found in job store {store.root.url}: it has no status.json and no "
            f"lease.json, so no driver ever ran it there; {found}. Check --job and --store "
            "(env CKPT_JOB, CKPT_STORE)"
        )
    return view


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def state_text(view: JobView) -> str:
    """The job's state in words (``ckpt job status``, the Streaming jobs page): who restarts it, stale, ended
    since when, or the state."""
    status = view.status
    if status is None:
        lease = view.lease
        assert lease is not None  # observe() refuses a job with neither
        return (f"- (no status yet: the driver of epoch {lease.epoch} took the lease at {when(lease.acquired_at)} "
                "and has not reported; if this lasts, it died while starting)")
    restarter = view.restarter
    if restarter is not None:
        return restarter.describe()
    if view.stale:
        return (f"{status.state} (stale: no heartbeat for {status.age(view.now):.0f} s; "
                "the driver is probably dead)")
    if status.state not in ACTIVE_STATES:
        return f"{status.state} since {when(status.updated_at)}"
    return status.state.value


def check_can_request(view: JobView, action: RequestAction) -> JobStatus:
    """The status of a driver able to answer ``action``; ConflictError saying why not otherwise."""
    job, s = view.store.job, view.status
    verb = _VERB[action]
    hint = ("; to snapshot its checkpoint use `ckpt snapshot create --checkpoint CHECKPOINT`"
            if action is RequestAction.SAVEPOINT else "")
    if s is None:
        lease = view.lease
        assert lease is not None  # observe() refuses a job with neither
        raise ConflictError(
            f"job {job} has no status yet: its driver (epoch {lease.epoch}, {lease.owner}) took the lease at "
            f"{when(lease.acquired_at)} but has not reported; nothing was requested. Retry when "
            "`ckpt job status` shows it RUNNING"
        )
    if s.state not in ACTIVE_STATES:
        reason = f" (reason {s.reason})" if s.reason else ""
        raise ConflictError(
            f"job {job} is {s.state} since {when(s.updated_at)}{reason}: there is no running driver to {verb}; "
            f"nothing was requested{hint}"
        )
    restarter = view.restarter
    if restarter is not None and restarter.by is RestartOwner.SUPERVISOR:
        raise ConflictError(
            f"job {job} is {restarter.describe()}: no driver runs to {verb} until then; nothing was requested. "
            f"Retry when `ckpt job status` shows it RUNNING{hint}"
        )
    if view.stale:
        where = f", pid {s.pid} on {s.host}" if s.pid is not None else ""
        raise ConflictError(
            f"job {job} is {s.state} but its driver (epoch {s.epoch}{where}) sent no heartbeat "
            f"for {s.age(view.now):.0f} s: it is probably dead and would never answer; nothing was requested. "
            f"Restarting the job resumes from its latest checkpoint{hint}"
        )
    newer = view.newer_lease
    if newer is not None:
        raise ConflictError(
            f"job {job}: a newer driver (epoch {newer.epoch}, {newer.owner}) took the lease from the driver of "
            f"epoch {s.epoch}, which stops; nothing was requested. Retry when `ckpt job status` shows epoch "
            f"{newer.epoch} RUNNING"
        )
    return s


def request_running(store: JobStore, action: RequestAction, *, requested_by: str | None = None,
                    key: str | None = None) -> Request:
    """Write ``action`` for the driver that runs the job now (the operators', the Dagster ops' and the UI's way
    to ask); ConfigError for an unknown job, ConflictError (check_can_request) when no driver could answer:
    nothing is written then. With ``key`` (an Airflow task run, a Dagster op's run) a retry resumes: the request an
    earlier try wrote is returned while it waits for an answer or once it completed (``earlier_request``); after a
    failure or a rejection the next attempt is asked."""
    request_id = None
    if key:
        asked = keyed_requests(store, action, key)
        earlier = _resumable(asked)
        if earlier is not None:
            return earlier
        request_id = keyed_request_id(action, key, asked[-1][0] + 1 if asked else 1)
    status = check_can_request(observe(store), action)
    return submit_request(store, action, epoch=status.epoch, requested_by=requested_by, request_id=request_id)


def earlier_request(store: JobStore, action: RequestAction, key: str) -> Request | None:
    """The last request asked for ``key`` if it is unanswered or completed: what a retried task waits for instead
    of asking again (a second savepoint, a stop of the job its first try already stopped); None if there is none,
    or it failed or was rejected (asking again may work: a newer driver rejects a request meant for an older one)."""
    return _resumable(keyed_requests(store, action, key))


def _resumable(asked: list[tuple[int, Request, Ack | None]]) -> Request | None:
    if not asked:
        return None
    _, request, ack = asked[-1]
    return request if ack is None or ack.outcome is Outcome.COMPLETED else None


def stop_check(store: JobStore, now: float | None = None, *, action: RequestAction | None = None,
               key: str | None = None) -> tuple[JobStatus | None, str]:
    """Before a stop: (the status of the driver to stop, '') or (the last status if any, why there is nothing to
    stop: never ran here, stopped, stale). ConflictError while its supervisor restarts it: stopping nothing
    would be wrong, the supervisor brings the job back right after. With ``action`` and ``key`` (a task's or op's
    run) a retry whose first try asked for the stop gets (None, ''): its request is to be waited for (its answer is
    the stop's result, the job stopped since or not)."""
    if action is not None and key and earlier_request(store, action, key) is not None:
        return None, ""
    try:
        view = observe(store, now)
    except ConfigError as err:  # never ran here: nothing to stop (safe as a teardown)
        return None, f"job {store.job}: nothing to stop: {err}"
    status, restarter = view.status, view.restarter
    if restarter is not None and restarter.by is RestartOwner.SUPERVISOR:
        raise ConflictError(
            f"job {store.job} is {restarter.describe()}: there is no driver to stop until it runs; nothing was "
            "requested. Retry once it runs (a retry of the task or op does that)")
    if status is None or not view.live:
        state = "never reported" if status is None else ("stale" if view.stale else status.state.value)
        return status, f"job {store.job} is not running ({state}): nothing to stop"
    return status, ""
