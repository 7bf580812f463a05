"""The supervisor: restarts, latest-state once a driver ran, stop on 0/2/3 or a newer driver, giving up,
killing a stuck or stopping driver.

Fake driver processes run on a fake clock: ``wait`` advances it, so no test sleeps; the fake clock is also
the wall clock of status.json and lease.json. The Python driver of fake process ``100 + i`` has pid
``5000 + i`` (``group_of``). Tests at the end start real (tiny, Spark-less) processes to check the process
group and the immediate detection of exits.
"""

from __future__ import annotations

import logging
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.jobstore import LEASE, STATUS, JobStore
from airflow_ckpt_provider.core.lease import LeaseRecord
from airflow_ckpt_provider.core.restart import ExponentialDelay, FailureRate, FixedDelay, HealthRule, RestartStrategy
from airflow_ckpt_provider.core.status import JobState, JobStatus, read_status, write_status
from airflow_ckpt_provider.launcher.submit import ENTRYPOINT_PY, SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, Supervisor, SupervisorOutcome
from airflow_ckpt_provider.runtime.config import RuntimeConfig

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

    def __call__(self, argv: list[str], env: dict[str, str]) -> FakeProcess:
        self.argvs.append(argv)
        self.envs.append(env)
        proc = FakeProcess(self.clock, self.runs.pop(0), 100 + len(self.procs), self.clock.now)
        self.procs.append(proc)
        return proc

    @property
    def restores(self) -> list[str]:
        return [argv[argv.index("--restore") + 1] for argv in self.argvs]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore.open(str(tmp_path / "store"), "orders")


@pytest.fixture
def spec(tmp_path: Path) -> SubmitSpec:
    job_file = tmp_path / "count.py"
    job_file.write_text("# a job\n")
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "ckpt"),
                           restore="latest-savepoint")
    return SubmitSpec(job_file=str(job_file), config=config, spark_submit="/opt/spark/bin/spark-submit")


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


def test_restarts_after_the_strategy_delays_from_latest_state(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.launcher.supervisor")
    strategy = FixedDelay(attempts=3, delay=5.0, clock=clock)
    runs = [Run(1, tick=reports(store)), Run(-9), Run(137), Run(0)]
    outcome, spawner = supervise(spec, clock, runs, strategy, store=store)
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=4, restarts=3, exit_code=0, reason="driver stopped")
    assert clock.sleeps == [5.0, 5.0, 5.0]
    assert spawner.restores == ["latest-savepoint", "latest-state", "latest-state", "latest-state"]
    assert [p.started for p in spawner.procs] == [START, START + 15, START + 30, START + 45]
    assert strategy.restarts == 3
    restarting = "job orders: restarting in 5.0 s (strategy fixed-delay: 3 attempts, 5 s apart; restart {})"
    assert caplog.messages == [
        "job orders: driver pid 100 started (attempt 1, restore latest-savepoint)",
        "job orders: driver pid 100 runs the job at epoch 4: restarts resume from latest-state",
        "job orders: driver exited with code 1 after 10.0 s (failed)",
        restarting.format(1),
        "job orders: driver pid 101 started (attempt 2, restore latest-state)",
        "job orders: driver exited with code -9 after 10.0 s (signal 9)",
        restarting.format(2),
        "job orders: driver pid 102 started (attempt 3, restore latest-state)",
        "job orders: driver exited with code 137 after 10.0 s "
        "(failed: 128+9, the Python driver likely died of signal 9)",
        restarting.format(3),
        "job orders: driver pid 103 started (attempt 4, restore latest-state)",
        "job orders: driver exited with code 0 after 10.0 s (stopped)",
        "job orders: stopped: driver stopped",
    ]


def test_exponential_delay_backs_off(spec: SubmitSpec, clock: FakeClock) -> None:
    strategy = ExponentialDelay(jitter=0.0, clock=clock)
    outcome, _ = supervise(spec, clock, [Run(1, runs_for=2.0)] * 4 + [Run(0)], strategy)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 5, 4)
    assert clock.sleeps == [1.0, 1.5, 2.25, 3.375]


@pytest.mark.parametrize(
    ("code", "final", "reason"),
    [
        (0, Ending.STOPPED, "driver stopped"),
        (2, Ending.CONFIG_ERROR, "driver exited with code 2 (bad input): a restart would fail again; see its log"),
        (3, Ending.FENCED, "a newer driver took the job's lease and runs the job: not restarting"),
    ],
)
def test_no_restart_after_stop_bad_input_or_fencing(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, code: int, final: Ending, reason: str
) -> None:
    outcome, spawner = supervise(spec, clock, [Run(code)], FixedDelay(attempts=5, clock=clock), store=store)
    assert outcome == SupervisorOutcome(final, attempts=1, restarts=0, exit_code=code, reason=reason)
    assert final.exit_code == code
    assert clock.sleeps == []
    assert spawner.restores == ["latest-savepoint"]
    assert read_status(store) is None  # the supervisor writes FAILED only when it gives up


def test_gives_up_when_failure_rate_is_exceeded(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    write_status(store, running(41))
    strategy = FailureRate(max_failures=2, interval=60.0, delay=1.0, clock=clock)
    outcome, spawner = supervise(spec, clock, [Run(1, runs_for=5.0)] * 3, strategy, store=store)
    reason = ("restart strategy exhausted (failure-rate: at most 2 failures within 60 s, 1 s apart) after 2 restarts; "
              "last failure: driver exited with code 1 (failed)")
    assert outcome == SupervisorOutcome(Ending.GAVE_UP, attempts=3, restarts=2, exit_code=1, reason=reason)
    assert outcome.final.exit_code == 1
    assert f"job orders: giving up: {reason}" in caplog.messages
    assert clock.sleeps == [1.0, 1.0]
    assert len(spawner.procs) == 3
    status = read_status(store)
    assert status is not None
    assert (status.state, status.reason, status.epoch, status.batch_id) == (JobState.FAILED, reason, 4, 41)


def test_failures_spread_beyond_the_interval_keep_restarting(spec: SubmitSpec, clock: FakeClock) -> None:
    strategy = FailureRate(max_failures=1, interval=60.0, delay=1.0, clock=clock)
    outcome, _ = supervise(spec, clock, [Run(1, runs_for=100.0)] * 3 + [Run(0)], strategy)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 4, 3)


def test_gives_up_when_the_health_rule_finds_too_many_restarts(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    health = HealthRule(max_restarts=2, window=600.0, progress_timeout=None)
    strategy = ExponentialDelay(jitter=0.0, clock=clock)
    outcome, _ = supervise(spec, clock, [Run(1, runs_for=3.0)] * 3, strategy, health=health, store=store)
    reason = "unhealthy: 2 restarts within 600 s (limit 2); last failure: driver exited with code 1 (failed)"
    assert outcome == SupervisorOutcome(Ending.GAVE_UP, attempts=3, restarts=2, exit_code=1, reason=reason)
    assert clock.sleeps == [1.0, 1.5]
    status = read_status(store)
    assert status is not None
    assert (status.state, status.reason, status.epoch) == (JobState.FAILED, reason, 0)


def test_restarts_outside_the_health_window_do_not_count(spec: SubmitSpec, clock: FakeClock) -> None:
    health = HealthRule(max_restarts=2, window=600.0, progress_timeout=None)
    strategy = FixedDelay(attempts=10, delay=1.0, clock=clock)
    outcome, _ = supervise(spec, clock, [Run(1, runs_for=400.0)] * 4 + [Run(0)], strategy, health=health)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 5, 4)


@pytest.mark.parametrize(("term_code", "signals", "killed_at"),
                         [(None, [signal.SIGTERM, signal.SIGKILL], 40.0), (0, [signal.SIGTERM], 30.0)])
def test_a_driver_without_progress_while_data_waits_is_killed_and_restarted(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, term_code: int | None, signals: list[int], killed_at: float
) -> None:
    def report_once(proc: FakeProcess) -> None:  # the stuck driver's only report: batch 7, data waiting
        if proc.clock.now == START:
            write_status(store, running(7, pid=5000))

    def progress(proc: FakeProcess) -> None:  # the second driver completes a batch every wait
        status = read_status(store)
        assert status is not None
        write_status(store, running((status.batch_id or 0) + 1, pid=5001))

    health = HealthRule(max_restarts=10, window=600.0, progress_timeout=30.0)
    runs = [Run(runs_for=None, term_code=term_code, tick=report_once), Run(0, runs_for=100.0, tick=progress)]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=1, delay=2.0, clock=clock),
                                 health=health, store=store, poll=5.0, grace=10.0, wall=time.time)
    stuck, healthy = spawner.procs
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=2, restarts=1, exit_code=0, reason="driver stopped")
    assert stuck.signals == signals
    assert stuck.ended == START + killed_at  # first look at 5 s, 30 s without a batch, then grace 10 s
    assert healthy.signals == []
    assert spawner.restores == ["latest-savepoint", "latest-state"]


@pytest.mark.parametrize("status_bytes", [running(7, data_waiting=False).to_bytes(), b"{not json"])
def test_no_kill_when_no_data_waits_or_status_unreadable(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, status_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store.storage.write("status.json", status_bytes)
    health = HealthRule(max_restarts=10, window=600.0, progress_timeout=30.0)
    outcome, spawner = supervise(spec, clock, [Run(0, runs_for=200.0)], FixedDelay(clock=clock),
                                 health=health, store=store, poll=5.0)
    assert (outcome.final, outcome.attempts, spawner.procs[0].signals) == (Ending.STOPPED, 1, [])
    if status_bytes.startswith(b"{not"):
        assert "cannot read status.json, progress not judged this time" in caplog.text


def test_stop_request_forwards_sigterm_and_never_restarts(spec: SubmitSpec, clock: FakeClock) -> None:
    holder: list[Supervisor] = []

    def stop_twice(proc: FakeProcess) -> None:
        if clock.now >= START + 10:
            holder[0].request_stop()

    spawner = Spawner(clock, [Run(runs_for=None, tick=stop_twice)])
    sup = Supervisor(spec, FixedDelay(attempts=5, clock=clock), clock=clock, sleep=clock.sleep, spawn=spawner,
                     poll=5.0)
    holder.append(sup)
    outcome = sup.run()
    # the driver ignores the first SIGTERM: the second request sends SIGKILL
    assert spawner.procs[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=1, restarts=0, exit_code=-9,
                                        reason="stop requested; driver exited with code -9")
    assert clock.sleeps == []


def test_stop_request_during_the_restart_delay(spec: SubmitSpec, clock: FakeClock) -> None:
    holder: list[Supervisor] = []
    spawner = Spawner(clock, [Run(1)])
    sup = Supervisor(spec, FixedDelay(attempts=5, delay=30.0, clock=clock), clock=clock,
                     sleep=lambda _s: holder[0].request_stop(), spawn=spawner)
    holder.append(sup)
    assert sup.run() == SupervisorOutcome(Ending.STOPPED, attempts=1, restarts=0, exit_code=1,
                                          reason="stop requested before the restart")


# -- whose status is it: restore on restart, newer drivers, giving up, heartbeats ---------------------


def test_restarts_keep_the_users_restore_until_a_driver_of_ours_reported_running(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.launcher.supervisor")
    runs = [
        Run(1),  # a transient error before restoring: no status at all
        Run(1, tick=reports(store, epoch=3, pid=OTHER_PID)),  # RUNNING, but written by a process not ours
        Run(1, tick=reports(store, JobState.STARTING, epoch=5, pid=5002)),  # ours, but never RUNNING
        Run(1, tick=reports(store, epoch=6, pid=5003)),  # ours, RUNNING
        Run(0),
    ]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=4, delay=1.0, clock=clock), store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 5)
    assert spawner.restores == ["latest-savepoint"] * 4 + ["latest-state"]
    assert [m for m in caplog.messages if "runs the job" in m] == [
        "job orders: driver pid 103 runs the job at epoch 6: restarts resume from latest-state"]
    assert "job orders: driver pid 104 started (attempt 5, restore latest-state)" in caplog.messages


def test_a_newer_driver_with_a_live_status_ends_supervision_as_fenced(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    def fenced(proc: FakeProcess) -> None:  # ours runs at epoch 4; at 5 s a driver elsewhere takes over
        if clock.now == START:
            put_status(store, JobState.RUNNING, 4, clock.now, pid=5000)
        elif clock.now == START + 5:
            put_lease(store, 5, clock.now)
            put_status(store, JobState.RUNNING, 5, clock.now, pid=77, host="host-b")

    runs = [Run(1, tick=fenced)]  # a fenced driver may exit 1 (cluster mode: spark-submit's own code)
    outcome, _ = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert outcome == SupervisorOutcome(Ending.FENCED, attempts=1, restarts=0, exit_code=1,
                                        reason="another driver (owner host-b:77:abcd, epoch 5) runs the job: "
                                               "not restarting")
    assert outcome.final.exit_code == 3
    assert clock.sleeps == []
    status = read_status(store)
    assert status is not None and (status.state, status.epoch) == (JobState.RUNNING, 5)


def test_a_lease_taken_after_ours_started_fences_a_driver_that_never_reported(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    def taken(proc: FakeProcess) -> None:
        put_lease(store, 5, START + 1)
        put_status(store, JobState.STARTING, 5, clock.now, pid=OTHER_PID)  # alive here, not in our group

    outcome, _ = supervise(spec, clock, [Run(1, runs_for=3.0, tick=taken)], FixedDelay(attempts=5, clock=clock),
                           store=store)
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.FENCED, 1, 1)
    assert outcome.reason == "another driver (owner host-b:77:abcd, epoch 5) runs the job: not restarting"


def _lease_then(store: JobStore, *, epoch: int = 5, acquired: float = START + 1, released: bool = False,
                state: JobState = JobState.RUNNING, at: float = START, pid: int = 77, host: str = "host-b",
                lease_bytes: bytes | None = None) -> Callable[[FakeProcess], None]:
    def tick(proc: FakeProcess) -> None:
        if lease_bytes is not None:
            store.storage.write(LEASE, lease_bytes)
        else:
            put_lease(store, epoch, acquired, released=released)
        put_status(store, state, epoch, at, pid=pid, host=host)

    return tick


@pytest.mark.parametrize(
    "world",
    [
        pytest.param({"at": START - 100}, id="its-status-is-stale"),
        pytest.param({"host": HOST, "pid": 4242}, id="it-ran-here-and-is-gone"),
        pytest.param({"released": True}, id="lease-released"),
        pytest.param({"state": JobState.FAILED}, id="it-failed"),
        pytest.param({"acquired": START - 1}, id="lease-taken-before-ours-started"),
        pytest.param({"lease_bytes": b"{not json"}, id="lease-unreadable"),
    ],
)
def test_no_fencing_without_a_newer_live_driver(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture, world: dict[str, object]
) -> None:
    runs = [Run(1, runs_for=3.0, tick=_lease_then(store, **world)), Run(0)]  # type: ignore[arg-type]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 2, 1)
    assert len(spawner.procs) == 2
    if "lease_bytes" in world:
        assert "cannot read the lease or status.json, restarting as usual" in caplog.text


def test_a_driver_of_ours_killed_hard_is_not_mistaken_for_a_newer_one(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    # kill -9: our driver's lease stays taken and its RUNNING status is fresh; it is ours by its epoch
    def ours(proc: FakeProcess) -> None:
        put_lease(store, 4, START + 1)
        put_status(store, JobState.RUNNING, 4, clock.now, pid=5000)

    runs = [Run(-9, runs_for=10.0, tick=ours), Run(0)]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


def test_in_cluster_mode_our_driver_is_known_by_its_epoch(spec: SubmitSpec, clock: FakeClock, store: JobStore) -> None:
    # The driver runs on a cluster host: its pid says nothing here. Ours took the epoch after the lease's
    # before it started (3); it crashed holding the lease with a fresh RUNNING status: not a newer driver.
    put_lease(store, 3, START - 60, released=True)

    def remote(proc: FakeProcess) -> None:
        put_lease(store, 4, START + 1)
        put_status(store, JobState.RUNNING, 4, clock.now, pid=77, host="host-b")

    cluster = replace(spec, master="yarn", deploy_mode="cluster")
    outcome, spawner = supervise(cluster, clock, [Run(1, tick=remote), Run(0)], FixedDelay(attempts=5, clock=clock),
                                 store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        # ours reported epoch 4 and died holding the lease: FAILED recorded at its epoch
        (lambda store: _lease_then(store, epoch=4, acquired=START, at=START, pid=5000, host=HOST), (4, True)),
        # a driver not ours holds the lease at epoch 9 and reports: left alone
        (lambda store: _lease_then(store, epoch=9, acquired=START - 60, at=START - 60), (9, False)),
        # that driver released the lease (stopped): nobody owns the job, FAILED recorded
        (lambda store: _lease_then(store, epoch=9, acquired=START - 60, released=True, state=JobState.STOPPED),
         (9, True)),
    ],
    ids=["ours", "another-drivers", "released"],
)
def test_giving_up_records_failed_only_over_a_status_no_other_driver_owns(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture,
    tick: Callable[[JobStore], Callable[[FakeProcess], None]], expected: tuple[int, bool],
) -> None:
    outcome, _ = supervise(spec, clock, [Run(1, tick=tick(store))], FixedDelay(attempts=0, clock=clock),
                           store=store)
    reason = "restart strategy exhausted (fixed-delay: 0 attempts, 1 s apart) after 0 restarts; " \
             "last failure: driver exited with code 1 (failed)"
    assert outcome == SupervisorOutcome(Ending.GAVE_UP, attempts=1, restarts=0, exit_code=1, reason=reason)
    status = read_status(store)
    assert status is not None
    epoch, recorded = expected
    assert status.epoch == epoch
    assert (status.state is JobState.FAILED, status.reason == reason) == (recorded, recorded)
    left_alone = "job orders: another driver (owner host-b:77:abcd, epoch 9) owns the job: not recording FAILED"
    assert (left_alone in caplog.messages) == (not recorded)


def test_a_driver_whose_heartbeat_stops_is_killed_and_restarted(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    # RUNNING once at the start, every 5 s expected: stale when older than 3 * 5 + 5 s, seen at the 25 s poll
    runs = [Run(runs_for=None, term_code=1, tick=reports(store, once=True)), Run(0)]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=1, delay=2.0, clock=clock),
                                 store=store, poll=5.0)
    stuck, _ = spawner.procs
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=2, restarts=1, exit_code=0, reason="driver stopped")
    assert (stuck.signals, stuck.ended) == ([signal.SIGTERM], START + 25)
    assert ("job orders: no heartbeat in status.json for 25 s (every 5 s expected): terminating driver pid 100"
            in caplog.messages)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


def _stops_with_savepoint(store: JobStore) -> Callable[[FakeProcess], None]:
    """RUNNING at the start, STOPPING at 5 s, then silent: the final savepoint sends no heartbeat."""

    def tick(proc: FakeProcess) -> None:
        if proc.clock.now in (START, START + 5):
            put_status(store, JobState.RUNNING if proc.clock.now == START else JobState.STOPPING, 4,
                       proc.clock.now, pid=5000)

    return tick


@pytest.mark.parametrize(
    "tick",
    [
        lambda store: reports(store, JobState.STARTING, once=True),
        lambda store: reports(store, pid=OTHER_PID, once=True),
        _stops_with_savepoint,
    ],
    ids=["never-running", "not-ours", "stopping-with-savepoint"],
)
def test_a_stale_status_kills_only_a_running_driver_of_ours(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, tick: Callable[[JobStore], Callable[[FakeProcess], None]]
) -> None:
    runs = [Run(0, runs_for=100.0, tick=tick(store))]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(clock=clock), store=store, poll=5.0)
    assert (outcome.final, outcome.attempts, spawner.procs[0].signals) == (Ending.STOPPED, 1, [])
    assert spawner.procs[0].ended == START + 100


def test_a_driver_ignoring_the_stop_request_is_killed_after_grace(spec: SubmitSpec, clock: FakeClock) -> None:
    holder: list[Supervisor] = []

    def stop_once(proc: FakeProcess) -> None:
        if clock.now == START + 10:
            holder[0].request_stop()

    spawner = Spawner(clock, [Run(runs_for=None, tick=stop_once)])  # ignores SIGTERM
    sup = Supervisor(spec, FixedDelay(attempts=5, clock=clock), clock=clock, sleep=clock.sleep, spawn=spawner,
                     poll=5.0, grace=30.0)
    holder.append(sup)
    outcome = sup.run()
    assert spawner.procs[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert spawner.procs[0].ended == START + 40
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=1, restarts=0, exit_code=-9,
                                        reason="stop requested; driver exited with code -9")


# -- real processes (no Spark): the process group and the detection of an exit ----------------------


def _fake_spark_submit(tmp_path: Path, body: str) -> str:
    """An executable standing in for spark-submit; it appends its --restore value to runs.log."""
    path = tmp_path / "spark-submit"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys, time\n"
        f"log = {str(tmp_path / 'runs.log')!r}\n"
        "with open(log, 'a') as fh: fh.write(sys.argv[sys.argv.index('--restore') + 1] + '\\n')\n"
        "runs = len(open(log).read().split())\n" + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_real_driver_exit_is_detected_at_once(spec: SubmitSpec, tmp_path: Path) -> None:
    submit = _fake_spark_submit(tmp_path, "sys.exit(1 if runs == 1 else 0)\n")
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    started = time.monotonic()
    outcome = Supervisor(real, FixedDelay(attempts=1, delay=0.0), poll=30.0).run()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 2, 0)
    # no store: no driver was seen running, so the restart restores what the user chose again
    assert (tmp_path / "runs.log").read_text().split() == ["latest-savepoint", "latest-savepoint"]
    assert time.monotonic() - started < 10.0  # far below poll: wait() returns when the driver exits


def test_real_python_driver_in_the_group_switches_restarts_to_latest_state(spec: SubmitSpec, tmp_path: Path) -> None:
    # The "Python driver" runs in spark-submit's process group and reports RUNNING with its own pid.
    report = (
        "import os, socket, time\n"
        "from airflow_ckpt_provider.core.jobstore import JobStore\n"
        "from airflow_ckpt_provider.core.status import JobState, JobStatus, write_status\n"
        f"store = JobStore.open({spec.config.store!r}, 'orders')\n"
        "now = time.time()\n"
        "write_status(store, JobStatus('orders', JobState.RUNNING, 1, now, now, pid=os.getpid(),"
        " host=socket.gethostname()))\n"
        "time.sleep(1.0)\n"
    )
    submit = _fake_spark_submit(
        tmp_path,
        f"if runs == 1:\n    subprocess.run([sys.executable, '-c', {report!r}])\n"
        "sys.exit(1 if runs == 1 else 0)\n",
    )
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    store = JobStore.open(spec.config.store, "orders")
    outcome = Supervisor(real, FixedDelay(attempts=1, delay=0.0), store=store, poll=0.1).run()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 2, 0)
    assert (tmp_path / "runs.log").read_text().split() == ["latest-savepoint", "latest-state"]


def _stop_when(path: Path, sup: Supervisor) -> threading.Thread:
    """A thread that asks ``sup`` to stop once the fake driver wrote ``path``."""

    def stop() -> None:
        deadline = time.monotonic() + 20
        while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        sup.request_stop()

    thread = threading.Thread(target=stop)
    thread.start()
    return thread


def test_real_sigterm_goes_to_the_python_driver_not_the_jvm(spec: SubmitSpec, tmp_path: Path) -> None:
    # The stand-in JVM starts a "Python driver" (a process whose argv holds entrypoint.py's path) and exits
    # with 7 when that one died of SIGTERM: had the JVM got SIGTERM as well, it would die of it (-15).
    started = tmp_path / "driver.pid"
    submit = _fake_spark_submit(
        tmp_path,
        f"driver = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {str(ENTRYPOINT_PY)!r}])\n"
        f"open({str(started)!r}, 'w').write(str(driver.pid))\n"
        "sys.exit(7 if driver.wait() == -15 else 1)\n",
    )
    sup = Supervisor(SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit),
                     FixedDelay(attempts=5, delay=0.0), poll=0.1)
    stopper = _stop_when(started, sup)
    outcome = sup.run()
    stopper.join()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 1, 7)


def test_real_stop_request_reaches_the_whole_process_group(spec: SubmitSpec, tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    submit = _fake_spark_submit(
        tmp_path,
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n",
    )
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    sup = Supervisor(real, FixedDelay(attempts=5, delay=0.0), poll=0.1)
    stopper = _stop_when(child_pid, sup)  # no entrypoint.py process here (as in cluster mode): the group gets it
    outcome = sup.run()
    stopper.join()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 1, -signal.SIGTERM)
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the driver's child got SIGTERM too
