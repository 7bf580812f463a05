"""RestartStreamingJobOperator: an operation like an upgrade. The task reads its arguments as RestartStepSettings, asks
for the restart in the job store, starts its actor (a detached ``ckpt job operate``; here the actor runs in this
process, the driver's answers and health played by tests/support/upgradefakes.py) and waits for the record to end; the
actor stops a running driver first, then launches the recorded deployment; a retry resumes, never stops or launches
twice."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import RequestAction, open_requests
from airflow_ckpt_provider.core.records.operations import OPERATION, OperationState, read_operation
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from airflow_ckpt_provider.triggers.operation import OperationTrigger
from tests.support.operatorfakes import (
    SID,
    SNAPSHOT_KEY,
    context,
    control_keys,
    deferral,
    fire,
    next_step,
    record_deployment,
    report,
    trigger_kwargs,
)
from tests.support.upgradefakes import TI, Actors, World


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(store, monkeypatch)


def restart_op(**kwargs: Any) -> RestartStreamingJobOperator:
    return RestartStreamingJobOperator(**{"task_id": "restart", "job": "orders", "stop_timeout": 0.3,
                                          "start_timeout": 5} | kwargs)


def run_to_end(op: RestartStreamingJobOperator, ti: TI, actors: Actors) -> dict[str, Any]:
    """The task's try: it asks and defers; its actor acts to the end; the trigger fires; the task resumes."""
    actors.act = True
    ctx = context(ti=ti)
    deferred = deferral(lambda: op.execute(ctx))
    found = read_operation(actors.world.store)
    assert found is not None and found.operation.state.final
    event = fire(deferred, {"status": found.operation.state.value, "message": found.operation.message,
                            "operation_id": found.operation.id})
    result: dict[str, Any] = op.resume(ctx, event)
    return result


def test_restart_without_a_recorded_deployment_is_refused(world: World, actors: Actors) -> None:
    report(world.store)
    actors.act = True
    with pytest.raises(AirflowFailException, match=r"^job orders has no recorded deployment \(spec/last.json\): "
                                                   r"submit it first$"):
        restart_op(deferrable=False, poll_interval=0.01).execute(context(ti=TI()))
    assert control_keys(world.store) == [] and world.launches.calls == []


BAD_INPUT = [({"restore": "snapshot"}, "needs the snapshot"),
             ({"stop_mode": "kill"}, "invalid stop mode: expected one of savepoint, cancel, found 'kill'")]


@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUT)
def test_restart_refuses_bad_literal_input_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RestartStreamingJobOperator(task_id="restart", job="orders", **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUT)
def test_restart_refuses_bad_templated_input_before_asking_for_anything(world: World, actors: Actors,
                                                                        kwargs: dict[str, Any], message: str) -> None:
    record_deployment(world.store)
    report(world.store)
    [(name, rendered)] = kwargs.items()
    op = restart_op(**{name: "{{ params.x }}"})
    setattr(op, name, rendered)  # as Airflow renders it
    with pytest.raises(AirflowFailException, match=message):
        op.execute(context(ti=TI()))
    assert control_keys(world.store) == [] and not world.store.storage.exists(OPERATION) and actors.started == []


def test_the_task_asks_for_the_restart_starts_one_actor_and_defers_on_its_record(world: World,
                                                                                  actors: Actors) -> None:
    record_deployment(world.store)
    report(world.store)
    deferred = deferral(lambda: restart_op(restore=SID).execute(context(ti=TI())))
    found = read_operation(world.store)
    assert found is not None and (found.operation.kind, found.operation.state) == ("restart", OperationState.PENDING)
    assert found.operation.settings["restore"] == SID
    assert found.operation.key == "airflow:adhoc_airflow.restart run manual__1"
    assert isinstance(deferred.trigger, OperationTrigger) and actors.started == [found.operation.id]
    assert next_step(deferred) == ("after_operation", {"operation_id": found.operation.id})
    assert trigger_kwargs(deferred)["timeout"] == 0.3 + 5 + 600  # the stop's, the start's, a grace
    assert open_requests(world.store) == [] and world.launches.calls == []  # the task itself acts on nothing


@pytest.mark.parametrize(("stop_mode", "action"), [("cancel", RequestAction.CANCEL), ("savepoint", RequestAction.STOP)])
def test_restart_of_a_running_job_stops_it_first_then_launches_its_deployment(
        world: World, actors: Actors, stop_mode: str, action: RequestAction) -> None:
    old = record_deployment(world.store)
    report(world.store, epoch=3)
    ti = TI()
    result = run_to_end(restart_op(stop_mode=stop_mode, restore="latest-savepoint"), ti, actors)
    [request] = open_requests(world.store)
    assert (request.action, request.epoch) == (action, 3)
    [record] = world.launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, "latest-savepoint")
    assert result == {"job": "orders", "restore": "latest-savepoint", "restarted_by": "operation",
                      "snapshot_id": SID if action is RequestAction.STOP else None, "epoch": 4, "batch_id": 9,
                      "launch_id": record.launch_id}
    [criteria] = world.criteria  # running is enough, as for a submit
    assert (criteria.started_after, criteria.min_epoch, criteria.min_batches) == (record.launched_at, None, 0)
    if action is RequestAction.STOP:
        assert ti.xcoms[SNAPSHOT_KEY] == world.store.snapshot_uri(SID)  # the final savepoint, linked
    assert world.said[-2:] == [f"2/3 starting {old.deployment.job_file} from latest-savepoint",
                               "3/3 running: epoch 4 at batch 9"]


@pytest.mark.parametrize("changes", [None, {"state": JobState.FAILED}], ids=["never-reported", "failed"])
def test_restart_of_a_job_that_does_not_run_launches_without_a_stop(world: World, actors: Actors,
                                                                    changes: dict[str, Any] | None) -> None:
    old = record_deployment(world.store)
    if changes is not None:
        report(world.store, **changes)
    result = run_to_end(restart_op(restore=SID), TI(), actors)
    [record] = world.launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, SID)
    assert open_requests(world.store) == []
    assert (result["restore"], result["launch_id"], result["restarted_by"]) == (SID, record.launch_id, "operation")


def test_a_stop_that_does_not_complete_fails_the_restart_and_launches_nothing(world: World, actors: Actors) -> None:
    record_deployment(world.store)
    report(world.store)
    world.stop_answers = False
    actors.act = True
    with pytest.raises(AirflowFailException, match=r"restart of job orders: the cancel did not complete \(no answer\); "
                                                   r"the old job still runs \(epoch 3\), nothing was changed"):
        restart_op(deferrable=False, poll_interval=0.01).execute(context(ti=TI()))
    assert world.launches.calls == []


def test_a_restarted_driver_that_does_not_run_fails_the_restart(world: World, actors: Actors) -> None:
    record_deployment(world.store)
    world.healthy = [False]
    actors.act = True
    with pytest.raises(AirflowFailException, match=r"restart of job orders: job orders: expected it healthy, found "
                                                   r"FAILED"):
        restart_op(deferrable=False, poll_interval=0.01).execute(context(ti=TI()))
    assert len(world.launches.calls) == 1  # no rollback: the same deployment


def test_a_retried_restart_resumes_its_first_tries_operation_and_never_stops_or_launches_twice(
        world: World, actors: Actors) -> None:
    record_deployment(world.store)
    report(world.store)
    first = deferral(lambda: restart_op().execute(context(ti=TI(1))))  # its actor never ran: the worker was lost
    result = run_to_end(restart_op(), TI(2), actors)  # the retry's actor acts on the same operation
    assert trigger_kwargs(first)["operation_id"] == actors.started[0] == actors.started[1]
    assert len(open_requests(world.store)) == 1 and len(world.launches.calls) == 1
    again = restart_op().execute(context(ti=TI(3)))  # a retry after the end returns how it ended, acts on nothing
    assert again == result and len(open_requests(world.store)) == 1 and len(world.launches.calls) == 1
    report(world.store, epoch=4)  # another run of the task restarts again: a new operation, a new stop
    world.healthy = [True]
    run_to_end(restart_op(), TI(1, run_id="manual__2"), actors)
    assert [r.epoch for r in open_requests(world.store)] == [3, 4] and len(world.launches.calls) == 2
