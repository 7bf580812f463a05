"""The supervisor's restart loop on fake processes and a fake clock: the strategy's delays, latest-state once a
driver ran, no restart after a stop, bad input or fencing, giving up, killing a driver that makes no progress."""

from __future__ import annotations

import logging
import signal
import time

import pytest

from airflow_ckpt_provider.core.policy.restart import ExponentialDelay, FailureRate, FixedDelay, HealthRule
from airflow_ckpt_provider.core.records.status import JobState, read_status, write_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, Supervisor, SupervisorOutcome
from tests.support.supervisorfakes import (
    START,
    FakeClock,
    FakeProcess,
    Run,
    Spawner,
    reports,
    running,
    supervise,
)


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
    restarting = ("job orders: driver pid {} died (exit code {}) after 10 s at batch -: restarting in 5.0 s "
                  "(attempt {}, strategy fixed-delay: 3 attempts, 5 s apart; expected running by {}: 2 x the last "
                  "cold start of 5 s + a poll, at least 30 s)")
    by = ["00:17:25Z", "00:17:40Z", "00:17:55Z"]  # START + 10 s ran + 5 s delay + 30 s allowance, and so on
    assert caplog.messages == [
        "job orders: driver pid 100 started (attempt 1, restore latest-savepoint)",
        "job orders: driver pid 100 runs the job at epoch 4: restarts resume from latest-state",
        "job orders: driver exited with code 1 after 10.0 s (failed)",
        restarting.format(100, "1: failed", 1, by[0]),
        "job orders: driver pid 101 started (attempt 2, restore latest-state)",
        "job orders: driver exited with code -9 after 10.0 s (signal 9)",
        restarting.format(101, "-9: signal 9", 2, by[1]),
        "job orders: driver pid 102 started (attempt 3, restore latest-state)",
        "job orders: driver exited with code 137 after 10.0 s "
        "(failed: 128+9, the Python driver likely died of signal 9)",
        restarting.format(102, "137: failed: 128+9, the Python driver likely died of signal 9", 3, by[2]),
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
                         [(None, [signal.SIGTERM, signal.SIGKILL], 45.0), (0, [signal.SIGTERM], 35.0)])
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
    # first look at 5 s, then every three heartbeats (15 s): 35 s without a batch (timeout 30 s), then grace 10 s
    assert stuck.ended == START + killed_at
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
        assert "cannot read status.json, progress not judged meanwhile" in caplog.text


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
