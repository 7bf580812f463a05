"""UpgradeStreamingJobOperator: what is refused before anything stops, and a stop or launch that fails mid-way."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import LEASE, SPEC_LAST, STATUS, JobStore
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from tests.support.operatorfakes import (
    HEALTHY,
    ORDERS_V1,
    ORDERS_V2,
    SID,
    UNHEALTHY,
    FakeCheck,
    FakeLaunch,
    FakeTI,
    PopenCall,
    ack_event,
    context,
    control_keys,
    deferral,
    fire,
    next_step,
    old_deployment,
    only_request,
    pass_check,
    record_deployment,
    report,
    start_new_code,
    trigger_kwargs,
    upgrade_op,
)

# -- UpgradeStreamingJobOperator: refused before anything stops -----------------------------------------------------


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize("mode", ["savepoint", "last-state", "stateless"])
def test_upgrade_to_a_missing_job_file_is_refused_before_anything_stops(store: JobStore, checks: FakeCheck,
                                                                        running_v1: Launch, mode: str) -> None:
    before = {key: store.storage.read(key) for key in (STATUS, LEASE, SPEC_LAST)}
    with pytest.raises(AirflowException) as info:
        upgrade_op(job_file="orders_v3.py", upgrade_mode=mode).execute(context())
    assert str(info.value) == (
        "upgrade of job orders to orders_v3.py refused before anything was stopped: job file orders_v3.py not "
        "found: expected a Python file defining the job; the job runs as before")
    assert checks.calls == [] and control_keys(store) == []  # no restore check, no stop request
    assert {key: store.storage.read(key) for key in before} == before


@pytest.mark.usefixtures("no_launch")
def test_upgrade_of_a_deployment_spark_submit_would_refuse_is_refused_before_anything_stops(
        store: JobStore, checks: FakeCheck) -> None:
    record_deployment(store, old_deployment(deploy_mode="cluster"))  # master local[2]: no cluster mode
    report(store, epoch=3)
    with pytest.raises(AirflowException, match=r"refused before anything was stopped: deploy mode cluster with "
                                               r"master 'local\[2\]'.*; the job runs as before$"):
        upgrade_op().execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_to_a_job_file_that_exists_goes_ahead(store: JobStore, checks: FakeCheck, tmp_path: Path) -> None:
    job_file = tmp_path / "orders_v2.py"
    job_file.write_text(Path(ORDERS_V2).read_text())
    deferred = pass_check(upgrade_op(job_file=str(job_file)))
    assert only_request(store).action is RequestAction.STOP and next_step(deferred)[0] == "after_stop"
    assert checks.calls[0].deployment.job_file == str(job_file)


@pytest.mark.usefixtures("no_launch", "running_v1")
@pytest.mark.parametrize("value", ["three", -1, "-2", None, "", "2.5"])
def test_upgrade_refuses_a_bad_verify_batches_before_anything(store: JobStore, checks: FakeCheck,
                                                              value: Any) -> None:
    with pytest.raises(AirflowException) as info:
        upgrade_op(verify_batches=value).execute(context())
    assert str(info.value) == f"verify_batches: expected a whole number >= 0, found {value!r}"
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("running_v1")
@pytest.mark.parametrize(("value", "batches"), [("5", 5), ("0", 0), (0, 0)])
def test_upgrade_verifies_a_rendered_verify_batches(store: JobStore, checks: FakeCheck, launches: FakeLaunch,
                                                    value: Any, batches: int) -> None:
    verifying = start_new_code(store, upgrade_op(verify_batches=value))
    assert trigger_kwargs(verifying)["min_batches"] == batches


class RetryTI(FakeTI):
    def __init__(self, try_number: int) -> None:
        super().__init__()
        self.try_number = try_number


@pytest.mark.usefixtures("no_launch")
def test_a_retried_upgrade_fails_without_retrying_and_does_nothing(store: JobStore, checks: FakeCheck,
                                                                   running_v1: Launch) -> None:
    before = {key: store.storage.read(key) for key in (STATUS, LEASE, SPEC_LAST)}
    with pytest.raises(AirflowFailException) as info:  # AirflowFailException: no further retries either
        upgrade_op().execute({"ti": RetryTI(2)})
    assert str(info.value).startswith("upgrade of job orders: not retried (try 2): an earlier try may have stopped "
                                      "the old job or started the new code")
    assert "run upgrades without retries (Airflow: retries=0 on the task" in str(info.value)
    assert checks.calls == [] and control_keys(store) == []
    assert {key: store.storage.read(key) for key in before} == before


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_the_first_try_of_an_upgrade_goes_ahead(store: JobStore, checks: FakeCheck) -> None:
    deferred = pass_check(upgrade_op(), {"ti": RetryTI(1)})
    assert next_step(deferred)[0] == "after_stop" and len(checks.calls) == 1


# -- UpgradeStreamingJobOperator: the stop failed, the new code cannot be launched ------------------------------------


STOP_FAILURES = {
    "failed": lambda store: ack_event(store, only_request(store), Outcome.FAILED, snapshot_id=None,
                                      message="the savepoint upload failed"),
    "rejected": lambda store: ack_event(store, only_request(store), Outcome.REJECTED, snapshot_id=None,
                                        message="a savepoint is in progress"),
    "timeout": lambda store: {"status": "timeout", "message": "no outcome within 600 s: request unanswered"},
}


@pytest.mark.parametrize("failure", sorted(STOP_FAILURES))
def test_upgrade_whose_stop_failed_while_the_old_job_runs_changes_nothing(store: JobStore, checks: FakeCheck,
                                                                          launches: FakeLaunch, running_v1: Launch,
                                                                          failure: str) -> None:
    op = upgrade_op()
    stopped = pass_check(op)
    event = STOP_FAILURES[failure](store)
    report(store, epoch=3, code_version="v1")  # still RUNNING, heartbeat fresh
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(stopped, event))
    text = str(info.value)
    assert text.startswith("upgrade of job orders: job orders: ")
    assert text.endswith("), nothing was changed")
    assert launches.calls == [] and read_launch(store) == running_v1


@pytest.mark.parametrize(("state", "silent_for"), [(JobState.STOPPED, 0), (JobState.FAILED, 0),
                                                   (JobState.RUNNING, 60)], ids=["stopped", "failed", "stale"])
def test_upgrade_whose_stop_failed_after_the_old_job_went_down_relaunches_it(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running_v1: Launch, state: JobState,
        silent_for: float) -> None:
    op = upgrade_op()
    stopped = pass_check(op)
    event = STOP_FAILURES["failed"](store)
    report(store, epoch=3, state=state, updated_at=time.time() - silent_for)
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(stopped, event))
    [relaunch] = launches.calls
    assert (relaunch.deployment, str(relaunch.restore)) == (running_v1.deployment, "latest-state")  # the old code
    assert read_launch(store) == relaunch
    assert "the savepoint upload failed" in event["message"]
    assert str(info.value) == (
        f"upgrade of job orders: job orders: stop failed: {event['message']}; the old job had stopped: relaunched "
        "orders_v1.py (code v1) from its latest state")


def test_upgrade_whose_stop_failed_after_a_newer_driver_took_the_lease_fails_as_an_airflow_exception(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running_v1: Launch) -> None:
    op = upgrade_op()
    stopped = pass_check(op)
    event = STOP_FAILURES["timeout"](store)
    lease = LeaseRecord(job="orders", epoch=4, owner="driver-4", host="h", pid=43, acquired_at=time.time())
    store.storage.write(LEASE, lease.to_bytes())  # another submit's driver took the job over meanwhile
    with pytest.raises(AirflowException, match="upgrade of job orders: "):
        op.resume(context(), fire(stopped, event))
    assert launches.calls == []


def test_upgrade_whose_new_code_cannot_be_launched_rolls_back(store: JobStore, checks: FakeCheck,
                                                              popen_calls: list[PopenCall], tmp_path: Path) -> None:
    old = record_deployment(store, old_deployment(job_file=ORDERS_V1))
    report(store, epoch=3, code_version="v1")
    new_file = tmp_path / "orders_v2.py"
    new_file.write_text(Path(ORDERS_V2).read_text())
    op = upgrade_op(job_file=str(new_file))
    stopped = pass_check(op)  # the file is there: checked, then the old driver stops
    event = ack_event(store, only_request(store))
    new_file.unlink()  # gone when the new code is launched (another worker, a cleanup)
    rolling = deferral(lambda: op.resume(context(), fire(stopped, event)))
    [(argv, _, _)] = popen_calls
    assert argv[4] == ORDERS_V1  # only the old code was started: the real launch refused the new one
    rollback = read_launch(store)
    assert rollback is not None and (rollback.deployment, str(rollback.restore)) == (old.deployment, SID)
    assert isinstance(rolling.trigger, JobHealthTrigger)
    assert trigger_kwargs(rolling)["started_after"] == rollback.launched_at
    method, kwargs = next_step(rolling)
    assert method == "after_rollback" and kwargs["plan"]["snapshot_id"] == SID
    assert kwargs["why"] == (f"the new code could not be launched: cannot launch job orders: job file {new_file} not "
                             "found: expected a Python file defining the job")
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(rolling, HEALTHY))
    assert str(info.value).endswith(f"rolled back to v1 from {SID}: the old code runs again (epoch 4)")
    assert "could not be launched" in str(info.value)


def test_a_failed_rollback_from_the_latest_state_says_the_state_is_uncertain() -> None:
    plan = {"old": {"deployment": old_deployment().to_dict()}, "snapshot_id": None}
    with pytest.raises(AirflowException) as info:
        upgrade_op(upgrade_mode="last-state").after_rollback(context(), UNHEALTHY, plan=plan,
                                                              why="no verdict within 120 s")
    assert str(info.value) == (
        "upgrade of job orders to v2 failed verification (no verdict within 120 s) and the rollback to v1 ALSO "
        "failed (job orders: expected it healthy, found FAILED at epoch 4 (reason: boom)); the job's state is "
        "uncertain: check `ckpt job status --job orders`, and if it is not running restore it from snapshot "
        "(its latest state)")
