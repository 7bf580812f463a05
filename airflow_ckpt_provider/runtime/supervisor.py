"""Keeps a job alive the way Flink does: restart its driver after a failure, as a restart strategy allows.

The first run restores what the user chose; every restart resumes from the latest completed state. Exit
codes 2 (bad input) and 3 (fenced) end supervision at once: restarting cannot help, or would compete
with the newer driver. While a driver runs, ``status.json`` shows whether batches still complete; a
driver without progress while data waits is killed and restarted like a failed one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.restart import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    Health,
    HealthRule,
    RestartStrategy,
)
from airflow_ckpt_provider.core.status import JobState, JobStatus, read_status, write_status
from airflow_ckpt_provider.runtime.config import RestoreMode
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_STOPPED,
    exit_meaning,
)
from airflow_ckpt_provider.runtime.submit import LAUNCH_PY, SubmitSpec, build_command

log = logging.getLogger(__name__)


class Ending(StrEnum):
    """How supervision ended; ``exit_code`` is what ``ckpt run --supervise`` returns for it."""

    STOPPED = "stopped"
    FENCED = "fenced"
    CONFIG_ERROR = "config-error"
    GAVE_UP = "gave-up"

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {Ending.STOPPED: EXIT_STOPPED, Ending.GAVE_UP: EXIT_FAILED, Ending.CONFIG_ERROR: EXIT_CONFIG,
               Ending.FENCED: EXIT_FENCED}


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


class ProcessLike(Protocol):
    """A started driver; ``wait`` raises ``subprocess.TimeoutExpired`` while it still runs."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None:
        """SIGTERM asks the driver to stop (cancel); SIGKILL ends its whole process group."""


Spawn = Callable[[list[str], dict[str, str]], ProcessLike]


class DriverProcess:
    """spark-submit in a session of its own: its JVM, the Python driver and the Python workers form one group.

    SIGTERM goes to the Python driver alone when it runs here (client mode): sent to the JVM too, the JVM's
    shutdown hook would stop the SparkContext under the driver while it cancels the query. Other signals,
    and SIGTERM in cluster mode (no local Python driver), go to the whole group.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is not None:
            return  # reaped: its pid, and so the group id, may belong to another process by now
        target = _python_driver(self._popen.pid) if sig == signal.SIGTERM else None
        with contextlib.suppress(ProcessLookupError):
            if target is not None:
                os.kill(target, sig)
            else:
                os.killpg(self._popen.pid, sig)


def _python_driver(pgid: int) -> int | None:
    """The pid of the process in group ``pgid`` that runs launch.py, or None (not found, or no /proc)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    launch = str(LAUNCH_PY).encode()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            if group == pgid and launch in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return None


def spawn_driver(argv: list[str], env: dict[str, str]) -> DriverProcess:
    """Start ``argv`` with ``env`` added to the inherited environment, as a process group leader."""
    return DriverProcess(subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True))


def describe_strategy(strategy: RestartStrategy) -> str:
    """The strategy in Flink's words, for logs."""
    if isinstance(strategy, FixedDelay):
        return f"fixed-delay: {strategy.attempts} attempts, {strategy.delay:g} s apart"
    if isinstance(strategy, FailureRate):
        return (f"failure-rate: at most {strategy.max_failures} failures within {strategy.interval:g} s, "
                f"{strategy.delay:g} s apart")
    if isinstance(strategy, ExponentialDelay):
        bound = "unbounded" if strategy.attempts is None else f"{strategy.attempts} attempts"
        return f"exponential-delay: {strategy.initial:g} s to {strategy.max_delay:g} s backoff, {bound}"
    return type(strategy).__name__


@dataclass
class _Progress:
    """The batch id last seen in status.json and when it last changed (supervisor clock)."""

    since: float
    batch_id: int | None = None
    seen: bool = False


class Supervisor:
    """Runs a job's driver until it stops, is fenced, has bad input, or the strategy gives up.

    ``poll`` is the seconds between reads of status.json; ``grace`` the seconds a stuck driver gets
    between SIGTERM and SIGKILL. A dead driver is noticed at once: ``wait`` returns when it exits.
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
    ) -> None:
        self.spec = spec
        self.strategy = strategy
        self.health = health
        self.store = store
        self.poll = poll
        self.grace = grace
        self.clock = clock
        self._stopping = threading.Event()
        self.sleep = sleep or self._stopping.wait  # a stop request cuts the restart delay short
        self.spawn = spawn
        self._stop_requests = 0
        self._proc: ProcessLike | None = None

    @property
    def job(self) -> str:
        return self.spec.config.job

    def request_stop(self) -> None:
        """Stop without restarting: SIGTERM to the driver, which cancels its query (SIGKILL on a second request).

        Safe in a signal handler; the CLI installs it for SIGTERM and SIGINT.
        """
        self._stop_requests += 1
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM if self._stop_requests == 1 else signal.SIGKILL)

    def run(self) -> SupervisorOutcome:
        attempts = 0
        restart_times: list[float] = []
        resume = replace(self.spec, config=replace(self.spec.config, restore=RestoreMode.LATEST_STATE.value))
        while True:
            attempts += 1
            code, stuck, ran = self._run_driver(self.spec if attempts == 1 else resume, attempts)
            ending = self._ending(code, stuck)
            if ending is not None:
                return self._end(ending[0], attempts, code, ending[1])
            failure = stuck or f"driver exited with code {code} ({exit_meaning(code)})"
            delay, why_not = self._restart_delay(restart_times, ran)
            if delay is None:
                return self._give_up(attempts, code, f"{why_not}; last failure: {failure}")
            log.warning("job %s: restarting in %.1f s (strategy %s; restart %d)", self.job, delay,
                        describe_strategy(self.strategy), self.strategy.restarts)
            self.sleep(delay)
            if self._stop_requests:
                return self._end(Ending.STOPPED, attempts, code, "stop requested before the restart")
            restart_times.append(self.clock())

    def _ending(self, code: int, stuck: str) -> tuple[Ending, str] | None:
        """How supervision ends after a driver exited with ``code``, or None: a failure to restart."""
        if self._stop_requests:
            return Ending.STOPPED, f"stop requested; driver exited with code {code}"
        if code == EXIT_CONFIG:
            return Ending.CONFIG_ERROR, "driver exited with code 2 (bad input): a restart would fail again; see its log"
        if code == EXIT_FENCED:
            return Ending.FENCED, "a newer driver took the job's lease and runs the job: not restarting"
        if code == EXIT_STOPPED and not stuck:
            return Ending.STOPPED, "driver stopped"
        return None

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

    def _run_driver(self, spec: SubmitSpec, attempt: int) -> tuple[int, str, float]:
        """Start one driver and wait for it: its exit code, why it was killed ("" if not), seconds it ran."""
        argv, env = build_command(spec)
        started = self.clock()
        proc = self._proc = self.spawn(argv, env)
        if self._stop_requests:  # a stop that came while it started
            proc.send_signal(signal.SIGTERM)
        log.info("job %s: driver pid %d started (attempt %d, restore %s)", self.job, proc.pid, attempt,
                 spec.config.restore)
        try:
            code, stuck = self._watch(proc, started)
        finally:
            self._proc = None
        ran = self.clock() - started
        log.info("job %s: driver exited with code %d after %.1f s (%s)", self.job, code, ran, exit_meaning(code))
        return code, stuck, ran

    def _watch(self, proc: ProcessLike, started: float) -> tuple[int, str]:
        progress = _Progress(since=started)
        while True:
            try:
                return proc.wait(timeout=self.poll), ""
            except subprocess.TimeoutExpired:
                pass
            if self._stop_requests:
                continue  # the driver got SIGTERM: let it finish its stop
            stuck = self._stuck(progress)
            if stuck:
                log.warning("job %s: %s: terminating driver pid %d", self.job, stuck, proc.pid)
                return self._terminate(proc), stuck

    def _stuck(self, progress: _Progress) -> str:
        """Why the running driver counts as stuck (health rule on status.json), or ""."""
        if self.store is None or self.health is None or self.health.progress_timeout is None:
            return ""
        try:
            status = read_status(self.store)
        except StorageError as err:
            log.warning("job %s: cannot read status.json, progress not judged this time: %s", self.job, err)
            return ""
        if status is None or status.state is not JobState.RUNNING:
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
        try:
            return proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            log.warning("job %s: driver pid %d still runs %.0f s after SIGTERM: SIGKILL", self.job, proc.pid,
                        self.grace)
            proc.send_signal(signal.SIGKILL)
            return proc.wait()

    def _give_up(self, attempts: int, code: int, reason: str) -> SupervisorOutcome:
        log.error("job %s: giving up: %s", self.job, reason)
        if self.store is not None:
            try:
                now = time.time()
                last = read_status(self.store)
                status = (replace(last, state=JobState.FAILED, reason=reason, updated_at=now, data_waiting=False)
                          if last else JobStatus(self.job, JobState.FAILED, 0, now, now, reason=reason))
                write_status(self.store, status)
            except StorageError as err:
                log.warning("job %s: cannot record FAILED in status.json: %s", self.job, err)
        return SupervisorOutcome(Ending.GAVE_UP, attempts, attempts - 1, code, reason)

    def _end(self, final: Ending, attempts: int, code: int, reason: str) -> SupervisorOutcome:
        log.info("job %s: %s: %s", self.job, final.value, reason)
        return SupervisorOutcome(final, attempts, attempts - 1, code, reason)
