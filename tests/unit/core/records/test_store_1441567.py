"""The job store files the release before the typed records (1441567) wrote, read with the record types.

tests/unit/data/store-1441567/orders/ holds them as that release's code wrote them (its to_bytes: no ``schema``
key; the restore check's records indented): control requests and acks, supervisor records, restore checks.
"""

from __future__ import annotations

import json
from pathlib import Path

from airflow_ckpt_provider.core.control import (
    Ack,
    Outcome,
    Request,
    RequestAction,
    open_requests,
    read_ack,
    request_key,
    submit_request,
)
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.storage import LocalStorage

RELEASE_STORE = Path(__file__).parents[2] / "data" / "store-1441567"
SAVEPOINT = "savepoint-7-20261127T101500Z-0a1b2c"


def _release() -> JobStore:
    return JobStore(LocalStorage(RELEASE_STORE), "orders")


def _raw(store: JobStore, key: str) -> dict[str, object]:
    body = json.loads(store.storage.read(key))
    assert "schema" not in body, f"{key} is not in the release-before shape"
    return body


# -- control/: requests and acks -------------------------------------------------------------------


def test_the_release_before_requests_and_acks_are_read() -> None:
    store = _release()
    request_id = "savepoint-20261127T101455Z-1a2b3c"
    request = Request.from_bytes(store.storage.read(request_key(request_id)), "x")
    assert request == Request(request_id, RequestAction.SAVEPOINT, 2, 1795846495.0, "ana@airflow-worker-1", schema=1)
    ack = read_ack(store, request_id)
    assert ack is not None and ack.to_dict() == _raw(store, f"control/{request_id}.ack.json")
    assert (ack.action, ack.outcome, ack.snapshot_id, ack.batch_id) == (RequestAction.SAVEPOINT, Outcome.COMPLETED,
                                                                        SAVEPOINT, 7)
    rejected = read_ack(store, "garbage")  # the answer to a file in control/ that was no request
    assert rejected is not None and (rejected.action, rejected.outcome) == (None, Outcome.REJECTED)
    assert "expected a request written by `ckpt job`" in rejected.message
    # Only the stop request has no ack: it is the one open request.
    assert [(r.id, r.action, r.epoch) for r in open_requests(store)] == [
        ("stop-20261127T120000Z-7a8b9c", RequestAction.STOP, 3)]


def test_a_request_is_written_with_its_schema_and_a_broken_one_is_reported_not_blocking(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    request = submit_request(store, RequestAction.CANCEL, 4, now=1795846495.0, requested_by="ana@host")
    assert json.loads(store.storage.read(request_key(request.id)))["schema"] == Request.SCHEMA
    store.storage.write("control/garbage.json", b"{not json")
    store.storage.write("control/pause.json", b'{"id": "pause", "action": "pause", "epoch": 4, "created_at": 1}')
    problems: dict[str, str] = {}
    assert [r.id for r in open_requests(store, on_malformed=problems.__setitem__)] == [request.id]
    assert problems["garbage"].startswith(f"control request {store.storage.uri('control/garbage.json')} is not JSON")
    assert problems["pause"].endswith("is not valid: Invalid enum value 'pause' - at `$.action`")


def test_an_ack_without_an_action_round_trips() -> None:
    ack = Ack("garbage", None, Outcome.REJECTED, "rejected: ...", 2, 1.5)
    assert Ack.from_bytes(ack.to_bytes(), "x").to_dict() == ack.to_dict()

