"""The sensors: declarative arguments, the defer path (trigger and method), execute_complete for every status,
and the poke path with the watch kept between pokes, on a real local job store."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.sensors.base import DEFER_GRACE, WatchFailedError
from airflow_ckpt_provider.sensors.job_health import JobHealthSensor
from airflow_ckpt_provider.sensors.kafka_lag import KafkaLagSensor
from airflow_ckpt_provider.sensors.snapshot import SnapshotSensor
from airflow_ckpt_provider.triggers.base import MIN_DEFERRAL
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.kafka_lag import KafkaLagTrigger
from airflow_ckpt_provider.triggers.snapshot import SnapshotTrigger
from tests.support.ckptfactory import make_checkpoint

UNHEALTHY = {"status": "unhealthy", "reason": "failed", "message": "job orders: expected it healthy, found FAILED",
             "job": "orders", "epoch": 3, "batch_id": 9, "state": "FAILED", "ui_url": None, "restarts": 0}
HEALTHY = UNHEALTHY | {"status": "healthy", "reason": None, "message": "job orders is healthy", "state": "RUNNING"}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    root = tmp_path / "store"
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT",
                       json.dumps({"conn_type": "ckpt_store", "extra": {"store_url": str(root)}}))
    return JobStore(LocalStorage(root), "orders")


def report(store: JobStore, **changes: Any) -> None:
    now = time.time()
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": now,
                            "started_at": now - 1}
    assert write_status(store, JobStatus(**body | changes))


def deferred(sensor: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})
    assert info.value.method_name == "execute_complete"
    assert info.value.timeout == timedelta(seconds=sensor.timeout + DEFER_GRACE)
    return info.value


# -- declarative arguments ------------------------------------------------------------------------------


def test_template_fields() -> None:
    assert JobHealthSensor.template_fields == ("job", "store_url", "min_epoch", "started_after")
    assert SnapshotSensor.template_fields == ("job", "store_url", "after", "kind")
    assert KafkaLagSensor.template_fields == ("group", "topics", "threshold", "bootstrap_servers", "kafka_conn_id")


def test_invalid_choices_and_reschedule_with_tracking_are_refused() -> None:
    with pytest.raises(ValueError, match="expect"):
        JobHealthSensor(task_id="h", job="orders", expect="sick")
    with pytest.raises(ValueError, match="reschedule"):
        JobHealthSensor(task_id="h", job="orders", healthy_for=60, deferrable=False, mode="reschedule")
    with pytest.raises(ValueError, match="reschedule"):
        SnapshotSensor(task_id="s", job="orders", deferrable=False, mode="reschedule")
    with pytest.raises(ValueError, match="condition"):
        KafkaLagSensor(task_id="k", group="g", threshold=1, condition="equal")
    JobHealthSensor(task_id="h", job="orders", healthy_for=60, mode="reschedule")  # deferrable: the trigger tracks


@pytest.mark.parametrize(("setting", "expected"), [(None, False), ("False", False), ("True", True)])
def test_deferrable_defaults_to_airflows_default_deferrable(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, expected: bool
) -> None:
    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")  # set by conftest.py: Airflow's default, False
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    sensors = [JobHealthSensor(task_id="h", job="orders"), SnapshotSensor(task_id="s", job="orders", after=0),
               KafkaLagSensor(task_id="k", group="g", threshold=1)]
    assert [s.deferrable for s in sensors] == [expected] * 3
    assert JobHealthSensor(task_id="h", job="orders", deferrable=not expected).deferrable is (not expected)
    if not expected:  # not deferrable by default, so tracking over time in mode="reschedule" is refused
        with pytest.raises(ValueError, match="reschedule"):
            JobHealthSensor(task_id="h", job="orders", healthy_for=60, mode="reschedule")


def test_job_health_sensor_refuses_invalid_criteria_where_they_are_written() -> None:
    with pytest.raises(ValueError, match="h: max_restarts must be >= 1"):
        JobHealthSensor(task_id="h", job="orders", max_restarts=0)
    with pytest.raises(ValueError, match="h: health_window must be >= 0"):
        JobHealthSensor(task_id="h", job="orders", health_window=-1)


def test_restart_window_is_the_deprecated_name_of_health_window() -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match="restart_window is deprecated, pass health_window"):
        sensor = JobHealthSensor(task_id="h", job="orders", max_restarts=2, restart_window=900)
    assert sensor.make_trigger().criteria.health_window == 900
    with pytest.warns(AirflowProviderDeprecationWarning), pytest.raises(ValueError, match="health_window only"):
        JobHealthSensor(task_id="h", job="orders", restart_window=900, health_window=300)


def test_every_health_argument_reaches_the_trigger_s_criteria() -> None:
    sensor = JobHealthSensor(task_id="h", job="orders", expect="unhealthy", min_epoch="4", started_after=1.5e9,
                             healthy_for=30, min_batches=2, heartbeat_timeout=45, max_restarts=3,
                             count_query_restarts=True, health_window=900, progress_timeout=120, start_timeout=200)
    assert sensor.make_trigger().criteria == HealthCriteria(
        expect=Health.UNHEALTHY, min_epoch=4, started_after=1.5e9, healthy_for=30, min_batches=2, heartbeat_timeout=45,
        max_restarts=3, count_query_restarts=True, health_window=900, progress_timeout=120, start_timeout=200)


# -- the defer path ---------------------------------------------------------------------------------------


def test_job_health_sensor_defers_to_its_trigger_with_rendered_arguments() -> None:
    sensor = JobHealthSensor(task_id="h", job="orders", expect="unhealthy", min_epoch="5",
                             started_after="2026-11-22T10:00:00+00:00", max_restarts=3, progress_timeout=120,
                             ckpt_store_conn_id="my_store", poke_interval=7, timeout=3600)
    trigger = deferred(sensor).trigger
    assert isinstance(trigger, JobHealthTrigger)
    _, kwargs = trigger.serialize()
    assert kwargs["min_epoch"] == 5 and kwargs["expect"] == "unhealthy"
    assert kwargs["started_after"] == datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp()
    assert (kwargs["max_restarts"], kwargs["progress_timeout"], kwargs["ckpt_store_conn_id"]) == (3, 120, "my_store")
    assert (kwargs["poll_interval"], kwargs["timeout"]) == (7, 3600)


def test_a_template_that_rendered_none_is_none() -> None:
    trigger = deferred(JobHealthSensor(task_id="h", job="orders", min_epoch="None", started_after="")).trigger
    _, kwargs = trigger.serialize()
    assert kwargs["min_epoch"] is None and kwargs["started_after"] is None


def test_snapshot_sensor_waits_for_snapshots_after_it_started_by_default() -> None:
    before = time.time()
    trigger = deferred(SnapshotSensor(task_id="s", job="orders", kind="savepoint")).trigger
    assert isinstance(trigger, SnapshotTrigger)
    _, kwargs = trigger.serialize()
    assert before <= kwargs["after"] <= time.time() and kwargs["kind"] == "savepoint"
    _, kwargs = deferred(SnapshotSensor(task_id="s", job="orders", after="1700000000.5")).trigger.serialize()
    assert kwargs["after"] == 1700000000.5 and kwargs["kind"] is None


def test_a_sensor_s_deferral_counts_from_when_it_deferred_and_lasts_at_least_min_deferral() -> None:
    before = time.time()
    _, kwargs = deferred(JobHealthSensor(task_id="h", job="orders", timeout=600)).trigger.serialize()
    assert before <= kwargs["waiting_since"] <= time.time() and kwargs["min_wait"] == MIN_DEFERRAL
    _, kwargs = deferred(SnapshotSensor(task_id="s", job="orders", min_deferral=0)).trigger.serialize()
    assert kwargs["min_wait"] == 0.0


def test_kafka_lag_sensor_defers_with_connection_or_brokers() -> None:
    trigger = deferred(KafkaLagSensor(task_id="k", group="g", threshold="100", topics="a, b")).trigger
    assert isinstance(trigger, KafkaLagTrigger)
    _, kwargs = trigger.serialize()
    assert (kwargs["threshold"], kwargs["topics"], kwargs["kafka_conn_id"], kwargs["bootstrap_servers"]) == (
        100, ["a", "b"], "kafka_default", None)
    _, kwargs = deferred(KafkaLagSensor(task_id="k", group="g", threshold=1, bootstrap_servers="k:9092")
                         ).trigger.serialize()
    assert (kwargs["kafka_conn_id"], kwargs["bootstrap_servers"], kwargs["topics"]) == (None, "k:9092", None)


# -- execute_complete -------------------------------------------------------------------------------------


def test_healthy_returns_the_event_and_unhealthy_fails_with_its_message() -> None:
    sensor = JobHealthSensor(task_id="h", job="orders")
    assert sensor.execute_complete({}, HEALTHY) == HEALTHY
    with pytest.raises(AirflowException, match="expected it healthy, found FAILED") as info:
        sensor.execute_complete({}, UNHEALTHY)
    assert not isinstance(info.value, AirflowSkipException)


def test_expect_unhealthy_returns_the_unhealthy_event() -> None:
    sensor = JobHealthSensor(task_id="h", job="orders", expect="unhealthy")
    assert sensor.execute_complete({}, UNHEALTHY) == UNHEALTHY
    with pytest.raises(AirflowException, match="expected an unhealthy event"):
        sensor.execute_complete({}, HEALTHY)


def test_timeout_fails_as_a_sensor_timeout_or_skips_with_soft_fail() -> None:
    event = {"status": "timeout", "message": "no outcome within 60 s: job orders: RUNNING at epoch 3"}
    with pytest.raises(AirflowSensorTimeout, match="RUNNING at epoch 3"):
        JobHealthSensor(task_id="h", job="orders", expect="unhealthy").execute_complete({}, event)
    with pytest.raises(AirflowSkipException, match="RUNNING at epoch 3"):
        JobHealthSensor(task_id="h", job="orders", expect="unhealthy", soft_fail=True).execute_complete({}, event)


@pytest.mark.parametrize("sensor", [
    JobHealthSensor(task_id="h", job="orders"),
    SnapshotSensor(task_id="s", job="orders"),
    KafkaLagSensor(task_id="k", group="g", threshold=1),
], ids=lambda s: type(s).__name__)
def test_error_and_unknown_events_raise(sensor: Any) -> None:
    error = {"status": "error", "message": "JobHealthTrigger failed: StorageError: access denied",
             "traceback": "Traceback ..."}
    with pytest.raises(WatchFailedError, match=f"^{sensor.task_id}: JobHealthTrigger failed: StorageError: access "
                                               "denied$") as info:
        sensor.execute_complete({}, error)
    assert not isinstance(info.value, AirflowException)  # Airflow's sensor would skip those under soft_fail
    for bad in ({"status": "maybe"}, {"no": "status"}, None):
        with pytest.raises(AirflowException, match="expected an event with a status in"):
            sensor.execute_complete({}, bad)


@pytest.mark.parametrize("sensor", [
    JobHealthSensor(task_id="h", job="orders", soft_fail=True),
    SnapshotSensor(task_id="s", job="orders", soft_fail=True),
    KafkaLagSensor(task_id="k", group="g", threshold=1, soft_fail=True),
], ids=lambda s: type(s).__name__)
def test_an_error_event_fails_the_task_even_with_soft_fail(sensor: Any) -> None:
    """Resumed as Airflow resumes a deferred sensor (resume_execution turns AirflowExceptions into skips under
    soft_fail): a broken watch (missing connection, unreachable store) must fail, not skip."""
    error = {"status": "error", "message": "JobHealthTrigger failed: AirflowNotFoundException: no_such_conn",
             "traceback": "Traceback ..."}
    with pytest.raises(WatchFailedError, match="no_such_conn"):
        sensor.resume_execution("execute_complete", {"event": error}, {})
    timeout = {"status": "timeout", "message": "no outcome within 60 s"}  # an outcome: soft_fail still skips it
    with pytest.raises(AirflowSkipException) as info:
        sensor.resume_execution("execute_complete", {"event": timeout}, {})
    assert "no outcome within 60 s" in str(info.value.__cause__)


def test_an_unhealthy_event_is_still_skipped_with_soft_fail() -> None:
    sensor = JobHealthSensor(task_id="h", job="orders", soft_fail=True)
    with pytest.raises(AirflowSkipException) as info:
        sensor.resume_execution("execute_complete", {"event": UNHEALTHY}, {})
    assert "expected it healthy, found FAILED" in str(info.value.__cause__)


def test_snapshot_and_lag_sensors_return_their_payload() -> None:
    snapshot = {"status": "completed", "snapshot_id": "savepoint-3-20261122T101500Z-abc123", "kind": "savepoint",
                "batch_id": 3, "uri": "file:///x", "created_at": "2026-11-22T10:15:00.000+00:00", "job": "orders",
                "message": "m"}
    assert SnapshotSensor(task_id="s", job="orders").execute_complete({}, snapshot) == snapshot
    lag = {"status": "met", "group": "g", "total_lag": 0, "partitions": [], "condition": "below", "threshold": 1,
           "message": "m"}
    assert KafkaLagSensor(task_id="k", group="g", threshold=1).execute_complete({}, lag) == lag
    with pytest.raises(AirflowException, match="expected an event with a status in"):
        SnapshotSensor(task_id="s", job="orders").execute_complete({}, lag)


# -- the poke path ------------------------------------------------------------------------------------------


def test_poke_keeps_its_watch_between_pokes(store: JobStore) -> None:
    sensor = JobHealthSensor(task_id="h", job="orders", min_batches=2, deferrable=False)
    report(store, batch_id=7)
    assert sensor.poke({}) is False
    report(store, batch_id=8)
    assert sensor.poke({}) is False  # one batch since the first poke: the watch remembered batch 7
    report(store, batch_id=9)
    result = sensor.poke({})
    assert isinstance(result, PokeReturnValue) and result.is_done and result.xcom_value is not None
    assert result.xcom_value["status"] == "healthy" and result.xcom_value["batch_id"] == 9


def test_poke_fails_on_unhealthy_and_skips_with_soft_fail(store: JobStore) -> None:
    report(store, state=JobState.FAILED, reason="query failed: boom")
    with pytest.raises(AirflowException, match="boom"):
        JobHealthSensor(task_id="h", job="orders", deferrable=False).poke({})
    with pytest.raises(AirflowSkipException, match="boom"):
        JobHealthSensor(task_id="h", job="orders", deferrable=False, soft_fail=True).poke({})


def test_execute_without_deferring_pokes_until_done(store: JobStore, tmp_path: Path) -> None:
    report(store, batch_id=4)
    event = JobHealthSensor(task_id="h", job="orders", deferrable=False, poke_interval=0).execute({})
    assert (event["status"], event["epoch"], event["batch_id"]) == ("healthy", 3, 4)
    result = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "ckpt", 2)), kind=Kind.CHECKPOINT,
                             trigger=Trigger.PERIODIC)
    event = SnapshotSensor(task_id="s", job="orders", after=0, deferrable=False, poke_interval=0).execute({})
    assert (event["snapshot_id"], event["kind"]) == (result.manifest.snapshot_id, "checkpoint")


def test_min_deferral_defaults_to_the_ckpt_config_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """``airflow dags test`` (demo, example DAG tests) sets ``[ckpt] min_deferral`` 0: no scheduler, no race."""
    monkeypatch.setenv("AIRFLOW__CKPT__MIN_DEFERRAL", "0")
    _, kwargs = deferred(SnapshotSensor(task_id="s", job="orders")).trigger.serialize()
    assert kwargs["min_wait"] == 0.0
    _, kwargs = deferred(SnapshotSensor(task_id="s", job="orders", min_deferral=7)).trigger.serialize()
    assert kwargs["min_wait"] == 7.0
