"""The start record (deployments/<epoch>.json): typed, one reader, and the files of the release before it read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.start import (
    StartRecord,
    epoch_of,
    last_start,
    read_start,
    read_starts,
    start_key,
    write_start,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage

#: deployments/ of a job store written by the release before the records were typed (1441567), as its
#: runtime/startup.py wrote them: no schema key; the oldest without timeline, time_travel and launch_id.
RELEASE_STORE = Path(__file__).parents[2] / "data" / "store-1441567"


def _store(root: Path) -> JobStore:
    return JobStore(LocalStorage(root), "orders")


def test_the_release_before_typed_records_is_read(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(RELEASE_STORE), "orders")
    starts = read_starts(store)
    assert [s.epoch for s in starts] == [1, 2, 3]
    first, _, third = starts
    assert (first.action, first.snapshot, first.timeline, first.launch_id) == ("fresh", None, 0, None)
    assert (third.action, third.snapshot, third.timeline) == ("restore", "savepoint-7-20261127T101500Z-0a1b2c", 1)
    assert third.time_travel == {"snapshot": "savepoint-7-20261127T101500Z-0a1b2c", "to_batch": 7, "from_batch": 12,
                                 "why": "an older savepoint was named"}
    assert (third.launch_id, third.code_version) == ("20261127T101455Z-0c1d2e", "v2")
    assert last_start(store) == third


def test_written_once_read_by_epoch_and_newest_last(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert last_start(store) is None and read_starts(store) == []
    for epoch in (2, 10, 1):
        write_start(store, StartRecord(epoch=epoch, at=1795850000.0 + epoch, action="keep-live",
                                       restore="latest-state"))
    assert [s.epoch for s in read_starts(store)] == [1, 2, 10]  # by epoch, not by key text
    assert [s.epoch for s in read_starts(store, since_epoch=2, known=frozenset({10}))] == [2]
    assert read_start(store, 10) == last_start(store)
    body = json.loads(store.storage.read(start_key(10)))
    assert (body["schema"], body["epoch"], body["action"]) == (1, 10, "keep-live")


def test_an_unreadable_or_mismatched_record_is_skipped_with_a_warning(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tmp_path)
    write_start(store, StartRecord(epoch=1, at=1.0))
    store.storage.write(start_key(2), b"{broken")
    store.storage.write(start_key(3), StartRecord(epoch=4, at=3.0).to_bytes())
    assert [s.epoch for s in read_starts(store)] == [1]
    assert "ignoring start record deployments/0000000002.json: start record orders/deployments/0000000002.json " \
           "is not JSON" in caplog.text
    assert "ignoring start record deployments/0000000003.json: it says epoch 4" in caplog.text


def test_epoch_of_a_key() -> None:
    assert epoch_of("deployments/0000000012.json") == 12
    assert epoch_of("deployments/notes.txt") is None and epoch_of("status.json") is None
