"""Restart strategies and the health rule: pure logic with an injected clock, no sleeping."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.restart import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    Health,
    HealthRule,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_fixed_delay_gives_up_after_attempts() -> None:
    clock = FakeClock()
    s = FixedDelay(attempts=2, delay=5.0, clock=clock)
    assert [s.on_failure(ran_for=1.0) for _ in range(3)] == [5.0, 5.0, None]
    assert s.restarts == 2


def test_exponential_delay_uses_flink_defaults_and_caps() -> None:
    s = ExponentialDelay(jitter=0.0, clock=FakeClock())
    delays = [s.on_failure(ran_for=1.0) for _ in range(12)]
    assert delays[:4] == [1.0, 1.5, 2.25, 3.375]
    assert delays[-1] == 60.0  # max backoff
    assert max(d for d in delays if d is not None) == 60.0


def test_exponential_delay_resets_after_a_long_healthy_run_and_jitters_within_bounds() -> None:
    s = ExponentialDelay(jitter=0.0, clock=FakeClock())
    for _ in range(5):
        s.on_failure(ran_for=10.0)
    assert s.on_failure(ran_for=3600.0) == 1.0  # ran an hour: back to the initial backoff
    jittery = ExponentialDelay(jitter=0.1, rng=random.Random(7), clock=FakeClock())
    first = jittery.on_failure(ran_for=0.0)
    assert first is not None and 0.9 <= first <= 1.1
    bounded = ExponentialDelay(jitter=0.0, attempts=2, clock=FakeClock())
    assert [bounded.on_failure(ran_for=0.0) for _ in range(3)] == [1.0, 1.5, None]


def test_failure_rate_counts_failures_within_the_interval() -> None:
    clock = FakeClock()
    s = FailureRate(max_failures=2, interval=60.0, delay=3.0, clock=clock)
    assert s.on_failure(0.0) == 3.0
    clock.now += 10
    assert s.on_failure(0.0) == 3.0
    clock.now += 10
    assert s.on_failure(0.0) is None  # 3 failures within 60 s
    fresh = FailureRate(max_failures=2, interval=60.0, delay=3.0, clock=clock)
    for _ in range(5):
        clock.now += 61
        assert fresh.on_failure(0.0) == 3.0  # one failure a minute never exceeds the rate


def test_retrying_drives_a_supervisor_loop_with_the_strategy() -> None:
    clock = FakeClock()
    runs: list[float] = []

    def driver() -> None:
        runs.append(clock.now)
        clock.now += 2.0  # the driver runs 2 s, then dies
        raise RuntimeError("driver exited with 137")

    strategy = FixedDelay(attempts=3, delay=10.0, clock=clock)

    def supervise() -> None:
        for attempt in strategy.retrying(sleep=clock.sleep):
            with attempt:
                driver()

    with pytest.raises(RuntimeError, match="137"):
        supervise()
    assert runs == [1000.0, 1012.0, 1024.0, 1036.0]  # 1 start + 3 restarts, 10 s apart after each 2 s run
    assert strategy.restarts == 3


def test_retrying_passes_the_run_length_to_the_strategy() -> None:
    clock = FakeClock()
    strategy = ExponentialDelay(jitter=0.0, reset_after=100.0, clock=clock)
    lengths = iter([1.0, 1.0, 150.0, 1.0])
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        clock.sleep(seconds)

    def driver() -> None:
        clock.now += next(lengths, 1.0)
        if len(delays) < 4:
            raise RuntimeError("died")

    for attempt in strategy.retrying(sleep=sleep):
        with attempt:
            driver()
    assert delays == [1.0, 1.5, 1.0, 1.5]  # the 150 s run reset the backoff


@pytest.mark.parametrize("make", [
    lambda: FixedDelay(attempts=-1),
    lambda: ExponentialDelay(multiplier=0.5),
    lambda: ExponentialDelay(jitter=2.0),
    lambda: FailureRate(max_failures=0),
])
def test_nonsense_settings_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ConfigError, match="must be"):
        make()


def test_health_rule_restarts_in_window_and_stalled_progress() -> None:
    rule = HealthRule(max_restarts=3, window=600.0, progress_timeout=300.0)
    assert rule.judge([0.0, 100.0], last_progress=990.0, data_waiting=True, now=1000.0).health is Health.HEALTHY
    verdict = rule.judge([500.0, 700.0, 900.0], last_progress=990.0, data_waiting=True, now=1000.0)
    assert verdict.health is Health.UNHEALTHY and "3 restarts within 600 s" in verdict.reason
    assert rule.judge([0.0, 100.0, 200.0], 990.0, True, now=1000.0).health is Health.HEALTHY  # old restarts
    stalled = rule.judge([], last_progress=600.0, data_waiting=True, now=1000.0)
    assert stalled.health is Health.UNHEALTHY and "no batch completed for 400 s" in stalled.reason
    assert rule.judge([], last_progress=600.0, data_waiting=False, now=1000.0).health is Health.HEALTHY  # idle
