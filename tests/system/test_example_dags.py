"""The example DAGs end to end with ``airflow dags test``: real Spark, tansu, SeaweedFS and Airflow.

One job lives through the module, as it would in production: kept alive (and killed), savepointed and
restored, refused an incompatible upgrade, rolled back from a failing one, and upgraded to v2. After
every step the job's totals are compared with the produced stream: exact counts, nothing lost or doubled.
The tests run in file order and build on each other.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.control import CONTROL
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.store.jobstore import SPEC_STABLE
from airflow_ckpt_provider.demo.world import EXAMPLES, AirflowHome, World
from airflow_ckpt_provider.triggers.base import MIN_DEFERRAL
from tests.system.airflow_server import AirflowServer, AirflowServerError

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


def running(world: World) -> JobStatus:
    return world.wait("the job RUNNING with all records", lambda s: s.state == JobState.RUNNING
                      and world.consumed(s) == world.produced)


def assert_exact(world: World) -> None:
    running(world)
    totals, expected = world.totals(), world.expected()
    assert totals == expected, {c: (totals.get(c), expected[c]) for c in expected if totals.get(c) != expected[c]}


def error_lines(log: str) -> list[str]:
    """The lines Airflow logged at level error."""
    return [line for line in log.splitlines() if "[error" in line or " ERROR " in line]


def control_requests(world: World) -> list[str]:
    return sorted(o.key for o in world.store.storage.list(CONTROL) if not o.key.endswith(".ack.json"))


def test_keep_alive_dag_restarts_a_killed_driver_with_exact_counts(world: World, home: AirflowHome) -> None:
    world.produce(2000)
    killed: list[JobStatus] = []

    def kill_after_two_batches() -> None:
        status = world.wait("two batches", lambda s: s.state == JobState.RUNNING and (s.batch_id or 0) >= 2)
        world.kill_driver(status)
        killed.append(status)
        world.produce(1000)

    killer = threading.Thread(target=kill_after_two_batches, daemon=True)
    killer.start()
    done = home.dags_test("ckpt_keep_alive")
    killer.join(300)
    assert done.returncode == 0, done.stdout[-5000:]
    assert error_lines(done.stdout) == []  # e.g. Airflow's "XCom not found" for a link never set
    assert killed, "the driver never reached batch 2 while the DAG ran"
    # The supervisor restarted it (epoch + 1); the DAG's restart task was skipped (it would add another epoch).
    status = world.wait("the restarted driver", lambda s: s.epoch == killed[0].epoch + 1 and s.batch_id is not None)
    assert "Skipping due to soft_fail" in done.stdout  # the health watch saw no unhealthy job
    deployment = json.loads(world.store.storage.read(f"deployments/{status.epoch:010d}.json"))
    assert deployment["restore"] == "latest-state"
    assert_exact(world)
    # A second run reconnects to the running job instead of submitting it again (its health watch: 3 s, not 25).
    again = home.dags_test("ckpt_keep_alive", env={"CKPT_EXAMPLE_WATCH_SECONDS": "3"})
    assert again.returncode == 0, again.stdout[-5000:]
    assert "reconnecting instead of submitting it again" in again.stdout
    assert error_lines(again.stdout) == []
    now = world.status()
    assert now is not None and now.epoch == status.epoch


@pytest.mark.full(proven_by="integration/test_cluster.py::test_exactly_once_on_the_cluster_... and "
                            "integration/test_exactly_once.py (a savepoint restored elsewhere, exact); scripts/demo "
                            "runs this DAG")
def test_savepoint_restore_dag(world: World, home: AirflowHome) -> None:
    before = running(world)
    done = home.dags_test("ckpt_savepoint_restore", {"job": world.job})
    assert done.returncode == 0, done.stdout[-5000:]
    status = world.wait("the restored driver", lambda s: s.epoch > before.epoch and s.state == JobState.RUNNING)
    savepoints = [m for m in list_snapshots(world.store) if m.kind.value == "savepoint"]
    assert savepoints, "no savepoint in the job store"
    assert status.restored_from is not None and status.restored_from.endswith(savepoints[-1].snapshot_id)
    world.produce(500)
    assert_exact(world)


def test_incompatible_upgrade_and_a_rescale_of_hdfs_state_are_refused_before_the_job_stops(
        world: World, home: AirflowHome) -> None:
    world.produce(500)  # data flowing, as in production: the upgrade must not lose it
    before = running(world)
    lease = read_lease(world.store)
    requests = control_requests(world)
    done = home.dags_test("ckpt_upgrade_job", {"job": world.job, "job_file": str(EXAMPLES / "orders_incompatible.py"),
                                               "code_version": "bad", "verify_batches": 1})
    assert done.returncode != 0
    assert "refused before anything was stopped" in done.stdout, done.stdout[-5000:]
    # The form's partitions on this job's HDFS-backed state (Spark's default): refused the same way.
    done = home.dags_test("ckpt_upgrade_job", {"job": world.job, "job_file": str(EXAMPLES / "orders_v1.py"),
                                               "code_version": "v1", "verify_batches": 1, "partitions": 3})
    assert done.returncode != 0
    assert re.search(r"upgrade of job \S+ to \S+/orders_v1.py with 3 state partitions refused before anything was "
                     r"stopped: snapshot \S+: the state is in the HDFS-backed state store", done.stdout), \
        done.stdout[-5000:]
    after = world.status()
    assert after is not None and after.epoch == before.epoch and after.state == JobState.RUNNING
    assert read_lease(world.store) == lease
    assert control_requests(world) == requests  # no stop was even requested
    launch = read_launch(world.store)
    assert launch is not None and launch.deployment.code_version == "v1"
    assert_exact(world)


def test_failing_upgrade_is_rolled_back(world: World, home: AirflowHome) -> None:
    before = running(world)
    with world.flowing():  # v2-broken fails on its first batch of data
        done = home.dags_test("ckpt_upgrade_job", {"job": world.job, "code_version": "v2-broken", "verify_batches": 1,
                                                   "job_file": str(EXAMPLES / "orders_v2_broken.py")})
    assert done.returncode != 0
    assert "rolled back to" in done.stdout, done.stdout[-5000:]
    status = world.wait("the old code again", lambda s: s.epoch > before.epoch + 1 and s.state == JobState.RUNNING
                        and s.code_version == "v1")
    launch = read_launch(world.store)
    assert launch is not None and launch.deployment.code_version == "v1"
    assert status.restored_from is not None  # the stop's savepoint
    world.produce(500)
    assert_exact(world)


@pytest.mark.full(proven_by="test_upgrade_chain_survives_defer_and_resume_through_scheduler_and_triggerer_"
                            "under_cpu_load (the same DAG to v2 with its state, through a real scheduler)")
def test_upgrade_dag_takes_the_job_to_v2_with_its_state(world: World, home: AirflowHome) -> None:
    before = running(world)
    with world.flowing():
        done = home.dags_test("ckpt_upgrade_job", {"job": world.job, "job_file": str(EXAMPLES / "orders_v2.py"),
                                                   "code_version": "v2", "verify_batches": 2})
    assert done.returncode == 0, done.stdout[-5000:]
    status = running(world)
    assert status.code_version == "v2" and status.epoch > before.epoch
    assert status.restored_from is not None and status.restored_from.startswith("savepoint-")
    stable = json.loads(world.store.storage.read(SPEC_STABLE))
    assert stable["deployment"]["code_version"] == "v2"
    assert_exact(world)  # v1's totals carried on by v2: state kept
    newest = max(Path(world.out).glob("batch-*.json"))
    assert all(row["version"] == 2 for row in json.loads(newest.read_text()))


UPGRADE_DAG = "ckpt_upgrade_job"
#: ``[ckpt] min_deferral`` on the real Airflow below: half the product's default (MIN_DEFERRAL, 30 s). The upgrade
#: chain under load then proves the floor with half the margin a deployment has: every deferral's executor report
#: (0.2-6.2 s measured under load) must come within it, which the test asserts; each upgrade defers once (on its
#: operation), so the module's time drops by ~15 s (and the CPU burner's by as much).
SERVER_MIN_DEFERRAL = MIN_DEFERRAL / 2
#: Busy-looping processes of the upgrade chain under load: every core but one. The running job, Airflow's four
#: processes and (in the suite) the other test worker load that one too: more burners measured the same exit report
#: delays, and their CPU only slowed the other worker.
BURNERS = max(1, (os.cpu_count() or 2) - 1)
INVALID_PARAMS = {
    "upgrade_mode": {"upgrade_mode": "bogus"},
    "allow_non_restored_state": {"allow_non_restored_state": "yes"},
    "job": {"job": "Orders Job!"},
}


@pytest.fixture(scope="module")
def airflow(world: World, home: AirflowHome) -> Iterator[AirflowServer]:
    """A real Airflow (api-server, scheduler, dag-processor, triggerer on the LocalExecutor) for the module's
    last tests. Its teardown kills every process it started, the job included: keep these tests last."""
    passthrough = {k: v for k, v in home.env.items() if k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_", "CKPT_"))}
    passthrough["AIRFLOW__CKPT__MIN_DEFERRAL"] = str(SERVER_MIN_DEFERRAL)
    # asyncio's debug mode makes the triggerer name any coroutine step that holds its event loop over 0.1 s.
    # Its home (component logs, task logs) stays in pytest's temp directory for a look after a failure.
    with AirflowServer(Path(home.env["AIRFLOW__CORE__DAGS_FOLDER"]), env=passthrough,
                       home=world.work / "airflow-server", users={"reader": "viewer"},
                       component_env={"triggerer": {"PYTHONASYNCIODEBUG": "1"}}) as server:
        server.wait_dag_parsed(UPGRADE_DAG)
        server.unpause(UPGRADE_DAG)
        server.unpause(server.wait_dag_parsed(SAVEPOINT_DAG)["dag_id"])  # its asset watcher starts
        yield server


def test_invalid_upgrade_params_are_refused_over_rest_without_a_run(airflow: AirflowServer) -> None:
    conf = {"job": "orders", "job_file": str(EXAMPLES / "orders_v2.py"), "code_version": "v9",
            "upgrade_mode": "savepoint", "allow_non_restored_state": False, "verify_batches": 1}
    for name, bad in INVALID_PARAMS.items():
        resp = airflow.trigger(UPGRADE_DAG, {**conf, **bad}, run_id=f"invalid-{name}")
        assert resp.status_code in (400, 422), resp.text
        assert name in resp.text
        assert airflow.api("GET", f"/dags/{UPGRADE_DAG}/dagRuns/invalid-{name}").status_code == 404


@pytest.mark.stress(base=300, per_run=600)
def test_upgrade_chain_survives_defer_and_resume_through_scheduler_and_triggerer_under_cpu_load(
        world: World, airflow: AirflowServer, stress_run_count: int) -> None:
    """The upgrade task defers (on its operation, acted on by a detached actor) and resumes through the real scheduler
    and triggerer while every core is kept busy (``BURNERS``), ``stress_run_count`` times in a row (v2 -> v2.1
    -> v2.2 ...), all successful. Airflow 3.3's scheduler fails a task that resumes before the report of its exit after
    defer() was processed (docs/airflow.md); the deferrals' min_deferral keeps that from happening."""
    from tests.system.cpuload import cpu_burner

    before = running(world)
    previous = before.code_version
    blocked_before = len(airflow.blocked_loop_warnings())
    started = time.monotonic()
    with cpu_burner(BURNERS) as burners, world.flowing():
        print(f"CPU burners {burners}; {stress_run_count} upgrade run(s) through the REST API")
        for i in range(1, stress_run_count + 1):
            version, run_id = f"v2.{i}", f"upgrade-under-load-{i}"
            conf = {"job": world.job, "job_file": str(EXAMPLES / "orders_v2.py"), "code_version": version,
                    "upgrade_mode": "savepoint", "allow_non_restored_state": False, "verify_batches": 1}
            resp = airflow.trigger(UPGRADE_DAG, conf, run_id=run_id)
            assert resp.status_code == 200, resp.text
            try:
                state = airflow.wait_run(UPGRADE_DAG, run_id, timeout=540)
            except AirflowServerError as err:
                pytest.fail(f"run {i} of {stress_run_count}: {err}\n{airflow.diagnose(UPGRADE_DAG, run_id, 'upgrade')}")
            assert state == "success", (f"run {i} of {stress_run_count} ended {state}\n"
                                        + airflow.diagnose(UPGRADE_DAG, run_id, "upgrade"))
            result = airflow.xcom(UPGRADE_DAG, run_id, "upgrade")
            assert (result["from_version"], result["to_version"]) == (previous, version), result
            assert result["snapshot_id"].startswith("savepoint-")
            # The task asked for the operation, deferred once on its record (its detached actor took the steps) and
            # resumed through the triggerer; the actor's steps are in the task's log.
            log = airflow.task_log(UPGRADE_DAG, run_id, "upgrade")
            assert log.count("Pausing task as DEFERRED") == 1 and "4/5 verified: " in log, log[-5000:]
            assert "ckpt job operate (pid " in log, log[-5000:]
            tries = airflow.api_json("GET", f"/dags/{UPGRADE_DAG}/dagRuns/{run_id}/taskInstances/upgrade")
            assert tries["try_number"] == 1, tries  # one try: never failed and retried
            status = world.wait(f"{version} RUNNING", lambda s: s.state == JobState.RUNNING)
            assert status.code_version == version and status.epoch > before.epoch
            # The margin itself: each deferring attempt's exit reached the scheduler before the deferral could end.
            delays = airflow.defer_report_delays(run_id)
            print(f"run {i}: deferral -> executor report of the exit: {delays} s "
                  f"(each deferral lasts at least {SERVER_MIN_DEFERRAL:.0f} s here, {MIN_DEFERRAL:.0f} by default)")
            assert len(delays) == 1 and max(delays) < SERVER_MIN_DEFERRAL, delays
            previous = version
    print(f"{stress_run_count} upgrade run(s) in {time.monotonic() - started:.0f} s; the triggerer's event loop was "
          f"reported blocked {len(airflow.blocked_loop_warnings()) - blocked_before} time(s) under load; "
          f"its slow steps (asyncio debug): {airflow.slow_loop_steps()}")
    # Checked before the server stops: its teardown kills every process it started, the job included.
    status = running(world)
    assert status.code_version == f"v2.{stress_run_count}"
    world.produce(300)
    assert_exact(world)


SAVEPOINT_DAG = "ckpt_on_savepoint"


def test_a_savepoint_schedules_the_dag_on_its_asset_event(world: World, airflow: AirflowServer) -> None:
    """A savepoint requested from the running job becomes exactly one asset event, carrying its id, batch and
    URI, from the watcher in the real triggerer; it schedules exactly one run of the asset-scheduled DAG, whose
    task reads them; the watcher's cursor in Airflow's asset state store records it."""
    from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, submit_request, wait_ack

    uri, key = f"ckpt://ckpt_store_default/{world.job}/savepoints", f"ckpt.snapshot_events.{world.job}.savepoint"

    def until(what: str, probe: Any, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := probe()):
            assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}\n{airflow.log_tails(30)}"
            time.sleep(0.5)
        return found

    asset_id = until("the asset", lambda: next((a["id"] for a in airflow.api_json(
        "GET", "/assets", params={"uri_pattern": uri})["assets"] if a["uri"] == uri), None))
    cursor = f"/assets/{asset_id}/state-store/{key}"
    until("the watcher's baseline cursor", lambda: airflow.api("GET", cursor).status_code == 200)

    status = running(world)
    ack = wait_ack(world.store, submit_request(world.store, RequestAction.SAVEPOINT, status.epoch).id, 60)
    assert ack is not None and ack.outcome is Outcome.COMPLETED, ack

    def events_of_it() -> list[dict[str, Any]]:
        resp = airflow.api("GET", "/assets/events", params={"asset_id": asset_id, "limit": 100})
        if resp.status_code == 500:
            # Airflow 3.3.2's GET /assets/events fails (AssetEventResponse: created_dagruns.0.start_date None)
            # while a run an event created is queued and not started yet: ask again once it started.
            return []
        assert resp.status_code == 200, resp.text
        found = resp.json()
        return [e for e in found["asset_events"] if e["extra"]["payload"]["snapshot_id"] == ack.snapshot_id]

    event = until("its asset event with a DAG run", lambda: [e for e in events_of_it() if e["created_dagruns"]])[0]
    assert event["extra"]["from_trigger"] is True
    payload = event["extra"]["payload"]
    assert (payload["job"], payload["kind"], payload["batch_id"], payload["uri"]) == (
        world.job, "savepoint", ack.batch_id, ack.snapshot_uri)
    (run,) = event["created_dagruns"]
    assert airflow.wait_run(SAVEPOINT_DAG, run["run_id"], timeout=60) == "success"
    assert {"snapshot_id": ack.snapshot_id, "batch_id": ack.batch_id, "uri": ack.snapshot_uri} in airflow.xcom(
        SAVEPOINT_DAG, run["run_id"], "use_savepoints")
    upstream = airflow.api_json("GET", f"/dags/{SAVEPOINT_DAG}/dagRuns/{run['run_id']}/upstreamAssetEvents")
    assert event["id"] in [e["id"] for e in upstream["asset_events"]]
    # Confirmed in the cursor, and announced once: one event, one run.
    until("the savepoint in the cursor", lambda: ack.snapshot_id in airflow.api_json("GET", cursor)["value"]["seen"])
    assert len(events_of_it()) == 1
    runs = [r for r in airflow.runs(SAVEPOINT_DAG) if any(
        e["extra"]["payload"]["snapshot_id"] == ack.snapshot_id for e in airflow.api_json(
            "GET", f"/dags/{SAVEPOINT_DAG}/dagRuns/{r['dag_run_id']}/upstreamAssetEvents")["asset_events"])]
    assert [r["dag_run_id"] for r in runs] == [run["run_id"]]


def test_upgrade_trigger_form_renders_in_chromium(airflow: AirflowServer) -> None:
    """The trigger form renders in headless Chromium (screenshots kept in build/test-artifacts)."""
    trigger_form_screenshots(airflow, UPGRADE_DAG)


def trigger_form_screenshots(airflow: object, dag_id: str) -> None:
    from playwright.sync_api import expect

    from tests.system.airflow_server import AirflowServer, chromium_browser

    assert isinstance(airflow, AirflowServer)
    artifacts = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    form_png, options_png = artifacts / "upgrade-trigger-form.png", artifacts / "upgrade-trigger-form-modes.png"
    for png in (form_png, options_png):
        png.unlink(missing_ok=True)
    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.set_default_timeout(30_000)
        airflow.ui_login(page)
        # The React UI has no route of its own for the form: it is a dialog on the DAG page.
        page.goto(f"{airflow.base_url}/dags/{dag_id}")
        page.get_by_test_id("trigger-dag-button").click()
        dialog = page.get_by_role("dialog").filter(has=page.get_by_role("heading", name=f"Trigger Dag - {dag_id}"))
        for name in ("job", "job_file", "code_version", "upgrade_mode", "allow_non_restored_state", "verify_batches",
                     "partitions"):
            expect(dialog.locator("label", has_text=re.compile(rf"^{re.escape(name)}\s*\*?$"))).to_be_visible()
        modes = dialog.get_by_role("combobox", name="upgrade_mode")
        expect(modes).to_be_visible()
        page.screenshot(path=str(form_png), full_page=True)
        modes.click()
        for option in ("savepoint", "last-state", "stateless"):
            expect(page.get_by_role("option", name=option, exact=True)).to_be_visible()
        page.screenshot(path=str(options_png), full_page=True)
    print(f"screenshots: {form_png} {options_png}")
    for png in (form_png, options_png):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, f"{png}: {len(data)} bytes"


def test_streaming_jobs_page_shows_the_running_job_and_takes_a_savepoint_for_a_user_who_may_act(
        world: World, airflow: AirflowServer) -> None:
    """The plugin's page in headless Chromium against the real API server, while the job runs: the list and
    the job page with its charts (screenshots kept in build/test-artifacts), a savepoint from the page's button
    that completes in the job store and is audit-logged with the user; a viewer sees read-only pages and is
    refused (403) with nothing written."""
    from playwright.sync_api import expect

    from tests.system.airflow_server import chromium_browser

    status = running(world)
    artifacts = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shots = {name: artifacts / f"streaming-jobs-{name}.png" for name in ("nav", "list", "job", "savepoint", "viewer")}
    charts_png = artifacts / "streaming-jobs-charts.png"
    for png in [*shots.values(), charts_png]:
        png.unlink(missing_ok=True)
    before = {m.snapshot_id for m in list_snapshots(world.store)}
    job_url = f"{airflow.base_url}/ckpt-jobs/jobs/ckpt_store_default/{world.job}"
    requests_url = f"{airflow.base_url}/ckpt-jobs/api/jobs/ckpt_store_default/{world.job}/requests"
    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        airflow.ui_login(page)
        # The navigation entry shows the page inside the Airflow UI.
        page.goto(f"{airflow.base_url}/plugin/streaming-jobs")
        row = page.frame_locator("iframe").locator(f"tr[data-job='{world.job}']")
        # The first look waits for the iframe, its page and the job list's reads of the store: on a loaded 2-core
        # machine (a full test run) that took more than expect's 5 s once; the page's own timeout is 30 s.
        expect(row).to_contain_text("RUNNING", timeout=30_000)
        page.screenshot(path=str(shots["nav"]), full_page=True)
        page.goto(f"{airflow.base_url}/ckpt-jobs/")
        row = page.locator(f"tr[data-job='{world.job}']")
        expect(row.locator("td").nth(1)).to_contain_text("RUNNING")
        expect(row.locator("td").nth(2)).to_have_text(str(status.epoch))
        expect(row.locator("td").nth(3)).to_have_text(str(status.code_version))
        page.screenshot(path=str(shots["list"]), full_page=True)
        row.get_by_role("link", name=world.job).click()
        page.wait_for_url(job_url)
        expect(page.get_by_test_id("state")).to_have_text("RUNNING")
        expect(page.get_by_test_id("lineage").locator("tr").nth(1)).to_contain_text(str(status.epoch))
        page.screenshot(path=str(shots["job"]), full_page=True)
        # The charts from the job store: the driver's batch samples and the retained snapshots, drawn as SVG.
        for chart in ("batch-seconds", "lag", "snapshot-size", "snapshot-new-bytes", "snapshot-seconds"):
            figure = page.get_by_test_id(f"chart-{chart}")
            assert int(figure.get_attribute("data-points") or 0) >= 1, chart
            expect(figure.locator("svg polyline")).to_have_count(1)
        page.locator(".charts").screenshot(path=str(charts_png))
        page.get_by_role("button", name="Trigger savepoint").click()
        answer = page.get_by_test_id("answer")
        expect(answer).to_have_attribute("data-outcome", "completed", timeout=120_000)
        snapshot_id = answer.get_attribute("data-snapshot")
        page.reload()
        expect(page.locator(f"tr[data-snapshot='{snapshot_id}']")).to_contain_text("savepoint")
        page.screenshot(path=str(shots["savepoint"]), full_page=True)

        viewer = browser.new_page(viewport={"width": 1400, "height": 1000})
        viewer.set_default_timeout(30_000)
        airflow.ui_login(viewer, user="reader")
        viewer.goto(job_url)
        expect(viewer.get_by_test_id("read-only")).to_be_visible()
        assert viewer.get_by_role("button", name="Trigger savepoint").count() == 0
        refused = viewer.evaluate("""async (url) => (await fetch(url, {method: "POST", body: '{"action": "savepoint"}',
            headers: {"Content-Type": "application/json"}})).status""", requests_url)
        viewer.screenshot(path=str(shots["viewer"]), full_page=True)
    assert refused == 403
    savepoints = {m.snapshot_id: m for m in list_snapshots(world.store)}
    assert set(savepoints) - before == {snapshot_id}, "exactly the page's savepoint was added"
    assert savepoints[snapshot_id].kind.value == "savepoint" and savepoints[snapshot_id].trigger.value == "manual"
    requests = [json.loads(world.store.storage.read(key)) for key in control_requests(world)]
    by_page = [r for r in requests if r["requested_by"] == "admin (Airflow UI)"]
    assert [r["action"] for r in by_page] == ["savepoint"], by_page  # the viewer's request wrote nothing
    audit = airflow.api_json("GET", "/eventLogs", params={"event": "ckpt.request"})["event_logs"]
    assert [(e["owner"], json.loads(e["extra"])["action"]) for e in audit] == [("admin", "savepoint")], audit
    for png in shots.values():
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, f"{png}: {len(data)} bytes"
    assert charts_png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and len(charts_png.read_bytes()) > 5_000
    print("screenshots:", *shots.values(), charts_png)
    # Caught up with the topic: the page's lag is 0 records (the driver reports it from Spark's progress).
    world.wait("idle", lambda s: s.idle)
    summary = airflow.client.get(f"/ckpt-jobs/api/jobs/ckpt_store_default/{world.job}",
                                 headers={"Authorization": f"Bearer {airflow.token()}"}).json()["summary"]
    assert (summary["state"], summary["lag"], summary["epoch"]) == ("RUNNING", 0, world.status().epoch), summary
    world.produce(300)
    assert_exact(world)

