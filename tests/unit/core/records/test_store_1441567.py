"""The job store files the release before the typed records (1441567) wrote, read with the record types.

tests/unit/data/store-1441567/orders/ holds them as that release's code wrote them (its to_bytes: no ``schema``
key; the restore check's and the launches' records indented): control requests and acks, supervisor records, restore
checks, status.json, lease.json and spec/{last,stable}.json (tests/unit/data/gen_store_1441567.py wrote
the last four with that release's code).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    Request,
    RequestAction,
    open_requests,
    read_ack,
    request_key,
    submit_request,
)
from airflow_ckpt_provider.core.records.deployments import read_launch, record_end
from airflow_ckpt_provider.core.records.lease import Lease, LeaseRecord, read_lease
from airflow_ckpt_provider.core.records.restore_check import (
    OUTCOME_GRACE,
    CheckStarted,
    check_key,
    outcome_key,
    read_end,
    record_pid,
    record_start,
    running_checks,
)
from airflow_ckpt_provider.core.records.restore_check import read_start as read_check
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, RestartOwner, read_status, write_status
from airflow_ckpt_provider.core.records.supervision import (
    SupervisorRecord,
    SupervisorState,
    latest_supervisor,
    read_supervisor,
    supervisor_key,
    write_supervisor,
)
from airflow_ckpt_provider.core.store.jobstore import LEASE, SPEC_LAST, SPEC_STABLE, STATUS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage

RELEASE_STORE = Path(__file__).parents[2] / "data" / "store-1441567"
SAVEPOINT = "savepoint-7-20261127T101500Z-0a1b2c"


def _release() -> JobStore:
    return JobStore(LocalStorage(RELEASE_STORE), "orders")


def _raw(store: JobStore, key: str) -> dict[str, object]:
    body = json.loads(store.storage.read(key))
    assert "schema" not in body, f"{key} is not in the release-before shape"
    return body


# -- control/: requests and acks -------------------------------------------------------------------


def test_the_release_before_requests_and_acks_are_read() -> None:
    store = _release()
    request_id = "savepoint-20261127T101455Z-1a2b3c"
    request = Request.from_bytes(store.storage.read(request_key(request_id)), "x")
    assert request == Request(request_id, RequestAction.SAVEPOINT, 2, 1795846495.0, "ana@airflow-worker-1", schema=1)
    ack = read_ack(store, request_id)
    assert ack is not None and ack.to_dict() == _raw(store, f"control/{request_id}.ack.json")
    assert (ack.action, ack.outcome, ack.snapshot_id, ack.batch_id) == (RequestAction.SAVEPOINT, Outcome.COMPLETED,
                                                                        SAVEPOINT, 7)
    rejected = read_ack(store, "garbage")  # the answer to a file in control/ that was no request
    assert rejected is not None and (rejected.action, rejected.outcome) == (None, Outcome.REJECTED)
    assert "expected a request written by `ckpt job`" in rejected.message
    # Only the stop request has no ack: it is the one open request.
    assert [(r.id, r.action, r.epoch) for r in open_requests(store)] == [
        ("stop-20261127T120000Z-7a8b9c", RequestAction.STOP, 3)]


def test_a_request_is_written_with_its_schema_and_a_broken_one_is_reported_not_blocking(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    request = submit_request(store, RequestAction.CANCEL, 4, now=1795846495.0, requested_by="ana@host")
    assert json.loads(store.storage.read(request_key(request.id)))["schema"] == Request.SCHEMA
    store.storage.write("control/garbage.json", b"{not json")
    store.storage.write("control/pause.json", b'{"id": "pause", "action": "pause", "epoch": 4, "created_at": 1}')
    problems: dict[str, str] = {}
    assert [r.id for r in open_requests(store, on_malformed=problems.__setitem__)] == [request.id]
    assert problems["garbage"].startswith(f"control request {store.storage.uri('control/garbage.json')} is not JSON")
    assert problems["pause"].endswith("is not valid: Invalid enum value 'pause' - at `$.action`")


def test_an_ack_without_an_action_round_trips() -> None:
    ack = Ack("garbage", None, Outcome.REJECTED, "rejected: ...", 2, 1.5)
    assert Ack.from_bytes(ack.to_bytes(), "x").to_dict() == ack.to_dict()


# -- supervisors/ ----------------------------------------------------------------------------------


def test_the_release_before_supervisor_records_are_read() -> None:
    store = _release()
    ended = read_supervisor(store, "20261127T090000Z-0a0b0c")
    assert ended is not None and (ended.state, ended.ending, ended.exit_code, ended.epoch) == (
        SupervisorState.ENDED, "fenced", 0, 2)
    assert ended.liveness(1795846500.0)[0] is False
    latest = latest_supervisor(store)
    assert latest == read_supervisor(store, "20261127T101455Z-0c1d2e")
    assert latest is not None and (latest.state, latest.pid, latest.driver_pid, latest.interval, latest.grace) == (
        SupervisorState.WATCHING, 5151, 5160, 5.0, 30.0)
    assert latest.liveness(1795852800.0, host="elsewhere") == (True, "")  # its heartbeat is 10 s old
    found = {k: v for k, v in msgspec.to_builtins(latest).items() if k != "schema"}
    assert (found.pop("standby_pid"), found.pop("standby_ready")) == (None, False)  # written before standbys existed
    assert found == _raw(store, latest.key)


def test_a_supervisor_record_is_written_with_its_schema_and_a_broken_one_says_what_it_found(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    record = SupervisorRecord(job="orders", launch_id="L1", pid=1, host="h", state=SupervisorState.RESTARTING,
                              started_at=1.0, updated_at=2.0, interval=5.0)
    assert write_supervisor(store, record) == read_supervisor(store, "L1")
    assert json.loads(store.storage.read(supervisor_key("L1")))["schema"] == SupervisorRecord.SCHEMA
    store.storage.write(supervisor_key("L2"), b'{"job": "orders", "launch_id": "L2", "state": "sleeping"}')
    with pytest.raises(StorageError, match=r"^supervisor record .*L2.json is not valid: Invalid enum value 'sleeping'"):
        read_supervisor(store, "L2")


# -- checks/: restore checks and their verdicts ----------------------------------------------------


def test_the_release_before_restore_check_records_are_read() -> None:
    store = _release()
    started = read_check(store, "20261127T101000Z-3c4d5e")
    assert started is not None and (started.pid, started.timeout, started.restore, started.rescale_to) == (
        6161, 600.0, "latest-state", None)
    assert started.deadline == 1795846200.0 + 600 + OUTCOME_GRACE
    ended = read_end(store, started.check_id)
    assert ended is not None and (ended.outcome, ended.ended_at) == (CheckOutcome.COMPATIBLE, 1795846380.0)
    assert ended.report == _raw(store, outcome_key(started.check_id))["report"]
    rescale = read_check(store, "20261127T110000Z-5e6f7a")
    assert rescale is not None and (rescale.pid, rescale.rescale_to, rescale.save_rescaled) == (None, 16, True)
    assert rescale.describe().startswith("rescale to 16 partitions 20261127T110000Z-5e6f7a of orders_v2.py (not "
                                         "spawned yet on airflow-worker-1")
    # The one without a verdict runs until its deadline (on another host: no process to look at).
    assert running_checks(store, 1795849200.0 + 60, host="elsewhere") == [rescale]
    assert read_end(store, rescale.check_id) is None


def test_the_pid_is_recorded_over_a_record_in_the_release_before_shape(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    key = check_key("20261127T110000Z-5e6f7a")
    store.storage.write(key, (RELEASE_STORE / "orders" / key).read_bytes())
    started = read_check(store, "20261127T110000Z-5e6f7a")
    assert started is not None
    spawned = record_pid(store, started, 7171)
    assert spawned == read_check(store, started.check_id) and spawned.pid == 7171
    assert json.loads(store.storage.read(key))["schema"] == CheckStarted.SCHEMA
    # A record made here (no schema until written) is recognised as the one in the store too.
    made = CheckStarted("orders", "c2", "v2.py", "v2", 1.0, 60.0, "h", "test")
    record_start(store, made)
    assert record_pid(store, made, 8181) == read_check(store, "c2")


def test_a_broken_restore_check_record_says_what_it_found(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage.write(outcome_key("c1"), b'{"check_id": "c1", "outcome": "fine", "reason": "", "ended_at": 1}')
    with pytest.raises(StorageError, match=r"^restore check verdict .*c1.outcome.json is not valid: Invalid enum value "
                                           r"'fine' - at `\$.outcome`"):
        read_end(store, "c1")
    store.storage.write(check_key("c2"), b"[]")
    with pytest.raises(StorageError, match=r"^restore check record .*c2.json: expected a JSON object, found list"):
        read_check(store, "c2")


# -- status.json, lease.json, spec/: the driver's heartbeat, its lease, the launches ---------------------------


def test_the_release_before_status_is_read_with_every_field() -> None:
    store = _release()
    _raw(store, STATUS)
    status = read_status(store)
    assert status is not None
    assert (status.job, status.state, status.epoch, status.batch_id, status.lag, status.idle) == (
        "orders", JobState.RUNNING, 3, 9, 0, True)
    assert (status.updated_at, status.started_at, status.heartbeat_interval) == (1795846500.25, 1795846200.0, 5.0)
    assert status.offsets == {"orders": {"0": 120, "1": 98}}
    assert status.last_snapshot == {"id": SAVEPOINT, "kind": "savepoint", "batch_id": 7}
    assert [(r.by, r.attempt, r.from_batch, r.resumed_batch) for r in status.query_restarts()] == [
        (RestartOwner.DRIVER, 1, 6, 7)]
    assert (status.restart_count, status.current_restart(), status.host, status.pid) == (1, None, "airflow-worker-1",
                                                                                          4242)


def test_a_status_is_written_with_its_schema_and_reads_back_equal(tmp_path: Path) -> None:
    status = read_status(_release())
    assert status is not None
    store = JobStore(LocalStorage(tmp_path), "orders")
    assert write_status(store, status)
    written = json.loads(store.storage.read(STATUS))
    assert written["schema"] == JobStatus.SCHEMA
    added_since = {"store_rates": {}, "store_window": 0.0, "metrics_url": None, "samples": [],  # optional, later
                   "lag_seconds": None}
    assert {k: v for k, v in written.items() if k != "schema"} == _raw(_release(), STATUS) | added_since
    assert read_status(store) == status


def test_the_release_before_lease_is_read_and_released_in_place(tmp_path: Path) -> None:
    lease = read_lease(_release())
    assert lease == LeaseRecord(job="orders", epoch=3, owner="airflow-worker-1:4242:9f8e7d", host="airflow-worker-1",
                                pid=4242, acquired_at=1795846200.5, outage_tolerance=29.0)
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage.write(LEASE, _release().storage.read(LEASE))
    driver = Lease(store)  # the driver of epoch 3, as it stops
    driver.owner, driver.record = lease.owner, lease
    assert driver.release()
    released = read_lease(store)
    assert released is not None and released.released and released.epoch == 3


def test_the_release_before_launches_are_read() -> None:
    store = _release()
    _raw(store, SPEC_LAST)
    last, stable = read_launch(store), read_launch(store, SPEC_STABLE)
    assert last is not None and stable is not None
    assert (last.launch_id, str(last.restore), last.pid, last.ended_at) == (
        "20261127T104950Z-4d5e6f", SAVEPOINT, 4200, None)
    d = last.deployment
    assert (d.job_file, d.code_version, d.master, d.py_files, d.files, d.python_env) == (
        "/opt/jobs/orders_v2.py", "v2", "spark://spark-master:7077", ("/opt/jobs/helpers.py",), (), "ship")
    assert (d.conf, d.env, d.checkpoint, d.snapshot_inline_bytes) == (
        {"spark.executor.memory": "1g"}, {"ORDERS_TOPIC": "orders"}, "s3://ckpt/checkpoints/orders", 20480)
    assert (stable.launch_id, str(stable.restore), stable.ending, stable.exit_code, stable.end_reason) == (
        "20261127T090000Z-0a0b0c", "latest", "stopped", 0, "stop requested")


def test_the_end_is_recorded_over_a_launch_in_the_release_before_shape(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage.write(SPEC_LAST, _release().storage.read(SPEC_LAST))
    assert record_end(store, "20261127T104950Z-4d5e6f", ending="failed", exit_code=2, reason="bad input")
    ended = read_launch(store)
    before = read_launch(_release())
    assert ended is not None and before is not None
    assert (ended.ending, ended.exit_code, ended.end_reason) == ("failed", 2, "bad input")
    assert ended.deployment == before.deployment and ended.restore == before.restore
