"""RescaleStreamingJobOperator (and the upgrade's ``partitions``): check on a repartitioned copy, stop with savepoint,
repartition the savepoint on a copy and save it, start from that one, verify, roll back to the old partitions."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.upgrade import RescaleStreamingJobOperator
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger
from tests.support.operatorfakes import (
    HEALTHY,
    ORDERS_V1,
    RESCALED_SID,
    SID,
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
    record_deployment,
    report,
    upgrade_op,
    verdict,
)
from tests.support.upgradefakes import rocksdb_savepoint


@pytest.fixture
def running(store: JobStore) -> Launch:
    """orders_v1 deployed (a job file that exists: the launch checks the spark-submit command) and running."""
    record = record_deployment(store, old_deployment(job_file=ORDERS_V1))
    report(store, epoch=3, code_version="v1")
    return record


def rescale_op(**kwargs: object) -> RescaleStreamingJobOperator:
    return RescaleStreamingJobOperator(**{"task_id": "rescale", "job": "orders", "partitions": 5,
                                          "verify_batches": 3, "verify_timeout": 120} | kwargs)


def to_verification(store: JobStore, op: RescaleStreamingJobOperator) -> TaskDeferred:
    """Steps 1-3 as Airflow resumes them; returns the deferral of the verification."""
    checking = deferral(lambda: op.execute(context()))
    stopping = deferral(lambda: op.resume(context(), fire(checking, verdict(checking))))
    rescaling = deferral(lambda: op.resume(context(), fire(stopping, ack_event(store, only_request(store)))))
    return deferral(lambda: op.resume(context(), fire(rescaling, verdict(rescaling))))


def test_rescale_checks_a_repartitioned_copy_stops_saves_the_repartitioned_savepoint_and_starts_on_it(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running: Launch) -> None:
    op = rescale_op()
    checking = deferral(lambda: op.execute(context()))
    [check] = checks.calls
    assert (check.deployment, check.restore, check.rescale_to, check.save_rescaled) == (
        running.deployment, "latest-state", 5, False)  # the same code, its latest state, repartitioned on a copy
    assert control_keys(store) == []  # nothing stopped while the check runs
    stopping = deferral(lambda: op.resume(context(), fire(checking, verdict(checking))))
    request = only_request(store)
    assert (request.action, request.epoch) == (RequestAction.STOP, 3)
    rescaling = deferral(lambda: op.resume(context(), fire(stopping, ack_event(store, request))))
    assert isinstance(rescaling.trigger, RestoreCheckTrigger) and next_step(rescaling)[0] == "after_rescale"
    _, repartition = checks.calls
    assert (repartition.deployment, repartition.restore, repartition.rescale_to, repartition.save_rescaled) == (
        running.deployment, SID, 5, True)  # the stop's savepoint, saved once repartitioned and checked
    assert launches.calls == []  # nothing starts before the repartitioned savepoint exists
    verifying = deferral(lambda: op.resume(context(), fire(rescaling, verdict(rescaling))))
    [started] = launches.calls
    assert (started.deployment, str(started.restore)) == (running.deployment, RESCALED_SID)
    assert isinstance(verifying.trigger, JobHealthTrigger) and next_step(verifying)[0] == "after_verify"
    result = op.resume(context(), fire(verifying, HEALTHY))
    assert result == {"job": "orders", "from_version": "v1", "to_version": "v1", "upgrade_mode": "savepoint",
                      "snapshot_id": SID, "epoch": 4, "batch_id": 9, "partitions": 5,
                      "rescaled_snapshot_id": RESCALED_SID}


def test_rescale_that_fails_verification_starts_the_old_partitions_again_from_the_stops_savepoint(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running: Launch) -> None:
    op = rescale_op()
    verifying = to_verification(store, op)
    rolling_back = deferral(lambda: op.resume(context(), fire(verifying, UNHEALTHY)))
    new, rollback = launches.calls
    assert str(new.restore) == RESCALED_SID
    assert (rollback.deployment, str(rollback.restore)) == (running.deployment, SID)
    with pytest.raises(AirflowException, match=r"rescale of job orders to 5 state partitions failed verification "
                                               r"\(job orders: expected it healthy, found FAILED .*\); rolled back to "
                                               r"v1 from savepoint-7-\S+ on its old partitions: it runs again"):
        op.resume(context(), fire(rolling_back, HEALTHY))


@pytest.mark.parametrize("outcome", [CheckOutcome.INCOMPATIBLE, CheckOutcome.INCONCLUSIVE])
def test_a_failed_repartition_of_the_savepoint_rolls_back_before_anything_new_starts(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running: Launch, outcome: CheckOutcome) -> None:
    op = rescale_op()
    checking = deferral(lambda: op.execute(context()))
    stopping = deferral(lambda: op.resume(context(), fire(checking, verdict(checking))))
    checks.outcome = outcome  # the repartition's verdict (the first check passed)
    rescaling = deferral(lambda: op.resume(context(), fire(stopping, ack_event(store, only_request(store)))))
    rolling_back = deferral(lambda: op.resume(context(), fire(rescaling, verdict(rescaling))))
    [rollback] = launches.calls
    assert (rollback.deployment, str(rollback.restore)) == (running.deployment, SID)
    assert next_step(rolling_back)[0] == "after_rollback"


@pytest.mark.usefixtures("running")
@pytest.mark.parametrize(("kwargs", "why"), [
    ({"partitions": 0}, r"partitions: expected a whole number from 1 to 10000, found 0; nothing was changed"),
    ({"partitions": "many"}, r"partitions: expected a whole number from 1 to 10000, found 'many'"),
    ({"partitions": None}, r"expected partitions \(a whole number >= 1\), found None; nothing was changed"),
])
def test_bad_partitions_are_refused_before_anything_runs(store: JobStore, checks: FakeCheck,
                                                         kwargs: dict[str, object], why: str) -> None:
    with pytest.raises(AirflowException, match=why):
        rescale_op(**kwargs).execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("running")
def test_partitions_with_another_upgrade_mode_are_refused(store: JobStore, checks: FakeCheck) -> None:
    with pytest.raises(AirflowException, match=r"partitions=5 with upgrade_mode last-state; a rescale goes through "
                                               r"a savepoint: use upgrade_mode savepoint"):
        upgrade_op(partitions=5, upgrade_mode="last-state").execute(context())
    assert checks.calls == [] and control_keys(store) == []


def test_a_stateless_jobs_rescale_is_refused_from_its_latest_snapshot_without_a_check(
        store: JobStore, tmp_path: Path, checks: FakeCheck, running: Launch) -> None:
    make_snapshots(store, tmp_path, [Kind.CHECKPOINT])  # a checkpoint without state operators
    with pytest.raises(AirflowException, match=r"rescale of job orders to 5 state partitions refused before "
                                               r"anything was stopped: snapshot checkpoint-0-.*: the query has no "
                                               r"state at batch 0.*the job runs as before"):
        rescale_op().execute(context())
    assert checks.calls == [] and control_keys(store) == []


def test_a_job_stopped_with_a_savepoint_is_repartitioned_from_it_without_a_stop(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running: Launch) -> None:
    rocksdb_savepoint(store, SID, 7, 2)
    report(store, epoch=3, state=JobState.STOPPED, batch_id=7,
           last_snapshot={"id": SID, "kind": "savepoint", "batch_id": 7})
    op = rescale_op()
    rescaling = deferral(lambda: op.execute(context()))
    [repartition] = checks.calls  # no separate check: the repartition step runs the code on its copy
    assert (repartition.restore, repartition.rescale_to, repartition.save_rescaled) == (SID, 5, True)
    assert control_keys(store) == [] and next_step(rescaling)[0] == "after_rescale"
    deferral(lambda: op.resume(context(), fire(rescaling, verdict(rescaling))))
    [started] = launches.calls
    assert (started.deployment, str(started.restore)) == (running.deployment, RESCALED_SID)


def test_a_rescale_that_died_after_saving_is_finished_from_the_saved_savepoint(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running: Launch) -> None:
    rocksdb_savepoint(store, SID, 7, 2)
    rocksdb_savepoint(store, RESCALED_SID, 8, 5, rescaled_from=SID, partitions_before="2")
    report(store, epoch=3, state=JobState.STOPPED, batch_id=7,
           last_snapshot={"id": SID, "kind": "savepoint", "batch_id": 7})
    op = rescale_op()
    verifying = deferral(lambda: op.execute(context()))
    assert checks.calls == [] and control_keys(store) == [] and next_step(verifying)[0] == "after_verify"
    [started] = launches.calls
    assert str(started.restore) == RESCALED_SID


def test_a_cancelled_jobs_rescale_is_refused(store: JobStore, checks: FakeCheck, running: Launch) -> None:
    rocksdb_savepoint(store, SID, 7, 2)
    report(store, epoch=3, state=JobState.STOPPED, batch_id=9)
    with pytest.raises(AirflowException, match=r"refused before anything was stopped: the job is not running "
                                               r"\(STOPPED\) and did not stop with a savepoint"):
        rescale_op().execute(context())
    assert checks.calls == []
