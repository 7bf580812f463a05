"""The driver's control door and the asker's knock (issue 43): a real HTTP server on 127.0.0.1, a local job store."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import RequestAction, knock, submit_request
from airflow_ckpt_provider.core.records.lease import Lease, read_lease
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
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
