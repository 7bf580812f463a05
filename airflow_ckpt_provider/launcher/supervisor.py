"""Keeps a job alive the way Flink does: restart its driver after a failure, as a restart strategy allows.

Design notes: docs/runtime.md#design-notes-launchersupervisorpy."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.policy.outage import ReadableAgain
from airflow_ckpt_provider.core.policy.restart import Health, HealthRule, RestartStrategy, describe_strategy
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import (
    JobState,
    JobStatus,
    driver_live,
    heartbeat_limit,
    read_status,
)
from airflow_ckpt_provider.core.records.supervision import (
    SupervisorRecord,
    SupervisorState,
    read_supervisor,
    take_driver_end,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.adoption import AdoptedDriver
from airflow_ckpt_provider.launcher.driverprocess import GroupOf, ProcessLike, Spawn, process_group, spawn_driver
from airflow_ckpt_provider.launcher.spare import Spare
from airflow_ckpt_provider.launcher.sparkapp import driver_command, release
from airflow_ckpt_provider.launcher.submit import SubmitSpec, driver_cwd
from airflow_ckpt_provider.launcher.supervisorreports import DriverRun, SupervisorReports
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



#: A supervisor whose driver runs beats (a PUT) and reads status.json every this many of the driver's heartbeats:
#: an idle job's budget (docs/scale.md) has room for one supervisor PUT in 90 s.
RUNNING_PACE = 3

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


class Supervisor:
    """Runs a job's driver until it stops, is fenced, has bad input, or the strategy gives up.

    ``poll`` is the seconds between reads of status.json; ``grace`` the seconds a stuck or stopping driver
    gets between SIGTERM and SIGKILL. A dead driver is noticed at once: ``wait`` returns when it exits.
    ``wall`` is the clock of ``status.json`` and ``lease.json``; ``group_of`` finds a pid's process group.
    ``launch_id`` is the Airflow launch it runs for (CKPT_LAUNCH_ID: superseded by a newer one in
    spec/last.json); without one it names its supervisors/ record with an id of its own. ``adopt_epoch``: the
    launch's driver of that epoch still runs though its supervisor was lost (the supervision service's takeover):
    watch it (launcher/adoption.py) before starting any, and restart it as usual once it ends.
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
        adopt_epoch: int | None = None,
        standby: bool = False,
    ) -> None:
        self.spec = spec
        self._resume = replace(spec, config=replace(spec.config, restore=LATEST_STATE))  # every start after the first
        # a warm standby beside the running driver (launcher/spare.py), promoted at a restart: client mode only
        self.spare = Spare(spec.config.job, spawn) if standby else None
        self.adopt_epoch = adopt_epoch
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
        self.reports = SupervisorReports(spec.config.job, store, launch_id=launch_id, poll=poll, grace=grace,
                                         wall=wall, runs_here=self._runs_here)
        self._reads = ReadableAgain()  # of status.json, on the supervisor's clock

    @property
    def job(self) -> str:
        return self.spec.config.job

    @property
    def record_id(self) -> str:
        """The id of its supervisors/ record: the launch's, or one of its own (a plain `ckpt run --supervise`)."""
        return self.reports.record_id

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
        resume = self._resume
        adopt = self.adopt_epoch is not None  # the first driver is the running one, watched
        adopting = self._lost_supervisor() if adopt else None
        if adopting is not None:  # the lost supervisor's attempts go on: its driver runs are not named twice
            attempts = max(adopting.attempt - 1, 0)
        self.reports.beat(SupervisorState.WATCHING)
        if self.reports.refused:  # a driver with the same credentials would be refused too: none is started
            return self._end(Ending.DENIED, 0, None, "the job store refused the supervisor's credentials: no driver "
                             "started; fix the access key, secret or permissions (a restart does not) and launch "
                             "again")
        while True:
            attempts += 1
            self.reports.attempt = attempts
            adopted = self._adopt(attempts, adopting) if adopt else None
            adopt = False
            driver = adopted or self._run_driver(resume if self._ran else self.spec, attempts)
            code = driver.code
            ending = self._ending(code, driver) or self._refused() or self._taken_over(driver)
            if ending is not None:
                return self._end(ending[0], attempts, code, ending[1])
            failure = driver.stuck or f"driver exited with code {code} ({exit_meaning(code)})"
            delay, why_not = self._restart_delay(restart_times, driver.ran)
            if delay is None:
                return self._give_up(attempts, code, f"{why_not}; last failure: {failure}")
            blocked = self._blocked()  # before claiming the restart in status.json
            if blocked is not None:
                return self._end(blocked[0], attempts, code, blocked[1])
            self.reports.announce_restart(driver, attempts, delay, describe_strategy(self.strategy))
            self._wait_delay(delay)
            if self._stop_requests:
                self.reports.stopped_while_restarting()
                return self._end(Ending.STOPPED, attempts, code, "stop requested before the restart")
            blocked = self._blocked()  # a refusal seen by the supervisor's heartbeats during the delay, a new launch
            if blocked is not None:
                return self._end(blocked[0], attempts, code, blocked[1])
            restart_times.append(self.clock())

    # -- one owner per restart: RESTARTING in status.json, the supervisor's own heartbeat ----------------

    def _wait_delay(self, delay: float) -> None:
        """Sleep ``delay`` in polls, refreshing the supervisor record between them; a stop cuts it short."""
        left = delay
        while left > 0 and not self._stop_requests:
            step = min(self.poll, left)
            self.sleep(step)
            left -= step
            if left > 0:
                self.reports.beat(SupervisorState.RESTARTING)

    def _ending(self, code: int, driver: DriverRun) -> tuple[Ending, str] | None:
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

    def _blocked(self) -> tuple[Ending, str] | None:
        """Why not to restart now: the store refuses our credentials, or a newer launch superseded this one."""
        refused = self._refused()
        if refused is not None:
            return refused
        superseded = self._superseded()
        return (Ending.FENCED, superseded) if superseded else None

    def _refused(self) -> tuple[Ending, str] | None:
        """DENIED if the store refuses the supervisor's credentials now (its last request): not restarting."""
        if not self.reports.refused:
            return None
        return Ending.DENIED, ("the job store refuses the supervisor's credentials: not restarting the driver (a "
                               "new one could not be watched, nor start with the same credentials); fix the access "
                               "key, secret or permissions and launch again")

    def _taken_over(self, driver: DriverRun) -> tuple[Ending, str] | None:
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

    def _run_driver(self, spec: SubmitSpec, attempt: int) -> DriverRun:
        """Start one driver and wait for it: its exit code, why it was killed, seconds it ran."""
        cluster = self.spec.deploy_mode == "cluster"
        # in cluster mode the driver records how it ended (spark-submit's exit code says nothing of it there)
        run = f"{self.reports.record_id}-{attempt}" if cluster and self.store is not None else None
        argv, env = driver_command(replace(spec, driver_run=run) if run else spec)  # spark-submit or SparkApplication
        baseline = self._lease_epoch() if cluster else None
        started, started_wall = self.clock(), self.wall()
        promoted = self.spare.promote() if self.spare is not None and self._ran else None
        self.reports.standby = None  # promoted, or stopped for not being ready: the next is started once it runs
        proc = self._proc = promoted or self.spawn(argv, env, driver_cwd(spec))
        if self._stop_requests:  # a stop that came while it started
            proc.send_signal(signal.SIGTERM)
        log.info("job %s: driver pid %d %s (attempt %d, restore %s)", self.job, proc.pid,
                 "is the standby, given the go" if promoted else "started", attempt, spec.config.restore)
        driver = DriverRun(proc, started, started_wall, baseline)
        try:
            driver.code, driver.stuck = self._watch(driver)
        finally:
            self._proc = None
        driver.ran = self.clock() - started
        if run is not None and not driver.stuck:
            driver.code = self._driver_word(run, driver)
        if driver.code not in (EXIT_STOPPED, EXIT_FENCED):
            self._observe(driver)  # its last words: the reason of a FAILED status, the batch it reached
        log.info("job %s: driver exited with code %d after %.1f s (%s)", self.job, driver.code, driver.ran,
                 exit_meaning(driver.code))
        return driver

    def _lost_supervisor(self) -> SupervisorRecord | None:
        """The record of the supervisor this one replaces (the same launch), read before this one overwrites it."""
        if self.store is None or self.launch_id is None:
            return None
        try:
            return read_supervisor(self.store, self.launch_id)
        except StorageError as err:
            log.warning("job %s: cannot read the lost supervisor's record: %s", self.job, err)
            return None

    def _adopt(self, attempt: int, lost: SupervisorRecord | None) -> DriverRun | None:
        """Watch the running driver of ``adopt_epoch`` until it ends (None when it no longer runs: start one)."""
        assert self.store is not None  # the service adopts only with the job store
        assert self.adopt_epoch is not None
        self._ran = True  # a driver of this launch ran: whatever starts next resumes from latest-state
        try:
            status = read_status(self.store)
        except StorageError as err:
            self.reports.store_failed("cannot read status.json to adopt the running driver", err)
            status = None
        live = status is not None and status.epoch == self.adopt_epoch and driver_live(
            status, self.wall(), host=self._host, pid_alive=self._runs_here)
        if status is None or not live:
            log.warning("job %s: the driver of epoch %d to adopt no longer runs: starting one (restore latest-state)",
                        self.job, self.adopt_epoch)
            return None
        # in cluster mode its end record is named as the lost supervisor named its run
        run = f"{self.record_id}-{lost.attempt}" if self.spec.deploy_mode == "cluster" and lost is not None else None
        proc = AdoptedDriver(self.store, status, host=self._host, group_of=self.group_of, poll=self.poll,
                             wall=self.wall, clock=self.clock, sleep=self.sleep, run=run)
        log.info("job %s: adopted the running driver of epoch %d (pid %s on %s, attempt %d) whose supervisor was lost: "
                 "watching it; restarts resume from latest-state", self.job, status.epoch, status.pid, status.host,
                 attempt)
        driver = DriverRun(proc, self.clock(), status.started_at, None, epoch=status.epoch, running=True,
                           batch_id=status.batch_id)
        self.reports.epoch = status.epoch  # in its record: an owner that loses this supervisor too adopts again
        self._proc = proc
        try:
            driver.code, driver.stuck = self._watch(driver)
        finally:
            self._proc = None
        driver.ran = self.clock() - driver.started
        if run is not None:
            release(replace(self.spec, driver_run=run))  # its SparkApplication, whose holder was lost: deleted
        if driver.code not in (EXIT_STOPPED, EXIT_FENCED):
            self._observe(driver)
        log.info("job %s: the adopted driver of epoch %d ended with code %d after %.1f s watched (%s)", self.job,
                 status.epoch, driver.code, driver.ran, exit_meaning(driver.code))
        return driver

    def _driver_word(self, run: str, driver: DriverRun) -> int:
        """A cluster-mode driver's exit code, which spark-submit's does not carry (0 however a Kubernetes driver
        pod ends, SPARK-26365; 1 for any failed YARN application master): the end record the driver wrote as it
        exited (core/records/supervision.py DriverEnd); without one, STOPPED if its own last status says so, else
        a failure: the driver died without a word (its pod or container lost, a kill -9)."""
        assert self.store is not None  # a run is named only with a store
        try:
            end = take_driver_end(self.store, run)
        except StorageError as err:
            self.reports.store_failed(f"cannot read the end record of driver run {run}", err)
            end = None
        if end is not None:
            return end.code
        status = self._observe(driver)
        if status is not None and self._own(driver, status) and status.state is JobState.STOPPED:
            return EXIT_STOPPED
        log.warning("job %s: driver run %s ended without recording how (spark-submit exited with %d): taken for a "
                    "failure (its pod or container lost)", self.job, run, driver.code)
        return EXIT_FAILED

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

    def _watch(self, driver: DriverRun) -> tuple[int, str]:
        proc = driver.proc
        progress = _Progress(since=driver.started)
        self.reports.interval = timeout = self.poll
        self.reports.beat(SupervisorState.WATCHING, proc=proc)
        look_at = self.clock()  # the next heartbeat and read of status.json: every reports.interval
        while True:
            try:
                return proc.wait(timeout=timeout), ""
            except subprocess.TimeoutExpired:
                pass
            if driver.running and self.spare is not None and self._stop_at is None:
                self._keep_spare(proc)  # a spare that died is replaced within a poll
            if self._stop_at is None and self.clock() < look_at:
                continue
            self.reports.beat(SupervisorState.WATCHING, proc=proc)
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
            look_at = self.clock() + self.reports.interval - self.poll / 2  # the waits come in polls
            if stuck:
                log.warning("job %s: %s: terminating driver pid %d", self.job, stuck, proc.pid)
                return self._terminate(proc), stuck

    def _observe(self, driver: DriverRun) -> JobStatus | None:
        """status.json now, noting the epoch, the batch and a RUNNING state when our driver wrote it; a read
        that fails is remembered: heartbeats are not judged right after an outage (``_reads``)."""
        if self.store is None:
            return None
        try:
            status = read_status(self.store)
        except StorageError as err:
            self.reports.store_failed("cannot read status.json, progress not judged meanwhile", err)
            self._reads.failed()
            return None
        self.reports.store_ok()
        self._reads.worked(self.clock())  # between two reads the supervisor's own heartbeat write retries too
        if status is not None and self._own(driver, status):
            driver.epoch = self.reports.epoch = status.epoch
            driver.batch_id, driver.reason = status.batch_id, status.reason
            if status.state is JobState.RUNNING and not driver.running:
                driver.running = self._ran = True
                self.reports.cold_start = self.clock() - driver.started
                # From now on every RUNNING_PACE of the driver's heartbeats (a dead driver is noticed at once all the
                # same: wait() returns when it exits): its record says so before the first longer wait (scale.md).
                self.reports.interval = max(self.poll, RUNNING_PACE * status.heartbeat_interval)
                log.info("job %s: driver pid %d runs the job at epoch %d: restarts resume from latest-state",
                         self.job, driver.proc.pid, status.epoch)
                if self.spare is not None:
                    self._keep_spare(driver.proc)  # once the running driver runs: the two JVMs never start at once
                # its record names the running driver's epoch at once: an owner that loses this supervisor adopts it
                self.reports.beat(SupervisorState.WATCHING, proc=driver.proc)
        return status

    def _own(self, driver: DriverRun, status: JobStatus) -> bool:
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

    def _stuck(self, driver: DriverRun, progress: _Progress, status: JobStatus | None) -> str:
        """Why the running driver counts as stuck (its heartbeat stopped, or the health rule), or ""."""
        if status is None:
            return ""
        wall = self.wall()
        # RUNNING only: a driver STOPPING with a savepoint sends no heartbeat while it takes the final one
        if driver.running and status.state is JobState.RUNNING and status.epoch == driver.epoch \
                and not driver_live(status, wall):
            if self._reads.within(self.clock(), heartbeat_limit(status)):
                # The driver could not write while we could not read: give it a whole limit to report again,
                # counted from when we could read again.
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
            self.reports.beat(SupervisorState.WATCHING, proc=proc)

    def _keep_spare(self, proc: ProcessLike) -> None:
        """Start a standby beside the running driver ``proc`` unless one runs (launcher/spare.py); the supervisor's
        record says at once when the standby starts, is ready or is gone."""
        assert self.spare is not None
        if self.spare.needed():  # its command is built only then: _watch asks every poll
            argv, env = driver_command(self._resume)
            self.spare.start(argv, env, driver_cwd(self._resume))
        seen = self.spare.seen()
        if seen != self.reports.standby:
            self.reports.standby = seen
            self.reports.beat(SupervisorState.WATCHING, proc=proc)

    def _give_up(self, attempts: int, code: int, reason: str) -> SupervisorOutcome:
        if self.spare is not None:
            self.spare.stop()
            self.reports.standby = None
        log.error("job %s: giving up: %s", self.job, reason)
        self.reports.failed(reason)
        self.reports.ended(Ending.GAVE_UP.value, code, reason)
        return SupervisorOutcome(Ending.GAVE_UP, attempts, attempts - 1, code, reason)

    def _end(self, final: Ending, attempts: int, code: int | None, reason: str) -> SupervisorOutcome:
        """``code``: the last driver's exit code, None when no driver was started."""
        if self.spare is not None:
            self.spare.stop()
            self.reports.standby = None
        (log.error if final is Ending.DENIED else log.info)("job %s: %s: %s", self.job, final.value, reason)
        self.reports.ended(final.value, code, reason)
        return SupervisorOutcome(final, attempts, max(0, attempts - 1), code, reason)
