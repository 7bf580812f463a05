"""UpgradeStreamingJobOperator: check the new code, stop with savepoint, start the new code, verify, roll back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, read_launch
from airflow_ckpt_provider.core.records.restore_check import OUTCOME_GRACE
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import LEASE, SPEC_LAST, SPEC_STABLE, STATUS, JobStore
from airflow_ckpt_provider.operators.base import DEFER_GRACE
from airflow_ckpt_provider.runtime.config import default_checkpoint
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome
from airflow_ckpt_provider.triggers.control import RequestTrigger
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger
from tests.support.operatorfakes import (
    HEALTHY,
    ORDERS_V2,
    SID,
    SNAPSHOT_KEY,
    SPARK_UI_KEY,
    UI,
    UNHEALTHY,
    FakeCheck,
    FakeLaunch,
    ack_event,
    context,
    control_keys,
    deferral,
    fire,
    make_snapshots,
    next_step,
    old_deployment,
    only_request,
    pass_check,
    record_deployment,
    report,
    start_new_code,
    timeout_s,
    trigger_kwargs,
    upgrade_op,
    verdict,
)

# -- UpgradeStreamingJobOperator --------------------------------------------------------------------------------------






@pytest.mark.usefixtures("no_launch")
def test_upgrade_without_a_deployment_is_refused(store: JobStore, checks: FakeCheck) -> None:
    report(store)
    with pytest.raises(AirflowException, match=r"no recorded deployment .*nothing was changed"):
        upgrade_op().execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_refuses_an_unknown_mode(store: JobStore, checks: FakeCheck) -> None:
    with pytest.raises(ConfigError, match="invalid upgrade_mode: expected one of savepoint, last-state, stateless, "
                       "found 'blue-green'"):
        upgrade_op(upgrade_mode="blue-green")
    op = upgrade_op(upgrade_mode="{{ params.upgrade_mode }}")
    op.upgrade_mode = "blue-green"  # rendered
    with pytest.raises(AirflowException, match=r"invalid upgrade_mode: .*found 'blue-green'.*nothing was changed"):
        op.execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
def test_upgrade_with_savepoint_of_a_job_that_is_not_running_is_refused(store: JobStore, checks: FakeCheck) -> None:
    record_deployment(store)
    report(store, state=JobState.STOPPED)
    with pytest.raises(AirflowException, match="refused before anything was stopped: it is not running, so no "
                                               "savepoint can be taken; use upgrade_mode last-state"):
        upgrade_op().execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
def test_upgrade_refused_by_the_restore_check_changes_nothing(store: JobStore, checks: FakeCheck,
                                                              running_v1: Launch) -> None:
    checks.outcome = CheckOutcome.INCOMPATIBLE
    before = {key: store.storage.read(key) for key in (STATUS, LEASE, SPEC_LAST)}
    op = upgrade_op()
    checking = deferral(lambda: op.execute(context()))
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(checking, verdict(checking)))
    assert str(info.value) == (
        f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: restore check of snapshot {SID} "
        "with the new code: incompatible: STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE: the key schema changed; "
        "the job runs as before")
    assert len(checks.calls) == 1 and control_keys(store) == []
    assert {key: store.storage.read(key) for key in before} == before
    assert read_launch(store) == running_v1


@pytest.mark.usefixtures("no_launch", "running_v1")
@pytest.mark.parametrize(("event", "why"), [
    ({"status": "failed", "message": "job orders: expected a verdict from restore check C, found none and its "
      "process no longer exists; no verdict. Run the upgrade again", "reason": "its process no longer exists"},
     "restore check of snapshot - with the new code: failed: its process no longer exists"),
    ({"status": "bad-input", "reason": "job file orders_v2.py does not define a @streaming_job", "message": "m"},
     "job file orders_v2.py does not define a @streaming_job"),
    ({"status": "timeout", "message": "no outcome within 720 s: expected the verdict of restore check C"},
     "restore check: timed out: no outcome within 720 s: expected the verdict of restore check C"),
    ({"status": "error", "message": "RestoreCheckTrigger failed: ConfigError: no connection", "traceback": "tb"},
     "restore check: the trigger failed: RestoreCheckTrigger failed: ConfigError: no connection\ntb"),
], ids=["process-gone", "bad-input", "timeout", "error"])
def test_upgrade_without_a_compatible_verdict_is_refused_before_anything_stops(
        store: JobStore, checks: FakeCheck, event: dict[str, Any], why: str) -> None:
    checks.outcome = None  # the check process recorded nothing
    op = upgrade_op()
    checking = deferral(lambda: op.execute(context()))
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(checking, event))
    text = str(info.value)
    assert text.startswith(f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: {why}")
    assert text.endswith("; the job runs as before")
    assert control_keys(store) == []


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_not_deferrable_waits_for_the_verdict_in_the_worker(store: JobStore, checks: FakeCheck) -> None:
    checks.outcome = CheckOutcome.INCOMPATIBLE
    with pytest.raises(AirflowException, match=r"refused before anything was stopped: restore check of snapshot "
                                               rf"{SID} with the new code: incompatible: "):
        upgrade_op(deferrable=False, poll_interval=0.01).execute(context())
    assert len(checks.calls) == 1 and control_keys(store) == []


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_refuses_when_the_job_stopped_while_the_check_ran(store: JobStore, checks: FakeCheck) -> None:
    op = upgrade_op()
    checking = deferral(lambda: op.execute(context()))
    report(store, epoch=3, state=JobState.STOPPED)
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(checking, verdict(checking)))
    assert str(info.value) == (
        f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: it is not running, so no "
        "savepoint can be taken; use upgrade_mode last-state to upgrade from its latest checkpoint (observed after "
        "the restore check); the job runs as before")
    assert control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
def test_upgrade_checks_the_new_code_then_stops_with_savepoint(store: JobStore, checks: FakeCheck,
                                                               running_v1: Launch) -> None:
    op = upgrade_op(check_timeout=321, stop_timeout=44)
    checking = deferral(lambda: op.execute(context()))
    [call] = checks.calls
    assert (call.deployment, call.timeout, call.allow_non_restored_state, call.started_by) == (
        running_v1.deployment.with_code(ORDERS_V2, "v2"), 321, False, "airflow:adhoc_airflow.upgrade")
    assert control_keys(store) == []  # nothing is stopped while the check runs
    assert isinstance(checking.trigger, RestoreCheckTrigger)
    assert trigger_kwargs(checking)["check_id"] == "check-1"
    assert trigger_kwargs(checking)["timeout"] == 321 + OUTCOME_GRACE + 30  # after the watch's own deadline
    assert timeout_s(checking) == 321 + OUTCOME_GRACE + 30 + DEFER_GRACE
    method, kwargs = next_step(checking)
    assert method == "after_check" and set(kwargs) == {"plan"}
    deferred = deferral(lambda: op.resume(context(), fire(checking, verdict(checking))))
    request = only_request(store)
    assert (request.action, request.epoch) == (RequestAction.STOP, 3)
    assert isinstance(deferred.trigger, RequestTrigger)
    assert (trigger_kwargs(deferred)["request_id"], trigger_kwargs(deferred)["timeout"]) == (request.id, 44)
    assert timeout_s(deferred) == 44 + DEFER_GRACE
    method, kwargs = next_step(deferred)
    assert method == "after_stop" and set(kwargs) == {"plan"}
    plan = kwargs["plan"]
    assert plan["old"]["deployment"]["job_file"] == "orders_v1.py"
    assert (plan["new"]["job_file"], plan["new"]["code_version"]) == (ORDERS_V2, "v2")
    stored = json.loads(json.dumps(trigger_kwargs(deferred)))["resume_with"]["kwargs"]["plan"]  # the trigger's JSON
    assert Launch.from_dict(stored["old"]) == running_v1
    assert Deployment.from_dict(stored["new"]) == running_v1.deployment.with_code(ORDERS_V2, "v2")


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_last_state_cancels_the_running_driver(store: JobStore, checks: FakeCheck) -> None:
    deferred = pass_check(upgrade_op(upgrade_mode="last-state"))
    assert only_request(store).action is RequestAction.CANCEL and next_step(deferred)[0] == "after_stop"
    assert len(checks.calls) == 1


@pytest.mark.usefixtures("running_v1")
def test_upgrade_after_the_savepoint_starts_the_new_code_from_it(store: JobStore, checks: FakeCheck,
                                                                 launches: FakeLaunch) -> None:
    deferred = start_new_code(store, upgrade_op())
    [record] = launches.calls
    assert (record.deployment.job_file, record.deployment.code_version, str(record.restore)) == (ORDERS_V2, "v2", SID)
    assert record.deployment.env == {"TOPIC": "orders"} and record.deployment.keep_checkpoints == 5  # kept from v1
    assert record.deployment.checkpoint is None  # with its state: on the live checkpoint location it had
    assert isinstance(deferred.trigger, JobHealthTrigger)
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["min_batches"], kwargs["started_after"], kwargs["start_timeout"], kwargs["max_restarts"]) == (
        3, record.launched_at, 120, 1)
    assert kwargs["timeout"] == 120 and timeout_s(deferred) == 120 + DEFER_GRACE  # verify_timeout: the verdict
    method, step_kwargs = next_step(deferred)
    assert method == "after_verify"
    plan = step_kwargs["plan"]
    assert plan["snapshot_id"] == SID and plan["launch"] == record.to_dict()


@pytest.mark.usefixtures("running_v1")
def test_upgrade_after_a_cancel_rolls_back_to_the_latest_snapshot(store: JobStore, tmp_path: Path,
                                                                  checks: FakeCheck, launches: FakeLaunch) -> None:
    [latest] = make_snapshots(store, tmp_path, [Kind.CHECKPOINT])
    op = upgrade_op(upgrade_mode="last-state")
    stopped = pass_check(op)
    event = ack_event(store, only_request(store), snapshot_id=None)
    deferred = deferral(lambda: op.resume(context(), fire(stopped, event)))
    assert str(launches.calls[0].restore) == "latest-state"
    assert next_step(deferred)[1]["plan"]["snapshot_id"] == latest


@pytest.mark.usefixtures("running_v1")
def test_upgrade_of_a_stopped_job_in_last_state_or_stateless_mode(store: JobStore, checks: FakeCheck,
                                                                   launches: FakeLaunch) -> None:
    report(store, epoch=3, state=JobState.STOPPED)
    deferred = pass_check(upgrade_op(upgrade_mode="last-state"))
    assert next_step(deferred)[0] == "after_verify" and control_keys(store) == []
    assert len(checks.calls) == 1 and str(launches.calls[-1].restore) == "latest-state"
    deferred = deferral(lambda: upgrade_op(upgrade_mode="stateless").execute(context()))
    assert next_step(deferred)[0] == "after_verify" and control_keys(store) == []
    assert len(checks.calls) == 1 and str(launches.calls[-1].restore) == "none"  # stateless: nothing to check


@pytest.mark.parametrize(("checkpoint", "base"), [(None, None), ("/ckpt/orders/", "/ckpt/orders")],
                         ids=["default", "own"])
def test_upgrade_stateless_starts_on_a_fresh_checkpoint_location(store: JobStore, checks: FakeCheck,
                                                                 launches: FakeLaunch, checkpoint: str | None,
                                                                 base: str | None) -> None:
    old = record_deployment(store, old_deployment(checkpoint=checkpoint))
    report(store, epoch=3, code_version="v1")
    op = upgrade_op(upgrade_mode="stateless")
    before = int(time.time())
    stopped = deferral(lambda: op.execute(context()))
    after = int(time.time())
    assert only_request(store).action is RequestAction.CANCEL and checks.calls == []
    assert next_step(stopped)[1]["plan"]["new"]["checkpoint"].startswith(f"{base or default_checkpoint('orders')}-")
    verifying = deferral(lambda: op.resume(context(), fire(stopped, ack_event(store, only_request(store),
                                                                              snapshot_id=None))))
    [new] = launches.calls
    assert new.deployment.checkpoint is not None
    prefix, stamp = new.deployment.checkpoint.rsplit("-stateless-", 1)
    assert prefix == (base or default_checkpoint("orders")) and before <= int(stamp) <= after
    assert (new.deployment.code_version, str(new.restore)) == ("v2", "none")
    assert new.deployment.to_dict() | {"checkpoint": checkpoint} == \
        old.deployment.with_code(ORDERS_V2, "v2").to_dict()  # only the code and the location changed
    # a failed verification rolls back to the old code on its own, untouched checkpoint location
    deferral(lambda: op.resume(context(), fire(verifying, UNHEALTHY)))
    rollback = launches.calls[-1]
    assert rollback.deployment == old.deployment and rollback.deployment.checkpoint == checkpoint


@pytest.mark.usefixtures("running_v1")
def test_upgrade_verified_records_the_stable_deployment(store: JobStore, checks: FakeCheck,
                                                        launches: FakeLaunch) -> None:
    op = upgrade_op()
    verifying = start_new_code(store, op)
    ctx = context()
    result = op.resume(ctx, fire(verifying, HEALTHY))
    assert result == {"job": "orders", "from_version": "v1", "to_version": "v2", "upgrade_mode": "savepoint",
                      "snapshot_id": SID, "epoch": 4, "batch_id": 9, "partitions": None,
                      "rescaled_snapshot_id": None}
    stable = read_launch(store, SPEC_STABLE)
    assert stable == launches.calls[0] and stable is not None and stable.deployment.code_version == "v2"
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI, SNAPSHOT_KEY: store.snapshot_uri(SID)}
    assert len(launches.calls) == 1  # no rollback


@pytest.mark.parametrize(("event", "why"), [
    (UNHEALTHY, "expected it healthy, found FAILED"),
    ({"status": "timeout", "message": "no outcome within 120 s"}, "no verdict within 120 s"),
])
def test_upgrade_that_fails_verification_rolls_back_from_the_savepoint(store: JobStore, checks: FakeCheck,
                                                                       launches: FakeLaunch, running_v1: Launch,
                                                                       event: dict[str, Any], why: str) -> None:
    op = upgrade_op()
    verifying = start_new_code(store, op)
    deferred = deferral(lambda: op.resume(context(), fire(verifying, event)))
    new, rollback = launches.calls
    assert new.deployment.code_version == "v2"
    assert (rollback.deployment, str(rollback.restore)) == (running_v1.deployment, SID)  # the old deployment, as it was
    assert read_launch(store, SPEC_STABLE) is None
    assert isinstance(deferred.trigger, JobHealthTrigger)
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["started_after"], kwargs["start_timeout"], kwargs["min_batches"]) == (rollback.launched_at, 120, 0)
    assert kwargs["timeout"] == 120 and timeout_s(deferred) == 120 + DEFER_GRACE
    method, step_kwargs = next_step(deferred)
    assert method == "after_rollback" and why in step_kwargs["why"]
    assert step_kwargs["plan"]["snapshot_id"] == SID


@pytest.mark.usefixtures("running_v1")
def test_upgrade_rollback_outcome_fails_the_task_either_way(store: JobStore, checks: FakeCheck,
                                                            launches: FakeLaunch) -> None:
    op = upgrade_op()
    verifying = start_new_code(store, op)
    rolling = deferral(lambda: op.resume(context(), fire(verifying, UNHEALTHY)))
    ctx = context()
    with pytest.raises(AirflowException) as info:
        op.resume(ctx, fire(rolling, HEALTHY))
    assert "failed verification (job orders: expected it healthy" in str(info.value)
    assert f"rolled back to v1 from {SID}: the old code runs again (epoch 4)" in str(info.value)
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(rolling, UNHEALTHY))
    assert "rollback to v1 ALSO failed (job orders: expected it healthy" in str(info.value)
    assert str(info.value).endswith("the job's state is uncertain: check `ckpt job status --job orders`, and if it "
                                    f"is not running restore it from snapshot {SID}")
    with pytest.raises(AirflowException, match=r"ALSO failed \(no verdict within 120 s"):
        op.resume(context(), fire(rolling, {"status": "timeout"}))


@pytest.mark.usefixtures("no_launch", "running_v1")
@pytest.mark.parametrize(("value", "expected"), [("False", False), ("false", False), ("True", True), (True, True),
                                                 (False, False), ("1", True), ("", False)])
def test_allow_non_restored_state_rendered_as_text(store: JobStore, checks: FakeCheck, value: Any,
                                                   expected: bool) -> None:
    deferral(lambda: upgrade_op(allow_non_restored_state=value).execute(context()))
    [call] = checks.calls
    assert call.allow_non_restored_state is expected


# -- the new code's py files and files ------------------------------------------------------------------------------


def test_upgrade_ships_the_new_code_s_files_and_the_rollback_the_old_ones(
    store: JobStore, checks: FakeCheck, launches: FakeLaunch
) -> None:
    old = record_deployment(store, old_deployment(py_files=("s3a://code/v1/common.py",), files=("s3a://v1/a.csv",)))
    report(store, epoch=3, code_version="v1")
    op = upgrade_op(py_files="s3a://code/v2/common.py, s3a://code/v2/x.zip", files=[])  # as a template renders
    verifying = start_new_code(store, op)
    [call] = checks.calls  # the restore check ran the new code with its own files
    assert call.deployment.py_files == ("s3a://code/v2/common.py", "s3a://code/v2/x.zip")
    deferral(lambda: op.resume(context(), fire(verifying, UNHEALTHY)))
    new, rollback = launches.calls
    assert (new.deployment.py_files, new.deployment.files) == (("s3a://code/v2/common.py", "s3a://code/v2/x.zip"), ())
    assert rollback.deployment == old.deployment
    assert (rollback.deployment.py_files, rollback.deployment.files) == (("s3a://code/v1/common.py",),
                                                                         ("s3a://v1/a.csv",))


@pytest.mark.parametrize("kept", [None, "", "None"])  # not given, or a template that rendered to nothing
def test_upgrade_without_files_keeps_the_recorded_ones(store: JobStore, checks: FakeCheck, launches: FakeLaunch,
                                                       kept: str | None) -> None:
    record_deployment(store, old_deployment(py_files=("s3a://code/v1/common.py",)))
    report(store, epoch=3, code_version="v1")
    start_new_code(store, upgrade_op(py_files=kept, files=kept))
    [new] = launches.calls
    assert (new.deployment.job_file, new.deployment.py_files, new.deployment.files) == (
        ORDERS_V2, ("s3a://code/v1/common.py",), ())


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_refuses_py_files_that_are_no_list_of_paths(store: JobStore, checks: FakeCheck) -> None:
    with pytest.raises(AirflowException) as info:
        upgrade_op(py_files=7).execute(context())
    assert str(info.value) == ("upgrade of job orders: py_files must be a list of paths or URIs (or one "
                               "comma-separated string), found int '7'; nothing was changed")
    assert checks.calls == [] and control_keys(store) == []
