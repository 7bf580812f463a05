"""One owner per restart (issue 15) in the Airflow layer: the DAG's restart launches nothing while the job's
supervisor restarts it and waits for that restart instead; it launches when the supervisor is gone or gave
up, or when asked for a chosen snapshot; submit reconnects to a restart in progress; stop refuses it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConflictError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.operations import read_operation
from airflow_ckpt_provider.core.records.status import RestartOwner
from airflow_ckpt_provider.core.records.supervision import SupervisorState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.views.jobview import RestartDecision, check_can_request, observe, restart_decision
from airflow_ckpt_provider.operators.job import (
    StopStreamingJobOperator,
    SubmitStreamingJobOperator,
)
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from tests.support.operatorfakes import (
    SID,
    context,
    control_keys,
    deferral,
    fire,
    record_deployment,
    report,
)
from tests.support.upgradefakes import TI, Actors, World
from tests.support.watchrecords import restarting, supervised

LAUNCH = "20261126T000000Z-abcdef"


def _restarting_now(store: JobStore) -> float:
    """Launch LAUNCH recorded; its supervisor (on host-b) live and restarting the driver of epoch 3."""
    launched = record_deployment(store, launch_id=LAUNCH)
    now = time.time()
    supervised(store, now, launch_id=LAUNCH, state=SupervisorState.RESTARTING, standalone=False)
    restarting(store, now, epoch=3)
    return launched.launched_at


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(store, monkeypatch)


def restarted(op: RestartStreamingJobOperator, actors: Actors) -> dict[str, Any]:
    """The task run to its end: it asks, its actor acts (as ``ckpt job operate`` would, detached), the trigger fires,
    it resumes with the result."""
    actors.act = True
    ctx = context(ti=TI())
    deferred = deferral(lambda: op.execute(ctx))
    found = read_operation(op.job_store())
    assert found is not None and found.operation.state.final, found
    result: dict[str, Any] = op.resume(ctx, fire(deferred, {"status": found.operation.state.value, "message": "",
                                                            "operation_id": found.operation.id}))
    return result


def test_the_restart_task_launches_nothing_while_the_supervisor_restarts_the_job_and_waits_for_it(
    world: World, actors: Actors
) -> None:
    store = world.store
    launched_at = _restarting_now(store)
    result = restarted(RestartStreamingJobOperator(task_id="restart", job="orders", start_timeout=77), actors)
    assert control_keys(store) == [] and world.launches.calls == []  # no cancel request for the dead driver either
    [criteria] = world.criteria  # the actor waited for the supervisor's restart: a driver of epoch 4 of its launch
    assert (criteria.min_epoch, criteria.started_after, criteria.start_timeout) == (4, launched_at, 77)
    said = world.said[0]
    assert said.startswith(f"nothing to launch: the job is RESTARTING by the supervisor (pid 77 on host-b, launch "
                           f"{LAUNCH}), attempt 2 (exit code 137: killed), expected running by ")
    assert said.endswith("; waiting for that")
    assert result == {"job": "orders", "restore": "latest-state", "restarted_by": "supervisor", "snapshot_id": None,
                      "epoch": 4, "batch_id": 9, "launch_id": LAUNCH}


def test_a_driver_that_just_died_under_a_live_supervisor_is_left_to_the_supervisor(world: World,
                                                                                    actors: Actors) -> None:
    store = world.store
    record_deployment(store, launch_id=LAUNCH)
    now = time.time()
    report(store, epoch=3, updated_at=now - 30, pid=4242, host="host-b")  # silent for 30 s: dead
    supervised(store, now, launch_id=LAUNCH, standalone=False)  # has not written RESTARTING yet
    decision, restarter = restart_decision(observe(store), LATEST_STATE)
    assert decision is RestartDecision.LEAVE_TO_OWNER
    assert restarter is not None and (restarter.by, restarter.min_epoch, restarter.restart) == (
        RestartOwner.SUPERVISOR, 4, None)
    result = restarted(RestartStreamingJobOperator(task_id="restart", job="orders"), actors)
    assert (result["restarted_by"], result["launch_id"]) == ("supervisor", LAUNCH) and world.launches.calls == []


@pytest.mark.parametrize("supervisor", ["gave-up", "gone"])
def test_the_restart_task_launches_when_the_supervisor_gave_up_or_is_gone(
    world: World, actors: Actors, supervisor: str
) -> None:
    store = world.store
    record_deployment(store, launch_id=LAUNCH)
    now = time.time()
    restarting(store, now - 40, epoch=3, expected_by=now + 30)
    if supervisor == "gave-up":
        supervised(store, now, launch_id=LAUNCH, state=SupervisorState.ENDED, ending="gave-up",
                   end_reason="restart strategy exhausted", standalone=False)
    else:
        supervised(store, now - 40, launch_id=LAUNCH, standalone=False)  # silent for 40 s, another host
    assert restart_decision(observe(store), LATEST_STATE) == (RestartDecision.LAUNCH, None)
    result = restarted(RestartStreamingJobOperator(task_id="restart", job="orders"), actors)
    [record] = world.launches.calls
    assert (result["launch_id"], result["restarted_by"]) == (record.launch_id, "operation")


def test_a_restart_from_a_chosen_snapshot_replaces_the_supervisors_restart(world: World, actors: Actors) -> None:
    _restarting_now(world.store)
    restarted(RestartStreamingJobOperator(task_id="restart", job="orders", restore=SID), actors)
    [record] = world.launches.calls
    assert str(record.restore) == SID


@pytest.mark.usefixtures("no_launch")
def test_submit_reconnects_to_a_restart_in_progress(store: JobStore) -> None:
    launched_at = _restarting_now(store)
    op = SubmitStreamingJobOperator(task_id="submit", job="orders", job_file="orders_v1.py", code_version="v1")
    assert op.submit_job(context()) == {"launch_id": LAUNCH, "launched_at": launched_at, "epoch": 4}
    assert op.get_job_status({}, context()) == "RESTARTING"
    assert op.is_job_active("RESTARTING")


def test_no_request_is_written_for_a_job_its_supervisor_restarts(store: JobStore) -> None:
    _restarting_now(store)
    with pytest.raises(ConflictError, match=r"job orders is RESTARTING by the supervisor .*: no driver runs to "
                                            r"take a savepoint until then; nothing was requested"):
        check_can_request(observe(store), RequestAction.SAVEPOINT)
    with pytest.raises(AirflowException, match=r"is RESTARTING by the supervisor .*: there is no driver to stop "
                                               r"until it runs; nothing was requested"):
        StopStreamingJobOperator(task_id="stop", job="orders").execute(context())
    assert control_keys(store) == []
