"""What a supervisor tells the world: its heartbeat record, RESTARTING in status.json, and how it ended.

The supervisor's counterpart of runtime/reporting.py. One owner per restart: before the restart delay the
supervisor writes RESTARTING in ``status.json`` (who, attempt, cause, by when the job should run again) with
its own pid and host, and it keeps a heartbeat of its own in ``supervisors/<launch id>.json``
(core/records/supervision.py), so that the health watch and the DAG's restart leave the restart to it. A write that
fails is logged once per outage of the store, never fatal; a store that refuses the supervisor's credentials
is no outage: ``refused`` says so (one ERROR line, without any credential), and the supervisor ends on it
instead of starting a driver (see launcher/supervisor.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import CredentialsError, StorageError
from airflow_ckpt_provider.core.policy.outage import Outage
from airflow_ckpt_provider.core.records.deployments import new_launch_id, record_end
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import (
    JobState,
    JobStatus,
    Restart,
    RestartOwner,
    driver_live,
    read_status,
    write_status,
)
from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, write_supervisor
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.driverprocess import ProcessLike
from airflow_ckpt_provider.runtime.exitcodes import exit_meaning

log = logging.getLogger("airflow_ckpt_provider.launcher.supervisor")  # one logger for the supervisor's lines

#: Seconds a restarted driver is expected to need from spawn to RUNNING while this supervisor has not seen one
#: of its drivers get there: Spark's cold start (JVM, SparkSession, restore) took 20-55 s on a loaded 2-core
#: machine (docs/benchmarks.md), 120 s leaves room for a slower cluster.
COLD_START_DEFAULT = 120.0
#: Once measured, the allowance is this many times the last cold start (+ a poll, the measure's precision) ...
COLD_START_FACTOR = 2.0
#: ... and at least this many seconds.
COLD_START_MIN = 30.0


@dataclass
class DriverRun:
    """One driver a supervisor started, and what its own statuses (see ``Supervisor._own``) told."""

    proc: ProcessLike
    started: float  # supervisor clock
    started_wall: float  # wall clock, as lease.json's acquired_at
    baseline: int | None  # cluster mode: the lease epoch before it started (None: unknown or client mode)
    epoch: int | None = None  # the epoch its statuses carry
    running: bool = False  # it reported RUNNING
    code: int = 0
    stuck: str = ""  # why it was killed, "" if not
    ran: float = 0.0
    batch_id: int | None = None  # the last batch its statuses reported
    reason: str = ""  # the reason of its last status (a FAILED driver's says why)


class SupervisorReports:
    """The records of one supervisor of ``job``; ``attempt``, ``epoch`` and ``cold_start`` are what the
    supervisor learnt so far (drivers started, the epoch they reported, seconds from spawn to RUNNING)."""

    def __init__(self, job: str, store: JobStore | None, *, launch_id: str | None, poll: float, grace: float,
                 wall: Callable[[], float], runs_here: Callable[[int], bool]) -> None:
        self.job = job
        self.store = store
        self.launch_id = launch_id
        self.poll = poll
        self.interval = poll  # the pace of its heartbeat: slower once its driver runs (Supervisor._observe)
        self.grace = grace
        self.wall = wall
        self.runs_here = runs_here
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.started_wall = wall()
        self.record_id = launch_id or new_launch_id(self.started_wall)  # names supervisors/<id>.json
        self.attempt = 0
        self.epoch: int | None = None
        self.standby: tuple[int, bool] | None = None  # its warm standby: (pid, ready), written with each beat
        self.cold_start: float | None = None
        self.outage = Outage(job, "the supervisor's job store")  # the driver logs its own
        #: Why the store refused the supervisor's credentials (its message names no secret), "" if it did not.
        self.refused = ""

    def store_failed(self, what: str, err: StorageError) -> None:
        """A request to the store failed: a refusal of the credentials is logged once as one (no outage, a
        wait does not end it), anything else counts towards an outage."""
        if isinstance(err, CredentialsError):
            if not self.refused:
                log.error("job %s: the job store refused the supervisor's credentials: %s (not an outage: waiting "
                          "or restarting does not fix it)", self.job, err)
            self.refused = str(err)
            return
        self.outage.failed(f"{what}: {err}")

    def store_ok(self) -> None:
        """A request to the store worked: ends an outage, or a refusal (credentials rotated back)."""
        if self.refused:
            log.warning("job %s: the job store accepts the supervisor's credentials again", self.job)
            self.refused = ""
        self.outage.ok()

    def beat(self, state: SupervisorState, *, proc: ProcessLike | None = None, ending: str | None = None,
             code: int | None = None, reason: str | None = None) -> None:
        """Write supervisors/<id>.json: this supervisor's heartbeat (a failure is logged once per outage)."""
        if self.store is None:
            return
        record = SupervisorRecord(
            job=self.job, launch_id=self.record_id, pid=self.pid, host=self.host, state=state,
            started_at=self.started_wall, updated_at=self.wall(), interval=self.interval, grace=self.grace,
            standalone=self.launch_id is None, attempt=self.attempt, epoch=self.epoch,
            driver_pid=proc.pid if proc is not None else None, ending=ending, exit_code=code, end_reason=reason,
            standby_pid=self.standby[0] if self.standby else None, standby_ready=bool(self.standby and self.standby[1]))
        try:
            write_supervisor(self.store, record)
        except StorageError as err:
            self.store_failed(f"write {record.key}", err)
        else:
            self.store_ok()

    def cold_start_allowance(self) -> tuple[float, str]:
        """Seconds the next driver gets from spawn to RUNNING, and where the number comes from."""
        if self.cold_start is None:
            return COLD_START_DEFAULT, (f"the default cold start of {COLD_START_DEFAULT:g} s (no driver of this "
                                        "supervisor reported RUNNING yet)")
        allowance = max(COLD_START_MIN, COLD_START_FACTOR * self.cold_start + self.poll)
        return allowance, (f"{COLD_START_FACTOR:g} x the last cold start of {self.cold_start:.0f} s + a poll, "
                           f"at least {COLD_START_MIN:g} s")

    def announce_restart(self, driver: DriverRun, attempt: int, delay: float, strategy: str) -> None:
        """RESTARTING in status.json, by this supervisor (its pid and host), at the epoch of its dead driver,
        before the delay; and one log line. A newer driver's status is left alone (write_status), and so is a
        live driver's status that is not ours (a previous deployment's, still running until fenced)."""
        cause = driver.stuck or f"exit code {driver.code}: {exit_meaning(driver.code)}"
        now = self.wall()
        allowance, source = self.cold_start_allowance()
        current: JobStatus | None = None
        if self.store is not None:
            try:
                current = read_status(self.store)
            except StorageError as err:
                self.store_failed("read status.json", err)
        epoch = self.epoch if self.epoch is not None else (current.epoch if current is not None else 0)
        ours = current is not None and current.epoch == epoch
        batch = driver.batch_id if driver.batch_id is not None else (current.batch_id if ours and current else None)
        restart = Restart(by=RestartOwner.SUPERVISOR, attempt=attempt, cause=cause, delay=delay, at=now,
                          expected_by=now + delay + allowance, from_batch=batch)
        log.warning("job %s: driver pid %d died (%s) after %.0f s at batch %s: restarting in %.1f s (attempt %d, "
                    "strategy %s; expected running by %s: %s)", self.job, driver.proc.pid, cause, driver.ran,
                    "-" if batch is None else batch, delay, attempt, strategy,
                    time.strftime("%H:%M:%SZ", time.gmtime(restart.expected_by)), source)
        self.beat(SupervisorState.RESTARTING)
        if self.store is None:
            return
        if current is not None and self.epoch is None and driver_live(current, now, host=self.host,
                                                                        pid_alive=self.runs_here):
            log.warning("job %s: status.json is a live driver's (epoch %d, pid %s on %s), not ours: not marking "
                        "it RESTARTING", self.job, current.epoch, current.pid, current.host)
            return
        base = current if current is not None and ours else JobStatus(self.job, JobState.RESTARTING, epoch, now, now)
        status = replace(base, state=JobState.RESTARTING, updated_at=now, pid=self.pid, host=self.host,
                         reason=f"driver died ({cause}): its supervisor restarts it", restart=restart.to_dict(),
                         data_waiting=False, idle=False, batch_id=batch)
        try:
            if not write_status(self.store, status):
                log.info("job %s: a newer driver reports in status.json: not marking it RESTARTING", self.job)
        except StorageError as err:
            self.store_failed("write status.json", err)

    def stopped_while_restarting(self) -> None:
        """STOPPED over our RESTARTING status: no driver runs, and none will."""
        if self.store is None:
            return
        try:
            current = read_status(self.store)
            if current is not None and current.state is JobState.RESTARTING and current.pid == self.pid:
                write_status(self.store, replace(current, state=JobState.STOPPED, updated_at=self.wall(),
                                                 reason="stop requested while its supervisor restarted it",
                                                 restart=None))
        except StorageError as err:
            log.warning("job %s: cannot record STOPPED in status.json: %s", self.job, err)

    def failed(self, reason: str) -> None:
        """FAILED in status.json, unless it is another driver's: its epoch is not ours and that driver holds
        the lease (a newer driver runs the job, or starts to)."""
        if self.store is None:
            return
        try:
            now = self.wall()
            last = read_status(self.store)
            if last is None or last.epoch != self.epoch:
                lease = read_lease(self.store)
                if lease is not None and not lease.released and lease.epoch != self.epoch:
                    log.warning("job %s: another driver (owner %s, epoch %d) owns the job: not recording FAILED",
                                self.job, lease.owner, lease.epoch)
                    return
            status = (replace(last, state=JobState.FAILED, reason=reason, updated_at=now, data_waiting=False,
                              restart=None)
                      if last else JobStatus(self.job, JobState.FAILED, 0, now, now, reason=reason))
            write_status(self.store, status)
        except StorageError as err:
            log.warning("job %s: cannot record FAILED in status.json: %s", self.job, err)

    def ended(self, ending: str, code: int | None, reason: str) -> None:
        """The end of supervision: the heartbeat record marked ended, and, when launched from Airflow, how the
        launch ended in spec/last.json (a waiter stops waiting). ``code`` None: no driver was started."""
        self.beat(SupervisorState.ENDED, ending=ending, code=code, reason=reason)
        if self.store is None or self.launch_id is None or code is None or self.refused:  # refused: logged once
            return
        try:
            record_end(self.store, self.launch_id, ending=ending, exit_code=code, reason=reason)
        except StorageError as err:
            log.warning("job %s: cannot record the end of launch %s: %s", self.job, self.launch_id, err)
