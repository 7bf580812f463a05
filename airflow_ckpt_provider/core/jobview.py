"""What the store says about a job (status and lease), and whether its driver can answer a request.

The CLI, the operators and the triggers observe a job into one ``JobView`` and decide from it; a request
no driver would answer (unknown job, stopped job, dead driver) is refused before anything is written.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_ckpt_provider.core.control import RequestAction
from airflow_ckpt_provider.core.deployments import Launch, read_launch
from airflow_ckpt_provider.core.errors import ConfigError, ConflictError, StorageError
from airflow_ckpt_provider.core.jobstore import SNAPSHOTS, STATUS, JobStore
from airflow_ckpt_provider.core.lease import LeaseRecord, read_lease
from airflow_ckpt_provider.core.status import ACTIVE_STATES, JobStatus, driver_live, read_status
from airflow_ckpt_provider.core.storage import Storage

_VERB = {RequestAction.SAVEPOINT: "take a savepoint", RequestAction.STOP: "stop", RequestAction.CANCEL: "cancel"}


@dataclass(frozen=True)
class JobView:
    """What the store says about a job at ``now``: its last status and its lease (either may be None)."""

    store: JobStore
    status: JobStatus | None
    lease: LeaseRecord | None
    now: float

    @property
    def live(self) -> bool:
        """The driver that wrote the status runs (core/status.driver_live); on this host its process is
        probed too, so a kill -9 is seen at once."""
        s = self.status
        return s is not None and driver_live(s, self.now, host=socket.gethostname(), pid_alive=_alive)

    @property
    def stale(self) -> bool:
        """The status says the job is active, but the driver that wrote it is gone (not ``live``)."""
        return self.status is not None and self.status.state in ACTIVE_STATES and not self.live

    @property
    def newer_lease(self) -> LeaseRecord | None:
        """The lease when a driver newer than the one that wrote the status took it."""
        if self.lease is not None and self.status is not None and self.lease.epoch > self.status.epoch:
            return self.lease
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def starting_launch(store: JobStore, status: JobStatus | None, now: float, within: float) -> Launch | None:
    """The launch in spec/last.json made after the driver of ``status`` started, not ended and younger than
    ``within`` s: a new driver is on its way. Between a stop (or a crash) and the next driver's first
    report, waiters and submitters must not take the job for dead. An unreadable record counts as none."""
    try:
        last = read_launch(store)
    except StorageError:
        return None
    if last is None or last.ended_at is not None or now - last.launched_at >= within:
        return None
    return None if status is not None and last.launched_at <= status.started_at else last


def job_names(root: Storage) -> list[str]:
    """The jobs under a store root: the top-level prefixes holding a status.json or snapshots."""
    names = set()
    for info in root.list():
        job, sep, rest = info.key.partition("/")
        if sep and (rest == STATUS or rest.startswith(SNAPSHOTS)):
            names.add(job)
    return sorted(names)


def observe(store: JobStore, now: float | None = None) -> JobView:
    """Read the job's status and lease; ConfigError naming the jobs that do exist if it has neither."""
    view = JobView(store, read_status(store), read_lease(store), time.time() if now is None else now)
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
