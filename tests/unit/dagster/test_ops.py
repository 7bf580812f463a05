"""The ops, run in-process with real Dagster on a local job store whose driver is played by the test: they write
the same control requests and launch records as the Airflow operators, and refuse what the operators refuse."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, open_requests, write_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, read_launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import CONTROL, SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.dagster import (
    CkptResource,
    cancel_streaming_job,
    dispose_snapshots,
    stop_streaming_job,
    submit_streaming_job,
    trigger_savepoint,
)
from tests.support.operatorfakes import SID, make_snapshots, report
from tests.unit.dagster.conftest import CKPT_RESOURCE, failure, run_op


class Driver(threading.Thread):
    """Answers the first control request as the driver of its epoch would (an ack with a snapshot)."""

    def __init__(self, store: JobStore, outcome: Outcome = Outcome.COMPLETED) -> None:
        super().__init__(daemon=True)
        self.store, self.outcome = store, outcome
        self.answered: list[Ack] = []

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            requests = open_requests(self.store)
            if requests:
                r = requests[0]
                ack = Ack(r.id, r.action, self.outcome, "done" if self.outcome is Outcome.COMPLETED else "no space",
                          r.epoch, time.time(), snapshot_id=SID, snapshot_uri=self.store.snapshot_uri(SID), batch_id=7)
                write_ack(self.store, ack)
                self.answered.append(ack)
                return
            time.sleep(0.02)


def test_the_savepoint_op_returns_the_drivers_savepoint_requested_of_its_epoch(store: JobStore,
                                                                                 ckpt: CkptResource) -> None:
    report(store)
    driver = Driver(store)
    driver.start()
    result = run_op(trigger_savepoint, ckpt, {"job": "orders", "poll_interval": 0.05})
    driver.join(5)
    assert result.success
    assert result.output_for_node("trigger_savepoint") == {
        "job": "orders", "outcome": "completed", "action": "savepoint", "snapshot_id": SID,
        "snapshot_uri": store.snapshot_uri(SID), "batch_id": 7}
    [ack] = driver.answered
    assert (ack.action, ack.epoch) == (RequestAction.SAVEPOINT, 3)
    [materialized] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = materialized.step_output_data.metadata
    assert metadata["snapshot_id"].value == SID and metadata["batch_id"].value == 7


def test_a_retried_savepoint_op_waits_for_its_first_tries_request_instead_of_asking_again(
        store: JobStore, ckpt: CkptResource, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.dagster import ops

    real, lost = ops.wait_for, []

    def lose_once(*args: Any, **kwargs: Any) -> Any:
        if not lost:  # the first try wrote its request, then lost its connection while waiting
            lost.append(1)
            raise OSError("connection reset")
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "wait_for", lose_once)
    report(store)
    driver = Driver(store)
    driver.start()
    job = dg.GraphDefinition(name="retried_savepoint", node_defs=[trigger_savepoint]).to_job(
        resource_defs={CKPT_RESOURCE: ckpt}, op_retry_policy=dg.RetryPolicy(max_retries=2))
    result = job.execute_in_process(
        run_config={"ops": {"trigger_savepoint": {"config": {"job": "orders", "poll_interval": 0.05, "timeout": 20}}}},
        raise_on_error=False)
    driver.join(5)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
    assert result.success, failure(result)
    [ack] = driver.answered  # one request in all, answered once, the retry's result
    assert result.output_for_node("trigger_savepoint")["snapshot_id"] == SID
    assert [o.key for o in store.storage.list(CONTROL) if not o.key.endswith(".ack.json")] == [
        f"{CONTROL}{ack.id}.json"]


def test_a_savepoint_the_driver_fails_fails_the_op_with_its_answer(store: JobStore, ckpt: CkptResource) -> None:
    report(store)
    driver = Driver(store, Outcome.FAILED)
    driver.start()
    result = run_op(trigger_savepoint, ckpt, {"job": "orders", "poll_interval": 0.05})
    driver.join(5)
    assert not result.success
    assert "job orders: savepoint failed: job orders: request savepoint-" in failure(result)
    assert "failed by the driver of epoch 3: no space" in failure(result)


def test_a_savepoint_of_a_stopped_job_is_refused_with_nothing_requested(store: JobStore, ckpt: CkptResource) -> None:
    report(store, state=JobState.STOPPED, reason="stopped with savepoint")
    result = run_op(trigger_savepoint, ckpt, {"job": "orders"})
    assert not result.success
    assert "job orders is STOPPED since" in failure(result)
    assert "there is no running driver to take a savepoint; nothing was requested" in failure(result)
    assert store.storage.list(CONTROL) == []


def test_a_savepoint_of_an_unknown_job_names_the_jobs_the_store_holds(store: JobStore, ckpt: CkptResource) -> None:
    report(store)
    result = run_op(trigger_savepoint, ckpt, {"job": "ordres"})
    assert not result.success
    assert "job 'ordres' not found in job store" in failure(result) and "jobs in this store: orders" in failure(result)


@pytest.mark.parametrize("op", [stop_streaming_job, cancel_streaming_job])
def test_stop_and_cancel_of_a_job_that_never_ran_leave_it_and_say_so(ckpt: CkptResource, op: Any) -> None:
    result = run_op(op, ckpt, {"job": "orders"})
    assert result.success
    assert result.output_for_node(op.name) == {"job": "orders", "outcome": "not_running", "action": None,
                                               "snapshot_id": None, "snapshot_uri": None, "batch_id": None}


def test_stop_with_savepoint_asks_the_driver_to_stop_and_returns_its_final_savepoint(store: JobStore,
                                                                                   ckpt: CkptResource) -> None:
    report(store)
    driver = Driver(store)
    driver.start()
    result = run_op(stop_streaming_job, ckpt, {"job": "orders", "mode": "savepoint", "poll_interval": 0.05})
    driver.join(5)
    assert result.success
    assert result.output_for_node("stop_streaming_job")["action"] == "stop"
    assert [(a.action, a.epoch) for a in driver.answered] == [(RequestAction.STOP, 3)]


class FakeLaunch:
    """Stands in for launcher.deploy.launch: records spec/last.json as it does, then reports the new driver."""

    def __init__(self) -> None:
        self.calls: list[tuple[Launch, str, S3Options | None]] = []

    def __call__(self, store: JobStore, deployment: Deployment, *, restore: Any, store_url: str,
                 s3: S3Options | None = None, launched_by: str = "", key: str = "", **_: Any) -> Launch:
        now = time.time()
        record = Launch(store.job, deployment, restore, now, launched_by, f"launch-{len(self.calls) + 1}", key=key)
        store.storage.write(SPEC_LAST, record.to_bytes())
        self.calls.append((record, store_url, s3))
        report(store, epoch=4, started_at=now + 0.01, batch_id=None)  # the new driver, as it reports
        return record


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> FakeLaunch:
    fake = FakeLaunch()
    monkeypatch.setattr("airflow_ckpt_provider.launcher.handover.launch", fake)  # under start_job
    return fake


SUBMIT = {"job": "orders", "job_file": "/opt/jobs/orders_v1.py", "code_version": "v1", "poll_interval": 0.05,
          "env": {"ORDERS_TOPIC": "orders"}, "spark_conf": {"spark.sql.shuffle.partitions": "2"},
          "settings": {"savepoint_interval": "600", "restart_strategy": "fixed-delay", "keep_savepoints": "6"}}


def test_submit_of_a_job_that_never_ran_launches_its_deployment_once_and_waits_until_it_runs(
    store: JobStore, ckpt: CkptResource, root: Path, launches: FakeLaunch
) -> None:
    result = run_op(submit_streaming_job, ckpt, SUBMIT)
    assert result.success, failure(result)
    [(record, store_url, _)] = launches.calls
    d = record.deployment
    assert (d.job_file, d.code_version, d.master, d.savepoint_interval, d.keep_savepoints, d.restart_strategy.value,
            d.env) == ("/opt/jobs/orders_v1.py", "v1", "local[2]", 600.0, 6, "fixed-delay", {"ORDERS_TOPIC": "orders"})
    assert d.conf == {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}  # the resource's, then the op's
    assert str(record.restore) == "latest-state" and store_url == str(root)
    assert record.launched_by.startswith("dagster:one_submit_streaming_job.submit_streaming_job (run ")
    assert result.output_for_node("submit_streaming_job") == {
        "job": "orders", "epoch": 4, "batch_id": None, "state": "RUNNING", "ui_url": None, "launch_id": "launch-1"}


def test_submit_ships_the_resource_s_then_the_op_s_py_files_and_files_recorded_with_the_deployment(
    store: JobStore, root: Path, launches: FakeLaunch
) -> None:
    ckpt = CkptResource(store_url=str(root), py_files=["s3a://code/common.zip"], files=["s3a://code/ref.csv"])
    config = SUBMIT | {"py_files": ["s3a://code/job_common.py", "s3a://code/common.zip"], "files": ["schema.json"]}
    result = run_op(submit_streaming_job, ckpt, config)
    assert result.success, failure(result)
    [(record, _, _)] = launches.calls
    assert (record.deployment.py_files, record.deployment.files) == (
        ("s3a://code/common.zip", "s3a://code/job_common.py"), ("s3a://code/ref.csv", "schema.json"))
    assert read_launch(store).deployment.py_files == record.deployment.py_files  # type: ignore[union-attr]


def test_submit_of_a_running_job_reconnects_and_launches_nothing(store: JobStore, ckpt: CkptResource,
                                                                  launches: FakeLaunch) -> None:
    report(store)
    result = run_op(submit_streaming_job, ckpt, SUBMIT)
    assert result.success, failure(result)
    assert launches.calls == []
    assert result.output_for_node("submit_streaming_job")["epoch"] == 3


def test_submit_of_a_stopping_job_is_refused_and_launches_nothing(store: JobStore, ckpt: CkptResource,
                                                                   launches: FakeLaunch) -> None:
    report(store, state=JobState.STOPPING, reason="stop requested")
    result = run_op(submit_streaming_job, ckpt, SUBMIT)
    assert not result.success
    assert "job orders is STOPPING (epoch 3: stop requested); nothing was submitted" in failure(result)
    assert launches.calls == [] and read_launch(store) is None


@pytest.mark.parametrize(("change", "expected"), [
    ({"env": {"DB_PASSWORD": "x"}}, "refusing env DB_PASSWORD"),
    ({"settings": {"savepoint_interval": "soon"}}, "savepoint_interval"),
    ({"settings": {"savepoint_every": "600"}}, "unknown setting 'savepoint_every': expected one of"),
    ({"job_file": ""}, "a deployment needs a job file"),
    ({"supervision": "k8s"}, "invalid supervision: expected one of auto, launcher, service, found 'k8s'"),
])
def test_submit_with_bad_input_fails_before_anything_is_launched(store: JobStore, ckpt: CkptResource,
                                                                  launches: FakeLaunch, change: dict[str, Any],
                                                                  expected: str) -> None:
    result = run_op(submit_streaming_job, ckpt, SUBMIT | change)
    assert not result.success
    assert expected in failure(result)
    assert launches.calls == [] and read_launch(store) is None


def test_submit_with_supervision_service_hands_the_job_over_and_launches_nothing_here(
    store: JobStore, ckpt: CkptResource, launches: FakeLaunch, tmp_path: Path
) -> None:
    from airflow_ckpt_provider.core.records.ownership import handed_key

    job_file = tmp_path / "orders_v1.py"
    job_file.write_text("# the job\n")
    # No service instance runs here: the op waits for a driver that never reports, briefly.
    result = run_op(submit_streaming_job, ckpt, SUBMIT | {"job_file": str(job_file), "supervision": "service",
                                                          "start_timeout": 0.5})
    assert not result.success
    assert launches.calls == []  # nothing started on this host
    record = read_launch(store)
    assert record is not None and record.pid is None and record.deployment.job_file == str(job_file)
    assert store.root.exists(handed_key("orders"))


def test_dispose_applies_retention_and_keeps_the_newest_savepoint(store: JobStore, ckpt: CkptResource,
                                                                   tmp_path: Path) -> None:
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.SAVEPOINT, Kind.SAVEPOINT])
    result = run_op(dispose_snapshots, ckpt, {"job": "orders", "keep_savepoints": 1})
    assert result.success, failure(result)
    disposed = result.output_for_node("dispose_snapshots")["disposed"]
    assert sorted(d["snapshot_id"] for d in disposed) == sorted(ids[:2])
    assert [m.snapshot_id for m in list_snapshots(store)] == ids[2:]
