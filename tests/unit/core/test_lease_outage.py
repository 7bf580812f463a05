"""The lease across a store outage: ``confirm`` rides it out for the recorded tolerance, and a newer driver
waits at least that long after taking the lease, so the older one stops committing before the newer starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import StorageError, UnreachableError
from airflow_ckpt_provider.core.records.lease import FencedError, Lease, read_lease
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage


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
    now[0] = 11.0  # a poll later (younger, the confirmation stands without a read: Lease.recent)
    assert lease.confirm() is False


def test_a_fenced_driver_is_fenced_whatever_its_tolerance(store: JobStore) -> None:
    now = [0.0]
    old = Lease(store, poll_interval=1.0, outage_tolerance=60.0, monotonic=lambda: now[0])
    old.acquire()
    Lease(store).acquire()
    now[0] = 1.0  # its next look, a poll later
    with pytest.raises(FencedError):
        old.confirm()


def test_a_confirmation_younger_than_a_poll_needs_no_read_and_a_lost_lease_is_never_confirmed_again(
        store: JobStore) -> None:
    """Per batch, the sinks and the fenced foreachBatch confirm the lease; the lease watch reads it every poll. A
    confirmation younger than a poll stands without a read (a newer driver waits its grace, longer: docs/scale.md),
    but taking the lease is no confirmation: the first commit reads (two drivers started at once); once any look
    found the lease lost, every later confirm raises at once, without a read."""
    now = [0.0]
    old = Lease(store, poll_interval=1.0, outage_tolerance=9.0, monotonic=lambda: now[0])
    old.acquire()
    reads = []
    real = store.storage.read_versioned
    store.storage.read_versioned = lambda key: reads.append(key) or real(key)  # type: ignore[method-assign]  # counts reads
    now[0] = 0.2
    assert old.confirm() is True and len(reads) == 1  # taking the lease is no look: the first commit reads
    now[0] = 0.5
    assert old.confirm() is True and len(reads) == 1  # confirmed 0.3 s ago: no read
    now[0] = 1.2
    assert old.confirm() is True and len(reads) == 2  # a poll old: read, and confirmed from this look on
    Lease(store).acquire()  # a newer driver (its own reads counted too)
    reads.clear()
    now[0] = 1.7
    assert old.confirm() is True and reads == []  # within the poll: commits before the newer one's grace ends
    now[0] = 2.2
    with pytest.raises(FencedError):
        old.confirm()
    now[0] = 2.3
    with pytest.raises(FencedError):
        old.confirm()  # found lost: raised again without a read
    assert len(reads) == 1


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


def _decisions(store: JobStore, wall_old: float, wall_new: float) -> list[object]:
    """What two drivers on two hosts decide through one store across a takeover and an outage, each host with its own
    wall clock (``wall_old``, ``wall_new``: its offset) and its own monotonic clock (unrelated origins)."""
    mono_old, mono_new = [1000.0], [-5e6]
    old = Lease(store, poll_interval=1.0, outage_tolerance=2.0, clock=lambda: 1.8e9 + wall_old,
                monotonic=lambda: mono_old[0])
    new = Lease(store, poll_interval=1.0, outage_tolerance=2.0, clock=lambda: 1.8e9 + wall_new,
                monotonic=lambda: mono_new[0])
    seen: list[object] = [old.acquire().epoch, old.confirm()]
    flaky = Flaky(store)
    flaky.down = True  # the old driver's host loses the store
    mono_old[0] += 1.5
    seen.append(old.confirm())  # within its tolerance: rides it out
    flaky.down = False
    seen.append(new.acquire().epoch)
    new.previous = replace(new.previous, host="elsewhere") if new.previous else None  # another host: it may run
    seen.append(new.grace(3.0))  # what the new driver waits, on its own monotonic clock
    flaky.down = True
    mono_old[0] += 0.6
    with pytest.raises(StorageError):  # beyond its tolerance: it stops committing, on its own monotonic clock
        old.confirm()
    seen.append(old.tolerating())
    flaky.down = False
    with pytest.raises(FencedError):
        old.confirm()
    mono_new[0] += 10.0
    seen.append(new.confirm())
    return seen


def test_the_lease_never_compares_the_clocks_of_two_hosts(tmp_path: Path) -> None:
    """Issue 41, clocks: every decision of the lease is the same whatever the two hosts' wall clocks say (a day apart
    either way, or equal): the old driver's stop counts from its own last confirmation on its own monotonic clock,
    the new driver's grace on its own; ``acquired_at`` is only shown (docs/reliability.md, Clocks)."""
    runs = {}
    for name, (old, new) in {"same": (0.0, 0.0), "new a day ahead": (0.0, 86400.0),
                             "old a day ahead": (86400.0, 0.0), "new an hour behind": (0.0, -3600.0)}.items():
        runs[name] = _decisions(JobStore(LocalStorage(tmp_path / name.replace(" ", "-")), "orders"), old, new)
    assert runs["same"] == [1, True, False, 2, 4.0, False, True]
    assert all(r == runs["same"] for r in runs.values()), runs
