"""Who owns a job's next restart: a supervisor's heartbeat in the job store, readable from any host.

Design notes: docs/runtime.md#design-notes-corerecordssupervisionpy."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.records import heard
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.records.status import (
    ACTIVE_STATES,
    BUSY_ALLOWANCE,
    JobState,
    JobStatus,
    heartbeat_limit,
)
from airflow_ckpt_provider.core.store.jobstore import DRIVER_ENDS, SUPERVISORS, JobStore

#: Characters of a launch id that name its second (``YYYYmmddTHHMMSSZ``): ids of one second are compared by record.
_SECOND = len("20260101T000000Z")


class SupervisorState(StrEnum):
    WATCHING = "watching"  # a driver of its runs (or starts)
    RESTARTING = "restarting"  # its driver died: waiting out the restart delay, then starting the next one
    ENDED = "ended"  # supervision is over: ``ending`` and ``end_reason`` say how


#: Whether process ``pid`` of this host runs (zombies count as gone): core/records/lease.pid_alive, the one probe.
process_alive = pid_alive


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


class SupervisorRecord(Record, frozen=True, kw_only=True):
    """One supervisor's heartbeat: its process (``pid`` on ``host``), the launch it supervises, its state
    (watching a driver, restarting one that died, or ended: ``ending``, ``exit_code`` and ``end_reason`` say how),
    the drivers it started and the one it watches. Written by the supervisor (launcher/supervisorreports.py) when
    it starts, every ``interval`` s while it runs and once when it ends; read by the health watch, the job view,
    the job report and the operators (``observe_supervision``: is a live supervisor restarting this job?)."""

    WHAT = "supervisor record"
    KEY = "supervisors/<launch id>.json"

    job: str
    launch_id: str
    pid: int
    host: str
    state: SupervisorState
    started_at: float
    updated_at: float
    interval: float
    grace: float = 30.0  # seconds it gives a driver between SIGTERM and SIGKILL
    standalone: bool = False  # `ckpt run --supervise` without a launch: its id is not in spec/last.json
    attempt: int = 0  # drivers it started so far
    epoch: int | None = None  # the epoch its drivers last reported
    driver_pid: int | None = None  # the driver process it watches (spark-submit), None between drivers
    standby_pid: int | None = None  # its warm standby driver (launcher/spare.py), None: none runs
    standby_ready: bool = False  # that standby is built and warmed up, waiting for its go
    ending: str | None = None
    exit_code: int | None = None
    end_reason: str | None = None

    @property
    def key(self) -> str:
        return supervisor_key(self.launch_id)

    def heartbeat_limit(self) -> float:
        """Seconds without a heartbeat after which the supervisor counts as gone: three polls + 5 s."""
        return 3 * self.interval + 5

    def reaction(self) -> float:
        """Seconds it may take to act on a driver that stopped reporting: notice it (a poll), terminate it
        (``grace``), write RESTARTING (a poll), + 5 s."""
        return self.grace + 2 * self.interval + 5

    def describe(self) -> str:
        return f"supervisor (pid {self.pid} on {self.host}, launch {self.launch_id})"

    def heard_at(self) -> float:
        """When this heartbeat was written, on this process's clock (core/records/heard.py)."""
        return heard.heard_at(("supervisor", self.launch_id), self.updated_at)

    def liveness(self, now: float, *, host: str | None = None,
                 pid_alive: Callable[[int], bool] | None = None) -> tuple[bool, str]:
        """(live, why not). Ended: not live. On this host (``host``, probed with ``pid_alive``) its process
        decides (a heartbeat within BUSY_ALLOWANCE too, against a reused pid); elsewhere, a heartbeat within
        ``heartbeat_limit``."""
        if self.state is SupervisorState.ENDED:
            code = "" if self.exit_code is None else f", exit code {self.exit_code}"
            verb = "gave up" if self.ending == "gave-up" else f"ended ({self.ending or 'unknown'}{code})"
            return False, f"{verb} at {_hms(self.updated_at)}: {self.end_reason or 'no reason recorded'}"
        age = now - self.heard_at()
        if pid_alive is not None and host is not None and host == self.host:
            if not pid_alive(self.pid):
                return False, "is gone: its process no longer exists"
            if age <= BUSY_ALLOWANCE:
                return True, ""
        if age <= self.heartbeat_limit():
            return True, ""
        return False, f"{STALE} for {age:.0f} s (every {self.interval:g} s expected)"


#: How ``liveness`` begins when only the heartbeat says the supervisor is gone (not its end, its process or a newer
#: launch): after a job store outage that may be the outage's doing (the health watch's grace, core/watches).
STALE = "is gone: no heartbeat"


def supervisor_key(launch_id: str) -> str:
    return f"{SUPERVISORS}{launch_id}.json"


def write_supervisor(store: JobStore, record: SupervisorRecord) -> SupervisorRecord:
    """Write the record; returns it (equal to it read back)."""
    store.storage.write(record.key, record.to_bytes())
    return record


def read_supervisor(store: JobStore, launch_id: str) -> SupervisorRecord | None:
    return _read(store, supervisor_key(launch_id))


def _read(store: JobStore, key: str) -> SupervisorRecord | None:
    """The record at ``key`` with its heartbeat's age noted (core/records/heard.py); None if it is gone."""
    found = store.storage.read_versioned(key)
    if found is None:
        return None
    record = SupervisorRecord.from_bytes(found.data, store.storage.uri(key))
    heard.note(("supervisor", record.launch_id), record.updated_at, found.age)
    return record


def latest_supervisor(store: JobStore) -> SupervisorRecord | None:
    """The record of the supervisor started last (the newest launch id; within one second, by ``started_at``)."""
    keys = sorted(info.key for info in store.storage.list(SUPERVISORS) if info.key.endswith(".json"))
    if not keys:
        return None
    second = keys[-1][len(SUPERVISORS):][:_SECOND]
    records = []
    for key in keys:
        if key[len(SUPERVISORS):][:_SECOND] != second:
            continue
        record = _read(store, key)
        if record is not None:
            records.append(record)
    return max(records, key=lambda r: r.started_at, default=None)


#: The environment variable naming a driver run (``DriverEnd.run``): set by a supervisor for each driver it starts in
#: cluster mode, passed to the driver through Spark's driver environment settings.
DRIVER_RUN_ENV = "CKPT_DRIVER_RUN"


class DriverEnd(Record, frozen=True, kw_only=True):
    """How one driver process ended, in its own words: its exit code (runtime/exitcodes.py), written by the
    driver's entrypoint as it exits. For a supervisor that cannot learn the code from spark-submit: in cluster mode
    spark-submit exits 0 however a Kubernetes driver pod ends (SPARK-26365) and 1 for any failed YARN application
    master. No record after spark-submit returned: the driver died without a word (its pod or container lost, a
    kill -9). ``run`` names the driver run (``DRIVER_RUN_ENV``); the supervisor deletes the record once read.
    ``report``: a restore check's verdict (runtime/restore_check_verdict.RestoreCheck as a dict), which a check driver
    in the cluster cannot print where its launcher reads it."""

    WHAT = "driver end record"
    KEY = "ends/<driver run>.json"

    job: str
    run: str
    code: int
    at: float
    host: str
    pid: int
    report: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return driver_end_key(self.run)


def driver_end_key(run: str) -> str:
    return f"{DRIVER_ENDS}{run}.json"


def write_driver_end(store: JobStore, record: DriverEnd) -> None:
    store.storage.write(record.key, record.to_bytes())


def take_driver_end(store: JobStore, run: str) -> DriverEnd | None:
    """The end record of driver run ``run``, deleted once read; None if the driver wrote none."""
    key = driver_end_key(run)
    try:
        data = store.storage.read(key)
    except FileNotFoundError:
        return None
    record = DriverEnd.from_bytes(data, store.storage.uri(key))
    store.storage.delete([key])
    return record


@dataclass(frozen=True)
class Supervision:
    """What the store says about the job's supervisor at ``now``: its record (None: no supervisor ever wrote
    one), whether it is live, and why not."""

    record: SupervisorRecord | None
    live: bool
    why_not: str = ""

    def gone(self) -> str:
        """'its supervisor (pid P on H, launch L) is gone: ...', or 'no supervisor' when there is no record."""
        if self.record is None:
            return "no supervisor restarts it (no record in supervisors/)"
        return f"its {self.record.describe()} {self.why_not}"


def observe_supervision(store: JobStore, now: float, *, host: str | None = None,
                        pid_alive: Callable[[int], bool] | None = process_alive,
                        last_launch: Callable[[], Launch | None] | None = None) -> Supervision:
    """The newest supervisor and whether it is live. One superseded by a newer launch in spec/last.json
    (an Airflow restart or upgrade whose own supervisor has not written yet) owns nothing: not live.
    ``host`` defaults to this host; ``last_launch`` reads spec/last.json (a poll that read it already passes its
    copy); StorageError when the store cannot be read."""
    record = latest_supervisor(store)
    if record is None:
        return Supervision(None, False)
    live, why_not = record.liveness(now, host=socket.gethostname() if host is None else host, pid_alive=pid_alive)
    if live and not record.standalone:
        last = read_launch(store) if last_launch is None else last_launch()
        if last is not None and last.launch_id != record.launch_id and last.launched_at >= record.started_at:
            return Supervision(record, False, f"is superseded by launch {last.launch_id} (by {last.launched_by})")
    return Supervision(record, live, why_not)


def live_supervisor(store: JobStore, now: float, *, host: str | None = None,
                    pid_alive: Callable[[int], bool] | None = process_alive) -> SupervisorRecord | None:
    """The record of the supervisor that owns the job now (latest launch, not ended, heartbeat fresh or its
    process alive on this host), or None."""
    seen = observe_supervision(store, now, host=host, pid_alive=pid_alive)
    return seen.record if seen.live else None


def restarts_dead_driver(status: JobStatus, supervision: Supervision, now: float) -> bool:
    """Whether the live supervisor will restart the driver that wrote ``status``: an active status (a driver
    that stopped reporting) younger than the driver's heartbeat limit plus the supervisor's reaction time, or
    a FAILED one younger than that reaction time (a failed driver exits at once; the supervisor then writes
    RESTARTING, or ends when it gives up)."""
    record = supervision.record
    if not supervision.live or record is None or record.state is SupervisorState.ENDED:
        return False
    if status.state is JobState.FAILED:
        return status.age(now) <= record.reaction()
    return status.state in ACTIVE_STATES and status.age(now) <= heartbeat_limit(status) + record.reaction()
