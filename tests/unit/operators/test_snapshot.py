"""TriggerSavepointOperator and DisposeSnapshotsOperator on a real local job store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, open_requests
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.base import DEFER_GRACE
from airflow_ckpt_provider.operators.snapshot import DisposeSnapshotsOperator, TriggerSavepointOperator
from airflow_ckpt_provider.triggers.control import RequestTrigger
from tests.support.operatorfakes import (
    SID,
    SNAPSHOT_KEY,
    FakeTI,
    ack_event,
    context,
    control_keys,
    deferral,
    fire,
    make_snapshots,
    next_step,
    only_request,
    report,
    timeout_s,
    trigger_kwargs,
)

# -- TriggerSavepointOperator -------------------------------------------------------------------------------------


def test_savepoint_requests_the_running_epoch_and_defers(store: JobStore) -> None:
    report(store, epoch=8)
    op = TriggerSavepointOperator(task_id="savepoint", job="orders", timeout=45)
    deferred = deferral(lambda: op.execute(context()))
    request = only_request(store)
    assert (request.action, request.epoch) == (RequestAction.SAVEPOINT, 8)
    assert isinstance(deferred.trigger, RequestTrigger) and next_step(deferred) == ("execute_complete", {})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["request_id"], kwargs["epoch"], kwargs["timeout"]) == (request.id, 8, 45)
    assert timeout_s(deferred) == 45 + DEFER_GRACE
    ctx = context()
    result = op.resume(ctx, fire(deferred, ack_event(store, request)))
    assert (result["action"], result["snapshot_id"], result["snapshot_uri"]) == (
        "savepoint", SID, store.snapshot_uri(SID))
    assert ctx["ti"].xcoms == {SNAPSHOT_KEY: store.snapshot_uri(SID)}


def test_a_retried_savepoint_task_waits_for_its_first_tries_request_and_asks_again_only_after_a_failure(
    store: JobStore
) -> None:
    report(store, epoch=8)
    op = TriggerSavepointOperator(task_id="savepoint", job="orders", timeout=45)

    def try_(run_id: str, number: int) -> str:
        """One try of the task in DAG run ``run_id``: the request it waits for."""
        deferred = deferral(lambda: op.execute(context(ti=FakeTI(run_id, number))))
        return trigger_kwargs(deferred)["request_id"]

    first = try_("scheduled__1", 1)
    assert try_("scheduled__1", 2) == first  # no answer yet: the retry waits for the same request
    (request,) = open_requests(store)
    assert request.requested_by == "airflow:adhoc_airflow.savepoint run scheduled__1 try 1"
    ack_event(store, request)  # completed
    assert try_("scheduled__1", 3) == first  # its answer is the retry's result: no second savepoint
    assert len([k for k in control_keys(store) if not k.endswith(".ack.json")]) == 1

    other = try_("scheduled__2", 1)  # another DAG run asks for its own savepoint
    assert other != first
    (pending,) = open_requests(store)
    ack_event(store, pending, Outcome.FAILED, snapshot_id=None, message="the upload failed")
    again = try_("scheduled__2", 2)  # its first try failed: the retry asks again, as attempt 2
    assert (other[-2:], again[-2:], again[:-2]) == ("-1", "-2", other[:-2])
    assert [r.id for r in open_requests(store)] == [again]


@pytest.mark.parametrize(("changes", "message"), [
    ({"state": JobState.STOPPED}, "is STOPPED since .*no running driver to take a savepoint; nothing was requested"),
    ({"updated_at": time.time() - 60}, "sent no heartbeat .*nothing was requested"),
])
def test_savepoint_of_a_job_that_is_not_running_is_refused(store: JobStore, changes: dict[str, Any],
                                                           message: str) -> None:
    report(store, **changes)
    with pytest.raises(AirflowException, match=message):
        TriggerSavepointOperator(task_id="savepoint", job="orders").execute(context())
    assert control_keys(store) == []


def test_savepoint_of_an_unknown_job_is_refused(store: JobStore) -> None:
    with pytest.raises(AirflowException, match="not found in job store"):
        TriggerSavepointOperator(task_id="savepoint", job="orders").execute(context())
    assert control_keys(store) == []


# -- DisposeSnapshotsOperator ---------------------------------------------------------------------------------------


@pytest.fixture
def five_checkpoints(store: JobStore, tmp_path: Path) -> list[str]:
    return make_snapshots(store, tmp_path, [Kind.CHECKPOINT] * 5)


def remaining(store: JobStore) -> list[str]:
    return [m.snapshot_id for m in list_snapshots(store)]


def test_dispose_keeps_the_newest_checkpoints(store: JobStore, five_checkpoints: list[str]) -> None:
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=2).execute(context())
    assert result["job"] == "orders" and result["preview"] is False
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(five_checkpoints[:3])
    assert {(d["kind"], d["reason"]) for d in result["disposed"]} == {("checkpoint", "checkpoint beyond the newest 2")}
    assert remaining(store) == five_checkpoints[3:]


def test_dispose_preview_lists_and_disposes_nothing(store: JobStore, five_checkpoints: list[str]) -> None:
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=2,
                                      preview=True).execute(context())
    assert result["preview"] is True
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(five_checkpoints[:3])
    assert remaining(store) == five_checkpoints


def test_dispose_keeps_the_newest_savepoint(store: JobStore, tmp_path: Path) -> None:
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.SAVEPOINT, Kind.CHECKPOINT, Kind.SAVEPOINT])
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_savepoints=1).execute(context())
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(ids[:2])
    assert remaining(store) == ids[2:]


def test_dispose_named_snapshots(store: JobStore, five_checkpoints: list[str]) -> None:
    named = [five_checkpoints[1], five_checkpoints[4]]
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=named).execute(context())
    assert result["disposed"] == [{"snapshot_id": sid, "kind": "checkpoint", "reason": "requested"} for sid in named]
    assert remaining(store) == [five_checkpoints[i] for i in (0, 2, 3)]


def test_dispose_named_snapshots_in_preview_disposes_nothing(store: JobStore, five_checkpoints: list[str]) -> None:
    op = DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[five_checkpoints[0]], preview=True)
    assert op.execute(context())["disposed"] == [
        {"snapshot_id": five_checkpoints[0], "kind": None, "reason": "requested"}]
    assert remaining(store) == five_checkpoints


def test_dispose_refuses_the_newest_savepoint_and_unknown_ids(store: JobStore, tmp_path: Path) -> None:
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.SAVEPOINT])
    with pytest.raises(AirflowException, match="is the newest completed savepoint of job orders"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[ids[1]]).execute(context())
    with pytest.raises(AirflowException, match=f"snapshot {SID} not found"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[SID]).execute(context())
    with pytest.raises(AirflowException, match="checkpoints_keep must be >= 1"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=0).execute(context())
    assert remaining(store) == ids
