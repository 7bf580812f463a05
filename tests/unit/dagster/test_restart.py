"""The restart ops, run in-process with real Dagster on a local job store: they ask for a restart operation and run
its actor (launcher/upgrade.py JobUpgrade), the driver's answers, launches and health played by
tests/support/upgradefakes.py; a retried op resumes the operation and launches once."""

from __future__ import annotations

import dagster as dg
import pytest

from airflow_ckpt_provider.core.records.control import RequestAction, open_requests
from airflow_ckpt_provider.core.records.operations import OperationState, read_operation
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.dagster import CKPT_RESOURCE, CkptResource, restart_from_snapshot, restart_streaming_job
from tests.support.operatorfakes import SID, record_deployment, report
from tests.support.upgradefakes import World
from tests.unit.dagster.conftest import failure, run_op

RESTART = {"job": "orders", "poll_interval": 0.01, "start_timeout": 5, "stop_timeout": 0.3}


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(store, monkeypatch)


def test_the_restart_op_stops_the_running_driver_then_launches_and_returns_where_the_job_went(
        world: World, ckpt: CkptResource) -> None:
    old = record_deployment(world.store)
    report(world.store, epoch=3)
    result = run_op(restart_streaming_job, ckpt, RESTART | {"stop_mode": "savepoint"})
    assert result.success, failure(result)
    [request] = open_requests(world.store)
    assert (request.action, request.epoch) == (RequestAction.STOP, 3)
    [record] = world.launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, "latest-state")
    found = read_operation(world.store)
    assert found is not None and found.operation.key == f"dagster:{result.run_id}.restart_streaming_job"
    assert record.key == f"restart {found.operation.id} step 2 start"  # the launch of exactly this step
    assert result.output_for_node("restart_streaming_job") == {
        "job": "orders", "restore": "latest-state", "restarted_by": "operation", "snapshot_id": SID, "epoch": 4,
        "batch_id": 9, "launch_id": record.launch_id}


def test_restart_from_snapshot_restores_the_snapshot_its_input_names(world: World, ckpt: CkptResource) -> None:
    record_deployment(world.store)
    job = dg.GraphDefinition(name="from_snapshot", node_defs=[restart_from_snapshot]).to_job(
        resource_defs={CKPT_RESOURCE: ckpt})
    result = job.execute_in_process(raise_on_error=False, run_config={"ops": {"restart_from_snapshot": {
        "config": RESTART, "inputs": {"snapshot": {"snapshot_id": SID}}}}})  # a dict input's config is the dict
    assert result.success, failure(result)
    [record] = world.launches.calls
    assert str(record.restore) == SID and open_requests(world.store) == []  # nothing ran: nothing stopped


def test_a_retried_restart_op_resumes_its_operation_and_launches_once(world: World, ckpt: CkptResource) -> None:
    record_deployment(world.store)
    report(world.store, epoch=3)
    world.lost_watches = 1  # the first try launched, then lost its connection while waiting for the new driver
    job = dg.GraphDefinition(name="retried_restart", node_defs=[restart_streaming_job]).to_job(
        resource_defs={CKPT_RESOURCE: ckpt}, op_retry_policy=dg.RetryPolicy(max_retries=2))
    result = job.execute_in_process(run_config={"ops": {"restart_streaming_job": {"config": RESTART}}},
                                    raise_on_error=False)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
    assert result.success, failure(result)
    assert len(open_requests(world.store)) == 1 and len(world.launches.calls) == 1  # one stop, one launch
    found = read_operation(world.store)
    assert found is not None and found.operation.state is OperationState.SUCCEEDED
    assert any("resumes restart" in line for line in found.operation.lines)
    assert result.output_for_node("restart_streaming_job")["launch_id"] == world.launches.calls[0].launch_id


def test_restart_of_a_job_without_a_deployment_says_to_submit_first(world: World, ckpt: CkptResource) -> None:
    result = run_op(restart_streaming_job, ckpt, {"job": "orders"})
    assert not result.success
    assert "job orders has no recorded deployment (spec/last.json): submit it first" in failure(result)
    assert world.launches.calls == [] and open_requests(world.store) == []


def test_the_restart_config_refuses_a_bad_stop_mode_before_the_op_runs(world: World, ckpt: CkptResource) -> None:
    record_deployment(world.store)
    report(world.store)
    result = run_op(restart_streaming_job, ckpt, RESTART | {"stop_mode": "kill"})
    assert not result.success
    assert "invalid stop mode: expected one of savepoint, cancel, found 'kill'" in failure(result)
    assert world.launches.calls == [] and open_requests(world.store) == []
