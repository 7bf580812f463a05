"""The triggers: every constructor argument survives serialize(), run() yields exactly one event from the closed
set on a real local job store (connection from AIRFLOW_CONN_*), timeouts and errors, and the event loop
keeps running while a watch polls."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, write_ack
from airflow_ckpt_provider.core.records.restore_check import CheckEnded, CheckStarted, record_end, record_start
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.hooks.kafka import KafkaConfigHook
from airflow_ckpt_provider.triggers.base import WatchTrigger
from airflow_ckpt_provider.triggers.control import RequestTrigger
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.kafka_lag import KafkaLagTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger
from airflow_ckpt_provider.triggers.snapshot import SnapshotTrigger
from tests.support.ckptfactory import make_checkpoint

#: What an operator's next step looks like: the method and its (JSON) kwargs, nested.
RESUME_WITH = {"method": "after_verify", "kwargs": {"plan": {"snapshot_id": "savepoint-3", "old": {"conf": {}},
                                                             "launch": {"pid": None, "py_files": ["a.zip"]}}}}

ALL_ARGUMENTS: list[tuple[type[WatchTrigger], dict[str, Any]]] = [
    (JobHealthTrigger, {"job": "orders", "expect": "unhealthy", "min_epoch": 4, "started_after": 1.5e9,
                        "healthy_for": 30.0, "min_batches": 2, "heartbeat_timeout": 45.0, "max_restarts": 3,
                        "count_query_restarts": True, "health_window": 900.0, "progress_timeout": 120.0,
                        "start_timeout": 200.0,
                        "ckpt_store_conn_id": "my_store", "store_url": "s3://b/jobs", "poll_interval": 3.0,
                        "timeout": 600.0, "waiting_since": 1.7e9, "min_wait": 30.0, "resume_with": RESUME_WITH}),
    (RequestTrigger, {"job": "orders", "request_id": "stop-20261122T101500Z-abc123", "epoch": 7,
                      "busy_timeout": 100.0, "ckpt_store_conn_id": "my_store", "store_url": "/data/jobs",
                      "poll_interval": 1.0, "timeout": 60.0, "waiting_since": 1.7e9 + 0.5, "min_wait": 5.0,
                      "resume_with": {"method": "after_stop", "kwargs": {}}}),
    (SnapshotTrigger, {"job": "orders", "after": 1.7e9, "kind": "savepoint", "ckpt_store_conn_id": "my_store",
                       "store_url": None, "poll_interval": 4.0, "timeout": None, "waiting_since": None,
                       "min_wait": 0.0, "resume_with": None}),
    (RestoreCheckTrigger, {"job": "orders", "check_id": "20261122T101500Z-abc123", "ckpt_store_conn_id": "my_store",
                           "store_url": "s3://b/jobs", "poll_interval": 2.0, "timeout": 720.0,
                           "waiting_since": 1.7e9, "min_wait": 30.0, "resume_with": RESUME_WITH}),
    (KafkaLagTrigger, {"group": "g1", "threshold": 10, "topics": ["a", "b"], "condition": "above",
                       "bootstrap_servers": "k:9092", "kafka_conn_id": "my_kafka", "request_timeout": 5.0,
                       "poll_interval": 7.0, "timeout": 30.0, "waiting_since": 1.6e9, "min_wait": 12.5,
                       "resume_with": RESUME_WITH}),
]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """A local job store, reached through the default connection as the triggerer would."""
    root = tmp_path / "store"
    conn = {"conn_type": "ckpt_store", "extra": {"store_url": str(root)}}
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT", json.dumps(conn))
    return JobStore(LocalStorage(root), "orders")


def run_trigger(trigger: BaseTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def one_event(trigger: WatchTrigger) -> dict[str, Any]:
    events = run_trigger(trigger)
    assert len(events) == 1, events
    assert events[0]["status"] in type(trigger).STATUSES
    return events[0]


def running(store: JobStore, **changes: Any) -> None:
    now = time.time()
    status: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 2, "updated_at": now,
                              "started_at": now - 5}
    assert write_status(store, JobStatus(**status | changes))


# -- serialization -------------------------------------------------------------------------------------


def constructor_arguments(cls: type[WatchTrigger]) -> set[str]:
    """The names a trigger takes. JobHealthTrigger's ``**fields`` stands for HealthCriteria's fields, which it
    also takes as one ``criteria``: serialize() writes the fields."""
    params = inspect.signature(cls).parameters
    names = {name for name, p in params.items() if p.kind is not p.VAR_KEYWORD}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names = names - {"criteria"} | {f.name for f in dataclasses.fields(HealthCriteria)}
    return names


@pytest.mark.parametrize(("cls", "kwargs"), ALL_ARGUMENTS, ids=lambda x: getattr(x, "__name__", ""))
def test_serialize_round_trips_every_constructor_argument(cls: type[WatchTrigger], kwargs: dict[str, Any]) -> None:
    assert set(kwargs) == constructor_arguments(cls)  # the test names every argument
    classpath, serialized = cls(**kwargs).serialize()
    assert classpath == f"{cls.__module__}.{cls.__qualname__}"
    assert serialized == kwargs
    module, name = classpath.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**serialized)
    assert again.serialize() == (classpath, serialized)
    assert json.loads(json.dumps(serialized)) == serialized  # plain JSON: nothing Airflow must encode specially


@pytest.mark.parametrize(("cls", "kwargs"), ALL_ARGUMENTS, ids=lambda x: getattr(x, "__name__", ""))
def test_resume_with_defaults_to_none(cls: type[WatchTrigger], kwargs: dict[str, Any]) -> None:
    trigger = cls(**{k: v for k, v in kwargs.items() if k != "resume_with"})
    assert trigger.resume_with is None and trigger.serialize()[1]["resume_with"] is None


#: What JobHealthTrigger.serialize() wrote before HealthCriteria (issue 14): the window was ``restart_window``.
PREVIOUS_VERSION = {"job": "orders", "ckpt_store_conn_id": "ckpt_store_default", "store_url": None,
                    "expect": "healthy", "min_epoch": None, "started_after": 1.7e9, "healthy_for": 0,
                    "min_batches": 2, "heartbeat_timeout": None, "max_restarts": 1, "restart_window": 900.0,
                    "progress_timeout": None, "start_timeout": 900.0, "poll_interval": 2.0, "timeout": 900.0,
                    "waiting_since": 1.7e9 + 1, "min_wait": 30.0, "resume_with": RESUME_WITH}


def test_a_job_health_trigger_the_previous_version_serialized_still_loads() -> None:
    """The triggerer rehydrates stored triggers after an upgrade of the provider: as it does (Airflow's kwargs
    encryption and decoding, then the class called with them)."""
    from airflow.models.trigger import Trigger as TriggerRow
    from airflow.serialization.decoders import smart_decode_trigger_kwargs

    row = TriggerRow(classpath="airflow_ckpt_provider.triggers.job_health.JobHealthTrigger", kwargs=PREVIOUS_VERSION)
    stored = TriggerRow._decrypt_kwargs(row.encrypted_kwargs)
    trigger = JobHealthTrigger(**{k: smart_decode_trigger_kwargs(v) for k, v in stored.items()})
    assert trigger.criteria == HealthCriteria(started_after=1.7e9, min_batches=2, max_restarts=1, health_window=900.0,
                                              start_timeout=900.0)
    assert (trigger.timeout, trigger.waiting_since, trigger.min_wait, trigger.resume_with) == (
        900.0, 1.7e9 + 1, 30.0, RESUME_WITH)
    renamed = {("health_window" if k == "restart_window" else k): v for k, v in PREVIOUS_VERSION.items()}
    # Serialized again under the current name, with the fields added since at their defaults (the earlier meaning).
    assert trigger.serialize()[1] == renamed | {"count_query_restarts": False}


def test_a_job_health_trigger_takes_criteria_or_their_fields() -> None:
    criteria = HealthCriteria(expect=Health.UNHEALTHY, min_epoch=3, max_restarts=2)
    by_value = JobHealthTrigger(job="orders", criteria=criteria)
    by_fields = JobHealthTrigger(job="orders", expect="unhealthy", min_epoch=3, max_restarts=2)
    assert by_value.criteria == by_fields.criteria == criteria
    assert by_value.serialize() == by_fields.serialize()
    assert JobHealthTrigger(job="orders").criteria == HealthCriteria()
    with pytest.raises(TypeError, match="not both"):
        JobHealthTrigger(job="orders", criteria=criteria, min_epoch=3)
    with pytest.raises(TypeError, match="unknown health criterion 'window'"):  # the triggerer's "failed to inflate"
        JobHealthTrigger(job="orders", window=600)
    with pytest.raises(TypeError, match="max_restarts must be >= 1"):
        JobHealthTrigger(job="orders", max_restarts=0)


# -- run() on a real store ------------------------------------------------------------------------------


def test_job_health_trigger_fires_healthy(store: JobStore) -> None:
    running(store, batch_id=4, ui_url="http://driver:4040")
    event = one_event(JobHealthTrigger(job="orders", min_epoch=2, poll_interval=0.01, timeout=5))
    assert (event["status"], event["epoch"], event["batch_id"], event["ui_url"]) == ("healthy", 2, 4,
                                                                                   "http://driver:4040")


def test_job_health_trigger_fires_unhealthy(store: JobStore) -> None:
    running(store, state=JobState.FAILED, reason="query failed: boom")
    event = one_event(JobHealthTrigger(job="orders", expect="unhealthy", poll_interval=0.01, timeout=5))
    assert (event["status"], event["reason"]) == ("unhealthy", "failed")
    assert "boom" in event["message"]


def test_request_trigger_fires_with_the_ack(store: JobStore) -> None:
    running(store)
    request = submit_request(store, RequestAction.SAVEPOINT, 2)
    ack = Ack(request.id, RequestAction.SAVEPOINT, Outcome.COMPLETED, "savepoint taken", 2, 1.0,
              snapshot_id="savepoint-3-20261122T101500Z-abc123", snapshot_uri="file:///x", batch_id=3)
    write_ack(store, ack)
    event = one_event(RequestTrigger(job="orders", request_id=request.id, epoch=2, poll_interval=0.01, timeout=5))
    assert event["status"] == "completed" and event["ack"] == ack.to_dict()


def test_restore_check_trigger_fires_with_the_verdict_of_its_check(store: JobStore) -> None:
    for check_id, outcome in (("C1", CheckOutcome.INCOMPATIBLE), ("C2", CheckOutcome.COMPATIBLE)):
        record_start(store, CheckStarted("orders", check_id, "v2.py", "v2", time.time(), 60.0, "h", "test", pid=1))
        record_end(store, CheckEnded(check_id, outcome, "why", time.time(), {"snapshot_id": "s", "batch_id": 3}))
    event = one_event(RestoreCheckTrigger(job="orders", check_id="C2", poll_interval=0.01, timeout=5))
    assert (event["status"], event["check_id"], event["snapshot_id"], event["batch_id"]) == ("compatible", "C2",
                                                                                              "s", 3)


def test_snapshot_trigger_fires_with_the_snapshot(store: JobStore, tmp_path: Path) -> None:
    result = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "ckpt", 2)), kind=Kind.SAVEPOINT,
                             trigger=Trigger.MANUAL)
    event = one_event(SnapshotTrigger(job="orders", after=0, kind="savepoint", poll_interval=0.01, timeout=5))
    assert (event["status"], event["snapshot_id"], event["batch_id"], event["uri"]) == (
        "completed", result.manifest.snapshot_id, 1, result.uri)


def test_store_url_overrides_the_connection(store: JobStore, tmp_path: Path) -> None:
    other = JobStore(LocalStorage(tmp_path / "other"), "orders")
    running(other, state=JobState.STOPPED)
    running(store)
    event = one_event(JobHealthTrigger(job="orders", store_url=str(tmp_path / "other"), poll_interval=0.01,
                                       timeout=5))
    assert (event["status"], event["reason"]) == ("unhealthy", "stopped")


def test_every_event_carries_resume_with_back(store: JobStore) -> None:
    running(store, batch_id=4)
    healthy = one_event(JobHealthTrigger(job="orders", poll_interval=0.01, timeout=5, resume_with=RESUME_WITH))
    assert healthy["status"] == "healthy" and healthy["resume_with"] == RESUME_WITH
    timeout = one_event(JobHealthTrigger(job="orders", min_epoch=5, poll_interval=0.01, timeout=0.05,
                                         resume_with=RESUME_WITH))
    assert timeout["status"] == "timeout" and timeout["resume_with"] == RESUME_WITH
    error = one_event(JobHealthTrigger(job="orders", ckpt_store_conn_id="no_such_conn", poll_interval=0.01,
                                       resume_with=RESUME_WITH))
    assert error["status"] == "error" and error["resume_with"] == RESUME_WITH
    json.dumps(healthy)  # the event is stored as JSON too


def test_an_event_without_resume_with_has_no_such_key(store: JobStore) -> None:
    running(store, batch_id=4)
    event = one_event(JobHealthTrigger(job="orders", poll_interval=0.01, timeout=5))
    assert event["status"] == "healthy" and "resume_with" not in event


def test_timeout_event_says_what_was_last_seen(store: JobStore) -> None:
    event = one_event(JobHealthTrigger(job="orders", min_epoch=5, poll_interval=0.01, timeout=0.05))
    assert event["status"] == "timeout"
    assert "within 0 s" in event["message"] and "epoch >= 5" in event["message"] and "never ran" in event["message"]


def test_error_event_carries_the_traceback(store: JobStore) -> None:
    event = one_event(JobHealthTrigger(job="orders", ckpt_store_conn_id="no_such_conn", poll_interval=0.01))
    assert event["status"] == "error"
    assert "no_such_conn" in event["message"] and "Traceback" in event["traceback"]
    event = one_event(JobHealthTrigger(job="not a job name!", poll_interval=0.01))
    assert event["status"] == "error" and "invalid job name" in event["message"] and "ConfigError" in event["traceback"]


# -- the event loop is never blocked ----------------------------------------------------------------------


class BlockingWatch:
    """A watch whose poll blocks its thread until the event loop, running concurrently, releases it."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.polls = 0

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        self.polls += 1
        if not self.released.wait(timeout=10):
            return {"status": "blocked"}  # the loop never ran while this poll blocked
        return {"status": "done", "polls": self.polls}

    def waiting_for(self) -> str:
        return "the release"


class BlockingTrigger(WatchTrigger):
    STATUSES = frozenset({"done", "timeout", "error"})

    def __init__(self, *, poll_interval: float = 0.01, timeout: float | None = None) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout)
        self.watch = BlockingWatch()

    def arguments(self) -> dict[str, Any]:
        return {}

    def build_watch(self) -> BlockingWatch:
        return self.watch


def test_polls_run_in_a_thread_while_the_loop_keeps_ticking() -> None:
    trigger = BlockingTrigger()

    async def main() -> tuple[list[dict[str, Any]], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while ticks < 5:  # the loop runs this while the poll blocks in its thread
                ticks += 1
                await asyncio.sleep(0.001)
            trigger.watch.released.set()

        tick_task = asyncio.create_task(ticker())
        events = [e.payload async for e in trigger.run()]
        await tick_task
        return events, ticks

    events, ticks = asyncio.run(main())
    assert events == [{"status": "done", "polls": 1}] and ticks == 5


class SlowBuildTrigger(WatchTrigger):
    """A trigger whose build_watch (connection, client, job store) blocks until the event loop has run."""

    STATUSES = frozenset({"done", "timeout", "error"})

    def __init__(self) -> None:
        super().__init__(poll_interval=0.01)
        self.loop_ran = threading.Event()

    def arguments(self) -> dict[str, Any]:
        return {}

    def build_watch(self) -> FlakyWatch:
        if not self.loop_ran.wait(timeout=10):
            raise AssertionError("the event loop never ran while build_watch blocked")
        return FlakyWatch(failures=0)


def test_building_the_watch_runs_in_a_thread_while_the_loop_keeps_ticking() -> None:
    trigger = SlowBuildTrigger()

    async def main() -> list[dict[str, Any]]:
        async def ticker() -> None:
            await asyncio.sleep(0.001)
            trigger.loop_ran.set()

        tick_task = asyncio.create_task(ticker())
        events = [e.payload async for e in trigger.run()]
        await tick_task
        return events

    assert asyncio.run(main()) == [{"status": "done", "polls": 1}]


@pytest.mark.parametrize("module", ["control", "job_health", "snapshot", "kafka_lag", "events", "restore_check"])
def test_a_trigger_module_imports_nothing_heavy(module: str) -> None:
    """The triggerer imports a trigger's module on its event loop: the watches, the hooks, boto3 and
    confluent-kafka are imported by build_watch, in a thread."""
    code = ("import sys, airflow.triggers.base, airflow.sdk; before = set(sys.modules); "
            f"import airflow_ckpt_provider.triggers.{module}; print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = done.stdout.split()
    heavy = [m for m in loaded if m.split(".")[0] in ("boto3", "botocore", "confluent_kafka", "pyarrow", "pyspark")
             or m.startswith(("airflow_ckpt_provider.core.watches", "airflow_ckpt_provider.hooks",
                              "airflow_ckpt_provider.core.snapshots.catalog",
                              "airflow_ckpt_provider.core.store.jobstore"))]
    assert heavy == [], loaded


def test_the_default_store_connection_is_the_hook_s() -> None:
    from airflow_ckpt_provider.hooks.job_store import JobStoreHook
    from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN

    assert JobStoreHook.default_conn_name == DEFAULT_STORE_CONN


# -- when the task deferred: the timeout counts from there, an early outcome is held ------------------------


def test_the_timeout_counts_from_when_the_task_deferred(store: JobStore) -> None:
    """A triggerer that gets to the trigger late (loaded, restarted) still ends the wait on time: after one
    poll, not a whole timeout later, and before Airflow's deferral timeout."""
    started = time.monotonic()
    event = one_event(JobHealthTrigger(job="orders", min_epoch=5, poll_interval=60, timeout=50,
                                       waiting_since=time.time() - 100))
    assert event["status"] == "timeout" and "within 50 s" in event["message"]
    assert time.monotonic() - started < 30  # no poll_interval (60 s) slept


def test_an_early_outcome_is_held_until_min_wait_after_the_deferral(store: JobStore) -> None:
    running(store, batch_id=4)
    started = time.monotonic()
    event = one_event(JobHealthTrigger(job="orders", poll_interval=0.01, timeout=5, waiting_since=time.time(),
                                       min_wait=0.5, resume_with=RESUME_WITH))
    assert event["status"] == "healthy" and event["resume_with"] == RESUME_WITH
    assert time.monotonic() - started >= 0.45


def test_an_outcome_after_min_wait_is_not_held(store: JobStore) -> None:
    running(store, batch_id=4)
    started = time.monotonic()
    event = one_event(JobHealthTrigger(job="orders", poll_interval=0.01, timeout=5, min_wait=30,
                                       waiting_since=time.time() - 60))
    assert event["status"] == "healthy"
    assert time.monotonic() - started < 15  # min_wait counts from the deferral, which was 60 s ago


# -- an unreachable store is retried until the timeout ------------------------------------------------------


class FlakyWatch:
    """A watch whose first ``failures`` polls cannot read the store (None: every poll fails)."""

    def __init__(self, failures: int | None, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or StorageError("cannot read s3://b/jobs/orders/status.json: connection reset")
        self.polls = 0

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        self.polls += 1
        if self.failures is None or self.polls <= self.failures:
            raise self.error
        return {"status": "done", "polls": self.polls}

    def waiting_for(self) -> str:
        return "the store to answer"


class FlakyTrigger(WatchTrigger):
    STATUSES = frozenset({"done", "timeout", "error"})

    def __init__(self, watch: FlakyWatch, *, timeout: float | None = None) -> None:
        super().__init__(poll_interval=0.01, timeout=timeout)
        self.watch = watch

    def arguments(self) -> dict[str, Any]:
        return {}

    def build_watch(self) -> FlakyWatch:
        return self.watch


def test_a_storage_error_is_retried_until_the_watch_decides() -> None:
    watch = FlakyWatch(failures=2)
    assert one_event(FlakyTrigger(watch, timeout=5)) == {"status": "done", "polls": 3}


def test_a_store_that_never_answers_ends_in_the_timeout_event() -> None:
    watch = FlakyWatch(failures=None)
    event = one_event(FlakyTrigger(watch, timeout=0.05))
    assert event == {"status": "timeout", "message": "no outcome within 0 s: the store to answer"}
    assert watch.polls > 1  # polled again after each failure, not given up at the first


def test_other_errors_of_a_poll_still_end_in_the_error_event() -> None:
    watch = FlakyWatch(failures=None, error=ConfigError("invalid job name"))
    event = one_event(FlakyTrigger(watch, timeout=5))
    assert event["status"] == "error" and watch.polls == 1
    assert event["message"] == "FlakyTrigger failed: ConfigError: invalid job name"


def test_a_job_health_trigger_keeps_polling_through_storage_errors(store: JobStore,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.watches import health_observe as watch_module  # the health watch's status read

    running(store, batch_id=4)
    real, calls = watch_module.read_status, []

    def flaky_read_status(job_store: JobStore) -> JobStatus | None:
        calls.append(1)
        if len(calls) <= 2:
            raise StorageError("status.json: access denied for now")
        return real(job_store)

    monkeypatch.setattr(watch_module, "read_status", flaky_read_status)
    event = one_event(JobHealthTrigger(job="orders", poll_interval=0.01, timeout=5))
    assert (event["status"], event["batch_id"]) == ("healthy", 4) and len(calls) == 3


# -- Kafka: brokers and settings from a connection, secrets never logged -----------------------------------


def test_kafka_connection_extra_is_the_client_config(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    extra = {"bootstrap.servers": "k1:9092,k2:9092", "security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN",
             "sasl.username": "svc", "sasl.password": "hunter2-secret", "group.id": "airflow"}
    monkeypatch.setenv("AIRFLOW_CONN_MY_KAFKA", json.dumps({"conn_type": "kafka", "extra": extra}))
    caplog.set_level(logging.DEBUG)
    watch = KafkaLagTrigger(group="g", threshold=1, kafka_conn_id="my_kafka").build_watch()
    assert watch.bootstrap_servers == "k1:9092,k2:9092"
    assert watch.conf == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "svc",
                          "sasl.password": "hunter2-secret"}  # group.id: a consumer setting the admin client ignores
    logged = caplog.text + "".join(capfd.readouterr())  # Airflow's structlog writes to stdout
    assert "hunter2-secret" not in logged and "'sasl.password': '***'" in logged
    override = KafkaLagTrigger(group="g", threshold=1, kafka_conn_id="my_kafka", bootstrap_servers="k3:9092")
    assert override.build_watch().bootstrap_servers == "k3:9092"


def test_kafka_connection_host_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "host": "broker",
                                                                 "port": 9093}))
    assert KafkaConfigHook().client_config() == ("broker:9093", {})
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka"}))
    event = one_event(KafkaLagTrigger(group="g", threshold=1, kafka_conn_id="kafka_default", poll_interval=0.01))
    assert event["status"] == "error" and "names no Kafka brokers" in event["message"]


def test_kafka_lag_trigger_without_brokers_is_an_error() -> None:
    event = one_event(KafkaLagTrigger(group="g", threshold=1, poll_interval=0.01))
    assert event["status"] == "error" and "kafka_conn_id" in event["message"]


def test_kafka_errors_keep_the_trigger_polling_until_its_timeout() -> None:
    # Nothing listens on port 1: every poll fails with a LagError, which the timeout event reports.
    event = one_event(KafkaLagTrigger(group="g", threshold=1, topics=["t"], bootstrap_servers="127.0.0.1:1",
                                      request_timeout=0.5, poll_interval=0.01, timeout=0.1))
    assert event["status"] == "timeout" and "the last poll failed" in event["message"]
