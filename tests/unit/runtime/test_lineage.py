"""The driver's OpenLineage RUNNING events (runtime/lineage.py): the run of a launch, the event built from a status,
when nothing is sent, rate-limited failure logs, and a driver without openlineage-python."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from openlineage.client import OpenLineageClient
from openlineage.client.serde import Serde

from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET, DatasetName, RunRef, launch_run_id, parse_run_ref
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.runtime import lineage
from airflow_ckpt_provider.runtime.lineage import FailureLog, LineageEmitter, LineageRun, running_report
from airflow_ckpt_provider.runtime.lineageevent import running_event

REPO = Path(__file__).resolve().parents[3]
LAUNCH = "20261126T073000Z-abc123"
PARENT_RUN = "01936f4e-0b1a-7c3d-8e5f-123456789abc"
ROOT_RUN = "01936f4e-0b1a-7c3d-8e5f-000000000001"
ENV = {"CKPT_LAUNCH_ID": LAUNCH, "OPENLINEAGE_NAMESPACE": "prod",
       "OPENLINEAGE_PARENT_ID": f"prod/orders_dag.submit/{PARENT_RUN}",
       "OPENLINEAGE_ROOT_PARENT_ID": f"prod/orders_dag/{ROOT_RUN}"}
#: status.json offsets: a ckpt-kafka source with commitGroupId (brokers known), one without, a file source.
OFFSETS = {
    "0:PythonMicroBatchStream": {"orders": {"0": 12}, "$commit": {"group": "g", "servers": "b1:9092,b2:9092"}},
    "1:PythonMicroBatchStream": {"refunds": {"0": 3}},
    "2:FileStreamSource": {"logOffset": 3},
}


def status(**changes: Any) -> JobStatus:
    base = JobStatus(job="orders", state=JobState.RUNNING, epoch=4, updated_at=1.0, started_at=1.0, batch_id=17,
                     offsets=OFFSETS, code_version="v2", restart_count=1)
    return replace(base, **changes)


# -- the run of a launch ---------------------------------------------------------------------------


def test_every_driver_of_a_launch_reports_the_same_run() -> None:
    first, restarted = LineageRun.of("orders", ENV, epoch=4), LineageRun.of("orders", ENV, epoch=5)
    assert first.run_id == restarted.run_id == launch_run_id(LAUNCH)
    assert first.run_id == "f12f7858-9719-57c4-8a9f-3cd35bee34c9"  # uuid5: the same in every version and process
    other = LineageRun.of("orders", {**ENV, "CKPT_LAUNCH_ID": "20261126T080000Z-def456"}, epoch=6)
    assert other.run_id != first.run_id


def test_a_driver_started_without_a_launch_is_a_run_of_its_epoch() -> None:
    run = LineageRun.of("orders", {}, epoch=3)
    assert (run.run_id, run.launch_id, run.namespace, run.parent) == (launch_run_id("orders/epoch-3"), None,
                                                                      "default", None)


def test_the_parent_and_root_runs_come_from_the_environment() -> None:
    run = LineageRun.of("orders", ENV, epoch=4, launched_by="airflow:orders_dag.submit")
    assert run.parent == RunRef("prod", "orders_dag.submit", PARENT_RUN)
    assert run.root == RunRef("prod", "orders_dag", ROOT_RUN)


@pytest.mark.parametrize("value", ["prod/orders_dag.submit", "prod/orders_dag.submit/not-a-uuid", f"/x/{PARENT_RUN}"])
def test_a_malformed_parent_is_left_out(value: str, caplog: pytest.LogCaptureFixture) -> None:
    assert parse_run_ref(value) is None
    with caplog.at_level(logging.WARNING):
        run = LineageRun.of("orders", {**ENV, "OPENLINEAGE_PARENT_ID": value}, epoch=4)
    assert (run.parent, run.root) == (None, None)
    assert [r.getMessage() for r in caplog.records] == [
        f"job orders: OPENLINEAGE_PARENT_ID={value!r} is not NAMESPACE/JOB/RUN_UUID: the lineage events name no "
        "parent run"]


# -- the event -------------------------------------------------------------------------------------


def test_the_report_says_what_the_status_says() -> None:
    run = LineageRun.of("orders", ENV, epoch=4, launched_by="airflow:orders_dag.submit")
    report = running_report(run, status(), at=1_764_142_200.0)
    assert report.inputs == (DatasetName("kafka://b1:9092", "orders"),)
    assert report.facet == {"job": "orders", "epoch": 4, "codeVersion": "v2", "launchId": LAUNCH, "batchId": 17,
                            "restarts": 1, "launchedBy": "airflow:orders_dag.submit", "unnamedTopics": ["refunds"]}
    assert (report.namespace, report.job_name, report.run_id) == ("prod", "ckpt.orders", launch_run_id(LAUNCH))


def test_the_running_event_through_the_openlineage_classes() -> None:
    run = LineageRun.of("orders", ENV, epoch=4, launched_by="airflow:orders_dag.submit")
    event = Serde.to_dict(running_event(running_report(run, status(), at=1_764_142_200.0)))
    assert event["eventType"] == "RUNNING"
    assert event["eventTime"] == "2025-11-26T07:30:00+00:00"
    assert event["job"]["namespace"] == "prod"
    assert event["job"]["name"] == "ckpt.orders"
    assert event["job"]["facets"]["jobType"]["processingType"] == "STREAMING"
    assert event["run"]["runId"] == launch_run_id(LAUNCH)
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [("kafka://b1:9092", "orders")]
    assert event["outputs"] == []
    parent = event["run"]["facets"]["parent"]
    assert (parent["job"]["namespace"], parent["job"]["name"], parent["run"]["runId"]) == (
        "prod", "orders_dag.submit", PARENT_RUN)
    root = parent["root"]
    assert (root["job"]["namespace"], root["job"]["name"], root["run"]["runId"]) == ("prod", "orders_dag", ROOT_RUN)
    facet = event["run"]["facets"][RUN_FACET]
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "job": "orders", "epoch": 4, "codeVersion": "v2", "launchId": LAUNCH, "batchId": 17, "restarts": 1,
        "launchedBy": "airflow:orders_dag.submit", "unnamedTopics": ["refunds"]}


def test_without_a_parent_the_event_has_no_parent_facet() -> None:
    run = LineageRun.of("orders", {"CKPT_LAUNCH_ID": LAUNCH}, epoch=4)
    event = Serde.to_dict(running_event(running_report(run, status(batch_id=None, offsets={}), at=1.0)))
    assert set(event["run"]["facets"]) == {RUN_FACET}
    assert event["inputs"] == []  # no batch completed yet: no offsets, no topics


# -- when nothing is sent --------------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, None),
    ({"OPENLINEAGE_NAMESPACE": "prod", "OPENLINEAGE_PARENT_ID": f"a/b/{PARENT_RUN}"}, None),  # no transport
    ({"OPENLINEAGE_URL": "http://marquez:5000"}, "OPENLINEAGE_URL"),
    ({"OPENLINEAGE_CONFIG": "/etc/ol.yml"}, "OPENLINEAGE_CONFIG"),
    ({"OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": "/x"},
     "OPENLINEAGE__TRANSPORT__* (2 variables)"),
    ({"OPENLINEAGE__TRANSPORT": '{"type": "console"}'}, "OPENLINEAGE__TRANSPORT"),
    ({"OPENLINEAGE_URL": "http://marquez:5000", "OPENLINEAGE_DISABLED": "True"}, None),
])
def test_configured_by_the_clients_own_variables(environ: dict[str, str], expected: str | None) -> None:
    assert lineage.configured_by(environ) == expected


@pytest.mark.parametrize(("environ", "interval"), [
    ({}, 300.0),  # the client would print every event to the console, with a warning: not created
    ({"OPENLINEAGE_URL": "http://marquez:5000"}, 0.0),  # lineage_interval 0: off
    ({"OPENLINEAGE_URL": "http://marquez:5000", "OPENLINEAGE_DISABLED": "true"}, 300.0),
])
def test_no_emitter_unless_configured(environ: dict[str, str], interval: float,
                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert lineage.start_emitter("orders", interval, 4, environ=environ) is None
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert not any(t.name.startswith("ckpt-lineage") for t in threading.enumerate())


def test_configured_but_openlineage_not_installed_is_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "openlineage.client", None)  # import openlineage.client: ImportError
    with caplog.at_level(logging.INFO):
        assert lineage.start_emitter("orders", 300.0, 4, environ={"OPENLINEAGE_URL": "http://m:5000"}) is None
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert caplog.records[0].getMessage().startswith(
        "job orders: OpenLineage is configured (OPENLINEAGE_URL) but openlineage-python is not installed")


def test_without_openlineage_the_driver_imports_and_gets_no_emitter() -> None:
    """openlineage blocked in a fresh interpreter: the driver module imports, and with OpenLineage configured the
    driver gets no emitter (its loop then skips lineage: ``self.lineage is None``)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["openlineage"] = None  # import openlineage...: ImportError
        from airflow_ckpt_provider.runtime import driver, lineage
        emitter = lineage.start_emitter("orders", 2.0, 1, environ={"OPENLINEAGE_URL": "http://m:5000"})
        print(emitter, [m for m in sys.modules if m.startswith("openlineage")])
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "None ['openlineage']"
    assert "openlineage-python is not installed" in out.stderr


# -- sending ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failures_are_logged_once_an_hour_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    failures = FailureLog("orders", clock=clock)
    with caplog.at_level(logging.WARNING):
        logged = [failures.failed(ConnectionError("refused"))]
        for _ in range(3):
            clock.now += 600
            logged.append(failures.failed(ConnectionError("refused")))
        clock.now += 1800  # an hour after the first
        logged.append(failures.failed(TimeoutError("slow")))
    assert logged == [True, False, False, False, True]
    assert [r.getMessage() for r in caplog.records] == [
        "job orders: OpenLineage event not sent: ConnectionError: refused; the job runs on, the next is tried in "
        "its lineage_interval",
        "job orders: OpenLineage event not sent: TimeoutError: slow (3 more failed since the last warning); the job "
        "runs on, the next is tried in its lineage_interval"]


def file_client(path: Path) -> OpenLineageClient:
    return OpenLineageClient(config={"transport": {"type": "file", "log_file_path": str(path), "append": True}})


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_emitter_sends_at_once_then_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    events = tmp_path / "events.jsonl"
    run = LineageRun.of("orders", ENV, epoch=4)
    emitter = LineageEmitter(run, 60.0, client_factory=lambda: file_client(events), clock=clock)
    try:
        assert emitter.due()
        emitter.offer(status(), at=1.0)
        assert not emitter.due()
        clock.now += 59.9
        assert not emitter.due()
        clock.now += 0.1
        assert emitter.due()
        wait_for(lambda: emitter.sent == 1)  # the first was sent before the second is offered
        emitter.offer(status(batch_id=18), at=61.0)
    finally:
        emitter.close()
    assert emitter.sent == 2
    sent = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["eventType"], e["run"]["runId"], e["run"]["facets"][RUN_FACET]["batchId"]) for e in sent] == [
        ("RUNNING", launch_run_id(LAUNCH), 17), ("RUNNING", launch_run_id(LAUNCH), 18)]


class FailingClient:
    def emit(self, event: Any) -> None:
        raise ConnectionError("connection refused")


class HangingClient:
    def __init__(self) -> None:
        self.release = threading.Event()

    def emit(self, event: Any) -> None:
        self.release.wait(30)


def test_a_failing_transport_never_reaches_the_driver(caplog: pytest.LogCaptureFixture) -> None:
    run = LineageRun.of("orders", ENV, epoch=4)
    emitter = LineageEmitter(run, 60.0, client_factory=FailingClient)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            emitter.offer(status(), at=1.0)  # returns at once, raises nothing
            wait_for(lambda: emitter.queued() == 0)
        emitter.close()
    assert emitter.sent == 0
    assert [r.getMessage() for r in caplog.records] == [
        "job orders: OpenLineage event not sent: ConnectionError: connection refused; the job runs on, the next is "
        "tried in its lineage_interval"]


def test_a_hanging_transport_drops_events_and_the_driver_ends_anyway() -> None:
    run = LineageRun.of("orders", ENV, epoch=4)
    client = HangingClient()
    emitter = LineageEmitter(run, 60.0, client_factory=lambda: client)
    try:
        emitter.offer(status(), at=1.0)  # taken by the thread, which hangs in emit
        wait_for(lambda: emitter.queued() == 0)
        emitter.offer(status(), at=2.0)  # waits in the queue
        started = time.monotonic()
        emitter.offer(status(), at=3.0)  # the queue is full: dropped, not waited for
        assert time.monotonic() - started < 0.5
        assert emitter.dropped == 1
        started = time.monotonic()
        emitter.close(timeout=0.5)
        assert time.monotonic() - started < 1.5
    finally:
        client.release.set()
