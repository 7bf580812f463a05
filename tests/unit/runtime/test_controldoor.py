"""The driver's control door and the asker's knock (issue 43): a real HTTP server on 127.0.0.1, a local job store."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    RequestAction,
    ack_key,
    knock,
    submit_request,
    wait_ack,
    wait_at_door,
    write_ack,
)
from airflow_ckpt_provider.core.records.lease import Lease, read_lease
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Versioned
from airflow_ckpt_provider.runtime.controldoor import open_door


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


def test_a_request_knocks_at_the_door_the_lease_names_once_written(store: JobStore) -> None:
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    try:
        lease = Lease(store, door=door.url)
        lease.acquire()
        record = read_lease(store)
        assert record is not None and record.door == door.url and door.url.startswith("http://127.0.0.1:")
        assert not door.take_knock()
        submit_request(store, RequestAction.SAVEPOINT, lease.epoch)
        assert door.take_knock()  # the knock came before submit_request returned
        assert not door.take_knock()  # once per knock(s)
        assert knock(store) and door.take_knock()
        assert lease.release()
        assert not knock(store) and not door.take_knock()  # a released lease: nobody to knock for
    finally:
        door.close()


def test_a_knock_for_another_job_or_path_is_refused_and_changes_nothing(store: JobStore) -> None:
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    try:
        other = door.url.replace("/knock/orders", "/knock/payments")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(other, method="POST", data=b""), timeout=5)
        assert err.value.code == 404
        assert not door.take_knock()
    finally:
        door.close()


def test_no_door_or_one_that_does_not_answer_is_no_knock(store: JobStore) -> None:
    Lease(store).acquire()  # an older driver: no door in its lease
    assert not knock(store)
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    url = door.url
    door.close()  # the driver is gone, its lease still names the door
    Lease(store, door=url).acquire()
    assert not knock(store, timeout=2.0)
    assert open_door("orders", None) is None  # --control-door none


def test_an_address_this_host_cannot_bind_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"control_door: expected an address of this host to bind the driver's "
                                          r"control door on, found '192\.0\.2\.1' \(.*\); set --control-door to one, "
                                          r"or none for no door"):
        open_door("orders", "192.0.2.1")


def _no_polling(seconds: float) -> None:
    raise AssertionError(f"polled the store ({seconds} s): expected the wait at the door")


def test_an_asker_waits_at_the_door_and_reads_the_ack_once_the_driver_says_it_is_written(
        store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: the savepoint's request-to-completion was the ack poll's (0.5 s); the door tells the asker at once,
    and the asker reads the store twice (before, and after the door's answer) instead of every poll."""
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    reads: list[str] = []
    real_read = LocalStorage.read_versioned

    def read_versioned(self: LocalStorage, key: str) -> Versioned | None:
        reads.append(key)
        return real_read(self, key)

    try:
        lease = Lease(store, door=door.url)
        lease.acquire()
        request = submit_request(store, RequestAction.SAVEPOINT, lease.epoch)
        ack = Ack(request.id, RequestAction.SAVEPOINT, Outcome.COMPLETED, "savepoint s1 at batch 3", lease.epoch,
                  1.0, snapshot_id="s1", batch_id=3)

        def driver() -> None:
            assert door.knocked.wait(10)
            time.sleep(0.2)  # the savepoint's work (the asker waits at the door, or finds the ack at its first read)
            write_ack(store, ack)
            door.answered(request.id)

        thread = threading.Thread(target=driver)
        thread.start()
        monkeypatch.setattr(LocalStorage, "read_versioned", read_versioned)
        found = wait_ack(store, request.id, 30.0, poll=5.0, sleep=_no_polling)
        thread.join()
        assert found == ack
        assert reads.count(ack_key(request.id)) <= 2, reads  # before the wait (maybe there already), and after
        assert door.wait_answered(request.id, 0)  # remembered: a later asker learns it at once
        assert not door.wait_answered("savepoint-other", 0.1)
    finally:
        door.close()


def test_a_closed_door_or_one_that_only_takes_knocks_sends_the_asker_back_to_polling(store: JobStore) -> None:
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    url = door.url
    door.close()  # the driver is gone, its lease still names the door
    lease = Lease(store, door=url)
    lease.acquire()
    request = submit_request(store, RequestAction.SAVEPOINT, lease.epoch)
    polls: list[float] = []

    def poll_then_ack(seconds: float) -> None:  # the driver answers during the first poll
        polls.append(seconds)
        write_ack(store, Ack(request.id, RequestAction.SAVEPOINT, Outcome.COMPLETED, "done", lease.epoch, 1.0))

    ack = wait_ack(store, request.id, 30.0, poll=0.5, sleep=poll_then_ack)
    assert ack is not None and ack.message == "done" and polls == [0.5]
    assert wait_at_door(url, request.id, 1.0) is None


def test_a_wait_at_the_door_for_another_job_is_refused_and_a_closing_door_ends_every_wait(store: JobStore) -> None:
    door = open_door("orders", "127.0.0.1")
    assert door is not None
    try:
        assert wait_at_door(door.url.replace("/knock/orders", "/knock/payments"), "r1", 1.0) is None  # 404
        assert wait_at_door(door.url, "r1", 0.2) is False  # not answered within the wait
        ended: list[bool | None] = []
        waiter = threading.Thread(target=lambda: ended.append(wait_at_door(door.url, "r2", 20.0)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not any("process_request" in t.name for t in threading.enumerate()):  # the waiter is at the door
            assert time.monotonic() < deadline, "the waiter never reached the door"
            time.sleep(0.01)
    finally:
        door.close()
    waiter.join(10)
    assert ended == [False]  # told at once that nothing will come: the asker goes back to the store
