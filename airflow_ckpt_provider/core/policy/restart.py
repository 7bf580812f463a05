"""Restart strategies and a health rule, with Flink's names and defaults, on tenacity.

Design notes: docs/concepts.md#design-notes-corepolicyrestartpy."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import RestartStrategyName

Clock = Callable[[], float]


class RestartStrategy(ABC):
    """Decides whether, and after how many seconds, a failed job restarts."""

    clock: Clock
    restarts: int

    @abstractmethod
    def next_delay(self, failed_at: float, ran_for: float) -> float | None:
        """Seconds to wait before the next start, or None to give up (the job is FAILED)."""

    def on_failure(self, ran_for: float) -> float | None:
        """Record a failure now; the delay before restarting, or None to give up."""
        delay = self.next_delay(self.clock(), ran_for)
        if delay is not None:
            self.restarts += 1
        return delay

    def retrying(
        self,
        *,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
        sleep: Callable[[float], None] = time.sleep,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> Retrying:
        """A tenacity loop driven by this strategy: stop when it gives up, wait what it says."""
        decided: dict[int, float | None] = {}
        started = [self.clock()]

        def before(_state: RetryCallState) -> None:
            started[0] = self.clock()

        def decide(state: RetryCallState) -> float | None:
            # tenacity asks stop, then wait, for the same failed attempt: decide once per attempt.
            if state.attempt_number not in decided:
                decided[state.attempt_number] = self.on_failure(max(0.0, self.clock() - started[0]))
            return decided[state.attempt_number]

        return Retrying(
            before=before,
            retry=retry_if_exception_type(retry_on),
            stop=lambda state: decide(state) is None,
            wait=lambda state: decide(state) or 0.0,
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )


@dataclass
class FixedDelay(RestartStrategy):
    """Restart after ``delay`` seconds, at most ``attempts`` times (Flink: fixed-delay)."""

    attempts: int = 1
    delay: float = 1.0
    clock: Clock = time.monotonic
    restarts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _positive("fixed-delay attempts", self.attempts, allow_zero=True)
        _positive("fixed-delay delay", self.delay, allow_zero=True)

    def next_delay(self, failed_at: float, ran_for: float) -> float | None:
        return self.delay if self.restarts < self.attempts else None


@dataclass
class ExponentialDelay(RestartStrategy):
    """Backoff from ``initial`` times ``multiplier`` up to ``max_delay``, with jitter (Flink 1.19 defaults).

    A run that lasted ``reset_after`` seconds resets the backoff to ``initial``; ``attempts`` bounds the
    restarts before such a reset (unbounded by default, as in Flink).
    """

    initial: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 1.5
    reset_after: float = 3600.0
    jitter: float = 0.1
    attempts: int | None = None
    clock: Clock = time.monotonic
    rng: random.Random = field(default_factory=random.Random, repr=False)
    restarts: int = field(default=0, init=False)
    _streak: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        _positive("exponential-delay initial backoff", self.initial)
        _positive("exponential-delay max backoff", self.max_delay)
        if self.multiplier < 1:
            raise ConfigError(f"exponential-delay multiplier must be >= 1, found {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"exponential-delay jitter must be within [0, 1], found {self.jitter}")

    def next_delay(self, failed_at: float, ran_for: float) -> float | None:
        if ran_for >= self.reset_after:
            self._streak = 0
        if self.attempts is not None and self._streak >= self.attempts:
            return None
        base = min(self.initial * self.multiplier**self._streak, self.max_delay)
        self._streak += 1
        return max(0.0, base * (1 + self.jitter * (2 * self.rng.random() - 1)))


@dataclass
class FailureRate(RestartStrategy):
    """Restart after ``delay`` unless more than ``max_failures`` happened within ``interval`` (Flink: failure-rate)."""

    max_failures: int = 1
    interval: float = 60.0
    delay: float = 1.0
    clock: Clock = time.monotonic
    restarts: int = field(default=0, init=False)
    _failures: deque[float] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        _positive("failure-rate max failures per interval", self.max_failures)
        _positive("failure-rate interval", self.interval)
        _positive("failure-rate delay", self.delay, allow_zero=True)

    def next_delay(self, failed_at: float, ran_for: float) -> float | None:
        self._failures.append(failed_at)
        while self._failures and failed_at - self._failures[0] > self.interval:
            self._failures.popleft()
        return self.delay if len(self._failures) <= self.max_failures else None


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


def _positive(what: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{what} must be {bound}, found {value}")


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class HealthVerdict:
    """The health of a job and, when unhealthy, why."""

    health: Health
    reason: str = ""


@dataclass(frozen=True)
class HealthRule:
    """Unhealthy after ``max_restarts`` restarts within ``window`` seconds, or no batch progress for
    ``progress_timeout`` seconds while data is waiting (Flink operator's health check)."""

    max_restarts: int = 3
    window: float = 600.0
    progress_timeout: float | None = 600.0

    def judge(
        self, restart_times: list[float], last_progress: float | None, data_waiting: bool, now: float
    ) -> HealthVerdict:
        recent = [t for t in restart_times if now - t <= self.window]
        if len(recent) >= self.max_restarts:
            return HealthVerdict(
                Health.UNHEALTHY, f"{len(recent)} restarts within {self.window:.0f} s (limit {self.max_restarts})"
            )
        if self.progress_timeout is not None and data_waiting and last_progress is not None:
            idle = now - last_progress
            if idle >= self.progress_timeout:
                return HealthVerdict(
                    Health.UNHEALTHY, f"no batch completed for {idle:.0f} s while data is waiting "
                    f"(limit {self.progress_timeout:.0f} s)"
                )
        return HealthVerdict(Health.HEALTHY)


def restart_strategy(
    name: RestartStrategyName | str, attempts: int | None = None, delay: float | None = None,
    interval: float | None = None,
) -> RestartStrategy:
    """A restart strategy by Flink's name; unset knobs keep Flink's defaults."""
    kind = RestartStrategyName.parse(name)
    if interval is not None and kind is not RestartStrategyName.FAILURE_RATE:
        raise ConfigError(f"--restart-interval applies to failure-rate only, found --restart-strategy {kind}")
    if kind is RestartStrategyName.FIXED_DELAY:
        return FixedDelay(**_given(attempts=attempts, delay=delay))
    if kind is RestartStrategyName.FAILURE_RATE:
        return FailureRate(**_given(max_failures=attempts, delay=delay, interval=interval))
    return ExponentialDelay(**_given(attempts=attempts, initial=delay))


def health_rule(max_restarts: int | None, window: float | None, progress_timeout: float | None) -> HealthRule | None:
    """The health rule when any of its knobs is given (HealthRule's defaults for the others), else None."""
    given = _given(max_restarts=max_restarts, window=window, progress_timeout=progress_timeout)
    if not given:
        return None
    for name, value in given.items():
        if value <= 0:
            raise ConfigError(f"health rule {name.replace('_', ' ')} must be > 0, found {value}")
    return HealthRule(**given)


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
