"""The records drivers and the CLI exchange through the store: round trips, malformed bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.base import RecordError
from airflow_ckpt_provider.core.records.control import Ack, Outcome, Request, RequestAction
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import (
    JobState,
    JobStatus,
)

WHERE = "s3://b/jobs/orders/x.json"


def _status(**changes: Any) -> JobStatus:
    base: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": 1000.0,
                            "started_at": 900.0}
    return JobStatus(**base | changes)


# -- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("action", list(RequestAction))
def test_request_round_trip(action: RequestAction) -> None:
    request = Request(id=f"{action}-20261122T101500Z-abc123", action=action, epoch=4, created_at=1700000000.25,
                      requested_by="ana@host")
    assert Request.from_bytes(request.to_bytes(), WHERE) == replace(request, schema=Request.SCHEMA)
    assert json.loads(request.to_bytes())["action"] == action.value
    assert request.to_dict() == {"id": request.id, "action": action.value, "epoch": 4, "created_at": 1700000000.25,
                                 "requested_by": "ana@host"}


def test_request_without_requested_by_reads_as_empty() -> None:
    body = {"id": "stop-1", "action": "stop", "epoch": 1, "created_at": 5}
    assert Request.from_bytes(json.dumps(body).encode(), WHERE) == Request("stop-1", RequestAction.STOP, 1, 5.0, "",
                                                                            schema=1)


@pytest.mark.parametrize(
    "ack",
    [
        Ack("savepoint-1", RequestAction.SAVEPOINT, Outcome.COMPLETED, "savepoint at batch 7", 2, 1700000001.5,
            snapshot_id="savepoint-7-20261122T101500Z-abc123", snapshot_uri="s3://b/jobs/o/snapshots/x",
            batch_id=7),
        Ack("stop-1", RequestAction.STOP, Outcome.FAILED, "upload failed", 2, 1.0),
        Ack("cancel-1", RequestAction.CANCEL, Outcome.REJECTED, "wrong epoch", 5, 2.0, batch_id=None),
    ],
)
def test_ack_round_trip(ack: Ack) -> None:
    assert Ack.from_bytes(ack.to_bytes(), WHERE) == replace(ack, schema=Ack.SCHEMA)
    assert ack.to_dict()["outcome"] == ack.outcome.value and isinstance(ack.to_dict()["outcome"], str)
    assert "schema" not in ack.to_dict() and Ack.from_bytes(ack.to_bytes(), WHERE).to_dict() == ack.to_dict()


def test_status_round_trip_with_every_field() -> None:
    status = _status(
        state=JobState.STOPPING, reason="stop requested", batch_id=41, offsets={"orders": {"0": 17}},
        data_waiting=True, last_snapshot={"id": "checkpoint-41-20261122T101500Z-abc123", "kind": "checkpoint",
                                          "batch_id": 41},
        restored_from="s3://b/jobs/orders/snapshots/savepoint-3-20261122T000000Z-000000", pid=4242, host="h1",
        app_id="local-1", ui_url="http://127.0.0.1:4040", code_version="v2", heartbeat_interval=2.5,
    )
    assert JobStatus.from_bytes(status.to_bytes(), WHERE) == status
    assert json.loads(status.to_bytes())["state"] == "STOPPING"


def test_status_ignores_unknown_fields_from_newer_drivers() -> None:
    body = json.loads(_status().to_bytes()) | {"written_by_a_newer_version": 1}
    assert JobStatus.from_bytes(json.dumps(body).encode(), WHERE) == _status()


def test_status_coerces_numbers() -> None:
    body = json.loads(_status().to_bytes()) | {"epoch": "3", "updated_at": 1000, "heartbeat_interval": "5"}
    parsed = JobStatus.from_bytes(json.dumps(body).encode(), WHERE)
    assert (parsed.epoch, parsed.updated_at, parsed.heartbeat_interval) == (3, 1000.0, 5.0)


def test_lease_round_trip_and_default_released() -> None:
    lease = LeaseRecord(job="orders", epoch=7, owner="h:1:abcd", host="h", pid=1, acquired_at=12.5, released=True)
    assert LeaseRecord.from_bytes(lease.to_bytes(), WHERE) == lease
    body = json.loads(lease.to_bytes())
    del body["released"]
    assert LeaseRecord.from_bytes(json.dumps(body).encode(), WHERE).released is False


# -- malformed bytes: a clear StorageError naming the object -------------------------------------

_MALFORMED = [b"", b"not json", b"\xff\xfe", b"[]", b"null", b'"text"', b"{}"]
#: What a broken record says (core/records/base.py): the file, then what was expected and what was found.
_BROKEN = r"( is not JSON \(.+\)|: expected a JSON object, found \w+| is not valid: .+)$"


@pytest.mark.parametrize(("data", "found"), [
    *((data, "") for data in _MALFORMED),
    (b'{"id": "x", "action": "pause", "epoch": 1, "created_at": 1}', "Invalid enum value 'pause' - at `$.action`"),
    (b'{"id": "x", "action": "stop", "epoch": "one", "created_at": 1}', "Expected `int`, got `str` - at `$.epoch`"),
    (b'{"id": "x", "action": "stop", "created_at": 1}', "Object missing required field `epoch`"),
])
def test_malformed_request(data: bytes, found: str) -> None:
    with pytest.raises(RecordError, match=rf"^control request {WHERE}{_BROKEN}") as err:
        Request.from_bytes(data, WHERE)
    assert isinstance(err.value, StorageError) and found in str(err.value)  # the driver answers it (REJECTED)


_ACK = {"id": "x", "action": "stop", "outcome": "completed", "message": "", "epoch": 1, "finished_at": 1.0}


@pytest.mark.parametrize("data", [*_MALFORMED, json.dumps(_ACK | {"outcome": "maybe"}).encode(),
                                  json.dumps({k: v for k, v in _ACK.items() if k != "message"}).encode()])
def test_malformed_ack(data: bytes) -> None:
    with pytest.raises(StorageError, match=rf"^control ack {WHERE}{_BROKEN}"):
        Ack.from_bytes(data, WHERE)


_STATUS = json.loads(_status().to_bytes())


@pytest.mark.parametrize("data", [*_MALFORMED, json.dumps(_STATUS | {"state": "PAUSED"}).encode(),
                                  json.dumps(_STATUS | {"updated_at": "yesterday"}).encode(),
                                  json.dumps({k: v for k, v in _STATUS.items() if k != "epoch"}).encode()])
def test_malformed_status(data: bytes) -> None:
    with pytest.raises(StorageError, match=rf"^status {WHERE}{_BROKEN}"):
        JobStatus.from_bytes(data, WHERE)


def test_malformed_status_says_what_it_found() -> None:
    with pytest.raises(StorageError, match=r"expected a JSON object, found list"):
        JobStatus.from_bytes(b"[1]", WHERE)
    with pytest.raises(StorageError, match=r"Invalid enum value 'PAUSED' - at `\$.state`"):
        JobStatus.from_bytes(json.dumps(_STATUS | {"state": "PAUSED"}).encode(), WHERE)


_LEASE = {"job": "o", "epoch": 1, "owner": "h:1:x", "host": "h", "pid": 1, "acquired_at": 1.0}


@pytest.mark.parametrize("data", [*_MALFORMED, json.dumps(_LEASE | {"epoch": "first"}).encode(),
                                  json.dumps({k: v for k, v in _LEASE.items() if k != "owner"}).encode()])
def test_malformed_lease(data: bytes) -> None:
    with pytest.raises(StorageError, match=rf"^lease {WHERE}{_BROKEN[:-1]}; expected the JSON "
                                           r"a ckpt driver writes\. Delete it only if no driver of this job is"):
        LeaseRecord.from_bytes(data, WHERE)
