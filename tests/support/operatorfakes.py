"""What the operators' unit tests share: a job store's fakes of ``launch`` and ``start_check`` that record
their calls, a task instance and its state store, and helpers that report a driver, record a deployment, and
take a deferral apart (its trigger, timeout and the step it carries back)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.records.control import Ack, Outcome, Request, open_requests, write_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.restore_check import CheckEnded, CheckStarted, record_end, record_start
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import CONTROL, SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, S3Options
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink
from airflow_ckpt_provider.operators.job import (
    SubmitStreamingJobOperator,
)
from airflow_ckpt_provider.operators.upgrade import UpgradeStreamingJobOperator
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck
from airflow_ckpt_provider.triggers.base import WatchTrigger
from airflow_ckpt_provider.triggers.control import RequestTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger
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


# -- helpers --------------------------------------------------------------------------------


class FakeLaunch:
    """Stands in for launcher.deploy.launch: records the call and spec/last.json, starts nothing."""

    def __init__(self) -> None:
        self.calls: list[Launch] = []
        self.store_urls: list[str] = []
        self.unrecorded_envs: list[dict[str, str]] = []

    def __call__(self, store: JobStore, deployment: Deployment, *, restore: str, store_url: str,
                 s3: S3Options | None = None, launched_by: str = "",
                 unrecorded_env: Mapping[str, str] | None = None, key: str = "") -> Launch:
        record = Launch(store.job, deployment, restore, time.time(), launched_by, f"launch-{len(self.calls) + 1}",
                        key=key)
        store.storage.write(SPEC_LAST, record.to_bytes())
        self.calls.append(record)
        self.store_urls.append(store_url)
        self.unrecorded_envs.append(dict(unrecorded_env or {}))
        return record


@dataclass(frozen=True)
class CheckCall:
    """What the operator asked ``start_check`` for."""

    deployment: Deployment
    store_url: str
    timeout: float
    allow_non_restored_state: bool
    started_by: str
    restore: str = "latest-state"
    rescale_to: int | None = None
    save_rescaled: bool = False


#: The savepoint FakeCheck says it saved for a rescale (``save_rescaled``).
RESCALED_SID = "savepoint-8-20261126T100000Z-rescal"


class FakeCheck:
    """Stands in for launcher.restore_check.start_check: records the call and the check's start record, and the
    verdict ``outcome`` at once, as the detached check process would when done (None: no verdict yet)."""

    def __init__(self) -> None:
        self.outcome: CheckOutcome | None = CheckOutcome.COMPATIBLE
        self.calls: list[CheckCall] = []

    def __call__(self, store: JobStore, deployment: Deployment, *, store_url: str, timeout: float,
                 s3: S3Options | None = None, allow_non_restored_state: bool = False,
                 started_by: str = "", restore: object = "latest-state", rescale_to: int | None = None,
                 save_rescaled: bool = False) -> CheckStarted:
        self.calls.append(CheckCall(deployment, store_url, timeout, allow_non_restored_state, started_by, str(restore),
                                    rescale_to, save_rescaled))
        started = CheckStarted(store.job, f"check-{len(self.calls)}", deployment.job_file, deployment.code_version,
                               time.time(), timeout, socket.gethostname(), started_by, pid=os.getpid())
        record_start(store, started)
        if self.outcome is not None:
            reason = "Spark restored the state" if self.outcome is CheckOutcome.COMPATIBLE else \
                "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE: the key schema changed"
            rescaled = RESCALED_SID if save_rescaled and self.outcome is CheckOutcome.COMPATIBLE else None
            report = RestoreCheck(self.outcome, reason, snapshot_id=SID, batch_id=7, state_partitions=rescale_to,
                                  rescaled_snapshot_id=rescaled)
            record_end(store, CheckEnded(started.check_id, self.outcome, reason, time.time(), report.to_dict()))
        return started


class FakeTI:
    """The task instance as the operators use it: XCom pushes (for the links), stats tags, and the run and try
    (``run_id`` None: outside a DAG run, as a bare execute() in a test)."""

    def __init__(self, run_id: str | None = None, try_number: int = 1, map_index: int = -1) -> None:
        self.xcoms: dict[str, Any] = {}
        self.stats_tags: dict[str, str] = {}
        if run_id is not None:  # else a subclass's own (tests/unit/operators/test_lineage.py RunningTI)
            self.run_id, self.try_number, self.map_index = run_id, try_number, map_index

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


def verdict(deferred: TaskDeferred) -> dict[str, Any]:
    """The event of the restore check the deferral waits for, as the trigger's watch reports it from the job store
    (FakeCheck recorded the verdict)."""
    assert isinstance(deferred.trigger, RestoreCheckTrigger)
    event = RestoreCheckTrigger(job="orders", check_id=deferred.trigger.check_id).build_watch().poll()
    assert event is not None
    return event


def pass_check(op: UpgradeStreamingJobOperator, ctx: dict[str, Any] | None = None) -> TaskDeferred:
    """Step 1 as Airflow runs it: execute starts the check and defers; resumed with its verdict (compatible), the
    operator goes on and defers again (the stop, or with nothing to stop, the verification)."""
    checking = deferral(lambda: op.execute(context() if ctx is None else ctx))
    assert next_step(checking)[0] == "after_check"
    return deferral(lambda: op.resume(context(), fire(checking, verdict(checking))))


def stop_and_ack(store: JobStore, op: UpgradeStreamingJobOperator) -> tuple[TaskDeferred, dict[str, Any]]:
    """Steps 1-2: the check passes, the stop is requested; the driver answers with savepoint SID. The event is
    what Airflow hands to ``resume``: it carries the next step (after_stop and the plan)."""
    deferred = pass_check(op)
    return deferred, fire(deferred, ack_event(store, only_request(store)))


def start_new_code(store: JobStore, op: UpgradeStreamingJobOperator) -> TaskDeferred:
    """Steps 1-3, resumed as Airflow does: the new code is launched from savepoint SID and verified."""
    _, stopped = stop_and_ack(store, op)
    return deferral(lambda: op.resume(context(), stopped))


#: What the fake subprocess.Popen of deploy.launch saw: argv, env, and spec/last.json at the call.
PopenCall = tuple[list[str], dict[str, str], Launch | None]


def alerting_store(tmp_path: Path, state: JobState) -> tuple[JobStore, str, str]:
    """A local job store of job ``orders`` for the alert tests: its driver in ``state`` at epoch 4 (heartbeat 5 s ago,
    batch 120) and one savepoint; the store, the savepoint's id and the ``ckpt_store_default`` connection (JSON)."""
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    now = time.time()
    write_status(store, JobStatus(job="orders", state=state, epoch=4, updated_at=now - 5, started_at=now - 600,
                                  batch_id=120))
    [savepoint] = make_snapshots(store, tmp_path, [Kind.SAVEPOINT])
    return store, savepoint, json.dumps({"conn_type": "ckpt_store", "extra": {"store_url": str(tmp_path / "store")}})
