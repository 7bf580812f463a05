"""RestartStreamingJobOperator: stop first when running, then launch the recorded deployment."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, open_requests
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.base import DEFER_GRACE
from airflow_ckpt_provider.operators.job import (
    RestartStreamingJobOperator,
)
from airflow_ckpt_provider.triggers.control import RequestTrigger
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from tests.support.operatorfakes import (
    HEALTHY,
    SID,
    SNAPSHOT_KEY,
    SPARK_UI_KEY,
    UI,
    FakeLaunch,
    FakeTI,
    ack_event,
    context,
    control_keys,
    deferral,
    fire,
    next_step,
    only_request,
    record_deployment,
    report,
    timeout_s,
    trigger_kwargs,
)

# -- RestartStreamingJobOperator ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_launch")
def test_restart_without_a_recorded_deployment_is_refused(store: JobStore) -> None:
    report(store)
    with pytest.raises(AirflowException, match=r"no recorded deployment \(spec/last.json\): submit it first"):
        RestartStreamingJobOperator(task_id="restart", job="orders").execute(context())
    assert control_keys(store) == []


BAD_INPUT = [({"restore": "snapshot"}, "needs the snapshot"),
             ({"stop_mode": "kill"}, "invalid stop mode: expected one of savepoint, cancel, found 'kill'")]


@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUT)
def test_restart_refuses_bad_literal_input_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RestartStreamingJobOperator(task_id="restart", job="orders", **kwargs)


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("kwargs", "message"), BAD_INPUT)
def test_restart_refuses_bad_templated_input_before_stopping(store: JobStore, kwargs: dict[str, Any],
                                                             message: str) -> None:
    record_deployment(store)
    report(store)
    [(name, rendered)] = kwargs.items()
    op = RestartStreamingJobOperator(task_id="restart", job="orders", **{name: "{{ params.x }}"})
    setattr(op, name, rendered)  # as Airflow renders it
    with pytest.raises(AirflowException, match=message):
        op.execute(context())
    assert control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("stop_mode", "action"), [("cancel", RequestAction.CANCEL), ("savepoint", RequestAction.STOP)])
def test_restart_of_a_running_job_stops_it_first(store: JobStore, stop_mode: str, action: RequestAction) -> None:
    record_deployment(store)
    report(store, epoch=3)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", stop_mode=stop_mode, stop_timeout=30)
    deferred = deferral(lambda: op.execute(context()))
    request = only_request(store)
    assert (request.action, request.epoch) == (action, 3)
    assert isinstance(deferred.trigger, RequestTrigger) and next_step(deferred) == ("after_stop", {})
    assert (trigger_kwargs(deferred)["request_id"], trigger_kwargs(deferred)["timeout"]) == (request.id, 30)
    assert timeout_s(deferred) == 30 + DEFER_GRACE


@pytest.mark.parametrize("changes", [None, {"state": JobState.FAILED}], ids=["never-reported", "failed"])
def test_restart_of_a_stopped_job_launches_its_deployment(store: JobStore, launches: FakeLaunch,
                                                          changes: dict[str, Any] | None) -> None:
    old = record_deployment(store)
    if changes is not None:
        report(store, **changes)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", restore=SID, start_timeout=77)
    deferred = deferral(lambda: op.execute(context()))
    [record] = launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, SID)
    assert control_keys(store) == []
    assert isinstance(deferred.trigger, JobHealthTrigger)
    assert next_step(deferred) == ("execute_complete", {"launch_id": record.launch_id})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["started_after"], kwargs["min_epoch"], kwargs["start_timeout"]) == (record.launched_at, None, 77)
    assert kwargs["timeout"] == 77 + 60 and timeout_s(deferred) == 77 + 60 + DEFER_GRACE


def test_restart_after_the_stop_launches_or_fails(store: JobStore, launches: FakeLaunch) -> None:
    old = record_deployment(store)
    report(store)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", restore="latest-savepoint")
    deferral(lambda: op.execute(context()))
    request = only_request(store)
    failed = ack_event(store, request, Outcome.FAILED, snapshot_id=None, message="cancel failed")
    with pytest.raises(AirflowException, match="cancel failed"):
        op.after_stop(context(), failed)
    assert launches.calls == []
    deferred = deferral(lambda: op.after_stop(context(), {**failed, "status": "completed"}))
    [record] = launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, "latest-savepoint")
    assert next_step(deferred) == ("execute_complete", {"launch_id": record.launch_id})
    assert op.execute_complete(context(), HEALTHY, launch_id=record.launch_id) == {
        "job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING", "ui_url": UI, "launch_id": record.launch_id,
        "restore": "latest-savepoint", "restarted_by": "operator"}


def test_a_retried_restart_waits_for_the_launch_of_its_first_try_instead_of_stopping_it_and_launching_again(
    store: JobStore, launches: FakeLaunch
) -> None:
    record_deployment(store)
    report(store)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", restore="latest-savepoint")
    deferral(lambda: op.execute(context(ti=FakeTI("scheduled__1", 1))))
    stop = only_request(store)
    ack_event(store, stop)  # the cancel completed
    deferral(lambda: op.after_stop(context(ti=FakeTI("scheduled__1", 1)), None))  # launched; then the worker died
    [first] = launches.calls
    assert first.key == "airflow:adhoc_airflow.restart run scheduled__1"
    report(store, epoch=4, state=JobState.STARTING)  # the new driver starts

    retried = deferral(lambda: op.execute(context(ti=FakeTI("scheduled__1", 2))))
    assert len(launches.calls) == 1 and open_requests(store) == []  # nothing stopped, nothing launched again
    assert next_step(retried) == ("execute_complete", {"launch_id": first.launch_id})
    assert trigger_kwargs(retried)["started_after"] == first.launched_at

    # another run of the task restarts again: it stops the running driver first
    deferral(lambda: op.execute(context(ti=FakeTI("scheduled__2", 1))))
    assert only_request(store).epoch == 4 and len(launches.calls) == 1


def test_restart_with_a_savepoint_stop_resumes_through_both_steps(store: JobStore, launches: FakeLaunch) -> None:
    old = record_deployment(store)
    report(store)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", stop_mode="savepoint", restore=SID)
    stopped = deferral(lambda: op.execute(context()))
    ctx = context()
    started = deferral(lambda: op.resume(ctx, fire(stopped, ack_event(store, only_request(store)))))
    assert ctx["ti"].xcoms == {SNAPSHOT_KEY: store.snapshot_uri(SID)}  # the final savepoint, linked
    [record] = launches.calls
    assert (record.deployment, str(record.restore)) == (old.deployment, SID)
    assert isinstance(started.trigger, JobHealthTrigger) and trigger_kwargs(started)["started_after"] == \
        record.launched_at
    ctx = context()
    assert op.resume(ctx, fire(started, HEALTHY)) == {
        "job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING", "ui_url": UI, "launch_id": record.launch_id,
        "restore": SID, "restarted_by": "operator"}
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}
