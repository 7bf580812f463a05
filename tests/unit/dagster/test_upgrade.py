"""The upgrade and rescale ops, run in-process with real Dagster on a local job store: they run the synchronous
driver (launcher/upgrade.py JobUpgrade) whose Spark, driver answers and launches are played
(tests/support/upgradefakes.py); config Dagster refuses, refusals, rollbacks and results as the op reports them."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.control import RequestAction, open_requests
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.store.jobstore import SPEC_STABLE, JobStore
from airflow_ckpt_provider.dagster import CKPT_RESOURCE, CkptResource, rescale_streaming_job, upgrade_streaming_job
from tests.support.operatorfakes import (
    ORDERS_V1,
    ORDERS_V2,
    RESCALED_SID,
    SID,
    old_deployment,
    record_deployment,
    report,
)
from tests.support.upgradefakes import World, rocksdb_savepoint
from tests.unit.dagster.conftest import failure, run_op

UPGRADE = {"job": "orders", "job_file": ORDERS_V2, "code_version": "v2", "poll_interval": 0.01, "verify_timeout": 5}


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    """orders_v1 recorded and running (epoch 3) with a RocksDB savepoint of batch 7 in 2 partitions."""
    record_deployment(store, old_deployment(job_file=ORDERS_V1))
    report(store, epoch=3, code_version="v1")
    rocksdb_savepoint(store, SID, 7, 2)
    return World(store, monkeypatch)


def refused(result: dg.ExecuteInProcessResult) -> tuple[str, dict[str, Any]]:
    """The dg.Failure's description and metadata."""
    assert not result.success
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = event.step_failure_data.user_failure_data
    assert data is not None, failure(result)
    return str(data.description), {k: v.value for k, v in data.metadata.items()}


def untouched(world: World) -> bool:
    """Nothing was requested of the driver and nothing launched."""
    return open_requests(world.store) == [] and world.launches.calls == []


def test_an_upgrade_logs_each_step_and_returns_where_the_job_went(world: World, ckpt: CkptResource) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = run_op(upgrade_streaming_job, ckpt, UPGRADE, instance=instance)
    assert result.success, failure(result)
    assert result.output_for_node("upgrade_streaming_job") == {
        "job": "orders", "from_version": "v1", "to_version": "v2", "upgrade_mode": "savepoint", "snapshot_id": SID,
        "epoch": 4, "batch_id": 9, "partitions": None, "rescaled_snapshot_id": None}
    [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = {k: v.value for k, v in output.step_output_data.metadata.items()}
    assert metadata == {"snapshot_id": SID, "epoch": 4, "batch_id": 9, "to_version": "v2"}
    lines = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message[:4] in ("1/5 ", "2/5 ",
                                                                                                "4/5 ")]
    assert [ln[:3] for ln in lines] == ["1/5", "1/5", "2/5", "2/5", "4/5", "4/5"]  # the driver's lines, in order
    assert lines[2] == "2/5 stopping the driver of epoch 3 with a savepoint"
    assert lines[-1] == "4/5 verified: epoch 4 at batch 9; v2 is the stable deployment"
    assert [r.action for r in open_requests(world.store)] == [RequestAction.STOP]
    [started] = world.launches.calls
    assert (started.deployment.job_file, started.deployment.code_version, str(started.restore)) == (ORDERS_V2, "v2",
                                                                                                     SID)
    assert "(dagster:one_upgrade_streaming_job.upgrade_streaming_job (run " in started.launched_by
    assert read_launch(world.store, SPEC_STABLE) == started


def test_an_upgrade_the_restore_check_refuses_fails_before_anything_stops(world: World, ckpt: CkptResource) -> None:
    world.check_outcome = CheckOutcome.INCOMPATIBLE
    message, metadata = refused(run_op(upgrade_streaming_job, ckpt, UPGRADE))
    assert message == (f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: restore check of "
                       f"snapshot {SID} with the new code: incompatible: key schema differs; the job runs as before")
    assert metadata == {"outcome": "refused"}
    assert world.checks == [("latest-state", False)] and untouched(world)


def test_an_upgrade_failing_verification_is_rolled_back_and_fails_saying_so(world: World, ckpt: CkptResource) -> None:
    world.healthy = [False, True]
    message, metadata = refused(run_op(upgrade_streaming_job, ckpt, UPGRADE))
    assert message == ("upgrade of job orders to v2 failed verification (job orders: expected it healthy, found "
                       f"FAILED); rolled back to v1 from {SID}: the old code runs again (epoch 4)")
    assert metadata == {"outcome": "failed"}
    new, old = world.launches.calls
    assert (new.deployment.code_version, old.deployment.code_version, str(old.restore)) == ("v2", "v1", SID)


def test_a_rescale_repartitions_the_savepoint_and_starts_the_running_code_from_it(world: World,
                                                                                  ckpt: CkptResource) -> None:
    result = run_op(rescale_streaming_job, ckpt, {"job": "orders", "partitions": 5, "poll_interval": 0.01,
                                                  "verify_timeout": 5})
    assert result.success, failure(result)
    assert result.output_for_node("rescale_streaming_job") == {
        "job": "orders", "partitions": 5, "snapshot_id": SID, "rescaled_snapshot_id": RESCALED_SID, "epoch": 4,
        "batch_id": 9}
    assert world.checks == [("latest-state", False), (SID, True)]
    [started] = world.launches.calls
    assert (started.deployment.job_file, str(started.restore)) == (ORDERS_V1, RESCALED_SID)


@pytest.mark.parametrize(("change", "expected"), [
    ({"partitions": 2}, f"upgrade of job orders to {ORDERS_V2} with 2 state partitions refused before anything was "
                        f"stopped: snapshot {SID}: the state already has 2 partitions"),
])
def test_what_the_steps_refuse_from_the_store_fails_the_op_with_nothing_stopped(
        world: World, ckpt: CkptResource, change: dict[str, Any], expected: str) -> None:
    message, _ = refused(run_op(upgrade_streaming_job, ckpt, UPGRADE | change))
    assert message.startswith(expected)
    assert world.checks == [] and untouched(world)


def test_an_upgrade_of_a_job_never_submitted_says_to_submit_it_first(ckpt: CkptResource) -> None:
    message, _ = refused(run_op(upgrade_streaming_job, ckpt, UPGRADE))
    assert message == ("job orders has no recorded deployment (spec/last.json): submit it first with the op "
                       "submit_streaming_job; nothing was stopped")


@pytest.mark.parametrize(("op", "change", "expected"), [
    (upgrade_streaming_job, {"upgrade_mode": "bogus"},
     "invalid upgrade_mode: expected one of savepoint, last-state, stateless, found 'bogus'; savepoint keeps exactly "
     "the stopped state, last-state the latest checkpoint, stateless none. Fix the op's config"),
    (upgrade_streaming_job, {"verify_batches": -1},
     "verify_batches: expected a whole number >= 0 (0: no batch), found -1. Nothing was changed. Fix the op's config"),
    (upgrade_streaming_job, {"partitions": 0},
     "partitions: expected a whole number from 1 to 10000 or 'none', found 0"),
    (upgrade_streaming_job, {"partitions": 3, "upgrade_mode": "last-state"},
     "partitions=3 with upgrade_mode last-state: a rescale goes through a savepoint; expected upgrade_mode savepoint"),
    (upgrade_streaming_job, {"job_file": " "}, "job_file: expected the new code's Python file, found an empty string"),
    (upgrade_streaming_job, {"check_timeout": 0}, "check_timeout: expected seconds > 0, found 0.0"),
    (rescale_streaming_job, {"partitions": 10_001},
     "partitions: expected a whole number from 1 to 10000 or 'none', found 10001"),
])
def test_a_config_value_the_op_judges_fails_the_step_before_anything(
        world: World, ckpt: CkptResource, op: dg.OpDefinition, change: dict[str, Any], expected: str) -> None:
    config = UPGRADE if op is upgrade_streaming_job else {"job": "orders", "partitions": 5}
    result = run_op(op, ckpt, config | change)
    assert not result.success
    assert expected in failure(result)
    assert world.checks == [] and untouched(world)


def test_a_config_of_the_wrong_type_is_refused_before_the_run_starts(ckpt: CkptResource) -> None:
    with pytest.raises(dg.DagsterInvalidConfigError) as info:
        run_op(rescale_streaming_job, ckpt, {"job": "orders", "partitions": "three"})
    assert ('Invalid scalar at path root:ops:rescale_streaming_job:config:partitions. Value "three" of type '
            "\"<class 'str'>\" is not valid for expected type \"Int\"") in str(info.value)


def test_a_retry_of_an_upgrade_that_failed_unexpectedly_resumes_it_and_does_each_step_once(
        world: World, ckpt: CkptResource, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.launcher import upgrade

    real, lost = upgrade.start_check, []

    def lose_once(*args: Any, **kwargs: Any) -> Any:
        if not lost:
            lost.append(1)
            raise OSError("connection reset")  # no verdict, no refusal: Dagster's RetryPolicy retries the op
        return real(*args, **kwargs)

    monkeypatch.setattr(upgrade, "start_check", lose_once)
    job = dg.GraphDefinition(name="retried", node_defs=[upgrade_streaming_job]).to_job(
        resource_defs={CKPT_RESOURCE: ckpt}, op_retry_policy=dg.RetryPolicy(max_retries=3))
    result = job.execute_in_process(run_config={"ops": {"upgrade_streaming_job": {"config": UPGRADE}}},
                                    raise_on_error=False)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1  # once, then resumed
    assert result.success, failure(result)
    assert world.checks == [("latest-state", False)]
    assert [r.action for r in open_requests(world.store)] == [RequestAction.STOP]
    assert len(world.launches.calls) == 1


def test_an_upgrade_ships_the_new_code_s_files_after_the_resource_s_and_its_rollback_the_old_ones(
    world: World, ckpt: CkptResource
) -> None:
    old_files = {"py_files": ("s3a://shared/all.zip", "s3a://code/v1/common.py"), "files": ("s3a://code/v1/a.csv",)}
    record_deployment(world.store, old_deployment(job_file=ORDERS_V1, **old_files))
    shared = ckpt.model_copy(update={"py_files": ["s3a://shared/all.zip"]})
    world.healthy = [False, True]
    config = UPGRADE | {"py_files": ["s3a://code/v2/common.py"], "files": []}
    message, _ = refused(run_op(upgrade_streaming_job, shared, config))
    assert message.startswith("upgrade of job orders to v2 failed verification")
    new, old = world.launches.calls
    assert (new.deployment.py_files, new.deployment.files) == (("s3a://shared/all.zip", "s3a://code/v2/common.py"), ())
    assert (old.deployment.py_files, old.deployment.files) == (old_files["py_files"], old_files["files"])


def test_an_upgrade_without_files_keeps_the_recorded_ones(world: World, ckpt: CkptResource) -> None:
    record_deployment(world.store, old_deployment(job_file=ORDERS_V1, py_files=("s3a://code/v1/common.py",)))
    assert run_op(upgrade_streaming_job, ckpt, UPGRADE).success
    [new] = world.launches.calls
    assert (new.deployment.job_file, new.deployment.py_files) == (ORDERS_V2, ("s3a://code/v1/common.py",))
