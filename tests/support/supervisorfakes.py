"""The supervisor's unit tests share fake driver processes on a fake clock: ``wait`` advances it, so no test
sleeps; the fake clock is also the wall clock of status.json and lease.json. The Python driver of fake process
``100 + i`` has pid ``5000 + i`` (``group_of``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_ckpt_provider.core.policy.restart import RestartStrategy
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.jobstore import LEASE, STATUS, JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Supervisor, SupervisorOutcome

START = 1000.0
HOST = socket.gethostname()
OTHER_PID = 999  # a process of this host outside our drivers' groups


class FakeClock:
    def __init__(self) -> None:
        self.now = START
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Run:
    """A scripted driver: exits with ``code`` after ``runs_for`` seconds (None: runs until killed); on
    SIGTERM exits with ``term_code`` (None: ignores it); ``tick`` is called on every wait."""

    code: int = 0
    runs_for: float | None = 10.0
    term_code: int | None = None
    tick: Callable[[FakeProcess], None] | None = None


@dataclass
class FakeProcess:
    clock: FakeClock
    run: Run
    pid: int
    started: float
    signals: list[int] = field(default_factory=list)
    returncode: int | None = None
    ended: float | None = None

    def poll(self) -> int | None:
        return self.returncode

    def _exit(self, code: int) -> int:
        self.returncode, self.ended = code, self.clock.now
        return code

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if self.run.tick is not None:
            self.run.tick(self)
            if self.returncode is not None:
                return self.returncode
        end = None if self.run.runs_for is None else self.started + self.run.runs_for
        if end is not None and (timeout is None or self.clock.now + timeout >= end):
            self.clock.now = max(self.clock.now, end)
            return self._exit(self.run.code)
        if timeout is None:
            raise AssertionError("wait() without timeout on a driver that never exits")
        self.clock.now += timeout
        raise subprocess.TimeoutExpired("spark-submit", timeout)

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.returncode is None and sig == signal.SIGKILL:
            self._exit(-signal.SIGKILL)
        elif self.returncode is None and sig == signal.SIGTERM and self.run.term_code is not None:
            self._exit(self.run.term_code)


class Spawner:
    """The process factory: hands out the scripted runs in order and records every command."""

    def __init__(self, clock: FakeClock, runs: list[Run]) -> None:
        self.clock, self.runs = clock, list(runs)
        self.argvs: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.procs: list[FakeProcess] = []

    def __call__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> FakeProcess:
        self.argvs.append(argv)
        self.envs.append(env)
        proc = FakeProcess(self.clock, self.runs.pop(0), 100 + len(self.procs), self.clock.now)
        self.procs.append(proc)
        return proc

    @property
    def restores(self) -> list[str]:
        return [argv[argv.index("--restore") + 1] for argv in self.argvs]


def group_of(pid: int) -> int | None:
    """The process group of a pid: 5000 + i runs in the group of fake driver 100 + i; others are gone."""
    if 5000 <= pid < 5100:
        return pid - 4900
    return OTHER_PID if pid == OTHER_PID else None


def supervise(
    spec: SubmitSpec, clock: FakeClock, runs: list[Run], strategy: RestartStrategy, **kw: object
) -> tuple[SupervisorOutcome, Spawner]:
    spawner = Spawner(clock, runs)
    kw = {"wall": clock, "group_of": group_of, **kw}
    # ignore[arg-type] below: kw holds Supervisor keywords of their own types
    sup = Supervisor(spec, strategy, clock=clock, sleep=clock.sleep, spawn=spawner, **kw)  # type: ignore[arg-type]
    outcome = sup.run()
    assert spawner.runs == []  # every scripted run was used, no more
    return outcome, spawner


def running(batch_id: int, *, data_waiting: bool = True, epoch: int = 4, pid: int | None = None) -> JobStatus:
    now = time.time()
    return JobStatus("orders", JobState.RUNNING, epoch, now, now, batch_id=batch_id, data_waiting=data_waiting,
                     pid=pid, host=HOST)


def put_status(store: JobStore, state: JobState, epoch: int, at: float, *, pid: int | None = None,
               host: str = HOST) -> None:
    """status.json as a driver writes it (bypassing write_status's epoch check: any world can be set up)."""
    store.storage.write(STATUS, JobStatus("orders", state, epoch, at, at, pid=pid, host=host).to_bytes())


def put_lease(store: JobStore, epoch: int, at: float, *, owner: str = "host-b:77:abcd", released: bool = False) -> None:
    lease = LeaseRecord(job="orders", epoch=epoch, owner=owner, host="host-b", pid=77, acquired_at=at,
                        released=released)
    store.storage.write(LEASE, lease.to_bytes())


def reports(store: JobStore, state: JobState = JobState.RUNNING, *, epoch: int = 4, pid: int = 5000,
            once: bool = False) -> Callable[[FakeProcess], None]:
    """A tick: the Python driver ``pid`` writes ``state`` at ``epoch`` (``once``: only at its start)."""

    def tick(proc: FakeProcess) -> None:
        if not once or proc.clock.now == proc.started:
            put_status(store, state, epoch, proc.clock.now, pid=pid)

    return tick
