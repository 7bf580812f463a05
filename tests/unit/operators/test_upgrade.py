"""UpgradeStreamingJobOperator and RescaleStreamingJobOperator: the task reads its arguments as UpgradeSettings, asks
for the operation in the job store, starts its actor (a detached ``ckpt job operate``; here the actor runs in this
process, Spark and the driver played by tests/support/upgradefakes.py) unless the supervision service owns the job,
and waits for the record to end; a retry finds the same operation. What the actor does at each step is tested in
tests/unit/launcher/test_upgrade_driver.py."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_ckpt_provider.core.records.operations import OPERATION, OperationState, read_operation
from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.upgrade import RescaleStreamingJobOperator
from airflow_ckpt_provider.triggers.operation import OperationTrigger
from tests.support.operatorfakes import (
    ORDERS_V1,
    ORDERS_V2,
    RESCALED_SID,
    SID,
    SNAPSHOT_KEY,
    context,
    deferral,
    fire,
    next_step,
    old_deployment,
    record_deployment,
    report,
    trigger_kwargs,
    upgrade_op,
)
from tests.support.upgradefakes import TI, Actors, World, rocksdb_savepoint


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    record_deployment(store, old_deployment(job_file=ORDERS_V1))
    report(store, epoch=3, code_version="v1")
    rocksdb_savepoint(store, SID, 7, 2)
    return World(store, monkeypatch)


FAST = {"verify_timeout": 5, "stop_timeout": 0.3, "verify_batches": None}


def test_the_task_asks_for_the_operation_starts_one_actor_and_defers_on_its_record(
        world: World, actors: Actors) -> None:
    deferred = deferral(lambda: upgrade_op(**FAST).execute(context(ti=TI())))
    found = read_operation(world.store)
    assert found is not None and found.operation.state is OperationState.PENDING
    assert found.operation.key == "airflow:adhoc_airflow.upgrade run manual__1"  # the task's run, the same for each try
    assert isinstance(deferred.trigger, OperationTrigger)
    assert trigger_kwargs(deferred)["operation_id"] == found.operation.id and actors.started == [found.operation.id]
    assert next_step(deferred) == ("after_operation", {"operation_id": found.operation.id})
    assert world.checks == [] and world.launches.calls == []  # the task itself acts on nothing


def test_a_retried_task_finds_its_operation_and_its_new_actor_resumes_it_to_the_result(
        world: World, actors: Actors) -> None:
    first = deferral(lambda: upgrade_op(**FAST).execute(context(ti=TI(1))))
    actors.act = True  # the first try's actor never ran (its worker was lost); the retry's does
    ctx = context(ti=TI(2))
    again = deferral(lambda: upgrade_op(**FAST).execute(ctx))
    operation_id = trigger_kwargs(first)["operation_id"]
    assert trigger_kwargs(again)["operation_id"] == operation_id and actors.started == [operation_id] * 2
    found = read_operation(world.store)
    assert found is not None and found.operation.state is OperationState.SUCCEEDED
    event = fire(again, {"status": "succeeded", "message": "", "operation_id": operation_id})
    result = upgrade_op(**FAST).resume(ctx, event)
    assert result == found.operation.result and result["to_version"] == "v2" and result["snapshot_id"] == SID
    assert ctx["ti"].xcoms[SNAPSHOT_KEY].endswith(SID)  # the savepoint's link
    [started] = world.launches.calls  # one new deployment
    assert (started.deployment.job_file, str(started.restore)) == (ORDERS_V2, SID)


def test_a_task_waiting_in_the_worker_gets_the_result(world: World, actors: Actors) -> None:
    actors.act = True
    result = upgrade_op(deferrable=False, poll_interval=0.01, **FAST).execute(context(ti=TI()))
    assert result["to_version"] == "v2" and [c[1] for c in world.checks] == [False]


def test_a_refused_upgrade_fails_the_task_without_a_retry_and_a_retry_finds_the_same_end(
        world: World, actors: Actors) -> None:
    from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome

    world.check_outcome = CheckOutcome.INCOMPATIBLE
    actors.act = True
    expected = (f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: restore check of snapshot "
                f"{SID} with the new code: incompatible: key schema differs; the job runs as before")
    for try_number in (1, 2):
        with pytest.raises(AirflowFailException) as info:
            upgrade_op(deferrable=False, poll_interval=0.01, **FAST).execute(context(ti=TI(try_number)))
        assert str(info.value) == expected
    assert len(world.checks) == 1 and world.launches.calls == []  # the retry did nothing again


def test_an_orphaned_operation_gets_a_new_actor(world: World, actors: Actors) -> None:
    first = deferral(lambda: upgrade_op(**FAST).execute(context(ti=TI())))
    operation_id = trigger_kwargs(first)["operation_id"]
    again = deferral(lambda: upgrade_op(**FAST).resume(context(ti=TI()), fire(first, {
        "status": "orphaned", "message": "its actor is gone", "operation_id": operation_id})))
    assert actors.started == [operation_id] * 2 and trigger_kwargs(again)["operation_id"] == operation_id


def test_a_job_handed_to_the_supervision_service_gets_no_actor_on_the_worker(world: World, actors: Actors) -> None:
    world.store.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="t").to_bytes())
    deferred = deferral(lambda: upgrade_op(**FAST).execute(context(ti=TI())))
    assert actors.started == [] and isinstance(deferred.trigger, OperationTrigger)


@pytest.mark.parametrize(("args", "expected"), [
    ({"verify_batches": -1}, "upgrade of job orders: verify_batches: expected a whole number >= 0 (0: no batch), "
                             "found -1. Nothing was changed"),
    ({"verify_batches": "many"}, "upgrade of job orders: verify_batches: expected a whole number or 'none', found "
                                 "'many'"),
    ({"partitions": 3, "upgrade_mode": "last-state"},
     "upgrade of job orders: partitions=3 with upgrade_mode last-state: a rescale goes through a savepoint"),
    ({"py_files": 7}, "upgrade of job orders: py_files: expected paths (a list, or comma-separated) or 'none', "
                      "found 7"),
])
def test_bad_arguments_fail_the_task_before_anything_is_recorded(world: World, actors: Actors, args: dict[str, Any],
                                                                 expected: str) -> None:
    with pytest.raises(AirflowFailException) as info:
        upgrade_op(**args).execute(context(ti=TI()))
    assert str(info.value).startswith(expected), info.value
    assert not world.store.storage.exists(OPERATION) and actors.started == []


@pytest.mark.parametrize(("value", "expected"), [("False", False), ("false", False), ("True", True), (True, True),
                                                 ("1", True), ("", False), ("None", False)])
def test_allow_non_restored_state_rendered_as_text(value: Any, expected: bool) -> None:
    assert upgrade_op(allow_non_restored_state=value).settings().allow_non_restored_state is expected


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("None", None), ("s3a://v2/a.py, s3a://v2/b.zip", ("s3a://v2/a.py", "s3a://v2/b.zip")),
    (["s3a://v2/a.py"], ("s3a://v2/a.py",)), ([], ())])
def test_py_files_as_a_template_renders_them(value: Any, expected: tuple[str, ...] | None) -> None:
    assert upgrade_op(py_files=value).settings().py_files == expected


def test_verify_batches_rendered_as_text_is_required_and_unset_is_the_default() -> None:
    settings = upgrade_op(verify_batches="3").settings()
    assert (settings.batches, settings.require_batches) == (3, True)
    settings = upgrade_op(verify_batches=None).settings()
    assert (settings.batches, settings.require_batches) == (2, False)
    assert upgrade_op().settings().stop_timeout == 600.0  # one default for the CLI, the operators and Dagster


def test_a_rescale_runs_the_running_code_on_a_repartitioned_savepoint(world: World, actors: Actors) -> None:
    actors.act = True
    op = RescaleStreamingJobOperator(task_id="rescale", job="orders", partitions="5", deferrable=False,
                                     poll_interval=0.01, **FAST)
    result = op.execute(context(ti=TI()))
    assert result["rescaled_snapshot_id"] == RESCALED_SID and result["partitions"] == 5
    [started] = world.launches.calls
    assert (started.deployment.job_file, str(started.restore)) == (ORDERS_V1, RESCALED_SID)


@pytest.mark.parametrize("partitions", ["", "None"])
def test_a_rescale_without_partitions_fails_before_anything(world: World, actors: Actors, partitions: str) -> None:
    op = RescaleStreamingJobOperator(task_id="rescale", job="orders", partitions=partitions)
    with pytest.raises(AirflowFailException, match="expected partitions"):
        op.execute(context(ti=TI()))
    assert not world.store.storage.exists(OPERATION) and actors.started == []
