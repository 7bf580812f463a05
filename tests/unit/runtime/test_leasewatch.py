"""The lease watch (runtime/leasewatch.py) stops the query once the lease goes unconfirmed beyond its outage tolerance,
however long the lease reads hang, and at once when a newer epoch shows (issue 41, scenario 1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from airflow_ckpt_provider.core.errors import UnreachableError
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.runtime.leasewatch import LeaseWatch


class FakeLease:
    """``check()`` runs ``answer`` (it may hang or raise); a success confirms from the time it was asked."""

    def __init__(self, tolerance: float, answer: Callable[[], None]) -> None:
        self.outage_tolerance = tolerance
        self.answer = answer
        self.epoch = 1
        self.monotonic = time.monotonic
        self.confirmed_at = time.monotonic()

    def check(self) -> None:
        asked = self.monotonic()
        self.answer()
        self.confirmed_at = max(self.confirmed_at, asked)

    def tolerating(self) -> bool:
        return self.monotonic() - self.confirmed_at < self.outage_tolerance


class FakeQuery:
    def __init__(self) -> None:
        self.isActive = True
        self.stopped_at: float | None = None

    def stop(self) -> None:
        self.isActive = False
        self.stopped_at = time.monotonic()


def watch(lease: FakeLease, query: FakeQuery) -> LeaseWatch:
    return LeaseWatch("j", lease, lambda: query, poll=0.05, tick=0.01).start()  # type: ignore[arg-type,return-value]


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_a_lease_read_that_hangs_stops_the_query_within_the_tolerance() -> None:
    hang = threading.Event()
    lease = FakeLease(0.3, lambda: None)
    query = FakeQuery()
    w = watch(lease, query)
    try:
        time.sleep(0.3)
        assert query.isActive and not w.take_lapsed()  # confirmed every poll: nothing to do
        def hangs() -> None:  # the store cut off: the read hangs (a 60 s read timeout)
            hang.wait(10)

        lease.answer = hangs
        cut = time.monotonic()
        wait_for(lambda: not query.isActive)
        assert query.stopped_at is not None and query.stopped_at - cut < 0.3 + 0.2
        assert w.take_lapsed() and not w.take_lapsed()  # told once
    finally:
        hang.set()
        w.close()


@pytest.mark.timeout(30)
def test_a_store_that_fails_fast_is_ridden_out_for_the_tolerance_only() -> None:
    def unreachable() -> None:
        raise UnreachableError("cannot reach S3")

    lease = FakeLease(0.5, lambda: None)
    query = FakeQuery()
    w = watch(lease, query)
    try:
        lease.answer = unreachable
        started = time.monotonic()
        time.sleep(0.25)
        assert query.isActive  # within the tolerance: the query runs on
        wait_for(lambda: not query.isActive)
        assert query.stopped_at is not None and query.stopped_at - started < 0.5 + 0.2
    finally:
        w.close()


@pytest.mark.timeout(30)
def test_a_newer_epoch_stops_the_query_at_once() -> None:
    def fenced() -> None:
        raise FencedError("epoch 2 holds the lease")

    lease = FakeLease(60.0, lambda: None)
    query = FakeQuery()
    w = watch(lease, query)
    try:
        lease.answer = fenced
        wait_for(lambda: not query.isActive, timeout=2.0)
        assert w.take_lapsed()
    finally:
        w.close()
