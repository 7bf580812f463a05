"""The operators on a real local job store: declarative construction, what each one writes (launch records,
control requests, stable deployments, disposals), the trigger they defer to and the step (method and kwargs) it
carries back to ``resume``, and every outcome of their callbacks; plus the links, the Spark hook's settings and
the deployment records they launch.

Nothing is started: ``launch`` and ``check_restore`` are replaced by fakes that record their calls (the fake
launch writes spec/last.json as the real one does)."""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException, TaskDeferred

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.control import Ack, Action, Outcome, Request, open_requests, write_ack
from airflow_ckpt_provider.core.deployments import LAUNCH_ENV, Deployment, Launch, read_launch, record_end
from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.jobstore import CONTROL, LEASE, SPEC_LAST, SPEC_STABLE, STATUS, JobStore
from airflow_ckpt_provider.core.lease import LeaseRecord
from airflow_ckpt_provider.core.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots import create_snapshot, list_snapshots
from airflow_ckpt_provider.core.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.storage import LocalStorage, S3Options
from airflow_ckpt_provider.hooks.spark import CkptSparkHook
from airflow_ckpt_provider.launcher import deploy
from airflow_ckpt_provider.launcher.deploy import credentials_env, run_argv
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, browsable
from airflow_ckpt_provider.operators.base import DEFER_GRACE, JobOperator
from airflow_ckpt_provider.operators.job import (
    RestartStreamingJobOperator,
    StopStreamingJobOperator,
    SubmitStreamingJobOperator,
)
from airflow_ckpt_provider.operators.snapshot import DisposeSnapshotsOperator, TriggerSavepointOperator
from airflow_ckpt_provider.operators.upgrade import UpgradeStreamingJobOperator
from airflow_ckpt_provider.runtime.config import default_checkpoint
from airflow_ckpt_provider.runtime.restoreverdict import CheckOutcome, RestoreCheck
from airflow_ckpt_provider.triggers.base import MIN_DEFERRAL, WatchTrigger
from airflow_ckpt_provider.triggers.control import RequestTrigger
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from tests.support.ckptfactory import make_checkpoint

SID = "savepoint-7-20261122T101500Z-abc123"
#: A job file that exists: the real launch checks the spark-submit command (and so the file) before recording.
ORDERS_V1 = str(Path(examples.__file__).parent / "orders_v1.py")
#: The upgrade's new code: it must exist too (the upgrade checks its spark-submit command before anything stops).
ORDERS_V2 = str(Path(examples.__file__).parent / "orders_v2.py")
UI = "http://driver:4040"
SPARK_UI_KEY = SparkUILink().xcom_key
SNAPSHOT_KEY = SnapshotLink().xcom_key
HEALTHY = {"status": "healthy", "reason": None, "message": "job orders is healthy", "job": "orders", "epoch": 4,
           "batch_id": 9, "state": "RUNNING", "ui_url": UI, "restarts": 0}
UNHEALTHY = HEALTHY | {"status": "unhealthy", "reason": "failed", "state": "FAILED", "ui_url": None,
                       "message": "job orders: expected it healthy, found FAILED at epoch 4 (reason: boom)"}


# -- fixtures and helpers --------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """Job ``orders`` in a local store that the default store connection names; no Spark connection."""
    root = tmp_path / "store"
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT",
                       json.dumps({"conn_type": "ckpt_store", "extra": {"store_url": str(root)}}))
    monkeypatch.delenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", raising=False)
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    return JobStore(LocalStorage(root), "orders")


class FakeLaunch:
    """Stands in for launcher.deploy.launch: records the call and spec/last.json, starts nothing."""

    def __init__(self) -> None:
        self.calls: list[Launch] = []
        self.store_urls: list[str] = []

    def __call__(self, store: JobStore, deployment: Deployment, *, restore: str, store_url: str,
                 s3: S3Options | None = None, launched_by: str = "") -> Launch:
        record = Launch(store.job, deployment, restore, time.time(), launched_by, f"launch-{len(self.calls) + 1}")
        store.storage.write(SPEC_LAST, record.to_bytes())
        self.calls.append(record)
        self.store_urls.append(store_url)
        return record


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> FakeLaunch:
    fake = FakeLaunch()
    monkeypatch.setattr("airflow_ckpt_provider.operators.job.launch", fake)
    return fake


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Launch:
        pytest.fail("the operator launched the job")

    monkeypatch.setattr("airflow_ckpt_provider.operators.job.launch", refuse)


class FakeCheck:
    """Stands in for launcher.restorecheck.check_restore: records (spec, timeout, env), answers ``outcome``."""

    def __init__(self) -> None:
        self.outcome = CheckOutcome.COMPATIBLE
        self.calls: list[tuple[SubmitSpec, float, dict[str, str]]] = []

    def __call__(self, spec: SubmitSpec, timeout: float, *, log_file: str | None = None,
                 env: dict[str, str] | None = None) -> RestoreCheck:
        self.calls.append((spec, timeout, dict(env or {})))
        reason = "Spark restored the state" if self.outcome is CheckOutcome.COMPATIBLE else \
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE: the key schema changed"
        return RestoreCheck(self.outcome, reason, snapshot_id=SID, batch_id=7)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> FakeCheck:
    fake = FakeCheck()
    monkeypatch.setattr("airflow_ckpt_provider.operators.upgrade.check_restore", fake)
    return fake


class FakeTI:
    """The task instance as the operators use it: XCom pushes (for the links) and stats tags."""

    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}
        self.stats_tags: dict[str, str] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class FakeTaskStateStore:
    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self.values = dict(values or {})

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


def context(**more: Any) -> dict[str, Any]:
    return {"ti": FakeTI(), **more}


def report(store: JobStore, **changes: Any) -> JobStatus:
    """A heartbeat of the driver of epoch 3, RUNNING at batch 7 (fresh unless ``updated_at`` says otherwise)."""
    now = time.time()
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": now,
                            "started_at": now - 1, "batch_id": 7}
    status = JobStatus(**body | changes)
    assert write_status(store, status)
    return status


def old_deployment(**changes: Any) -> Deployment:
    body: dict[str, Any] = {"job_file": "orders_v1.py", "code_version": "v1", "env": {"TOPIC": "orders"},
                            "conf": {"spark.sql.shuffle.partitions": "4"}, "keep_checkpoints": 5}
    return Deployment(**body | changes)


def record_deployment(store: JobStore, deployment: Deployment | None = None, **changes: Any) -> Launch:
    """spec/last.json as a launch of ``deployment`` (default: orders_v1.py, code v1) ten seconds ago."""
    body: dict[str, Any] = {"job": "orders", "deployment": deployment or old_deployment(), "restore": "latest-state",
                            "launched_at": time.time() - 10, "launched_by": "test", "launch_id": "launch-0"}
    record = Launch(**body | changes)
    store.storage.write(SPEC_LAST, record.to_bytes())
    return record


def deferral(call: Callable[[], Any]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        call()
    return info.value


def timeout_s(deferred: TaskDeferred) -> float | None:
    """The deferral's timeout in seconds (Airflow's backstop: the trigger's own timeout plus DEFER_GRACE)."""
    timeout = deferred.timeout
    return timeout.total_seconds() if isinstance(timeout, timedelta) else timeout


def trigger_kwargs(deferred: TaskDeferred) -> dict[str, Any]:
    _, kwargs = deferred.trigger.serialize()
    return kwargs


def next_step(deferred: TaskDeferred) -> tuple[str, dict[str, Any]]:
    """The method and kwargs the operator continues with once the trigger fires. Airflow always resumes it in
    ``resume`` with no kwargs (dag.test drops defer()'s); the serialized trigger carries the step instead."""
    assert deferred.method_name == "resume" and deferred.kwargs is None
    step = trigger_kwargs(deferred)["resume_with"]
    assert step == deferred.trigger.resume_with and set(step) == {"method", "kwargs"}
    return step["method"], step["kwargs"]


def fire(deferred: TaskDeferred, event: dict[str, Any]) -> dict[str, Any]:
    """The event Airflow hands to ``resume`` when the trigger's watch yields ``event``: the trigger is rebuilt
    from its JSON-serialized arguments (as the triggerer does) and its run() adds what it carries back."""
    classpath, kwargs = deferred.trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    kwargs = json.loads(json.dumps(kwargs))
    # The task deferred min_wait seconds ago, so the trigger holds the event no longer (that is tested on its own).
    kwargs["waiting_since"] -= kwargs["min_wait"]
    trigger: WatchTrigger = getattr(importlib.import_module(module), name)(**kwargs)

    async def outcome(since: float) -> dict[str, Any]:
        return dict(event)

    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    trigger._outcome = outcome  # type: ignore[method-assign]  # the watch's verdict, without polling a store
    [payload] = asyncio.run(collect())
    return payload


def control_keys(store: JobStore) -> list[str]:
    return [o.key for o in store.storage.list(CONTROL)]


def only_request(store: JobStore) -> Request:
    requests = open_requests(store)
    assert len(requests) == 1, requests
    return requests[0]


def ack_event(store: JobStore, request: Request, outcome: Outcome = Outcome.COMPLETED, *,
              snapshot_id: str | None = SID, message: str = "done") -> dict[str, Any]:
    """The driver's answer to ``request``, as the RequestTrigger's watch reports it."""
    write_ack(store, Ack(request.id, request.action, outcome, message, request.epoch, time.time(),
                         snapshot_id=snapshot_id, snapshot_uri=store.snapshot_uri(snapshot_id) if snapshot_id else None,
                         batch_id=7))
    event = RequestTrigger(job="orders", request_id=request.id, epoch=request.epoch).build_watch().poll()
    assert event is not None
    return event


def submit_op(**kwargs: Any) -> SubmitStreamingJobOperator:
    return SubmitStreamingJobOperator(**{"task_id": "submit", "job": "orders", "job_file": "orders_v1.py",
                                         "code_version": "v1"} | kwargs)


def upgrade_op(**kwargs: Any) -> UpgradeStreamingJobOperator:
    return UpgradeStreamingJobOperator(**{"task_id": "upgrade", "job": "orders", "job_file": ORDERS_V2,
                                          "code_version": "v2", "verify_batches": 3, "verify_timeout": 120} | kwargs)


def make_snapshots(store: JobStore, tmp_path: Path, kinds: list[Kind]) -> list[str]:
    """Completed snapshots of a tiny checkpoint, oldest first (batch i for the i-th: a strict order)."""
    checkpoint = LocalStorage(make_checkpoint(tmp_path / "ckpt", len(kinds)))
    return [create_snapshot(store, checkpoint, kind=kind, trigger=Trigger.PERIODIC, batch_id=i).manifest.snapshot_id
            for i, kind in enumerate(kinds)]


# -- declarative construction -------------------------------------------------------------------------------


def every_operator(conn_id: str = "ckpt_store_default") -> list[JobOperator]:
    common: dict[str, Any] = {"job": "orders", "ckpt_store_conn_id": conn_id}
    return [
        SubmitStreamingJobOperator(task_id="submit", job_file="j.py", ckpt_spark_conn_id=conn_id, **common),
        StopStreamingJobOperator(task_id="stop", **common),
        RestartStreamingJobOperator(task_id="restart", **common),
        TriggerSavepointOperator(task_id="savepoint", **common),
        DisposeSnapshotsOperator(task_id="dispose", **common),
        UpgradeStreamingJobOperator(task_id="upgrade", job_file="j2.py", **common),
    ]


@pytest.mark.parametrize("op", every_operator(), ids=lambda op: type(op).__name__)
def test_every_template_field_is_an_attribute(op: JobOperator) -> None:
    assert op.template_fields[:2] == ("job", "store_url")
    missing = [name for name in op.template_fields if not hasattr(op, name)]
    assert missing == []


def test_template_fields_and_extra_links() -> None:
    ops = {type(op).__name__: op for op in every_operator()}
    assert ops["SubmitStreamingJobOperator"].template_fields == (
        "job", "store_url", "job_file", "code_version", "restore", "env", "conf", "checkpoint")
    assert ops["UpgradeStreamingJobOperator"].template_fields == (
        "job", "store_url", "job_file", "code_version", "upgrade_mode", "allow_non_restored_state", "verify_batches")
    assert ops["RestartStreamingJobOperator"].template_fields == ("job", "store_url", "restore", "stop_mode")
    assert ops["StopStreamingJobOperator"].template_fields == ("job", "store_url", "mode")
    assert ops["DisposeSnapshotsOperator"].template_fields == ("job", "store_url", "snapshot_ids")
    links = {name: [link.name for link in op.operator_extra_links] for name, op in ops.items()}
    assert links == {
        "SubmitStreamingJobOperator": ["Spark UI"],
        "StopStreamingJobOperator": ["Snapshot location"],
        "RestartStreamingJobOperator": ["Spark UI", "Snapshot location"],  # a savepoint stop: its snapshot
        "TriggerSavepointOperator": ["Snapshot location"],
        "DisposeSnapshotsOperator": [],
        "UpgradeStreamingJobOperator": ["Spark UI", "Snapshot location"],
    }


def test_construction_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lookup(cls: type, conn_id: str) -> Any:
        pytest.fail(f"connection {conn_id} looked up while the operator was constructed")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(no_lookup))
    for op in every_operator("no_such_connection"):
        assert "store_hook" not in op.__dict__  # the hook is a cached property, built at execute
        assert op.ckpt_store_conn_id == "no_such_connection"


def test_the_connection_is_looked_up_at_execute() -> None:
    stop = StopStreamingJobOperator(task_id="stop", job="orders", ckpt_store_conn_id="no_such_connection")
    with pytest.raises(AirflowNotFoundException, match="no_such_connection"):
        stop.execute(context())


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
    assert record.restore == "latest-savepoint" and record.launched_by == "airflow:adhoc_airflow.submit"
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
    assert record.restore == "latest-savepoint"  # the task's restore decision still applies
    assert trigger_kwargs(deferred)["started_after"] == record.launched_at
    logged = "".join(capfd.readouterr())  # Airflow's structlog writes to stdout
    [line] = [line for line in logged.splitlines() if "job orders last ran" in line]
    assert "[warning" in line and "job orders last ran orders_v2.py (code v2, launched by test); starting that " \
           "again, not this task's orders_v1.py (code v1)" in line


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


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"restore": ""}, "invalid restore strategy"),
    ({"restore": "snapshot"}, "needs the snapshot"),
    ({"on_kill_policy": "explode"}, "on_kill_policy 'explode': expected one of leave_running"),
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
    with pytest.raises(AirflowException, match=message):
        submit_op(**kwargs).execute(context())
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


@pytest.mark.parametrize(("policy", "action"), [("stop_with_savepoint", Action.STOP), ("cancel", Action.CANCEL)])
def test_on_kill_requests_the_policy_of_the_running_epoch(store: JobStore, policy: str, action: Action) -> None:
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
    ({"restart_strategy": "immediately"}, "unknown restart strategy 'immediately'"),
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


@pytest.mark.parametrize(("mode", "action"), [("savepoint", Action.STOP), ("cancel", Action.CANCEL)])
def test_stop_requests_the_running_epoch_and_defers(store: JobStore, mode: str, action: Action) -> None:
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
    assert only_request(store).action is Action.STOP  # requested, then waited for in the worker


def test_stop_refuses_an_unknown_mode(store: JobStore) -> None:
    report(store)
    with pytest.raises(AirflowException, match="stop mode 'kill'"):
        StopStreamingJobOperator(task_id="stop", job="orders", mode="kill").execute(context())
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


# -- TriggerSavepointOperator -------------------------------------------------------------------------------------


def test_savepoint_requests_the_running_epoch_and_defers(store: JobStore) -> None:
    report(store, epoch=8)
    op = TriggerSavepointOperator(task_id="savepoint", job="orders", timeout=45)
    deferred = deferral(lambda: op.execute(context()))
    request = only_request(store)
    assert (request.action, request.epoch) == (Action.SAVEPOINT, 8)
    assert isinstance(deferred.trigger, RequestTrigger) and next_step(deferred) == ("execute_complete", {})
    kwargs = trigger_kwargs(deferred)
    assert (kwargs["request_id"], kwargs["epoch"], kwargs["timeout"]) == (request.id, 8, 45)
    assert timeout_s(deferred) == 45 + DEFER_GRACE
    ctx = context()
    result = op.resume(ctx, fire(deferred, ack_event(store, request)))
    assert (result["action"], result["snapshot_id"], result["snapshot_uri"]) == (
        "savepoint", SID, store.snapshot_uri(SID))
    assert ctx["ti"].xcoms == {SNAPSHOT_KEY: store.snapshot_uri(SID)}


@pytest.mark.parametrize(("changes", "message"), [
    ({"state": JobState.STOPPED}, "is STOPPED since .*no running driver to take a savepoint; nothing was requested"),
    ({"updated_at": time.time() - 60}, "sent no heartbeat .*nothing was requested"),
])
def test_savepoint_of_a_job_that_is_not_running_is_refused(store: JobStore, changes: dict[str, Any],
                                                           message: str) -> None:
    report(store, **changes)
    with pytest.raises(AirflowException, match=message):
        TriggerSavepointOperator(task_id="savepoint", job="orders").execute(context())
    assert control_keys(store) == []


def test_savepoint_of_an_unknown_job_is_refused(store: JobStore) -> None:
    with pytest.raises(AirflowException, match="not found in job store"):
        TriggerSavepointOperator(task_id="savepoint", job="orders").execute(context())
    assert control_keys(store) == []


# -- DisposeSnapshotsOperator ---------------------------------------------------------------------------------------


@pytest.fixture
def five_checkpoints(store: JobStore, tmp_path: Path) -> list[str]:
    return make_snapshots(store, tmp_path, [Kind.CHECKPOINT] * 5)


def remaining(store: JobStore) -> list[str]:
    return [m.snapshot_id for m in list_snapshots(store)]


def test_dispose_keeps_the_newest_checkpoints(store: JobStore, five_checkpoints: list[str]) -> None:
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=2).execute(context())
    assert result["job"] == "orders" and result["preview"] is False
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(five_checkpoints[:3])
    assert {(d["kind"], d["reason"]) for d in result["disposed"]} == {("checkpoint", "checkpoint beyond the newest 2")}
    assert remaining(store) == five_checkpoints[3:]


def test_dispose_preview_lists_and_disposes_nothing(store: JobStore, five_checkpoints: list[str]) -> None:
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=2,
                                      preview=True).execute(context())
    assert result["preview"] is True
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(five_checkpoints[:3])
    assert remaining(store) == five_checkpoints


def test_dispose_keeps_the_newest_savepoint(store: JobStore, tmp_path: Path) -> None:
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.SAVEPOINT, Kind.CHECKPOINT, Kind.SAVEPOINT])
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_savepoints=1).execute(context())
    assert sorted(d["snapshot_id"] for d in result["disposed"]) == sorted(ids[:2])
    assert remaining(store) == ids[2:]


def test_dispose_named_snapshots(store: JobStore, five_checkpoints: list[str]) -> None:
    named = [five_checkpoints[1], five_checkpoints[4]]
    result = DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=named).execute(context())
    assert result["disposed"] == [{"snapshot_id": sid, "kind": "checkpoint", "reason": "requested"} for sid in named]
    assert remaining(store) == [five_checkpoints[i] for i in (0, 2, 3)]


def test_dispose_named_snapshots_in_preview_disposes_nothing(store: JobStore, five_checkpoints: list[str]) -> None:
    op = DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[five_checkpoints[0]], preview=True)
    assert op.execute(context())["disposed"] == [
        {"snapshot_id": five_checkpoints[0], "kind": None, "reason": "requested"}]
    assert remaining(store) == five_checkpoints


def test_dispose_refuses_the_newest_savepoint_and_unknown_ids(store: JobStore, tmp_path: Path) -> None:
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.SAVEPOINT])
    with pytest.raises(AirflowException, match="is the newest completed savepoint of job orders"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[ids[1]]).execute(context())
    with pytest.raises(AirflowException, match=f"snapshot {SID} not found"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", snapshot_ids=[SID]).execute(context())
    with pytest.raises(AirflowException, match="checkpoints_keep must be >= 1"):
        DisposeSnapshotsOperator(task_id="dispose", job="orders", keep_checkpoints=0).execute(context())
    assert remaining(store) == ids


# -- RestartStreamingJobOperator ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_launch")
def test_restart_without_a_recorded_deployment_is_refused(store: JobStore) -> None:
    report(store)
    with pytest.raises(AirflowException, match=r"no recorded deployment \(spec/last.json\): submit it first"):
        RestartStreamingJobOperator(task_id="restart", job="orders").execute(context())
    assert control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("kwargs", "message"), [({"restore": "snapshot"}, "needs the snapshot"),
                                                 ({"stop_mode": "kill"}, "stop_mode 'kill'")])
def test_restart_refuses_bad_input(store: JobStore, kwargs: dict[str, Any], message: str) -> None:
    record_deployment(store)
    report(store)
    with pytest.raises(AirflowException, match=message):
        RestartStreamingJobOperator(task_id="restart", job="orders", **kwargs).execute(context())
    assert control_keys(store) == []


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize(("stop_mode", "action"), [("cancel", Action.CANCEL), ("savepoint", Action.STOP)])
def test_restart_of_a_running_job_stops_it_first(store: JobStore, stop_mode: str, action: Action) -> None:
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
    assert (record.deployment, record.restore) == (old.deployment, SID)
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
    assert (record.deployment, record.restore) == (old.deployment, "latest-savepoint")
    assert next_step(deferred) == ("execute_complete", {"launch_id": record.launch_id})
    assert op.execute_complete(context(), HEALTHY, launch_id=record.launch_id) == {
        "job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING", "ui_url": UI, "launch_id": record.launch_id,
        "restore": "latest-savepoint"}


def test_restart_with_a_savepoint_stop_resumes_through_both_steps(store: JobStore, launches: FakeLaunch) -> None:
    old = record_deployment(store)
    report(store)
    op = RestartStreamingJobOperator(task_id="restart", job="orders", stop_mode="savepoint", restore=SID)
    stopped = deferral(lambda: op.execute(context()))
    ctx = context()
    started = deferral(lambda: op.resume(ctx, fire(stopped, ack_event(store, only_request(store)))))
    assert ctx["ti"].xcoms == {SNAPSHOT_KEY: store.snapshot_uri(SID)}  # the final savepoint, linked
    [record] = launches.calls
    assert (record.deployment, record.restore) == (old.deployment, SID)
    assert isinstance(started.trigger, JobHealthTrigger) and trigger_kwargs(started)["started_after"] == \
        record.launched_at
    ctx = context()
    assert op.resume(ctx, fire(started, HEALTHY)) == {
        "job": "orders", "epoch": 4, "batch_id": 9, "state": "RUNNING", "ui_url": UI, "launch_id": record.launch_id,
        "restore": SID}
    assert ctx["ti"].xcoms == {SPARK_UI_KEY: UI}


# -- UpgradeStreamingJobOperator --------------------------------------------------------------------------------------


@pytest.fixture
def running_v1(store: JobStore) -> Launch:
    """v1 deployed and running at epoch 3, holding the lease."""
    record = record_deployment(store)
    report(store, epoch=3, code_version="v1")
    lease = LeaseRecord(job="orders", epoch=3, owner="driver-3", host="h", pid=42, acquired_at=time.time() - 5)
    store.storage.write(LEASE, lease.to_bytes())
    return record


def stop_and_ack(store: JobStore, op: UpgradeStreamingJobOperator) -> tuple[TaskDeferred, dict[str, Any]]:
    """Steps 1-2: the check passes, the stop is requested; the driver answers with savepoint SID. The event is
    what Airflow hands to ``resume``: it carries the next step (after_stop and the plan)."""
    deferred = deferral(lambda: op.execute(context()))
    return deferred, fire(deferred, ack_event(store, only_request(store)))


def start_new_code(store: JobStore, op: UpgradeStreamingJobOperator) -> TaskDeferred:
    """Steps 1-3, resumed as Airflow does: the new code is launched from savepoint SID and verified."""
    _, stopped = stop_and_ack(store, op)
    return deferral(lambda: op.resume(context(), stopped))


@pytest.mark.usefixtures("no_launch")
def test_upgrade_without_a_deployment_is_refused(store: JobStore, checks: FakeCheck) -> None:
    report(store)
    with pytest.raises(AirflowException, match=r"no recorded deployment .*nothing was changed"):
        upgrade_op().execute(context())
    assert checks.calls == [] and control_keys(store) == []


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_upgrade_refuses_an_unknown_mode(store: JobStore, checks: FakeCheck) -> None:
    with pytest.raises(AirflowException, match="upgrade_mode 'blue-green'"):
        upgrade_op(upgrade_mode="blue-green").execute(context())
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
    with pytest.raises(AirflowException) as info:
        upgrade_op().execute(context())
    assert str(info.value) == (
        f"upgrade of job orders to {ORDERS_V2} refused before anything was stopped: restore check of snapshot {SID} "
        "with the new code: incompatible: STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE: the key schema changed; "
        "the job runs as before")
    assert len(checks.calls) == 1 and control_keys(store) == []
    assert {key: store.storage.read(key) for key in before} == before
    assert read_launch(store) == running_v1


@pytest.mark.usefixtures("no_launch")
def test_upgrade_checks_the_new_code_then_stops_with_savepoint(store: JobStore, checks: FakeCheck,
                                                               running_v1: Launch) -> None:
    deferred = deferral(lambda: upgrade_op(check_timeout=321, stop_timeout=44).execute(context()))
    [(spec, timeout, env)] = checks.calls
    assert (spec.job_file, spec.config.restore, spec.config.job, spec.config.code_version) == (
        ORDERS_V2, "latest-state", "orders", "v2")
    assert spec.conf == {"spark.sql.shuffle.partitions": "4"} and timeout == 321
    assert env == {"TOPIC": "orders"}  # the job's settings; no credentials in a local store's connection
    request = only_request(store)
    assert (request.action, request.epoch) == (Action.STOP, 3)
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
    deferred = deferral(lambda: upgrade_op(upgrade_mode="last-state").execute(context()))
    assert only_request(store).action is Action.CANCEL and next_step(deferred)[0] == "after_stop"
    assert len(checks.calls) == 1


@pytest.mark.usefixtures("running_v1")
def test_upgrade_after_the_savepoint_starts_the_new_code_from_it(store: JobStore, checks: FakeCheck,
                                                                 launches: FakeLaunch) -> None:
    deferred = start_new_code(store, upgrade_op())
    [record] = launches.calls
    assert (record.deployment.job_file, record.deployment.code_version, record.restore) == (ORDERS_V2, "v2", SID)
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
    stopped = deferral(lambda: op.execute(context()))
    event = ack_event(store, only_request(store), snapshot_id=None)
    deferred = deferral(lambda: op.resume(context(), fire(stopped, event)))
    assert launches.calls[0].restore == "latest-state"
    assert next_step(deferred)[1]["plan"]["snapshot_id"] == latest


@pytest.mark.usefixtures("running_v1")
def test_upgrade_of_a_stopped_job_in_last_state_or_stateless_mode(store: JobStore, checks: FakeCheck,
                                                                   launches: FakeLaunch) -> None:
    report(store, epoch=3, state=JobState.STOPPED)
    deferred = deferral(lambda: upgrade_op(upgrade_mode="last-state").execute(context()))
    assert next_step(deferred)[0] == "after_verify" and control_keys(store) == []
    assert len(checks.calls) == 1 and launches.calls[-1].restore == "latest-state"
    deferred = deferral(lambda: upgrade_op(upgrade_mode="stateless").execute(context()))
    assert next_step(deferred)[0] == "after_verify" and control_keys(store) == []
    assert len(checks.calls) == 1 and launches.calls[-1].restore == "none"  # stateless: nothing to check


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
    assert only_request(store).action is Action.CANCEL and checks.calls == []
    assert next_step(stopped)[1]["plan"]["new"]["checkpoint"].startswith(f"{base or default_checkpoint('orders')}-")
    verifying = deferral(lambda: op.resume(context(), fire(stopped, ack_event(store, only_request(store),
                                                                              snapshot_id=None))))
    [new] = launches.calls
    prefix, stamp = new.deployment.checkpoint.rsplit("-stateless-", 1)  # type: ignore[union-attr]
    assert prefix == (base or default_checkpoint("orders")) and before <= int(stamp) <= after
    assert (new.deployment.code_version, new.restore) == ("v2", "none")
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
                      "snapshot_id": SID, "epoch": 4, "batch_id": 9}
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
    assert (rollback.deployment, rollback.restore) == (running_v1.deployment, SID)  # the old deployment, as it was
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
    [(spec, _, _)] = checks.calls
    assert spec.config.allow_non_restored_state is expected


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
    deferred = deferral(lambda: upgrade_op(job_file=str(job_file)).execute(context()))
    assert only_request(store).action is Action.STOP and next_step(deferred)[0] == "after_stop"
    assert checks.calls[0][0].job_file == str(job_file)


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
    assert "set retries=0 on this task" in str(info.value)
    assert checks.calls == [] and control_keys(store) == []
    assert {key: store.storage.read(key) for key in before} == before


@pytest.mark.usefixtures("no_launch", "running_v1")
def test_the_first_try_of_an_upgrade_goes_ahead(store: JobStore, checks: FakeCheck) -> None:
    deferred = deferral(lambda: upgrade_op().execute({"ti": RetryTI(1)}))
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
    stopped = deferral(lambda: op.execute(context()))
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
    stopped = deferral(lambda: op.execute(context()))
    event = STOP_FAILURES["failed"](store)
    report(store, epoch=3, state=state, updated_at=time.time() - silent_for)
    with pytest.raises(AirflowException) as info:
        op.resume(context(), fire(stopped, event))
    [relaunch] = launches.calls
    assert (relaunch.deployment, relaunch.restore) == (running_v1.deployment, "latest-state")  # the old code
    assert read_launch(store) == relaunch
    assert "the savepoint upload failed" in event["message"]
    assert str(info.value) == (
        f"upgrade of job orders: job orders: stop failed: {event['message']}; the old job had stopped: relaunched "
        "orders_v1.py (code v1) from its latest state")


def test_upgrade_whose_stop_failed_after_a_newer_driver_took_the_lease_fails_as_an_airflow_exception(
        store: JobStore, checks: FakeCheck, launches: FakeLaunch, running_v1: Launch) -> None:
    op = upgrade_op()
    stopped = deferral(lambda: op.execute(context()))
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
    stopped = deferral(lambda: op.execute(context()))  # the file is there: checked, then the old driver stops
    event = ack_event(store, only_request(store))
    new_file.unlink()  # gone when the new code is launched (another worker, a cleanup)
    rolling = deferral(lambda: op.resume(context(), fire(stopped, event)))
    [(argv, _, _)] = popen_calls
    assert argv[4] == ORDERS_V1  # only the old code was started: the real launch refused the new one
    rollback = read_launch(store)
    assert rollback is not None and (rollback.deployment, rollback.restore) == (old.deployment, SID)
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


# -- waiting in the worker --------------------------------------------------------------------------------------------


class Waiter(JobOperator):
    def done(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        return event


def test_waiting_in_the_worker_retries_storage_errors() -> None:
    from tests.unit.triggers.test_triggers import FlakyTrigger, FlakyWatch

    op = Waiter(task_id="w", job="orders", deferrable=False, poll_interval=0.01)
    watch = FlakyWatch(failures=2)
    assert op.wait(context(), trigger=FlakyTrigger(watch, timeout=5), method_name="done") == {"status": "done",
                                                                                             "polls": 3}
    never = FlakyWatch(failures=None)
    event = op.wait(context(), trigger=FlakyTrigger(never, timeout=0.05), method_name="done")
    assert event == {"status": "timeout", "message": "no outcome within 0 s: the store to answer"}
    assert never.polls > 1
    with pytest.raises(ConfigError, match="invalid job name"):  # other errors are not retried
        op.wait(context(), trigger=FlakyTrigger(FlakyWatch(None, ConfigError("invalid job name")), timeout=5),
                method_name="done")


# -- links -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "endpoint", "link"), [
    ("s3://bucket/jobs/orders/snapshots/sp-1", None,
     "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=jobs/orders/snapshots/sp-1/"),
    ("s3a://bucket/jobs/orders/snapshots/sp-1/", None,
     "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=jobs/orders/snapshots/sp-1/"),
    ("s3://bucket/jobs/orders/snapshots/sp-1", "http://seaweed:8333/",
     "http://seaweed:8333/bucket/jobs/orders/snapshots/sp-1/manifest.json"),
    ("/data/jobs/orders/snapshots/sp-1", None, "file:///data/jobs/orders/snapshots/sp-1"),
    ("file:///data/jobs/orders/snapshots/sp-1", "http://ignored:1", "file:///data/jobs/orders/snapshots/sp-1"),
])
def test_browsable(uri: str, endpoint: str | None, link: str) -> None:
    assert browsable(uri, endpoint) == link


def test_links_persist_under_their_xcom_key() -> None:
    ctx = context()
    SparkUILink.persist(ctx, UI)
    SnapshotLink.persist_snapshot(ctx, "s3://b/jobs/orders/snapshots/sp-1", "http://s3:8333")
    assert ctx["ti"].xcoms == {"_link_SparkUILink": UI,
                               "_link_SnapshotLink": "http://s3:8333/b/jobs/orders/snapshots/sp-1/manifest.json"}


def test_links_without_a_url_persist_an_empty_one() -> None:
    ctx = context()
    SparkUILink.persist(ctx, None)  # an empty link is hidden; a missing XCom is logged as an error
    SnapshotLink.persist_snapshot(ctx, None, "http://s3:8333")
    assert ctx["ti"].xcoms == {"_link_SparkUILink": "", "_link_SnapshotLink": ""}


def test_get_link_reads_the_xcom(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    stored = {"_link_SparkUILink": UI}
    monkeypatch.setattr(XCom, "get_value", lambda *, ti_key, key: stored.get(key))
    op = submit_op()
    assert SparkUILink().get_link(op, ti_key=None) == UI  # type: ignore[arg-type]
    assert SnapshotLink().get_link(op, ti_key=None) == ""  # type: ignore[arg-type]


# -- CkptSparkHook ---------------------------------------------------------------------------------------------------


def spark_connection(monkeypatch: pytest.MonkeyPatch, **conn: Any) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", json.dumps({"conn_type": "ckpt_spark", **conn}))


@pytest.mark.parametrize("conf", [{"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": 4},
                                  json.dumps({"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": 4})],
                         ids=["object", "json-text"])
def test_spark_hook_settings_from_the_connection(monkeypatch: pytest.MonkeyPatch, conf: Any) -> None:
    spark_connection(monkeypatch, host="spark://h", port=7077,
                     extra={"conf": conf, "deploy_mode": "client", "spark_submit": "/opt/spark/bin/spark-submit"})
    assert CkptSparkHook().settings == {
        "master": "spark://h:7077", "deploy_mode": "client", "spark_submit": "/opt/spark/bin/spark-submit",
        "conf": {"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "4"}}


def test_spark_hook_keeps_a_port_in_the_host_and_other_masters(monkeypatch: pytest.MonkeyPatch) -> None:
    spark_connection(monkeypatch, host="spark://h:7078", port=7077)
    assert CkptSparkHook().settings["master"] == "spark://h:7078"
    spark_connection(monkeypatch, host="yarn", port=7077, extra={"deploy_mode": "cluster"})
    assert (CkptSparkHook().settings["master"], CkptSparkHook().settings["deploy_mode"]) == ("yarn", "cluster")
    spark_connection(monkeypatch)
    assert CkptSparkHook().settings == {"master": "local[2]", "deploy_mode": "client", "spark_submit": None,
                                        "conf": {}}


@pytest.mark.parametrize(("conn", "message"), [
    ({"host": "mesos://m:5050"}, "unknown Spark master 'mesos://m:5050'"),
    ({"host": "local[2]", "extra": {"conf": "{not json"}}, "extra 'conf' is not JSON"),
    ({"host": "local[2]", "extra": {"conf": ["a=b"]}}, "extra 'conf' must be a JSON object .*found list"),
])
def test_spark_hook_refuses_bad_settings(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any], message: str) -> None:
    spark_connection(monkeypatch, **conn)
    with pytest.raises(ConfigError, match=message):
        _ = CkptSparkHook().settings


def test_spark_hook_without_the_default_connection_runs_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", raising=False)
    assert CkptSparkHook().settings == {"master": "local[2]", "deploy_mode": "client", "spark_submit": None,
                                        "conf": {}}
    with pytest.raises(AirflowNotFoundException, match="my_spark"):
        _ = CkptSparkHook("my_spark").settings  # a connection named on purpose must exist


# -- deployments ------------------------------------------------------------------------------------------------------


def full_deployment() -> Deployment:
    return Deployment(job_file="s3://code/orders_v2.py", code_version="v2", master="yarn", deploy_mode="cluster",
                      conf={"spark.executor.memory": "2g", "spark.sql.shuffle.partitions": "8"},
                      py_files=("lib.zip", "util.py"), files=("schema.json",),
                      spark_submit="/opt/spark/bin/spark-submit",
                      env={"TOPIC": "orders", "KEYSPACE": "ks"}, checkpoint="/ckpt/orders", checkpoint_interval=None,
                      savepoint_interval=None, keep_checkpoints=4, keep_savepoints=None, heartbeat_interval=2.5,
                      restart_strategy="failure-rate", restart_attempts=None, restart_delay=1.5,
                      restart_interval=60.0, max_restarts_in_window=3, health_window=120.0, progress_timeout=None)


def test_deployment_round_trips_through_json() -> None:
    d = full_deployment()
    assert Deployment.from_dict(d.to_dict()) == d
    again = Deployment.from_dict(json.loads(json.dumps(d.to_dict())) | {"a_field_of_a_newer_version": 1})
    assert again == d and again.py_files == ("lib.zip", "util.py")  # lists back to tuples, unknown keys dropped
    record = Launch("orders", d, SID, 1.7e9, "airflow:dag.task", "launch-1", pid=7, host="h", log_file="/l")
    assert Launch.from_bytes(record.to_bytes(), "x") == record
    with pytest.raises(StorageError, match="deployment record x is malformed"):
        Launch.from_bytes(b'{"job": "orders"}', "x")


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_run_argv_supervises_and_carries_every_setting() -> None:
    s3 = S3Options(endpoint_url="http://s3:8333", region="eu-west-1", access_key_id="AKIAEXAMPLE",
                   secret_access_key="wJalrXUtnFEMI-secret", session_token="FwoGZX-token")
    argv = run_argv(full_deployment(), "orders", "s3://bucket/jobs", SID, s3)
    assert argv[1:5] == ["-m", "airflow_ckpt_provider.cli", "run", "s3://code/orders_v2.py"]
    assert "--supervise" in argv
    expected = {"--job": ["orders"], "--store": ["s3://bucket/jobs"], "--restore": [SID], "--master": ["yarn"],
                "--deploy-mode": ["cluster"], "--restart-strategy": ["failure-rate"], "--code-version": ["v2"],
                "--checkpoint": ["/ckpt/orders"], "--keep-checkpoints": ["4"], "--heartbeat-interval": ["2.5"],
                "--restart-delay": ["1.5"], "--restart-interval": ["60"], "--max-restarts-in-window": ["3"],
                "--health-window": ["120"], "--checkpoint-interval": ["none"], "--savepoint-interval": ["none"],
                "--keep-savepoints": ["none"], "--endpoint-url": ["http://s3:8333"], "--region": ["eu-west-1"],
                "--conf": ["spark.executor.memory=2g", "spark.sql.shuffle.partitions=8"],
                "--py-files": ["lib.zip,util.py"], "--files": ["schema.json"],
                "--spark-submit": ["/opt/spark/bin/spark-submit"]}
    assert {flag: flag_values(argv, flag) for flag in expected} == expected
    assert flag_values(argv, "--restart-attempts") == flag_values(argv, "--progress-timeout") == []  # unset: defaults
    # credentials go to the environment, never to argv (ps shows it)
    assert not any(secret in arg for arg in argv for secret in ("AKIAEXAMPLE", "wJalrXUtnFEMI", "FwoGZX"))
    assert credentials_env(s3) == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-secret",
                                   "AWS_SESSION_TOKEN": "FwoGZX-token"}


def test_run_argv_intervals_of_zero_are_not_none() -> None:
    argv = run_argv(Deployment(job_file="j.py", savepoint_interval=600.0, keep_savepoints=2), "orders", "/s", "none")
    assert (flag_values(argv, "--checkpoint-interval"), flag_values(argv, "--savepoint-interval"),
            flag_values(argv, "--keep-savepoints")) == (["0"], ["600"], ["2"])
    assert flag_values(argv, "--endpoint-url") == flag_values(argv, "--code-version") == []


@pytest.mark.parametrize("name", ["AWS_SECRET", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN", "API_KEY",
                                  "KEY", "SSH_PRIVATE", "GCP_CREDENTIALS", "passwd", "KAFKA_SASL_JAAS_CONFIG",
                                  "DB_PASS", "APIKEY", "X_AUTH", "SERVICE_API_KEY", "PGPASS", "MYSQL_PWD",
                                  "AUTH_HEADER", "sasl_jaas_config"])
def test_secret_looking_env_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"refusing env {name}: a deployment's env is stored in the job store"):
        Deployment(job_file="j.py", env={name: "x"})


def test_ordinary_env_names_are_kept() -> None:
    env = {"TOPIC": "orders", "KEYSPACE": "ks", "MONKEY": "1", "OUTPUT_PATH": "/out", "TOPIC_KEYS": "id"}
    assert Deployment(job_file="j.py", env=env).env == env


PopenCall = tuple[list[str], dict[str, str], Launch | None]


@pytest.fixture
def popen_calls(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> list[PopenCall]:
    """subprocess.Popen for deploy.launch: records argv, env and what spec/last.json held when it was called."""
    calls: list[PopenCall] = []

    class FakePopen:
        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            calls.append((argv, env, read_launch(store)))
            self.pid = 4242

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(deploy.subprocess, "Popen", FakePopen)
    return calls


def test_launch_records_the_deployment_first_and_passes_credentials_in_the_env(
        store: JobStore, popen_calls: list[PopenCall], tmp_path: Path) -> None:
    s3 = S3Options(endpoint_url="http://s3:8333", access_key_id="AKIAEXAMPLE", secret_access_key="wJalr-secret")
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore=SID, store_url="/stores", s3=s3,
                           launched_by="me")
    [(argv, env, recorded_before)] = popen_calls
    assert recorded_before is not None and recorded_before.launch_id == record.launch_id  # target recorded first
    assert recorded_before.pid is None and record.pid == 4242 and read_launch(store) == record
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIAEXAMPLE", "wJalr-secret")
    assert (env[LAUNCH_ENV], env["TOPIC"]) == (record.launch_id, "orders")
    assert not any("wJalr" in arg or "AKIAEXAMPLE" in arg for arg in argv)
    assert b"wJalr" not in store.storage.read(SPEC_LAST)
    assert (record.restore, record.launched_by, record.host) == (SID, "me", socket.gethostname())
    assert record.log_file == str(tmp_path / "home" / "jobs" / "orders" / "logs" / f"{record.launch_id}.log")


def test_launch_keeps_airflow_settings_out_of_the_job_s_env(store: JobStore, popen_calls: list[PopenCall],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_X", "postgres://airflow:hunter2@db/airflow")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:hunter2@db/airflow")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/scratch")
    deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    [(_, env, _)] = popen_calls
    assert [name for name in env if name.startswith("AIRFLOW")] == []  # the store fixture's connection too
    assert "hunter2" not in json.dumps(env)
    assert (env["SPARK_LOCAL_DIRS"], env["TOPIC"]) == ("/scratch", "orders")  # the rest is inherited, env on top


@pytest.mark.parametrize(("changes", "message"), [
    ({"job_file": "no_such_job.py"}, r"job file no_such_job\.py not found"),
    ({"job_file": ORDERS_V1, "deploy_mode": "cluster"}, "deploy mode cluster with master 'local\\[2\\]'"),
])
def test_launch_refuses_bad_input_before_recording_anything(store: JobStore, popen_calls: list[PopenCall],
                                                            changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        deploy.launch(store, old_deployment(**changes), restore="latest-state", store_url="/stores")
    assert popen_calls == [] and read_launch(store) is None  # spec/last.json not written: nothing was meant to run


def test_submit_of_a_missing_job_file_fails_before_recording_a_launch(store: JobStore,
                                                                      popen_calls: list[PopenCall]) -> None:
    with pytest.raises(AirflowException, match=r"cannot launch job orders: job file no_such_job\.py not found"):
        submit_op(job_file="no_such_job.py").execute(context())  # the real launch: its check refuses it
    assert popen_calls == [] and read_launch(store) is None


def test_launch_does_not_overwrite_an_end_recorded_meanwhile(store: JobStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    class EndsAtOnce:
        """Its supervisor fails at once and records its end before launch() records the pid."""

        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            assert record_end(store, env[LAUNCH_ENV], ending="config-error", exit_code=2, reason="bad input")
            self.pid = 4242

        def wait(self) -> int:
            return 2

    monkeypatch.setattr(deploy.subprocess, "Popen", EndsAtOnce)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242
    stored = read_launch(store)
    assert stored is not None and stored.launch_id == record.launch_id
    assert stored.ended_at is not None and (stored.ending, stored.exit_code, stored.end_reason) == (
        "config-error", 2, "bad input")  # the end survives: waiters stop waiting for a driver
    assert stored.pid is None


def test_launch_does_not_overwrite_a_newer_launch(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    newer = Launch("orders", old_deployment(job_file=ORDERS_V1, code_version="v0"), SID, time.time() + 1,
                   "airflow:other.restart", "newer-launch", pid=5151)

    class Superseded:
        """Another task launches the job before this launch() records its pid."""

        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            store.storage.write(SPEC_LAST, newer.to_bytes())
            self.pid = 4242

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(deploy.subprocess, "Popen", Superseded)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242 and record.launch_id != newer.launch_id
    assert read_launch(store) == newer


def test_launch_whose_pid_cannot_be_recorded_still_returns_it(store: JobStore, popen_calls: list[PopenCall],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(key: str) -> Any:
        raise StorageError(f"cannot read {key}: connection reset")

    monkeypatch.setattr(store.storage, "read_versioned", unreachable)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242 and len(popen_calls) == 1  # it runs; the warning says its pid was not recorded
    stored = read_launch(store)
    assert stored == replace(record, pid=None)  # the record written before the start stays
