"""SubmitStreamingJobOperator: reconnect or launch, retries that reconnect to their launch, a launch on its way
waited for, on_kill, refusals before launching."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import LEASE, SPEC_LAST, JobStore
from airflow_ckpt_provider.operators.base import DEFER_GRACE
from airflow_ckpt_provider.runtime.config import default_checkpoint
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from tests.support.operatorfakes import (
    HEALTHY,
    SPARK_UI_KEY,
    UI,
    UNHEALTHY,
    FakeLaunch,
    FakeTaskStateStore,
    context,
    control_keys,
    deferral,
    fire,
    next_step,
    old_deployment,
    only_request,
    record_deployment,
    report,
    submit_op,
    timeout_s,
    trigger_kwargs,
)

# -- SubmitStreamingJobOperator ------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_launch")
def test_submit_reconnects_to_a_running_driver_instead_of_launching(store: JobStore) -> None:
    record = record_deployment(store)
    report(store, epoch=3)
    state = FakeTaskStateStore()
    deferred = deferral(lambda: submit_op().execute(context(task_state_store=state)))
    assert isinstance(deferred.trigger, JobHealthTrigger)
    assert next_step(deferred) == ("execute_complete", {"launch_id": record.launch_id})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["job"], kwargs["expect"], kwargs["min_epoch"], kwargs["started_after"]) == (
        "orders", "healthy", 3, None)
    assert (kwargs["ckpt_store_conn_id"], kwargs["store_url"], kwargs["start_timeout"]) == (
        "ckpt_store_default", None, 600.0)
    # the trigger gives up a minute after the health watch's start timeout; Airflow's backstop a grace later
    assert kwargs["timeout"] == 660.0 and timeout_s(deferred) == 660.0 + DEFER_GRACE
    assert state.values == {"ckpt_launch": {"launch_id": "launch-0", "launched_at": None, "epoch": 3}}
    assert read_launch(store) == record  # nothing relaunched, spec/last.json untouched


def test_submit_launches_a_job_that_never_ran(store: JobStore, launches: FakeLaunch,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", json.dumps({
        "conn_type": "ckpt_spark", "host": "spark://master", "port": 7077,
        "extra": {"conf": {"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "8"}}}))
    state = FakeTaskStateStore()
    op = submit_op(restore="latest-savepoint", env={"TOPIC": "orders"}, conf={"spark.sql.shuffle.partitions": "4"},
                   savepoint_interval=300.0, restart_strategy="fixed-delay", restart_attempts=5)
    deferred = deferral(lambda: op.execute(context(task_state_store=state)))

    [record] = launches.calls
    d = record.deployment
    assert (d.job_file, d.code_version, d.master, d.env) == ("orders_v1.py", "v1", "spark://master:7077",
                                                             {"TOPIC": "orders"})
    assert d.conf == {"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "4"}  # the task's on top
    assert (d.savepoint_interval, d.restart_strategy, d.restart_attempts) == (300.0, "fixed-delay", 5)
    assert str(record.restore) == "latest-savepoint" and record.launched_by == "airflow:adhoc_airflow.submit"
    assert launches.store_urls == [str(store.root.root)]
    assert read_launch(store) == record
    # the identity is persisted before waiting; the wait is for a driver started after the launch
    assert state.values["ckpt_launch"] == {"launch_id": "launch-1", "launched_at": record.launched_at, "epoch": None}
    assert isinstance(deferred.trigger, JobHealthTrigger)
    assert next_step(deferred) == ("execute_complete", {"launch_id": "launch-1"})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["started_after"], kwargs["min_epoch"]) == (record.launched_at, None)
    # resumed by Airflow: the step the trigger carried back completes the task
    ctx = context()
    assert op.resume(ctx, fire(deferred, HEALTHY)) == {"job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING",
                                                      "ui_url": UI, "launch_id": "launch-1"}
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}


@pytest.mark.parametrize("job_state", [JobState.FAILED, JobState.STOPPED])
def test_submit_launches_again_after_the_job_ended(store: JobStore, launches: FakeLaunch, job_state: JobState) -> None:
    report(store, state=job_state)
    deferred = deferral(lambda: submit_op().execute(context()))
    assert len(launches.calls) == 1
    assert trigger_kwargs(deferred)["started_after"] == launches.calls[0].launched_at


def test_submit_launches_again_when_the_heartbeat_is_stale(store: JobStore, launches: FakeLaunch) -> None:
    report(store, updated_at=time.time() - 60)  # 3 * 5 s + 5 s without a heartbeat: dead
    deferral(lambda: submit_op().execute(context()))
    assert len(launches.calls) == 1


@pytest.mark.usefixtures("no_launch")
def test_submit_of_a_stopping_job_fails_and_launches_nothing(store: JobStore) -> None:
    record = record_deployment(store)
    report(store, state=JobState.STOPPING, reason="stop requested")
    state = FakeTaskStateStore()
    with pytest.raises(AirflowException, match=r"job orders is STOPPING \(epoch 3: stop requested\); nothing was "
                                               "submitted. Retry once it is STOPPED"):
        submit_op().execute(context(task_state_store=state))
    assert read_launch(store) == record and state.values == {}


def upgraded_to_v2(store: JobStore) -> Launch:
    """spec/last.json: the job was upgraded to orders_v2.py (code v2) by another DAG, and has stopped since."""
    record = record_deployment(store, old_deployment(job_file="orders_v2.py", code_version="v2",
                                                     env={"TOPIC": "orders-v2"}))
    report(store, state=JobState.STOPPED)
    return record


def test_submit_of_a_stopped_job_starts_the_code_it_last_ran(store: JobStore, launches: FakeLaunch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    upgraded = upgraded_to_v2(store)
    deferred = deferral(lambda: submit_op(restore="latest-savepoint").execute(context()))
    [record] = launches.calls
    assert record.deployment == upgraded.deployment  # v2 as recorded (its env too), not this task's v1
    assert str(record.restore) == "latest-savepoint"  # the task's restore decision still applies
    assert trigger_kwargs(deferred)["started_after"] == record.launched_at
    logged = "".join(capfd.readouterr())  # Airflow's structlog writes to stdout
    [line] = [line for line in logged.splitlines() if "job orders last ran" in line]
    assert "[warning" in line and "job orders last ran orders_v2.py (code v2, launched by test); starting that " \
           "again, not the orders_v1.py asked for (code v1)" in line


def test_submit_with_keep_recorded_code_false_starts_the_task_s_code(store: JobStore, launches: FakeLaunch) -> None:
    upgraded_to_v2(store)
    deferral(lambda: submit_op(keep_recorded_code=False, env={"TOPIC": "orders"}).execute(context()))
    [record] = launches.calls
    assert (record.deployment.job_file, record.deployment.code_version, record.deployment.env) == (
        "orders_v1.py", "v1", {"TOPIC": "orders"})


def test_submit_after_a_stateless_upgrade_keeps_its_checkpoint_location(store: JobStore,
                                                                        launches: FakeLaunch) -> None:
    fresh = f"{default_checkpoint('orders')}-stateless-1795000000"
    record_deployment(store, old_deployment(job_file="orders_v2.py", code_version="v2", checkpoint=fresh))
    report(store, state=JobState.FAILED)
    deferral(lambda: submit_op(job_file="orders_v2.py", code_version="v2").execute(context()))  # the DAG, updated
    [record] = launches.calls
    assert record.deployment.checkpoint == fresh


def test_submit_of_the_recorded_code_starts_the_task_s_deployment(store: JobStore, launches: FakeLaunch) -> None:
    record_deployment(store)  # orders_v1.py, v1, TOPIC orders: the task's code
    report(store, state=JobState.FAILED)
    deferral(lambda: submit_op(env={"TOPIC": "orders-eu"}, keep_checkpoints=7).execute(context()))
    [record] = launches.calls
    assert (record.deployment.code_version, record.deployment.env, record.deployment.keep_checkpoints) == (
        "v1", {"TOPIC": "orders-eu"}, 7)  # same code: the task's settings apply


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"restore": ""}, "invalid restore strategy"),
    ({"restore": "snapshot"}, "needs the snapshot"),
    ({"on_kill_policy": "explode"}, "invalid on_kill_policy: expected one of leave-running, stop-with-savepoint, "
                                    "cancel, found 'explode'"),
    ({"restart_strategy": "immediately"}, "invalid restart strategy: expected one of exponential-delay, fixed-delay, "
                                          "failure-rate, found 'immediately'"),
    ({"savepoint_interval": "hourly"}, "savepoint_interval: expected seconds or 'none', found 'hourly'"),
])
def test_submit_refuses_bad_literal_input_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        submit_op(**kwargs)


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"restore": "snapshot"}, "needs the snapshot"),
    ({"on_kill_policy": "explode"}, "invalid on_kill_policy: .*found 'explode'"),
    ({"time_travel": "maybe"}, "invalid time-travel policy: .*found 'maybe'"),
    ({"keep_checkpoints": "many"}, "keep_checkpoints: expected a whole number, found 'many'"),
    ({"env": {"AWS_SECRET": "x"}}, "refusing env AWS_SECRET"),
    ({"env": {"api-key": "x"}}, "invalid environment variable name"),
    ({"job_file": ""}, "a deployment needs a job file"),
    ({"ckpt_spark_conn_id": "mesos_spark"}, "unknown Spark master 'mesos://m:5050'"),
    ({"env": '{"TOPIC": "orders"}'}, r"env must be a mapping of names to values, found str '\{\"TOPIC\": "
                                     r"\"orders\"\}'; a templated env needs the DAG's render_template_as_native_obj"),
    ({"conf": "spark.sql.shuffle.partitions=4"}, "conf must be a mapping .*found str .*render_template_as_native_obj"),
])
def test_submit_refuses_bad_input_before_launching(store: JobStore, monkeypatch: pytest.MonkeyPatch,
                                                   kwargs: dict[str, Any], message: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MESOS_SPARK", json.dumps({"conn_type": "ckpt_spark", "host": "mesos://m:5050"}))
    templated = {"restore", "on_kill_policy", "time_travel", "keep_checkpoints"} & kwargs.keys()
    op = submit_op(**{k: "{{ params.x }}" if k in templated else v for k, v in kwargs.items()})
    for name in templated:
        setattr(op, name, kwargs[name])  # as Airflow renders it
    with pytest.raises(AirflowException, match=message):
        op.execute(context())
    assert read_launch(store) is None


def test_submit_execute_complete_healthy_returns_the_driver_and_pushes_its_ui() -> None:
    ctx = context()
    result = submit_op().execute_complete(ctx, HEALTHY, launch_id="launch-1")
    assert result == {"job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING", "ui_url": UI,
                      "launch_id": "launch-1"}
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}


def test_submit_execute_complete_unhealthy_fails_with_the_message_and_the_log_tail(store: JobStore,
                                                                                    tmp_path: Path) -> None:
    log = tmp_path / "launch.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "py4j.Py4JException: boom\n")
    record_deployment(store, host=socket.gethostname(), log_file=str(log))
    ctx = context()
    with pytest.raises(AirflowException) as info:
        submit_op().execute_complete(ctx, UNHEALTHY, launch_id="launch-1")
    text = str(info.value)
    assert text.startswith("job orders did not start: job orders: expected it healthy, found FAILED")
    assert "last lines of its log:\n" in text and text.endswith("py4j.Py4JException: boom")
    assert "line 10\n" not in text and "line 11\n" in text  # the last 20 lines only
    assert ctx["ti"].xcoms == {}


@pytest.mark.parametrize(("event", "message"), [
    ({"status": "error", "message": "JobHealthTrigger failed: StorageError: access denied",
      "traceback": "Traceback (most recent call last):\n  File x"}, "the trigger failed: .*access denied\nTraceback"),
    ({"status": "timeout", "message": "no outcome within 60 s"}, "timed out: no outcome within 60 s"),
    ({"status": "completed"}, r"unexpected event status 'completed' \(expected one of \['healthy', 'unhealthy'\]\)"),
    ({"no": "status"}, "expected a trigger event with a status"),
    (None, "expected a trigger event with a status, found None"),
])
def test_submit_execute_complete_refuses_other_events(event: Any, message: str) -> None:
    with pytest.raises(AirflowException, match=message):
        submit_op().execute_complete(context(), event)


@pytest.mark.usefixtures("no_launch")
def test_submit_without_deferring_waits_in_the_worker(store: JobStore) -> None:
    record_deployment(store)
    report(store, epoch=5, batch_id=12, ui_url=UI)
    ctx = context()
    result = submit_op(deferrable=False, poll_interval=0).execute(ctx)  # returns: no TaskDeferred
    assert result == {"job": "orders", "epoch": 5, "batch_id": 12, "state": "RUNNING", "ui_url": UI,
                      "launch_id": "launch-0"}
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}


@pytest.mark.parametrize(("policy", "action"),
                         [("stop_with_savepoint", RequestAction.STOP), ("cancel", RequestAction.CANCEL)])
def test_on_kill_requests_the_policy_of_the_running_epoch(store: JobStore, policy: str, action: RequestAction) -> None:
    report(store, epoch=4)
    submit_op(on_kill_policy=policy).on_kill()
    request = only_request(store)
    assert (request.action, request.epoch) == (action, 4)


def test_on_kill_leave_running_writes_nothing(store: JobStore) -> None:
    report(store, epoch=4)
    submit_op(on_kill_policy="leave_running").on_kill()
    assert control_keys(store) == []


def test_on_kill_of_a_job_that_is_not_running_writes_nothing_and_does_not_raise(store: JobStore) -> None:
    submit_op(on_kill_policy="stop_with_savepoint").on_kill()  # never ran
    report(store, state=JobState.STOPPED)
    submit_op(on_kill_policy="cancel").on_kill()
    assert control_keys(store) == []


# -- SubmitStreamingJobOperator as a ResumableJobMixin: a retry reconnects to the launch it made ----------------


@pytest.mark.usefixtures("no_launch")
def test_retry_reconnects_to_the_stored_launch_of_a_running_job(store: JobStore) -> None:
    launched_at = time.time() - 30
    stored = {"launch_id": "launch-7", "launched_at": launched_at, "epoch": None}
    report(store, epoch=3, started_at=launched_at + 5)
    state = FakeTaskStateStore({"ckpt_launch": stored})
    deferred = deferral(lambda: submit_op().execute(context(task_state_store=state)))
    assert isinstance(deferred.trigger, JobHealthTrigger)
    assert (trigger_kwargs(deferred)["started_after"], trigger_kwargs(deferred)["min_epoch"]) == (launched_at, None)
    assert next_step(deferred) == ("execute_complete", {"launch_id": "launch-7"})
    assert state.values == {"ckpt_launch": stored}


@pytest.mark.parametrize("changes", [{"state": JobState.FAILED}, {"updated_at": time.time() - 3600}],
                         ids=["failed", "stale"])
def test_retry_launches_again_when_the_stored_launch_is_gone(store: JobStore, launches: FakeLaunch,
                                                             changes: dict[str, Any]) -> None:
    report(store, **changes)
    state = FakeTaskStateStore({"ckpt_launch": {"launch_id": "launch-0", "launched_at": 1.0, "epoch": 3}})
    deferral(lambda: submit_op().execute(context(task_state_store=state)))
    [record] = launches.calls
    assert state.values["ckpt_launch"] == {"launch_id": record.launch_id, "launched_at": record.launched_at,
                                           "epoch": None}


@pytest.mark.usefixtures("no_launch")
def test_retry_reconnects_to_a_launch_whose_driver_has_not_reported_yet(store: JobStore) -> None:
    launched = record_deployment(store)
    ident = {"launch_id": launched.launch_id, "launched_at": launched.launched_at, "epoch": None}
    state = FakeTaskStateStore({"ckpt_launch": ident})
    deferred = deferral(lambda: submit_op().execute(context(task_state_store=state)))
    assert trigger_kwargs(deferred)["started_after"] == launched.launched_at
    assert next_step(deferred) == ("execute_complete", {"launch_id": launched.launch_id})
    assert state.values == {"ckpt_launch": ident}  # reconnected: nothing submitted, the stored launch kept


def test_get_job_status_of_a_launch_without_status_is_starting(store: JobStore) -> None:
    op, ident = submit_op(), {"launch_id": "launch-0", "launched_at": time.time(), "epoch": None}
    assert op.get_job_status(ident, context()) == "LOST"  # no launch recorded at all: launch again
    record = record_deployment(store)
    assert op.get_job_status(ident, context()) == "STARTING"  # launched, neither status.json nor lease.json yet
    record_deployment(store, ended_at=time.time(), exit_code=2, end_reason="bad input")
    assert op.get_job_status(ident, context()) == "LOST"  # its supervisor ended without a driver reporting
    record_deployment(store, launched_at=time.time() - op.start_timeout - 1)
    assert op.get_job_status(ident, context()) == "LOST"  # older than the start timeout: it died unrecorded
    assert not op.is_job_active("LOST")
    store.storage.write(SPEC_LAST, record.to_bytes())
    lease = LeaseRecord(job="orders", epoch=1, owner="driver-1", host="h", pid=42, acquired_at=time.time())
    store.storage.write(LEASE, lease.to_bytes())
    assert op.get_job_status(ident, context()) == "STARTING"  # the driver took the lease, has not reported
    assert op.is_job_active("STARTING")
    report(store, state=JobState.FAILED)
    assert op.get_job_status(ident, context()) == "FAILED" and not op.is_job_active("FAILED")
    report(store, updated_at=time.time() - 3600)
    assert op.get_job_status(ident, context()) == "STALE" and not op.is_job_active("STALE")


# -- SubmitStreamingJobOperator: a launch on its way is waited for, not launched again -------------------------


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("state", "silent_for"), [(None, 0), (JobState.STOPPED, 0), (JobState.FAILED, 0),
                                                   (JobState.RUNNING, 60), (JobState.STOPPING, 0)],
                         ids=["no-status", "stopped", "failed", "stale", "stopping"])
def test_submit_waits_for_a_launch_on_its_way_instead_of_launching_again(store: JobStore, state: JobState | None,
                                                                        silent_for: float) -> None:
    now = time.time()
    if state is not None:  # the previous driver, started before the launch
        report(store, state=state, started_at=now - 100, updated_at=now - silent_for)
    on_its_way = record_deployment(store, launched_at=now - 10, launched_by="airflow:ops.restart")
    state_store = FakeTaskStateStore()
    deferred = deferral(lambda: submit_op().execute(context(task_state_store=state_store)))
    ident = {"launch_id": "launch-0", "launched_at": on_its_way.launched_at, "epoch": None}
    assert state_store.values == {"ckpt_launch": ident}  # its identity, as if this task had launched it
    assert isinstance(deferred.trigger, JobHealthTrigger)
    assert next_step(deferred) == ("execute_complete", {"launch_id": "launch-0"})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["started_after"], kwargs["min_epoch"]) == (on_its_way.launched_at, None)  # its driver's start
    assert read_launch(store) == on_its_way  # nothing launched over it


@pytest.mark.parametrize(("launch_changes", "started_ago"), [
    ({"ended_at": 1.0, "exit_code": 2, "end_reason": "bad input"}, 1000),  # its supervisor recorded its end
    ({"launched_at": -700}, 1000),  # older than the start timeout (600 s): it died unrecorded
    ({}, 5),  # the launch of the driver that stopped: not a newer one
], ids=["ended", "too-old", "the-stopped-driver-s-own"])
def test_submit_launches_again_when_the_recorded_launch_is_not_on_its_way(store: JobStore, launches: FakeLaunch,
                                                                         launch_changes: dict[str, Any],
                                                                         started_ago: float) -> None:
    now = time.time()
    report(store, state=JobState.STOPPED, started_at=now - started_ago)
    changes = dict(launch_changes)
    changes["launched_at"] = now + changes.get("launched_at", -10)
    if "ended_at" in changes:
        changes["ended_at"] = now
    record_deployment(store, **changes)
    deferred = deferral(lambda: submit_op().execute(context()))
    [record] = launches.calls
    assert read_launch(store) == record and trigger_kwargs(deferred)["started_after"] == record.launched_at


def test_submit_launches_again_when_the_driver_s_process_is_gone(store: JobStore, launches: FakeLaunch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a kill -9 of the driver: its last heartbeat is fresh, its process is gone
    report(store, host=socket.gethostname(), pid=proc.pid)
    deferral(lambda: submit_op().execute(context()))
    assert len(launches.calls) == 1


def test_get_job_status_of_a_launch_after_an_ended_driver_is_starting(store: JobStore) -> None:
    op, ident = submit_op(), {"launch_id": "launch-0", "launched_at": time.time(), "epoch": None}
    now = time.time()
    report(store, state=JobState.STOPPED, started_at=now - 1000)
    assert op.get_job_status(ident, context()) == "STOPPED"
    record_deployment(store, launched_at=now - 10)
    assert op.get_job_status(ident, context()) == "STARTING"  # on its way: not taken for a dead job
    assert op.is_job_active("STARTING")
    record_deployment(store, launched_at=now - 10, ended_at=now, exit_code=2, end_reason="bad input")
    assert op.get_job_status(ident, context()) == "STOPPED"
    record_deployment(store, launched_at=now - op.start_timeout - 1)
    assert op.get_job_status(ident, context()) == "STOPPED"
    record_deployment(store, launched_at=now - 10)
    report(store, state=JobState.RUNNING, started_at=now - 5)  # its driver reported
    assert op.get_job_status(ident, context()) == "RUNNING"
    report(store, state=JobState.FAILED, started_at=now - 5)
    assert op.get_job_status(ident, context()) == "FAILED"


def test_get_job_status_of_a_dead_driver_on_this_host_is_stale(store: JobStore) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    report(store, host=socket.gethostname(), pid=proc.pid)
    op = submit_op()
    assert op.get_job_status({}, context()) == "STALE" and not op.is_job_active("STALE")


def test_get_job_status_without_a_lease_or_a_launch_on_its_way_is_lost(store: JobStore) -> None:
    op = submit_op()
    assert op.get_job_status({}, context()) == "LOST"
    record_deployment(store, launched_at=time.time() - 10)
    assert op.get_job_status({}, context()) == "STARTING"
    record_deployment(store, launched_at=time.time() - 10, ended_at=time.time(), exit_code=1)
    assert op.get_job_status({}, context()) == "LOST"  # launch again


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"restart_strategy": "fixed-delay", "restart_interval": 60.0},
     "restart-interval applies to failure-rate only, found --restart-strategy fixed-delay"),
    ({"restart_interval": 60.0}, "restart-interval applies to failure-rate only, found --restart-strategy "
                                 "exponential-delay"),
    ({"restart_strategy": "fixed-delay", "restart_attempts": -1}, "fixed-delay attempts must be"),
    ({"restart_strategy": "failure-rate", "restart_delay": -5.0}, "failure-rate delay must be"),
    ({"health_window": -1.0}, "health rule window must be > 0, found -1"),
    ({"max_restarts_in_window": 0}, "health rule max restarts must be > 0, found 0"),
    ({"progress_timeout": 0.0}, "health rule progress timeout must be > 0, found 0"),
])
def test_submit_refuses_bad_restart_settings_before_launching(store: JobStore, kwargs: dict[str, Any],
                                                              message: str) -> None:
    state = FakeTaskStateStore()
    with pytest.raises(AirflowException, match=f"^job orders: .*{message}"):
        submit_op(**kwargs).execute(context(task_state_store=state))
    assert read_launch(store) is None and state.values == {}


def test_submit_with_a_failure_rate_interval_and_a_health_rule_launches(store: JobStore, launches: FakeLaunch) -> None:
    op = submit_op(restart_strategy="failure-rate", restart_attempts=3, restart_interval=300.0,
                   max_restarts_in_window=5, health_window=600.0, progress_timeout=120.0)
    deferral(lambda: op.execute(context()))
    [record] = launches.calls
    d = record.deployment
    assert (d.restart_strategy, d.restart_attempts, d.restart_interval) == ("failure-rate", 3, 300.0)
    assert (d.max_restarts_in_window, d.health_window, d.progress_timeout) == (5, 600.0, 120.0)


@pytest.mark.usefixtures("no_launch")
def test_submit_with_supervision_service_hands_the_job_over_and_defers_starting_nothing_on_the_worker(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.records.operations import OperationState, read_operation
    from airflow_ckpt_provider.core.records.ownership import handed_key
    from airflow_ckpt_provider.launcher.upgrade import JobUpgrade
    from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
    from airflow_ckpt_provider.triggers.operation import OperationTrigger
    from tests.support.upgradefakes import World

    job_file = tmp_path / "orders_v1.py"
    job_file.write_text("# the job\n")
    state = FakeTaskStateStore()
    deferred = deferral(lambda: submit_op(job_file=str(job_file), supervision="service").execute(
        context(task_state_store=state)))
    record = read_launch(store)
    assert record is not None and (record.pid, record.host) == (None, None)  # the service's instances start it
    assert record.launched_by == "airflow:adhoc_airflow.submit" and store.root.exists(handed_key("orders"))
    assert isinstance(deferred.trigger, JobHealthTrigger)  # the task waits for the service's driver, deferred
    assert trigger_kwargs(deferred)["started_after"] == record.launched_at
    assert state.values["ckpt_launch"]["launch_id"] == record.launch_id

    # A later restart is the service's to act on (no actor on the worker); acted on (by JobUpgrade, as an instance
    # does), with supervision auto (the default) it keeps the job with the service.
    world = World(store, monkeypatch)
    restarted = deferral(lambda: RestartStreamingJobOperator(task_id="restart", job="orders").execute(context()))
    assert isinstance(restarted.trigger, OperationTrigger) and read_launch(store) == record  # nothing started here
    found = read_operation(store)
    assert found is not None and (found.operation.kind, found.operation.actor) == ("restart", "")
    ended = JobUpgrade(store, str(store.root.url), None, say=world.said.append, actor="svc", poll=0.01).run(found)
    assert ended.state is OperationState.SUCCEEDED, ended.message
    again = read_launch(store)
    assert again is not None and again.launch_id != record.launch_id and again.pid is None
    assert world.launches.calls == []  # handed over again, not launched on a host


def test_an_unknown_supervision_is_refused_when_the_task_is_made() -> None:
    with pytest.raises(ConfigError, match="invalid supervision: expected one of auto, launcher, service, found 'k8s'"):
        submit_op(supervision="k8s")


def test_the_drivers_export_their_metrics_where_airflow_exports_its_own_over_opentelemetry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert submit_op().deployment().metrics_otlp is None  # Airflow exports nothing: neither do the drivers
    for name, value in {"OTEL_ON": "True", "OTEL_HOST": "otel-collector", "OTEL_PORT": "4318",
                        "OTEL_INTERVAL_MILLISECONDS": "30000"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{name}", value)
    deployment = submit_op().deployment()
    assert (deployment.metrics_otlp, deployment.metrics_interval) == ("http://otel-collector:4318/v1/metrics", 30.0)
    own = submit_op(metrics_otlp="https://collector.example:4318/v1/metrics").deployment()
    assert (own.metrics_otlp, own.metrics_interval) == ("https://collector.example:4318/v1/metrics", 15.0)
    interval = submit_op(metrics_interval=5).deployment()  # Airflow's endpoint, the task's own interval
    assert (interval.metrics_otlp, interval.metrics_interval) == ("http://otel-collector:4318/v1/metrics", 5.0)
