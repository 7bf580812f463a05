"""Keeps a job alive the way Flink does: restart its driver after a failure, as a restart strategy allows.

Drivers restore what the user chose until one of them reported RUNNING in ``status.json``; later restarts
resume from the latest completed state. The exit codes of runtime/exitcodes.NOT_RESTARTABLE (bad input,
fenced, incompatible state, credentials refused, a sink refused the query) end supervision at once:
restarting cannot help, or would compete with the newer driver; so does a lease and a live status of a
newer driver (the exit code is lost in cluster mode). While a driver runs, ``status.json`` shows whether
batches still complete and heartbeats arrive; a driver without either is killed and restarted like a
failed one.

One owner per restart: before the restart delay the supervisor writes RESTARTING in ``status.json`` (who,
attempt, cause, by when the job should run again) with its own pid and host, and it keeps a heartbeat of
its own in ``supervisors/<launch id>.json`` (core/supervision.py), so that the health watch and the DAG's
restart leave the restart to it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.deployments import new_launch_id, read_launch, record_end
from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.lease import read_lease
from airflow_ckpt_provider.core.modes import LATEST_STATE
from airflow_ckpt_provider.core.outage import Outage
from airflow_ckpt_provider.core.restart import Health, HealthRule, RestartStrategy, describe_strategy
from airflow_ckpt_provider.core.status import (
    JobState,
    JobStatus,
    Restart,
    RestartOwner,
    driver_live,
    heartbeat_limit,
    read_status,
    write_status,
)
from airflow_ckpt_provider.core.supervision import SupervisorRecord, SupervisorState, write_supervisor
from airflow_ckpt_provider.launcher.driverprocess import GroupOf, ProcessLike, Spawn, process_group, spawn_driver
from airflow_ckpt_provider.launcher.submit import SubmitSpec, build_command
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_INCOMPATIBLE,
    EXIT_REFUSED,
    EXIT_STOPPED,
    exit_meaning,
)

log = logging.getLogger(__name__)

#: Seconds a restarted driver is expected to need from spawn to RUNNING while this supervisor has not seen one
#: of its drivers get there: Spark's cold start (JVM, SparkSession, restore) took 20-55 s on a loaded 2-core
#: machine (docs/benchmarks.md), 120 s leaves room for a slower cluster.
COLD_START_DEFAULT = 120.0
#: Once measured, the allowance is this many times the last cold start (+ a poll, the measure's precision) ...
COLD_START_FACTOR = 2.0
#: ... and at least this many seconds.
COLD_START_MIN = 30.0


class Ending(StrEnum):
    """How supervision ended; ``exit_code`` is what ``ckpt run --supervise`` returns for it."""

    STOPPED = "stopped"
    FENCED = "fenced"
    CONFIG_ERROR = "config-error"
    GAVE_UP = "gave-up"
    INCOMPATIBLE = "incompatible"  # the driver's code cannot restore or run on the state (exit 5)
    DENIED = "credentials-refused"  # the storage refused the credentials (exit 6)
    REFUSED = "sink-refused"  # a sink refused the query (exit 7)

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {Ending.STOPPED: EXIT_STOPPED, Ending.GAVE_UP: EXIT_FAILED, Ending.CONFIG_ERROR: EXIT_CONFIG,
               Ending.FENCED: EXIT_FENCED, Ending.INCOMPATIBLE: EXIT_INCOMPATIBLE, Ending.DENIED: EXIT_DENIED,
               Ending.REFUSED: EXIT_REFUSED}
#: The driver exit codes that end supervision at once (runtime/exitcodes.NOT_RESTARTABLE), but fenced (3),
#: which _ending answers first.
_NOT_RESTARTABLE = {EXIT_CONFIG: Ending.CONFIG_ERROR, EXIT_INCOMPATIBLE: Ending.INCOMPATIBLE,
                    EXIT_DENIED: Ending.DENIED, EXIT_REFUSED: Ending.REFUSED}


@dataclass(frozen=True)
class SupervisorOutcome:
    """The result of supervising: driver starts, restarts among them, the last exit code and why it ended."""

    final: Ending
    attempts: int
    restarts: int
    exit_code: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "final": self.final.value}


@dataclass
class _Progress:
    """The batch id last seen in status.json and when it last changed (supervisor clock)."""

    since: float
    batch_id: int | None = None
    seen: bool = False


@dataclass
class _Driver:
    """One driver this supervisor started, and what its own statuses (see ``Supervisor._own``) told."""

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


class Supervisor:
    """Runs a job's driver until it stops, is fenced, has bad input, or the strategy gives up.

    ``poll`` is the seconds between reads of status.json; ``grace`` the seconds a stuck or stopping driver
    gets between SIGTERM and SIGKILL. A dead driver is noticed at once: ``wait`` returns when it exits.
    ``wall`` is the clock of ``status.json`` and ``lease.json``; ``group_of`` finds a pid's process group.
    ``launch_id`` is the Airflow launch it runs for (CKPT_LAUNCH_ID: superseded by a newer one in
    spec/last.json); without one it names its supervisors/ record with an id of its own.
    """

    def __init__(
        self,
        spec: SubmitSpec,
        strategy: RestartStrategy,
        *,
        health: HealthRule | None = None,
        store: JobStore | None = None,
        poll: float = 5.0,
        grace: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        spawn: Spawn = spawn_driver,
        wall: Callable[[], float] = time.time,
        group_of: GroupOf = process_group,
        launch_id: str | None = None,
    ) -> None:
        self.spec = spec
        self.launch_id = launch_id
        self.strategy = strategy
        self.health = health
        self.store = store
        self.poll = poll
        self.grace = grace
        self.clock = clock
        self._stopping = threading.Event()
        self.sleep = sleep or self._stopping.wait  # a stop request cuts the restart delay short
        self.spawn = spawn
        self.wall = wall
        self.group_of = group_of
        self._host = socket.gethostname()
        self._stop_requests = 0
        self._stop_at: float | None = None  # supervisor clock at the first stop request
        self._proc: ProcessLike | None = None
        self._ran = False  # a driver of ours reported RUNNING: restarts resume from latest-state
        self._epoch: int | None = None  # the epoch our drivers last reported
        self._pid = os.getpid()
        self._started_wall = wall()
        self.record_id = launch_id or new_launch_id(self._started_wall)  # names supervisors/<id>.json
        self._attempt = 0
        self._cold_start: float | None = None  # seconds our last driver took from spawn to RUNNING
        self._unreadable_at: float | None = None  # supervisor clock when status.json last could not be read
        self._outage = Outage(spec.config.job, "the supervisor's job store")  # the driver logs its own

    @property
    def job(self) -> str:
        return self.spec.config.job

    def request_stop(self) -> None:
        """Stop without restarting: SIGTERM to the driver, which cancels its query (SIGKILL on a second request).

        Safe in a signal handler; the CLI installs it for SIGTERM and SIGINT.
        """
        if self._stop_at is None:
            self._stop_at = self.clock()
        self._stop_requests += 1
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM if self._stop_requests == 1 else signal.SIGKILL)

    def run(self) -> SupervisorOutcome:
        attempts = 0
        restart_times: list[float] = []
        resume = replace(self.spec, config=replace(self.spec.config, restore=LATEST_STATE))
        self._beat(SupervisorState.WATCHING)
        while True:
            attempts += 1
            self._attempt = attempts
            driver = self._run_driver(resume if self._ran else self.spec, attempts)
            code = driver.code
            ending = self._ending(code, driver) or self._taken_over(driver)
            if ending is not None:
                return self._end(ending[0], attempts, code, ending[1])
            failure = driver.stuck or f"driver exited with code {code} ({exit_meaning(code)})"
            delay, why_not = self._restart_delay(restart_times, driver.ran)
            if delay is None:
                return self._give_up(attempts, code, f"{why_not}; last failure: {failure}")
            superseded = self._superseded()  # before claiming the restart in status.json
            if superseded:
                return self._end(Ending.FENCED, attempts, code, superseded)
            self._announce_restart(driver, attempts, delay)
            self._wait_delay(delay)
            if self._stop_requests:
                self._record_stopped_while_restarting()
                return self._end(Ending.STOPPED, attempts, code, "stop requested before the restart")
            superseded = self._superseded()
            if superseded:
                return self._end(Ending.FENCED, attempts, code, superseded)
            restart_times.append(self.clock())

    # -- one owner per restart: RESTARTING in status.json, the supervisor's own heartbeat ----------------

    def _cold_start_allowance(self) -> tuple[float, str]:
        """Seconds the next driver gets from spawn to RUNNING, and where the number comes from."""
        if self._cold_start is None:
            return COLD_START_DEFAULT, (f"the default cold start of {COLD_START_DEFAULT:g} s (no driver of this "
                                        "supervisor reported RUNNING yet)")
        allowance = max(COLD_START_MIN, COLD_START_FACTOR * self._cold_start + self.poll)
        return allowance, (f"{COLD_START_FACTOR:g} x the last cold start of {self._cold_start:.0f} s + a poll, "
                           f"at least {COLD_START_MIN:g} s")

    def _announce_restart(self, driver: _Driver, attempt: int, delay: float) -> None:
        """RESTARTING in status.json, by this supervisor (its pid and host), at the epoch of its dead driver,
        before the delay; and one log line. A newer driver's status is left alone (write_status), and so is a
        live driver's status that is not ours (a previous deployment's, still running until fenced)."""
        cause = driver.stuck or f"exit code {driver.code}: {exit_meaning(driver.code)}"
        now = self.wall()
        allowance, source = self._cold_start_allowance()
        current: JobStatus | None = None
        if self.store is not None:
            try:
                current = read_status(self.store)
            except StorageError as err:
                self._outage.failed(f"read status.json: {err}")
        epoch = self._epoch if self._epoch is not None else (current.epoch if current is not None else 0)
        ours = current is not None and current.epoch == epoch
        batch = driver.batch_id if driver.batch_id is not None else (current.batch_id if ours and current else None)
        restart = Restart(by=RestartOwner.SUPERVISOR, attempt=attempt, cause=cause, delay=delay, at=now,
                          expected_by=now + delay + allowance, from_batch=batch)
        log.warning("job %s: driver pid %d died (%s) after %.0f s at batch %s: restarting in %.1f s (attempt %d, "
                    "strategy %s; expected running by %s: %s)", self.job, driver.proc.pid, cause, driver.ran,
                    "-" if batch is None else batch, delay, attempt, describe_strategy(self.strategy),
                    time.strftime("%H:%M:%SZ", time.gmtime(restart.expected_by)), source)
        self._beat(SupervisorState.RESTARTING)
        if self.store is None:
            return
        if current is not None and self._epoch is None and driver_live(current, now, host=self._host,
                                                                         pid_alive=self._runs_here):
            log.warning("job %s: status.json is a live driver's (epoch %d, pid %s on %s), not ours: not marking "
                        "it RESTARTING", self.job, current.epoch, current.pid, current.host)
            return
        base = current if current is not None and ours else JobStatus(self.job, JobState.RESTARTING, epoch, now, now)
        status = replace(base, state=JobState.RESTARTING, updated_at=now, pid=self._pid, host=self._host,
                         reason=f"driver died ({cause}): its supervisor restarts it", restart=restart.to_dict(),
                         data_waiting=False, idle=False, batch_id=batch)
        try:
            if not write_status(self.store, status):
                log.info("job %s: a newer driver reports in status.json: not marking it RESTARTING", self.job)
        except StorageError as err:
            self._outage.failed(f"write status.json: {err}")

    def _wait_delay(self, delay: float) -> None:
        """Sleep ``delay`` in polls, refreshing the supervisor record between them; a stop cuts it short."""
        left = delay
        while left > 0 and not self._stop_requests:
            step = min(self.poll, left)
            self.sleep(step)
            left -= step
            if left > 0:
                self._beat(SupervisorState.RESTARTING)

    def _record_stopped_while_restarting(self) -> None:
        """STOPPED over our RESTARTING status: no driver runs, and none will."""
        if self.store is None:
            return
        try:
            current = read_status(self.store)
            if current is not None and current.state is JobState.RESTARTING and current.pid == self._pid:
                write_status(self.store, replace(current, state=JobState.STOPPED, updated_at=self.wall(),
                                                 reason="stop requested while its supervisor restarted it",
                                                 restart=None))
        except StorageError as err:
            log.warning("job %s: cannot record STOPPED in status.json: %s", self.job, err)

    def _beat(self, state: SupervisorState, *, proc: ProcessLike | None = None, ending: Ending | None = None,
              code: int | None = None, reason: str | None = None) -> None:
        """Write supervisors/<id>.json: this supervisor's heartbeat (a failure is logged once per outage)."""
        if self.store is None:
            return
        record = SupervisorRecord(
            job=self.job, launch_id=self.record_id, pid=self._pid, host=self._host, state=state,
            started_at=self._started_wall, updated_at=self.wall(), interval=self.poll, grace=self.grace,
            standalone=self.launch_id is None, attempt=self._attempt, epoch=self._epoch,
            driver_pid=proc.pid if proc is not None else None, ending=ending.value if ending else None,
            exit_code=code, end_reason=reason)
        try:
            write_supervisor(self.store, record)
        except StorageError as err:
            self._outage.failed(f"write {record.key}: {err}")
        else:
            self._outage.ok()

    def _ending(self, code: int, driver: _Driver) -> tuple[Ending, str] | None:
        """How supervision ends after a driver exited with ``code``, or None: a failure to restart."""
        if self._stop_requests:
            return Ending.STOPPED, f"stop requested; driver exited with code {code}"
        if code == EXIT_FENCED:
            return Ending.FENCED, "a newer driver took the job's lease and runs the job: not restarting"
        if code in _NOT_RESTARTABLE:
            why = f": {driver.reason}" if driver.reason else ""
            return _NOT_RESTARTABLE[code], (f"driver exited with code {code} ({exit_meaning(code)}): a restart "
                                            f"would fail again{why}; see its log")
        if code == EXIT_STOPPED and not driver.stuck:
            return Ending.STOPPED, "driver stopped"
        return None

    def _taken_over(self, driver: _Driver) -> tuple[Ending, str] | None:
        """FENCED if, after our driver failed, a newer driver holds the lease and reports a live status.

        A fenced driver may exit 1, and in cluster mode spark-submit's exit code says nothing of the driver's.
        """
        if self.store is None:
            return None
        try:
            lease, status = read_lease(self.store), read_status(self.store)
        except StorageError as err:
            log.warning("job %s: cannot read the lease or status.json, restarting as usual: %s", self.job, err)
            return None
        if lease is None or lease.released or status is None or status.epoch != lease.epoch:
            return None
        if driver.epoch is not None:
            newer = lease.epoch > driver.epoch
        else:  # ours never reported: a lease taken since it started is another's unless the status is ours
            newer = lease.acquired_at >= driver.started_wall and not self._own(driver, status)
        if not newer or not driver_live(status, self.wall(), host=self._host, pid_alive=self._runs_here):
            return None
        return Ending.FENCED, (f"another driver (owner {lease.owner}, epoch {lease.epoch}) runs the job: "
                               "not restarting")

    def _superseded(self) -> str:
        """Why not to restart because a newer launch of the job was recorded (spec/last.json), else ''.

        An upgrade or a restart from Airflow launches a new supervisor; this one must not start another
        driver that would fence the new deployment's.
        """
        if self.store is None or self.launch_id is None:
            return ""
        try:
            last = read_launch(self.store)
        except StorageError as err:
            log.warning("job %s: cannot read spec/last.json, restarting as usual: %s", self.job, err)
            return ""
        if last is None or last.launch_id == self.launch_id:
            return ""
        return f"superseded by launch {last.launch_id} (by {last.launched_by}): not restarting"

    def _restart_delay(self, restart_times: list[float], ran: float) -> tuple[float | None, str]:
        """Seconds to wait before restarting, or None and why not (health rule first, then the strategy)."""
        if self.health is not None:
            verdict = self.health.judge(restart_times, None, False, self.clock())
            if verdict.health is Health.UNHEALTHY:
                return None, f"unhealthy: {verdict.reason}"
        delay = self.strategy.on_failure(ran)
        if delay is None:
            return None, (f"restart strategy exhausted ({describe_strategy(self.strategy)}) "
                          f"after {len(restart_times)} restarts")
        return delay, ""

    def _run_driver(self, spec: SubmitSpec, attempt: int) -> _Driver:
        """Start one driver and wait for it: its exit code, why it was killed, seconds it ran."""
        argv, env = build_command(spec)
        baseline = self._lease_epoch() if self.spec.deploy_mode == "cluster" else None
        started, started_wall = self.clock(), self.wall()
        proc = self._proc = self.spawn(argv, env)
        if self._stop_requests:  # a stop that came while it started
            proc.send_signal(signal.SIGTERM)
        log.info("job %s: driver pid %d started (attempt %d, restore %s)", self.job, proc.pid, attempt,
                 spec.config.restore)
        driver = _Driver(proc, started, started_wall, baseline)
        try:
            driver.code, driver.stuck = self._watch(driver)
        finally:
            self._proc = None
        driver.ran = self.clock() - started
        if driver.code not in (EXIT_STOPPED, EXIT_FENCED):
            self._observe(driver)  # its last words: the reason of a FAILED status, the batch it reached
        log.info("job %s: driver exited with code %d after %.1f s (%s)", self.job, driver.code, driver.ran,
                 exit_meaning(driver.code))
        return driver

    def _lease_epoch(self) -> int | None:
        """The lease's epoch now (0: never taken), or None if unknown."""
        if self.store is None:
            return None
        try:
            lease = read_lease(self.store)
        except StorageError as err:
            log.warning("job %s: cannot read the lease: %s", self.job, err)
            return None
        return 0 if lease is None else lease.epoch

    def _watch(self, driver: _Driver) -> tuple[int, str]:
        proc = driver.proc
        progress = _Progress(since=driver.started)
        timeout = self.poll
        self._beat(SupervisorState.WATCHING, proc=proc)
        while True:
            try:
                return proc.wait(timeout=timeout), ""
            except subprocess.TimeoutExpired:
                pass
            self._beat(SupervisorState.WATCHING, proc=proc)
            if self._stop_at is not None:  # the driver got SIGTERM: it has ``grace`` seconds to stop
                left = max(self._stop_at, driver.started) + self.grace - self.clock()
                if left <= 0:
                    log.warning("job %s: driver pid %d still runs %.0f s after the stop request: SIGKILL",
                                self.job, proc.pid, self.grace)
                    proc.send_signal(signal.SIGKILL)
                    return proc.wait(), ""
                timeout = min(self.poll, left)
                continue
            stuck = self._stuck(driver, progress, self._observe(driver))
            if stuck:
                log.warning("job %s: %s: terminating driver pid %d", self.job, stuck, proc.pid)
                return self._terminate(proc), stuck

    def _observe(self, driver: _Driver) -> JobStatus | None:
        """status.json now, noting the epoch, the batch and a RUNNING state when our driver wrote it; a read
        that fails is remembered (``_unreadable_at``): heartbeats are not judged right after an outage."""
        if self.store is None:
            return None
        try:
            status = read_status(self.store)
        except StorageError as err:
            self._outage.failed(f"cannot read status.json, progress not judged meanwhile: {err}")
            self._unreadable_at = self.clock()
            return None
        self._outage.ok()
        if status is not None and self._own(driver, status):
            driver.epoch = self._epoch = status.epoch
            driver.batch_id, driver.reason = status.batch_id, status.reason
            if status.state is JobState.RUNNING and not driver.running:
                driver.running = self._ran = True
                self._cold_start = self.clock() - driver.started
                log.info("job %s: driver pid %d runs the job at epoch %d: restarts resume from latest-state",
                         self.job, driver.proc.pid, status.epoch)
        return status

    def _own(self, driver: _Driver, status: JobStatus) -> bool:
        """Whether ``driver`` wrote ``status``: once known, by its epoch; before, by the pid in status.json
        (in client mode the Python driver runs in the group spark-submit leads), or in cluster mode, where
        that pid is another host's, by an epoch above the lease's before the driver started."""
        if driver.epoch is not None:
            return status.epoch == driver.epoch
        if driver.baseline is not None:
            return status.epoch > driver.baseline
        return status.host == self._host and status.pid is not None and self.group_of(status.pid) == driver.proc.pid

    def _runs_here(self, pid: int) -> bool:
        """Whether process ``pid`` of this host still runs (a driver that reported from here)."""
        return self.group_of(pid) is not None

    def _stuck(self, driver: _Driver, progress: _Progress, status: JobStatus | None) -> str:
        """Why the running driver counts as stuck (its heartbeat stopped, or the health rule), or ""."""
        if status is None:
            return ""
        wall = self.wall()
        # RUNNING only: a driver STOPPING with a savepoint sends no heartbeat while it takes the final one
        if driver.running and status.state is JobState.RUNNING and status.epoch == driver.epoch \
                and not driver_live(status, wall):
            readable_for = None if self._unreadable_at is None else self.clock() - self._unreadable_at
            if readable_for is not None and readable_for < heartbeat_limit(status):
                # The driver could not write while we could not read: give it a whole limit to report again.
                return ""
            return (f"no heartbeat in status.json for {status.age(wall):.0f} s "
                    f"(every {status.heartbeat_interval:g} s expected)")
        if self.health is None or self.health.progress_timeout is None or status.state is not JobState.RUNNING:
            return ""  # starting, restoring or stopping: no batches expected
        now = self.clock()
        if not progress.seen:  # a first look, possibly at the previous driver's status: not progress
            progress.seen, progress.batch_id = True, status.batch_id
        elif status.batch_id != progress.batch_id:
            progress.batch_id, progress.since = status.batch_id, now
        verdict = self.health.judge([], progress.since, status.data_waiting, now)
        return verdict.reason if verdict.health is Health.UNHEALTHY else ""

    def _terminate(self, proc: ProcessLike) -> int:
        proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + self.grace
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(self.poll, deadline - self.clock())))
            except subprocess.TimeoutExpired:
                pass
            if self.clock() >= deadline:
                log.warning("job %s: driver pid %d still runs %.0f s after SIGTERM: SIGKILL", self.job, proc.pid,
                            self.grace)
                proc.send_signal(signal.SIGKILL)
                return proc.wait()
            self._beat(SupervisorState.WATCHING, proc=proc)

    def _give_up(self, attempts: int, code: int, reason: str) -> SupervisorOutcome:
        log.error("job %s: giving up: %s", self.job, reason)
        if self.store is not None:
            try:
                self._record_failed(self.store, reason)
            except StorageError as err:
                log.warning("job %s: cannot record FAILED in status.json: %s", self.job, err)
        self._beat(SupervisorState.ENDED, ending=Ending.GAVE_UP, code=code, reason=reason)
        self._record_end(Ending.GAVE_UP, code, reason)
        return SupervisorOutcome(Ending.GAVE_UP, attempts, attempts - 1, code, reason)

    def _record_failed(self, store: JobStore, reason: str) -> None:
        """FAILED in status.json, unless it is another driver's: its epoch is not ours and that driver holds
        the lease (a newer driver runs the job, or starts to)."""
        now = self.wall()
        last = read_status(store)
        if last is None or last.epoch != self._epoch:
            lease = read_lease(store)
            if lease is not None and not lease.released and lease.epoch != self._epoch:
                log.warning("job %s: another driver (owner %s, epoch %d) owns the job: not recording FAILED",
                            self.job, lease.owner, lease.epoch)
                return
        status = (replace(last, state=JobState.FAILED, reason=reason, updated_at=now, data_waiting=False, restart=None)
                  if last else JobStatus(self.job, JobState.FAILED, 0, now, now, reason=reason))
        write_status(store, status)

    def _end(self, final: Ending, attempts: int, code: int, reason: str) -> SupervisorOutcome:
        log.info("job %s: %s: %s", self.job, final.value, reason)
        self._beat(SupervisorState.ENDED, ending=final, code=code, reason=reason)
        self._record_end(final, code, reason)
        return SupervisorOutcome(final, attempts, attempts - 1, code, reason)

    def _record_end(self, final: Ending, code: int, reason: str) -> None:
        """How this launch ended, in spec/last.json (when launched from Airflow): a waiter stops waiting."""
        if self.store is None or self.launch_id is None:
            return
        try:
            record_end(self.store, self.launch_id, ending=final.value, exit_code=code, reason=reason)
        except StorageError as err:
            log.warning("job %s: cannot record the end of launch %s: %s", self.job, self.launch_id, err)
