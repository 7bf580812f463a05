"""`ckpt job status|savepoint|stop|cancel` on a directory store and on SeaweedFS S3, with a thread that plays
the driver: it answers requests the way the runtime does, through ``control/``."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.cli import job as cli_job
from airflow_ckpt_provider.cli.main import main
from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    Request,
    RequestAction,
    open_requests,
    read_ack,
    write_ack,
)
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.store.jobstore import CONTROL, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage
from airflow_ckpt_provider.embedded import EmbeddedS3, free_port

pytestmark = pytest.mark.integration

SNAPSHOT_ID = "savepoint-41-20261122T101500Z-abc123"
ACTIONS = [a.value for a in RequestAction]


@dataclass
class Target:
    """A job store as the CLI reaches it (options) and as the test reaches it (root)."""

    options: list[str]
    root: Storage
    secret: str | None = None

    def job(self, name: str = "orders") -> JobStore:
        return JobStore(self.root, name)


@dataclass
class Result:
    code: int
    out: str
    err: str
    lines: dict[str, str] = field(default_factory=dict)


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Target:
    for name in ("CKPT_STORE", "CKPT_JOB", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli_job, "ACK_POLL", 0.05)  # the CLI reads acks often; the outcomes stay the same
    if request.param == "local":
        root = tmp_path / "store"
        return Target(["--store", str(root)], LocalStorage(root))
    server: EmbeddedS3 = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("bucket")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    return Target(["--store", f"s3://{bucket}/jobs", "--endpoint-url", server.endpoint_url, "--region", server.region],
                  request.getfixturevalue("s3_root"), server.secret_key)


def ckpt(target: Target, capsys: pytest.CaptureFixture[str], *args: str, expect: int = 0,
         job: str = "orders") -> Result:
    code = main(["job", *args, "--job", job, *target.options])
    captured = capsys.readouterr()
    assert code == expect, captured.err
    assert "Traceback" not in captured.err
    if target.secret:
        assert target.secret not in captured.out + captured.err
    lines = dict(line.split(":", 1) for line in captured.out.splitlines() if ":" in line)
    return Result(code, captured.out, captured.err, {k.strip(): v.strip() for k, v in lines.items()})


def running(epoch: int = 3, age: float = 1.0, **changes: object) -> JobStatus:
    now = time.time()
    status = JobStatus(
        job="orders", state=JobState.RUNNING, epoch=epoch, updated_at=now - age, started_at=now - 3600,
        reason="running", batch_id=41, last_snapshot={"id": SNAPSHOT_ID, "kind": "savepoint", "batch_id": 41},
        restored_from="s3://b/jobs/orders/snapshots/savepoint-3-20261121T000000Z-000000", pid=4242,
        host="worker-1", app_id="local-1700000000", ui_url="http://127.0.0.1:4040", code_version="git-1a2b3c",
        heartbeat_interval=5.0,
    )
    return replace(status, **changes)


def lease(epoch: int = 3, owner: str = "worker-1:4242:abcd1234") -> LeaseRecord:
    return LeaseRecord(job="orders", epoch=epoch, owner=owner, host="worker-1", pid=4242,
                       acquired_at=time.time() - 3600)


def install(target: Target, status: JobStatus | None, held: LeaseRecord | None = None) -> JobStore:
    store = target.job()
    if status is not None:
        write_status(store, status)
    if held is not None:
        store.storage.write("lease.json", held.to_bytes())
    return store


class FakeDriver(threading.Thread):
    """Answers the first request that appears in ``control/`` with ``answer(request)``, as a driver would."""

    def __init__(self, store: JobStore, answer: Callable[[Request], Ack]) -> None:
        super().__init__(daemon=True)
        self.store, self.answer = store, answer
        self.done = threading.Event()
        self.requests: list[Request] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.wait(0.02):  # bounded by the test, which sets done after the command
                found = open_requests(self.store)
                if found:
                    self.requests.append(found[0])
                    write_ack(self.store, self.answer(found[0]))
                    return
        except BaseException as err:  # reported by stop() in the test thread
            self.error = err

    def __enter__(self) -> FakeDriver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join(timeout=30)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


def completed(request: Request) -> Ack:
    uri = f"s3://b/jobs/orders/snapshots/{SNAPSHOT_ID}"
    if request.action is RequestAction.CANCEL:
        return Ack(request.id, request.action, Outcome.COMPLETED, "canceled; the latest completed batch is 41",
                   request.epoch, time.time(), batch_id=41)
    return Ack(request.id, request.action, Outcome.COMPLETED, f"savepoint {SNAPSHOT_ID} at batch 41", request.epoch,
               time.time(), snapshot_id=SNAPSHOT_ID, snapshot_uri=uri, batch_id=41)


def control_keys(store: JobStore) -> list[str]:
    return [o.key for o in store.storage.list(CONTROL)]


# -- status ------------------------------------------------------------------------------------------


def test_status_of_an_unknown_job_lists_the_jobs_that_exist(target: Target,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    empty = ckpt(target, capsys, "status", job="nope", expect=1)
    assert f"job 'nope' not found in job store {target.root.url}" in empty.err
    assert "this store holds no jobs" in empty.err and "Check --job and --store" in empty.err

    install(target, running())
    target.root.write("billing/snapshots/savepoint-1-20261122T000000Z-000000/manifest.json", b"{}")
    target.root.write("scratch/objects/abc", b"not a job: no status, no snapshots")
    missing = ckpt(target, capsys, "status", job="nope", expect=1)
    assert "jobs in this store: billing, orders. Check" in missing.err
    assert "no status.json and no lease.json" in missing.err
    assert missing.out == ""
    assert target.root.list("nope/") == []


def test_status_of_a_running_job(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    install(target, running(age=2.0), lease())
    shown = ckpt(target, capsys, "status").lines
    assert shown["state"] == "RUNNING"
    assert (shown["epoch"], shown["batch"]) == ("3", "41")
    # Written 2 s ago by the driver's clock; on S3 the age is the store's: written just now.
    assert re.match(r"2 s ago \(" if target.secret is None else r"[012] s ago \(", shown["heartbeat"]), shown
    assert shown["last snapshot"] == f"{SNAPSHOT_ID} (savepoint, batch 41)"
    assert shown["restored from"].endswith("snapshots/savepoint-3-20261121T000000Z-000000")
    assert (shown["driver"], shown["app id"], shown["code version"]) == ("pid 4242 on worker-1", "local-1700000000",
                                                                        "git-1a2b3c")
    assert (shown["ui"], shown["reason"]) == ("http://127.0.0.1:4040", "running")
    assert shown["lease"].startswith("epoch 3, held by worker-1:4242:abcd1234")
    assert "note" not in shown

    data = json.loads(ckpt(target, capsys, "status", "--json").out)
    assert (data["state"], data["epoch"], data["batch_id"], data["stale"]) == ("RUNNING", 3, 41, False)
    assert data["lease"] == lease().to_dict() | {"acquired_at": data["lease"]["acquired_at"]}  # its fields
    assert data["last_snapshot"]["id"] == SNAPSHOT_ID
    assert "supervised by" not in shown and data["service"] is None  # never handed to the supervision service


def test_status_of_a_handed_job_names_the_service_instance_that_owns_it(target: Target,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ckpt_provider.core.records.ownership import OWNER, OwnerRecord, ServiceJob, handed_key

    store = install(target, running(), lease())
    target.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="test").to_bytes())
    store.storage.write(OWNER, OwnerRecord(job="orders", instance="svc-a", epoch=3, acquired_at=1.0).to_bytes())
    shown = ckpt(target, capsys, "status").lines
    assert shown["supervised by"] == "supervision service instance svc-a (ownership epoch 3)"
    assert json.loads(ckpt(target, capsys, "status", "--json").out)["service"] == shown["supervised by"]


#: A stale heartbeat is faked by an old ``updated_at``, which only a store with no clock of its own believes: S3
#: measures a heartbeat's age by its own clock (test_status_on_s3_judges_the_heartbeat_by_the_stores_clock_...).
ONLY_LOCAL = pytest.mark.parametrize("target", ["local"], indirect=True)


@ONLY_LOCAL
def test_status_of_a_stale_job_says_the_driver_is_probably_dead(target: Target,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    install(target, running(age=130.0), lease())
    shown = ckpt(target, capsys, "status").lines
    assert shown["state"] == "RUNNING (stale: no heartbeat for 130 s; the driver is probably dead)"
    data = json.loads(ckpt(target, capsys, "status", "--json").out)
    assert (data["state"], data["stale"]) == ("RUNNING", True)


@pytest.mark.parametrize("target", ["s3"], indirect=True)
def test_status_on_s3_judges_the_heartbeat_by_the_stores_clock_not_the_drivers(
        target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    """A driver whose host's clock is 130 s behind this one's (or 130 s ahead) wrote its heartbeat just now: the age
    is the store's (Date minus Last-Modified), so the job is live, not stale, and no request is refused as dead
    (finding 8, docs/reliability.md)."""
    for skew in (130.0, -130.0):
        install(target, running(age=skew), lease())
        shown = ckpt(target, capsys, "status").lines
        assert shown["state"] == "RUNNING", shown
        heartbeat = int(shown["heartbeat"].split(" s ago", 1)[0])
        assert 0 <= heartbeat <= 2, shown  # whole seconds of the store's clock, and the time to read it
        assert json.loads(ckpt(target, capsys, "status", "--json").out)["stale"] is False


def test_status_of_a_stopped_job_and_of_a_newer_driver(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(state=JobState.STOPPED, age=500.0, reason="stopped on request"),
                    lease(4, owner="worker-2:77:ffff0000"))
    shown = ckpt(target, capsys, "status").lines
    assert shown["state"].startswith("STOPPED since 20") and "stale" not in shown["state"]
    assert shown["reason"] == "stopped on request"
    assert shown["note"].startswith("a newer driver (epoch 4, worker-2:77:ffff0000) took the lease at ")
    assert shown["note"].endswith("and is starting; the status above is from epoch 3")
    assert json.loads(ckpt(target, capsys, "status", "--json").out)["stale"] is False

    store.storage.delete(["status.json"])
    starting = ckpt(target, capsys, "status")
    assert starting.lines["state"].startswith("- (no status yet: the driver of epoch 4 took the lease at ")
    data = json.loads(ckpt(target, capsys, "status", "--json").out)
    assert (data["state"], data["lease"]["epoch"], data["stale"]) == (None, 4, False)


# -- requests that no driver would answer are refused before anything is written ------------------


@pytest.mark.parametrize("action", ACTIONS)
def test_request_to_an_unknown_job_is_refused(target: Target, capsys: pytest.CaptureFixture[str],
                                              action: str) -> None:
    install(target, running())
    refused = ckpt(target, capsys, action, job="nope", expect=1)
    assert "job 'nope' not found in job store" in refused.err and "jobs in this store: orders" in refused.err
    assert target.root.list("nope/") == []
    assert control_keys(target.job()) == []


@pytest.mark.parametrize("action", ACTIONS)
def test_request_to_a_stopped_job_is_refused(target: Target, capsys: pytest.CaptureFixture[str], action: str) -> None:
    store = install(target, running(state=JobState.STOPPED, age=60.0, reason="stopped on request"), lease())
    refused = ckpt(target, capsys, action, expect=1)
    verb = {"savepoint": "take a savepoint", "stop": "stop", "cancel": "cancel"}[action]
    assert "error: job orders is STOPPED since 20" in refused.err
    assert f"(reason stopped on request): there is no running driver to {verb}; nothing was requested" in refused.err
    assert ("ckpt snapshot create --checkpoint" in refused.err) == (action == "savepoint")
    assert control_keys(store) == []


@ONLY_LOCAL
@pytest.mark.parametrize("action", ACTIONS)
def test_request_to_a_stale_driver_is_refused(target: Target, capsys: pytest.CaptureFixture[str], action: str) -> None:
    store = install(target, running(age=300.0), lease())
    refused = ckpt(target, capsys, action, "--no-wait", expect=1)
    # 300 s when written, a second more if the store was slow to answer (the age is counted when the CLI reads it)
    assert re.search(r"error: job orders is RUNNING but its driver \(epoch 3, pid 4242 on worker-1\) sent no heartbeat "
                     r"for 30[01] s: it is probably dead and would never answer; nothing was requested", refused.err)
    assert control_keys(store) == []


def test_request_while_a_newer_driver_starts_or_before_any_status_is_refused(
        target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(), lease(4, owner="worker-2:77:ffff0000"))
    newer = ckpt(target, capsys, "savepoint", expect=1)
    assert "a newer driver (epoch 4, worker-2:77:ffff0000) took the lease from the driver of epoch 3" in newer.err
    store.storage.delete(["status.json"])
    early = ckpt(target, capsys, "stop", expect=1)
    assert "job orders has no status yet: its driver (epoch 4, worker-2:77:ffff0000) took the lease" in early.err
    assert control_keys(store) == []


# -- requests to a running driver ----------------------------------------------------------------


def test_no_wait_writes_exactly_one_request_for_the_status_epoch(target: Target,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(epoch=7), lease(7))
    shown = ckpt(target, capsys, "savepoint", "--no-wait")
    [request] = open_requests(store)
    assert (request.action, request.epoch) == (RequestAction.SAVEPOINT, 7)
    assert control_keys(store) == [f"control/{request.id}.json"]
    assert shown.out.startswith(f"requested savepoint of job orders: request {request.id} for the driver of epoch 7")

    data = json.loads(ckpt(target, capsys, "cancel", "--no-wait", "--json").out)
    assert (data["action"], data["epoch"]) == ("cancel", 7)
    assert [r.id for r in open_requests(store)] == [request.id, data["id"]]


@pytest.mark.parametrize("action", ACTIONS)
def test_completed_request(target: Target, capsys: pytest.CaptureFixture[str], action: str) -> None:
    store = install(target, running(), lease())
    with FakeDriver(store, completed) as driver:
        done = ckpt(target, capsys, action, "--timeout", "30")
    [request] = driver.requests
    assert (request.action.value, request.epoch) == (action, 3)
    assert f"requested {action} of job orders: request {request.id}" in done.err
    if action == "cancel":
        assert done.out.strip() == ("cancel of job orders completed at batch 41: "
                                    "canceled; the latest completed batch is 41")
    else:
        what = "savepoint" if action == "savepoint" else "job orders stopped with final savepoint"
        assert done.out.splitlines() == [f"{what} {SNAPSHOT_ID} completed at batch 41",
                                         f"s3://b/jobs/orders/snapshots/{SNAPSHOT_ID}"]
    assert open_requests(store) == []


def test_a_rerun_with_the_same_key_returns_the_first_runs_stop_and_asks_nothing_again(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    store = install(target, running(), lease())
    with FakeDriver(store, completed) as driver:
        first = ckpt(target, capsys, "stop", "--key", "nightly-2026-11-29", "--timeout", "30")
    write_status(store, running(state=JobState.STOPPED, reason="stopped with savepoint"))  # the stop stopped it
    again = ckpt(target, capsys, "stop", "--key", "nightly-2026-11-29", "--timeout", "30")
    [request] = driver.requests
    assert first.out == again.out and f"request {request.id}" in again.err
    assert [k for k in control_keys(store) if not k.endswith(".ack.json")] == [f"control/{request.id}.json"]
    refused = ckpt(target, capsys, "stop", "--key", "nightly-2026-11-30", expect=1)  # another intent: asked anew
    assert "is STOPPED since" in refused.err


def test_completed_savepoint_json_prints_the_ack(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(), lease())
    with FakeDriver(store, completed) as driver:
        data = json.loads(ckpt(target, capsys, "savepoint", "--timeout", "30", "--json").out)
    ack = read_ack(store, driver.requests[0].id)
    assert ack is not None and data == ack.to_dict()
    assert (data["outcome"], data["snapshot_id"], data["batch_id"]) == ("completed", SNAPSHOT_ID, 41)


@pytest.mark.parametrize(("outcome", "message"), [(Outcome.FAILED, "upload failed: disk full"),
                                                  (Outcome.REJECTED, "rejected: the request was for epoch 2")])
def test_failed_or_rejected_request_exits_1(target: Target, capsys: pytest.CaptureFixture[str], outcome: Outcome,
                                           message: str) -> None:
    store = install(target, running(), lease())

    def answer(request: Request) -> Ack:
        return Ack(request.id, request.action, outcome, message, request.epoch, time.time())

    with FakeDriver(store, answer) as driver:
        failed = ckpt(target, capsys, "savepoint", "--timeout", "30", expect=1)
    request_id = driver.requests[0].id
    assert f"error: savepoint of job orders {outcome} (request {request_id}): {message}" in failed.err
    assert failed.out == ""

    with FakeDriver(store, answer) as driver:
        data = json.loads(ckpt(target, capsys, "stop", "--timeout", "30", "--json", expect=1).out)
    assert (data["id"], data["outcome"], data["message"]) == (driver.requests[0].id, outcome.value, message)


def test_no_answer_in_time_exits_4_and_leaves_the_request_queued(target: Target,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(), lease())
    late = ckpt(target, capsys, "stop", "--timeout", "0", expect=4)
    [request] = open_requests(store)
    assert (f"error: no answer to stop request {request.id} within 0 s: the request stays queued and the driver of "
            "epoch 3 acts on it when it next polls; check with `ckpt job status --job orders`") in late.err
    data = json.loads(ckpt(target, capsys, "savepoint", "--timeout", "0", "--json", expect=4).out)
    assert (data["action"], data["epoch"], data["ack"]) == ("savepoint", 3, None)
    assert len(open_requests(store)) == 2


def test_negative_timeout_is_refused_before_anything_is_written(target: Target,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store = install(target, running(), lease())
    assert "--timeout must be >= 0 seconds, found -1.0" in ckpt(target, capsys, "stop", "--timeout", "-1",
                                                                expect=1).err
    assert control_keys(store) == []


def test_unreachable_store_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    secret = "wJalrXUtnFEMI-very-secret-never-printed"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATESTKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    endpoint = f"http://127.0.0.1:{free_port()}"
    target = Target(["--store", "s3://bucket/jobs", "--endpoint-url", endpoint, "--region", "us-east-1"],
                    LocalStorage("/nonexistent"), secret)
    for args in (["status"], ["savepoint", "--no-wait"]):
        failed = ckpt(target, capsys, *args, expect=1)
        assert failed.err.rstrip().splitlines()[-1].startswith(
            f"error: read s3://bucket/jobs/orders/status.json: cannot reach S3 endpoint {endpoint} after 5 attempts")
        assert "check the endpoint URL and that the server is up" in failed.err
        assert failed.out == ""
