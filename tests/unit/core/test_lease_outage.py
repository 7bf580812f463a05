"""The lease across a store outage: ``confirm`` rides it out for the recorded tolerance, and a newer driver
waits at least that long after taking the lease, so the older one stops committing before the newer starts."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import StorageError, UnreachableError
from airflow_ckpt_provider.core.records.lease import FencedError, Lease, read_lease
from airflow_ckpt_provider.core.store.jobstore import JobStore


class Flaky:
    """Turns a store's reads into UnreachableError while ``down``."""

    def __init__(self, store: JobStore) -> None:
        self.down = False
        real = store.storage.read_versioned

        def read_versioned(key: str):  # type: ignore[no-untyped-def]  # mirrors Storage.read_versioned
            if self.down:
                raise UnreachableError(f"read {key}: cannot reach S3 endpoint")
            return real(key)

        store.storage.read_versioned = read_versioned  # type: ignore[method-assign]  # the fault, in a unit test


def test_confirm_rides_out_an_outage_for_the_tolerance_then_raises(store: JobStore) -> None:
    now = [0.0]
    lease = Lease(store, poll_interval=1.0, outage_tolerance=10.0, monotonic=lambda: now[0])
    lease.acquire()
    flaky = Flaky(store)
    assert lease.confirm() is True
    flaky.down = True
    now[0] = 9.9
    assert lease.confirm() is False  # not confirmed, but within the tolerance: commits may go on
    now[0] = 10.0
    with pytest.raises(StorageError, match="cannot reach"):
        lease.confirm()
    flaky.down = False
    assert lease.confirm() is True  # back: confirmed, the tolerance starts again from now
    flaky.down = True
    assert lease.confirm() is False


def test_a_fenced_driver_is_fenced_whatever_its_tolerance(store: JobStore) -> None:
    old = Lease(store, outage_tolerance=60.0)
    old.acquire()
    Lease(store).acquire()
    with pytest.raises(FencedError):
        old.confirm()


def test_the_tolerance_is_recorded_and_a_newer_driver_waits_it_out(store: JobStore) -> None:
    old = Lease(store, poll_interval=1.0, outage_tolerance=29.0)
    old.acquire()
    record = read_lease(store)
    assert record is not None and record.outage_tolerance == 29.0
    newer = Lease(store, poll_interval=1.0)
    newer.acquire()
    assert newer.previous is not None
    newer.previous = replace(newer.previous, host="elsewhere")  # not a dead process of this host: it may run
    assert newer.grace(3.0) == 29.0 + 1.0 + 1.0  # the old one's tolerance + its poll + 1 s
