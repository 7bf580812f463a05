"""The Streaming jobs app's routes on a real local job store, Airflow's authentication replaced by a fixed
user (the real API server, its auth manager, Chromium and a running job: tests/system/test_example_dags.py).
Bad input gets a clear 4xx and writes nothing; an action no driver would answer is refused (409)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_ckpt_provider.core.records.control import CONTROL, RequestAction
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.ui import app as ui
from airflow_ckpt_provider.ui.stores import _env_conn_type, store_conn_ids


class User:
    def get_name(self) -> str:
        return "alice"


@pytest.fixture
def client(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from airflow.api_fastapi.core_api.security import get_user

    app = ui.create_app()
    for dep in (*ui.READ, *ui.ACT):
        app.dependency_overrides[dep.dependency] = lambda: None
    app.dependency_overrides[get_user] = User
    monkeypatch.setattr(ui, "_can_act", lambda user: True)
    with TestClient(app) as c:
        yield c


def running(store: JobStore, **changes: Any) -> JobStatus:
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 2, "updated_at": time.time(),
                            "started_at": time.time() - 60, "batch_id": 4, "pid": os.getpid(),
                            "host": socket.gethostname(), "code_version": "v1"}
    status = JobStatus(**body | changes)
    write_status(store, status)
    return status


def requests_written(store: JobStore) -> list[str]:
    return [o.key for o in store.storage.list(CONTROL)]


def test_the_store_connections_come_from_the_environment_and_the_config(monkeypatch: pytest.MonkeyPatch,
                                                                        store: JobStore) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_STORE", "ckpt-store://?store_url=s3%3A%2F%2Fb%2Fp")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws"}))
    monkeypatch.setenv("AIRFLOW__CKPT__UI_STORE_CONN_IDS", "vault_store, ")
    assert store_conn_ids() == ["ckpt_store_default", "other_store", "vault_store"]
    assert (_env_conn_type("{not json"), _env_conn_type("ckpt-store://h")) == (None, "ckpt_store")


def test_the_list_and_the_job_page_show_the_running_job(client: TestClient, store: JobStore) -> None:
    running(store)
    (listed,) = client.get("/api/jobs").json()
    assert listed["conn_id"] == "ckpt_store_default" and listed["problem"] is None
    assert [(j["job"], j["state"], j["epoch"], j["batch_id"]) for j in listed["jobs"]] == [("orders", "RUNNING", 2, 4)]
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "Trigger savepoint" in page.text and 'data-testid="lineage"' in page.text
    assert client.get("/", headers={"Accept": "text/html"}).text.count('data-job="orders"') == 1
    assert '<td data-testid="operation">-</td>' in page.text  # never upgraded nor rescaled
    assert client.get("/api/jobs/ckpt_store_default/orders").json()["service"] is None  # not handed over


def test_the_job_page_says_which_service_instance_supervises_a_handed_job(client: TestClient, store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.ownership import OWNER, OwnerRecord, ServiceJob, handed_key

    running(store)
    store.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="test").to_bytes())
    report = client.get("/api/jobs/ckpt_store_default/orders").json()
    assert report["service"].startswith("handed to the supervision service; no instance owns it now")
    store.storage.write(OWNER, OwnerRecord(job="orders", instance="svc-b", epoch=2, acquired_at=1.0).to_bytes())
    report = client.get("/api/jobs/ckpt_store_default/orders").json()
    assert report["service"] == "supervision service instance svc-b (ownership epoch 2)"
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert '<td data-testid="service">supervision service instance svc-b (ownership epoch 2)</td>' in page


def test_the_job_page_shows_the_operation_in_progress_and_a_damaged_record_says_so(client: TestClient,
                                                                                  store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.operations import Acting, OperationState, ask

    running(store)
    found, _ = ask(store, "rescale", {"partitions": 4}, requested_by="airflow:dag.task run r")
    Acting(store, found, "ckpt job operate (pid 7)").save(
        actor="ckpt job operate (pid 7)", state=OperationState.RUNNING, steps=2, step={"type": "Stop"},
        line="2/5 stopping the driver of epoch 2 with a savepoint")
    report = client.get("/api/jobs/ckpt_store_default/orders").json()
    assert report["operation"]["text"] == (
        f"rescale {found.operation.id} of job orders (running, step 2 (Stop), acted on by ckpt job operate (pid 7); "
        "asked by airflow:dag.task run r): 2/5 stopping the driver of epoch 2 with a savepoint")
    assert report["operation"]["record"]["settings"] == {"partitions": 4}
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert f"rescale {found.operation.id} of job orders (running, step 2 (Stop)" in page
    store.storage.write("operation.json", b"{not json")
    damaged = client.get("/api/jobs/ckpt_store_default/orders")
    assert damaged.status_code == 200, damaged.text  # the page still shows the job
    assert damaged.json()["operation"]["text"].startswith("operation record not readable: operation record ")


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/api/jobs/nope_conn/orders", 404, "no 'nope_conn' connection of type ckpt_store: expected one of "
                                        "ckpt_store_default"),
    ("/api/jobs/ckpt_store_default/Orders!", 404, "invalid job name 'Orders!'"),
    ("/api/jobs/ckpt_store_default/billing", 404, "job 'billing' not found in job store"),
    ("/api/jobs/ckpt_store_default/orders/requests/lease.json", 404,
     "invalid request id 'lease.json': expected ACTION-"),
])
def test_bad_addresses_get_a_clear_404(client: TestClient, store: JobStore, path: str, status: int,
                                       says: str) -> None:
    running(store)
    resp = client.get(path)
    assert resp.status_code == status and says in resp.json()["detail"], resp.text


def test_an_html_error_page_for_a_browser(client: TestClient, store: JobStore) -> None:
    running(store)
    resp = client.get("/jobs/ckpt_store_default/billing", headers={"Accept": "text/html"})
    assert resp.status_code == 404 and 'data-testid="error"' in resp.text and "not found" in resp.text


def test_a_savepoint_request_is_written_for_the_running_driver_and_answered_later(client: TestClient,
                                                                                  store: JobStore) -> None:
    running(store)
    made = client.post("/api/jobs/ckpt_store_default/orders/requests", json={"action": "savepoint"})
    assert made.status_code == 202, made.text
    body = made.json()
    assert (body["action"], body["epoch"], body["requested_by"]) == ("savepoint", 2, "alice (Airflow UI)")
    request = json.loads(store.storage.read(f"{CONTROL}{body['request_id']}.json"))
    assert (request["action"], request["epoch"], request["requested_by"]) == ("savepoint", 2, "alice (Airflow UI)")
    state = client.get(f"/api/jobs/ckpt_store_default/orders/requests/{body['request_id']}").json()
    assert state == {"request_id": body["request_id"], "answered": False}
    # a task's request (its id from the task run's key) is looked up the same way
    from airflow_ckpt_provider.core.views.jobview import request_running

    keyed = request_running(store, RequestAction.SAVEPOINT, key="airflow:nightly.savepoint run scheduled__1")
    state = client.get(f"/api/jobs/ckpt_store_default/orders/requests/{keyed.id}").json()
    assert state == {"request_id": keyed.id, "answered": False}


def test_an_unknown_action_and_a_stopped_job_are_refused_with_nothing_written(client: TestClient,
                                                                               store: JobStore) -> None:
    running(store)
    bogus = client.post("/api/jobs/ckpt_store_default/orders/requests", json={"action": "restart"})
    assert bogus.status_code == 422 and "expected one of savepoint, stop, cancel" in bogus.json()["detail"]
    running(store, state=JobState.STOPPED)
    stopped = client.post("/api/jobs/ckpt_store_default/orders/requests", json={"action": "stop"})
    assert stopped.status_code == 409 and "there is no running driver to stop; nothing was requested" in \
        stopped.json()["detail"]
    assert requests_written(store) == []


def test_an_action_sent_as_a_form_or_text_is_refused(client: TestClient, store: JobStore) -> None:
    """A cross-site form can send text/plain or urlencoded bodies only: the action needs JSON (no CSRF)."""
    running(store)
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        resp = client.post("/api/jobs/ckpt_store_default/orders/requests", content=b'{"action": "savepoint"}',
                           headers={"Content-Type": content_type})
        assert resp.status_code == 422, (content_type, resp.text)
    assert requests_written(store) == []


def _handed(store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key

    store.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="test").to_bytes())


def test_a_restart_of_a_handed_job_is_recorded_for_the_service_and_followed_to_its_end(client: TestClient,
                                                                                       store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.operations import Acting, OperationState, read_operation

    running(store)
    assert "data-operation=\"restart\"" not in client.get("/jobs/ckpt_store_default/orders",
                                                          headers={"Accept": "text/html"}).text  # not handed yet
    _handed(store)
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert 'data-operation="restart"' in page
    resp = client.post("/api/jobs/ckpt_store_default/orders/operations",
                       json={"kind": "restart", "stop_mode": "savepoint"})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    found = read_operation(store)
    assert found is not None
    op = found.operation
    assert (body["operation_id"], op.kind, op.state, op.requested_by) == (op.id, "restart", OperationState.PENDING,
                                                                         "alice (Airflow UI)")
    assert (op.settings["restore"], op.settings["stop_mode"]) == ("latest-state", "savepoint")
    assert requests_written(store) == []  # the page asked; the service's instance acts (nothing here)
    state = client.get(f"/api/jobs/ckpt_store_default/orders/operations/{op.id}").json()
    assert (state["state"], state["final"], state["kind"]) == ("pending", False, "restart")
    acting = Acting.take(store, found, "supervision service instance svc-a", line="svc-a acts")
    acting.save(state=OperationState.SUCCEEDED, result={"epoch": 3, "batch_id": 5}, line="3/3 running: epoch 3")
    state = client.get(f"/api/jobs/ckpt_store_default/orders/operations/{op.id}").json()
    assert (state["state"], state["final"], state["line"], state["result"]) == (
        "succeeded", True, "3/3 running: epoch 3", {"epoch": 3, "batch_id": 5})
    assert client.get("/api/jobs/ckpt_store_default/orders/operations/restart-x").status_code == 404


def test_a_restart_from_the_page_is_refused_with_nothing_written_when_nobody_here_would_act(
        client: TestClient, store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.operations import OPERATION

    running(store)
    refused = client.post("/api/jobs/ckpt_store_default/orders/operations", json={"kind": "restart"})
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith("job orders: expected a job handed to the supervision service, whose "
                                               "owning instance acts on a restart asked here; found no recorded "
                                               "deployment, not handed over")
    _handed(store)
    for body, status, says in [({"kind": "upgrade"}, 422, "unknown operation 'upgrade': expected restart"),
                               ({"kind": "restart", "stop_mode": "kill"}, 422, "invalid stop mode"),
                               ({"kind": "restart", "restore": "snapshot"}, 422, "needs the snapshot")]:
        resp = client.post("/api/jobs/ckpt_store_default/orders/operations", json=body)
        assert resp.status_code == status and says in resp.json()["detail"], resp.text
    assert not store.storage.exists(OPERATION) and requests_written(store) == []
    assert client.post("/api/jobs/ckpt_store_default/orders/operations", json={"kind": "restart"}).status_code == 202
    busy = client.post("/api/jobs/ckpt_store_default/orders/operations", json={"kind": "restart", "restore": "none"})
    assert busy.status_code == 409 and "expected no operation in progress" in busy.json()["detail"]


def test_the_page_and_ckpt_job_status_show_the_drivers_store_request_rate_and_its_monthly_cost(
        client: TestClient, store: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ckpt_provider.cli.main import main

    running(store)
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert '<td data-testid="store-cost">-</td>' in page  # no window yet (or a store that is a directory)
    running(store, store_rates={"GetObject": 2.0, "PutObject": 0.2}, store_window=600.0)
    cost = ("2.20 requests/s (GET 2.00, PUT 0.20) over the last 600 s, about $4.73 a month at put $0.005 / get "
            "$0.0004 / delete $0 per 1,000 (CKPT_REQUEST_PRICES)")
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert f'<td data-testid="store-cost">{cost}</td>' in page
    assert main(["job", "status", "--store", str(store.root.url), "--job", "orders"]) == 0
    assert f"store requests: by the driver: {cost}" in capsys.readouterr().out


def test_the_job_page_shows_the_newest_state_sample_or_how_to_take_one(client: TestClient, store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.statesample import KEPT, SAMPLES, SampledTable, StateSample, write_sample

    running(store)
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert "no state sample yet: <code>ckpt state sample SNAPSHOT --store STORE --job orders</code>" in page
    table = SampledTable("0/default", "stateStoreSave", 2, None, ["key_k", "value_count", "partition_id"],
                         [["a", "3", "0"], ["b<script>", "", "1"]], 7)
    for i in range(KEPT + 2):  # the older ones beyond KEPT go
        write_sample(store, StateSample(snapshot_id=f"savepoint-{i}-x", batch_id=i, taken_at=1_800_000_000.0 + i,
                                        taken_by="alice@host (ckpt state sample)", tables=[table]))
    assert len(list(store.storage.list(SAMPLES))) == KEPT
    page = client.get("/jobs/ckpt_store_default/orders", headers={"Accept": "text/html"}).text
    assert f"snapshot <span class=\"mono\">savepoint-{KEPT + 1}-x</span> (batch {KEPT + 1}), sampled" in page
    assert "stateStoreSave, 2 partitions: 2 of 7 rows" in page
    assert '<td class="mono">b&lt;script&gt;</td>' in page  # values are escaped
    sample = client.get("/api/jobs/ckpt_store_default/orders").json()["state_sample"]
    assert (sample["snapshot_id"], sample["tables"][0]["rows"][0]) == (f"savepoint-{KEPT + 1}-x", ["a", "3", "0"])
