"""StopStreamingJobOperator: the request it writes, its deferral and every outcome of resuming."""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.operators.base import DEFER_GRACE
from airflow_ckpt_provider.operators.job import (
    StopStreamingJobOperator,
)
from airflow_ckpt_provider.triggers.base import MIN_DEFERRAL
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
    next_step,
    only_request,
    report,
    timeout_s,
    trigger_kwargs,
)

# -- StopStreamingJobOperator ------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [{"state": JobState.STOPPED}, {"state": JobState.FAILED},
                                     {"updated_at": time.time() - 60}], ids=["stopped", "failed", "stale"])
def test_stop_of_a_job_that_is_not_running_writes_nothing(store: JobStore, changes: dict[str, Any]) -> None:
    report(store, batch_id=11, **changes)
    result = StopStreamingJobOperator(task_id="stop", job="orders").execute(context())
    assert result == {"job": "orders", "outcome": "not_running", "snapshot_id": None, "snapshot_uri": None,
                      "batch_id": 11}
    assert control_keys(store) == []


def test_stop_of_a_job_that_never_ran_writes_nothing(store: JobStore, capfd: pytest.CaptureFixture[str]) -> None:
    result = StopStreamingJobOperator(task_id="stop", job="orders").execute(context())  # safe as a teardown
    assert result == {"job": "orders", "outcome": "not_running", "snapshot_id": None, "snapshot_uri": None,
                      "batch_id": None}
    assert control_keys(store) == []
    logged = "".join(capfd.readouterr())  # a mistyped job or store still shows: the log names the store
    assert f"job orders: nothing to stop: job 'orders' not found in job store {store.root.url}" in logged


@pytest.mark.parametrize(("mode", "action"), [("savepoint", RequestAction.STOP), ("cancel", RequestAction.CANCEL)])
def test_stop_requests_the_running_epoch_and_defers(store: JobStore, mode: str, action: RequestAction) -> None:
    report(store, epoch=6)
    op = StopStreamingJobOperator(task_id="stop", job="orders", mode=mode, timeout=90, poll_interval=0.5)
    deferred = deferral(lambda: op.execute(context()))
    request = only_request(store)
    assert (request.action, request.epoch) == (action, 6)
    assert isinstance(deferred.trigger, RequestTrigger) and next_step(deferred) == ("execute_complete", {})
    assert trigger_kwargs(deferred) | {"busy_timeout": None} == {
        "job": "orders", "ckpt_store_conn_id": "ckpt_store_default", "store_url": None, "request_id": request.id,
        "epoch": 6, "busy_timeout": None, "poll_interval": 0.5, "timeout": 90,
        "waiting_since": deferred.trigger.waiting_since, "min_wait": MIN_DEFERRAL,
        "resume_with": {"method": "execute_complete", "kwargs": {}}}
    assert timeout_s(deferred) == 90 + DEFER_GRACE  # the trigger's timeout event first, Airflow's backstop later


def test_a_deferral_says_when_it_began_and_lasts_at_least_min_deferral(store: JobStore) -> None:
    """The trigger's timeout counts from the deferral (not from when the triggerer got to it), and an outcome
    that comes sooner than ``min_deferral`` is held, so Airflow never resumes the task while it may still take
    the report of the worker's exit after defer() for a task killed from outside."""
    report(store, epoch=6)
    before = time.time()
    default = deferral(lambda: StopStreamingJobOperator(task_id="stop", job="orders", timeout=90).execute(context()))
    kwargs = trigger_kwargs(default)
    assert before <= kwargs["waiting_since"] <= time.time() and kwargs["min_wait"] == MIN_DEFERRAL == 30.0
    report(store, epoch=7)
    op = StopStreamingJobOperator(task_id="stop", job="orders", timeout=90, min_deferral=5)
    assert trigger_kwargs(deferral(lambda: op.execute(context())))["min_wait"] == 5.0


def test_stop_without_deferring_times_out_in_the_worker(store: JobStore) -> None:
    report(store)
    op = StopStreamingJobOperator(task_id="stop", job="orders", deferrable=False, timeout=0, poll_interval=0)
    with pytest.raises(AirflowException, match=r"job orders: timed out: no outcome within 0 s: job orders: expected "
                                               r"an answer to request stop-.* from the driver of epoch 3"):
        op.execute(context())  # the trigger's timeout and its watch, polled in the worker
    assert only_request(store).action is RequestAction.STOP  # requested, then waited for in the worker


def test_stop_refuses_an_unknown_mode(store: JobStore) -> None:
    report(store)
    with pytest.raises(ConfigError, match="invalid stop mode: expected one of savepoint, cancel, found 'kill'"):
        StopStreamingJobOperator(task_id="stop", job="orders", mode="kill")
    op = StopStreamingJobOperator(task_id="stop", job="orders", mode="{{ params.mode }}")
    op.mode = "kill"  # rendered
    with pytest.raises(AirflowException, match=r"job orders: invalid stop mode: .*found 'kill'"):
        op.execute(context())
    assert control_keys(store) == []


def test_stop_resumes_with_the_final_savepoint(store: JobStore) -> None:
    report(store)
    op = StopStreamingJobOperator(task_id="stop", job="orders")
    deferred = deferral(lambda: op.execute(context()))
    event = ack_event(store, only_request(store))
    ctx = context()
    result = op.resume(ctx, fire(deferred, event))
    uri = store.snapshot_uri(SID)
    assert result == {"job": "orders", "outcome": "completed", "action": "stop", "snapshot_id": SID,
                      "snapshot_uri": uri, "batch_id": 7}
    assert uri.startswith("file:///") and ctx["ti"].xcoms == {SNAPSHOT_KEY: uri}


def test_a_retried_stop_task_returns_its_first_tries_stop_though_the_job_is_stopped_since(store: JobStore) -> None:
    report(store)
    op = StopStreamingJobOperator(task_id="stop", job="orders")
    deferral(lambda: op.execute(context(ti=FakeTI("manual__1", 1))))
    request = only_request(store)
    ack_event(store, request)
    report(store, state=JobState.STOPPED)  # the first try's stop stopped the job; then its worker died
    deferred = deferral(lambda: op.execute(context(ti=FakeTI("manual__1", 2))))
    assert trigger_kwargs(deferred)["request_id"] == request.id
    result = op.resume(context(), fire(deferred, RequestTrigger(job="orders", request_id=request.id,
                                                                 epoch=request.epoch).build_watch().poll() or {}))
    assert (result["outcome"], result["snapshot_id"]) == ("completed", SID)  # not "not_running": the savepoint's id
    assert len([k for k in control_keys(store) if not k.endswith(".ack.json")]) == 1


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.REJECTED])
def test_stop_execute_complete_fails_unless_completed(store: JobStore, outcome: Outcome) -> None:
    report(store)
    op = StopStreamingJobOperator(task_id="stop", job="orders")
    deferral(lambda: op.execute(context()))
    event = ack_event(store, only_request(store), outcome, snapshot_id=None, message="the savepoint upload failed")
    ctx = context()
    with pytest.raises(AirflowException, match=f"job orders: stop {outcome.value}: .*the savepoint upload failed"):
        op.execute_complete(ctx, event)
    assert ctx["ti"].xcoms == {}


def test_stop_execute_complete_fails_when_the_driver_went_away(store: JobStore) -> None:
    event = {"status": "failed", "ack": None, "message": "job orders: request x: found it FAILED without answering"}
    with pytest.raises(AirflowException, match=r"request failed: .*without answering"):
        StopStreamingJobOperator(task_id="stop", job="orders").execute_complete(context(), event)


def test_stop_resumed_after_the_trigger_timed_out_fails_saying_so(store: JobStore) -> None:
    report(store)
    op = StopStreamingJobOperator(task_id="stop", job="orders", timeout=90)
    deferred = deferral(lambda: op.execute(context()))
    event = fire(deferred, {"status": "timeout", "message": "no outcome within 90 s: request stop-1 unanswered"})
    with pytest.raises(AirflowException, match="job orders: timed out: no outcome within 90 s: request stop-1"):
        op.resume(context(), event)


@pytest.mark.parametrize("event", [{"status": "completed"}, {"status": "completed", "resume_with": None},
                                   {"status": "completed", "resume_with": {"kwargs": {}}}, None])
def test_resume_without_the_step_fails_clearly(event: dict[str, Any] | None) -> None:
    with pytest.raises(AirflowException, match="job orders: the trigger's event does not say how to resume"):
        StopStreamingJobOperator(task_id="stop", job="orders").resume(context(), event)


def test_an_operator_that_defers_has_stored_its_links_first(running_v1: Launch) -> None:
    ctx = context()
    deferral(lambda: StopStreamingJobOperator(task_id="stop", job="orders", deferrable=True).execute(ctx))
    assert ctx["ti"].xcoms == {"_link_SnapshotLink": ""}  # read by Airflow as the deferring process ends
