"""Compare-and-swap, the job lease and the control channel on both backends (a directory, SeaweedFS S3)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    RequestAction,
    ack_key,
    open_requests,
    read_ack,
    request_key,
    submit_request,
    wait_ack,
    write_ack,
)
from airflow_ckpt_provider.core.records.lease import FencedError, Lease, LeaseRecord, read_lease
from airflow_ckpt_provider.core.store.jobstore import CONTROL, LEASE, JobStore
from airflow_ckpt_provider.core.store.storage import Storage

pytestmark = pytest.mark.integration

T = TypeVar("T")


def race(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(0..n-1)`` in n threads released at the same instant; results in index order."""
    barrier = threading.Barrier(n)

    def run(i: int) -> T:
        barrier.wait(timeout=30)
        return fn(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


@pytest.fixture
def store(store_root: Storage) -> JobStore:
    return JobStore(store_root, "orders")


# -- write_if ----------------------------------------------------------------------------------------


def test_create_if_absent_has_exactly_one_winner(store_root: Storage) -> None:
    won = race(8, lambda i: store_root.write_if("race/lock.json", f"writer {i}".encode(), None))
    assert won.count(True) == 1
    assert store_root.read("race/lock.json") == f"writer {won.index(True)}".encode()
    assert [o.key for o in store_root.list("race/")] == ["race/lock.json"]


def test_compare_and_swap(store_root: Storage) -> None:
    assert store_root.read_versioned("cas.json") is None
    assert store_root.write_if("cas.json", b"v1", None) is True
    assert store_root.write_if("cas.json", b"v1 again", None) is False  # exists: create-if-absent fails
    first = store_root.read_versioned("cas.json")
    assert first is not None and first.data == b"v1"

    assert store_root.write_if("cas.json", b"v2", first.tag) is True
    second = store_root.read_versioned("cas.json")
    assert second is not None and second.data == b"v2" and second.tag != first.tag

    assert store_root.write_if("cas.json", b"v3 from a stale reader", first.tag) is False
    assert store_root.read("cas.json") == b"v2"
    assert store_root.write_if("missing.json", b"x", second.tag) is False  # a tag never matches an absent object
    assert not store_root.exists("missing.json")


def test_a_swap_returns_the_tag_its_next_swap_needs_without_a_read(store_root: Storage) -> None:
    """Storage.swap: the new version tag from the write itself (S3: the PUT's ETag), the one read_versioned would
    give; a chain of swaps by one writer needs no read, and a stale tag loses."""
    first = store_root.swap("chain.json", b"v1", None)
    assert first is not None and store_root.swap("chain.json", b"v1 again", None) is None
    found = store_root.read_versioned("chain.json")
    assert found is not None and found.tag == first
    second = store_root.swap("chain.json", b"v2", first)
    third = store_root.swap("chain.json", b"v3", second)
    assert second is not None and third is not None and len({first, second, third}) == 3
    assert store_root.swap("chain.json", b"stale", second) is None
    found = store_root.read_versioned("chain.json")
    assert found is not None and (found.data, found.tag) == (b"v3", third)


def test_compare_and_swap_race_has_one_winner(store_root: Storage) -> None:
    # Every writer's bytes differ from the base's: tags derive from content (ETag = MD5, local: SHA-256),
    # so the swap compares values, and a writer of the unchanged bytes may legitimately "win" as well.
    store_root.write("counter.json", b"base")
    base = store_root.read_versioned("counter.json")
    assert base is not None
    won = race(8, lambda i: store_root.write_if("counter.json", f"writer {i}".encode(), base.tag))
    assert won.count(True) == 1
    assert store_root.read("counter.json") == f"writer {won.index(True)}".encode()


# -- lease -------------------------------------------------------------------------------------------


def test_newer_driver_fences_the_older(store: JobStore) -> None:
    first = Lease(store, clock=lambda: 1000.0)
    record = first.acquire()
    assert (record.epoch, record.owner, record.acquired_at, record.released) == (1, first.owner, 1000.0, False)
    assert first.previous is None and not first.previous_may_run()
    assert first.check() == record

    second = Lease(store)
    assert second.acquire().epoch == 2
    assert second.previous == record and second.previous_may_run()  # the first never released it
    assert second.check().owner == second.owner

    with pytest.raises(FencedError) as fenced:
        first.check()
    message = str(fenced.value)
    assert first.owner in message and second.owner in message
    assert "epoch 1" in message and "epoch 2" in message and "job orders" in message


def test_release_lets_the_next_driver_know(store: JobStore) -> None:
    first = Lease(store)
    first.acquire()
    assert first.release() is True
    released = read_lease(store)
    assert released is not None and released.released and released.epoch == 1

    nxt = Lease(store)
    assert nxt.acquire().epoch == 2
    assert nxt.previous == released and not nxt.previous_may_run()
    record = read_lease(store)
    assert record is not None and not record.released


def test_fenced_release_changes_nothing(store: JobStore) -> None:
    old, new = Lease(store), Lease(store)
    old.acquire()
    new.acquire()
    before = store.storage.read(LEASE)
    assert old.release() is False
    assert store.storage.read(LEASE) == before
    assert LeaseRecord.from_bytes(before, LEASE).owner == new.owner


def test_release_without_acquire_is_false(store: JobStore) -> None:
    assert Lease(store).release() is False
    Lease(store).acquire()
    assert Lease(store).release() is False
    record = read_lease(store)
    assert record is not None and record.epoch == 1


def test_concurrent_acquires_get_distinct_epochs_and_only_the_newest_runs(store: JobStore) -> None:
    leases = [Lease(store) for _ in range(6)]
    epochs = race(6, lambda i: leases[i].acquire().epoch)
    assert sorted(epochs) == [1, 2, 3, 4, 5, 6]
    newest = leases[epochs.index(6)]
    assert read_lease(store) == newest.record
    for lease in leases:
        if lease is newest:
            assert lease.check() == newest.record
        else:
            with pytest.raises(FencedError, match=f"now shows epoch 6 held by {newest.owner}"):
                lease.check()
    # Each winner saw the epoch below it: the epochs form one chain, no epoch was taken twice.
    assert sorted(lease.previous.epoch if lease.previous else 0 for lease in leases) == [0, 1, 2, 3, 4, 5]


# -- control channel ---------------------------------------------------------------------------------


def test_open_requests_oldest_first_and_acks_hide_them(store: JobStore) -> None:
    stop = submit_request(store, RequestAction.STOP, epoch=3, now=1_700_000_300.0)
    savepoint = submit_request(store, RequestAction.SAVEPOINT, epoch=3, now=1_700_000_100.0)
    cancel = submit_request(store, RequestAction.CANCEL, epoch=2, now=1_700_000_200.0)
    assert savepoint.id.startswith("savepoint-20231114T221") and savepoint.epoch == 3
    assert open_requests(store) == [savepoint, cancel, stop]
    assert store.storage.read(request_key(stop.id)) == stop.to_bytes()

    ack = Ack(savepoint.id, RequestAction.SAVEPOINT, Outcome.COMPLETED, "savepoint at batch 9", 3, 1_700_000_101.0,
              snapshot_id="savepoint-9-20231114T221501Z-abcdef", snapshot_uri="s3://x", batch_id=9)
    write_ack(store, ack)
    assert open_requests(store) == [cancel, stop]
    assert read_ack(store, savepoint.id) == replace(ack, schema=Ack.SCHEMA)  # as written
    assert read_ack(store, stop.id) is None
    assert sorted(o.key for o in store.storage.list(CONTROL)) == sorted(
        [request_key(stop.id), request_key(savepoint.id), request_key(cancel.id), ack_key(savepoint.id)])


def test_open_requests_of_an_empty_channel(store: JobStore) -> None:
    assert open_requests(store) == []


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_ack_gives_up_at_the_timeout(store: JobStore) -> None:
    request = submit_request(store, RequestAction.SAVEPOINT, epoch=1)
    fake = FakeTime()
    assert wait_ack(store, request.id, 2.0, poll=0.5, sleep=fake.sleep, clock=fake.clock) is None
    assert fake.sleeps == [0.5, 0.5, 0.5, 0.5] and fake.now == 2.0
    assert open_requests(store) == [request]  # the request stays queued


def test_wait_ack_returns_the_ack_once_written(store: JobStore) -> None:
    request = submit_request(store, RequestAction.STOP, epoch=1)
    ack = Ack(request.id, RequestAction.STOP, Outcome.FAILED, "upload failed", 1, 5.0)
    fake = FakeTime()

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if len(fake.sleeps) == 2:  # the driver answers while the caller sleeps for the second time
            write_ack(store, ack)

    written = replace(ack, schema=Ack.SCHEMA)
    assert wait_ack(store, request.id, 60.0, poll=1.0, sleep=sleep, clock=fake.clock) == written
    assert fake.sleeps == [1.0, 1.0]


def test_wait_ack_with_zero_timeout_reads_once(store: JobStore) -> None:
    request = submit_request(store, RequestAction.CANCEL, epoch=1)
    fake = FakeTime()
    assert wait_ack(store, request.id, 0.0, sleep=fake.sleep, clock=fake.clock) is None
    assert fake.sleeps == []
