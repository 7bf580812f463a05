"""The Dagster layer end to end: real Dagster in-process execution, SeaweedFS S3, a tansu broker and real Spark.

A job submitted through the Dagster op (a detached supervisor, spark-submit local[2]) consumes a topic, the
health op waits until it caught up, the savepoint op takes a savepoint of its last batch through the control
channel, a kill -9 of the driver is restarted by the supervisor while the health sensor ticks without asking for a
restart, the restart op restores the savepoint, and the cancel op stops it: exact batch ids, counts, epochs and
snapshot contents. The orders example, submitted
through the op, is upgraded by the upgrade op to orders_v2 with its state (the totals exact after), and an upgrade
to orders_incompatible.py is refused before the job stops.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import CONTROL
from airflow_ckpt_provider.dagster import (
    CKPT_RESOURCE,
    CkptResource,
    cancel_streaming_job,
    job_health_sensor,
    kafka_lag_sensor,
    restart_from_snapshot,
    submit_streaming_job,
    trigger_savepoint,
    upgrade_streaming_job,
    wait_until_healthy,
)
from airflow_ckpt_provider.examples._orders import read_totals
from tests.integration.test_restore_check import expected_totals, produce_orders
from tests.support.runtimejob import (
    JOB_FILE,
    SPARK_CONF,
    JobEnv,
    expected_counts,
    kill_driver,
    produce,
    stop_supervisor,
)

pytestmark = pytest.mark.integration

RECORDS = 600  # 3 batches of 200 (CKPT_TEST_MAX_OFFSETS) after the source's first, empty batch 0
LAST_BATCH = 3
MORE = 200  # one more batch after the restore


def resource(env: JobEnv, secret: str | None = None) -> CkptResource:
    return CkptResource(store_url=env.store_url, endpoint_url=env.s3.endpoint_url, region_name=env.s3.region,
                        access_key_id=env.s3.access_key, secret_access_key=secret or env.s3.secret_key,
                        spark_conf=dict(c.split("=", 1) for c in SPARK_CONF))


def test_the_resource_connection_test_lists_the_s3_store_and_names_refused_credentials(env: JobEnv) -> None:
    assert resource(env).test_connection() == (True, f"job store {env.store_url} is reachable")
    ok, message = resource(env, secret="wrong-secret-value").test_connection()
    assert not ok
    assert "refused the credentials" in message and "wrong-secret-value" not in message


def test_the_lag_sensor_runs_once_when_the_lag_rises_above_the_threshold(
    env: JobEnv
) -> None:
    target = dg.GraphDefinition(name="on_lag", node_defs=[]).to_job()
    sensor = kafka_lag_sensor("g-never-committed", threshold=40, rearm_below=10, topics=[env.topic], run_job=target,
                              bootstrap_servers=env.kafka.bootstrap_servers)

    def tick(cursor: str | None) -> Any:
        with dg.build_sensor_context(cursor=cursor) as context:
            return sensor.evaluate_tick(context)

    produce(env.kafka.bootstrap_servers, env.topic, 0, 30)
    below = tick(None)
    assert below.run_requests == [] and "last seen 30 over 3 partitions" in str(below.skip_message)
    produce(env.kafka.bootstrap_servers, env.topic, 30, 20)
    above = tick(below.cursor)
    [run] = above.run_requests
    assert (run.tags["ckpt/group"], run.tags["ckpt/total_lag"]) == ("g-never-committed", "50")
    still_above = tick(above.cursor)  # one run per crossing, not one per tick
    assert still_above.run_requests == []


def test_the_dagster_webserver_on_loopback_serves_the_example_definitions_asset_graph_and_a_sensor_tick_in_chromium(
        tmp_path: Path) -> None:
    """dagster-webserver (and the code server it starts) on 127.0.0.1 serves the example Definitions: every job,
    sensor, asset and asset check, read back through its GraphQL API; in headless Chromium the asset lineage graph
    shows both assets, and the health sensor's "Preview tick result" evaluates a tick through the webserver that
    says why it skipped (the store is empty; screenshots kept in build/test-artifacts). The tick history needs
    dagster-daemon, which this test does not start."""
    import json
    import socket
    import subprocess
    import urllib.request

    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    from tests.system.airflow_server import chromium_browser

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    example = Path(__file__).parents[2] / "examples" / "dagster" / "definitions.py"
    webserver = Path(sys.executable).with_name("dagster-webserver")
    env = {**os.environ, "DAGSTER_HOME": str(home), "CKPT_STORE": str(tmp_path / "store")}
    log = tmp_path / "webserver.log"
    artifacts = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    graph_png, tick_png = artifacts / "dagster-asset-graph.png", artifacts / "dagster-sensor-tick.png"
    for png in (graph_png, tick_png):
        png.unlink(missing_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen([str(webserver), "-h", "127.0.0.1", "-p", str(port), "-f", str(example)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    query = ("{ repositoriesOrError { ... on RepositoryConnection { nodes { sensors { name } jobs { name } "
             "assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name } } } } } } } }")
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/server_info", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        request = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": query}).encode(),
                                         headers={"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(request, timeout=30).read())
        with chromium_browser() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            page.goto(f"{base}/asset-groups")
            skip = page.get_by_role("button", name="Skip")  # the community dialog of a first visit, if this
            try:  # Dagster version shows one
                skip.wait_for(timeout=10_000)
                skip.click()
            except PlaywrightTimeout:
                pass
            for name in ("output", "savepoints"):
                expect(page.get_by_text(name, exact=True).last).to_be_visible()
            page.screenshot(path=str(graph_png), full_page=True)
            page.goto(f"{base}/locations/definitions.py/sensors/orders_health")
            page.get_by_role("button", name="Preview tick result").click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_role("button", name="Continue").click()
            expect(dialog.get_by_text("Skipped", exact=True)).to_be_visible()
            expect(dialog).to_contain_text("job orders: watching for a fault; last seen: waiting for a driver to "
                                           "report; found no status.json: the job never ran")
            page.screenshot(path=str(tick_png), full_page=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    print(f"screenshots: {graph_png} {tick_png}")
    for png in (graph_png, tick_png):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, f"{png}: {len(data)} bytes"
    [repo] = body["data"]["repositoriesOrError"]["nodes"]
    assert sorted(s["name"] for s in repo["sensors"]) == [
        "ckpt_orders_lag", "orders_health", "orders_output", "orders_savepoints"]
    assert sorted(j["name"] for j in repo["jobs"]) == [
        "__ASSET_JOB", "ckpt_keep_alive", "ckpt_on_lag", "ckpt_on_savepoint", "ckpt_restart", "ckpt_savepoint_restore",
        "ckpt_upgrade_job"]
    checks = {"/".join(a["assetKey"]["path"]): sorted(c["name"] for c in a["assetChecksOrError"]["checks"])
              for a in repo["assetNodes"]}
    assert checks == {"orders/output": ["fresh", "lag"], "orders/savepoints": []}


def _stop_supervisor(env: JobEnv) -> None:
    """Teardown: the last launch's supervisor, if a failed assertion left it alive."""
    last = read_launch(env.store())
    if last is not None:
        stop_supervisor(env.store(), last.launch_id)


@pytest.fixture
def launched_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops launch drivers from this process: a CKPT_HOME of the test's own, loopback, this Python."""
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)


def test_a_job_submitted_through_dagster_ops_rides_out_a_kill_9_unseen_by_the_health_sensor_and_restores_its_savepoint(
    env: JobEnv, tmp_path: Path, launched_here: None
) -> None:
    """One Dagster run: submit, caught up, savepoint of the last batch; kill -9 of the driver while the health
    sensor ticks (the supervisor restarts it: no tick asks for a restart run, the ticks say a restart is in
    progress); the restart op restores the savepoint; more records; caught up again; cancel. Exact batch ids,
    counts, epochs and the snapshot restored."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, RECORDS)
    ckpt = resource(env)
    restart_target = dg.GraphDefinition(name="restart_orders", node_defs=[]).to_job()
    health = job_health_sensor(env.job, restart_job=restart_target, name="health_under_test")

    @dg.op(ins={"snapshot": dg.In(dict)}, out=dg.Out(dict))
    def kill_9_while_the_health_sensor_ticks(snapshot: dict[str, Any]) -> dict[str, Any]:
        store = env.store()
        killed = read_status(store)
        assert killed is not None and killed.state is JobState.RUNNING
        kill_driver(killed)
        ticks, deadline = [], time.monotonic() + 240
        while True:
            with dg.build_sensor_context(resources={CKPT_RESOURCE: ckpt}) as context:
                tick = health.evaluate_tick(context)
            ticks.append((len(tick.run_requests or []), str(tick.skip_message)))
            now = read_status(store)
            if now is not None and now.state is JobState.RUNNING and now.epoch > killed.epoch and len(ticks) > 1:
                break
            assert time.monotonic() < deadline, f"not running again within 240 s; ticks: {ticks[-3:]}"
            time.sleep(0.5)
        return snapshot | {"killed_epoch": killed.epoch, "running_epoch": now.epoch, "ticks": ticks}

    @dg.op(ins={"after": dg.In(dg.Nothing)})
    def produce_more() -> None:
        produce(env.kafka.bootstrap_servers, env.topic, RECORDS, MORE)

    caught_up_again = dg.NodeInvocation("wait_until_healthy", alias="caught_up_again")
    job = dg.GraphDefinition(
        name="submit_kill_restore",
        node_defs=[submit_streaming_job, wait_until_healthy, trigger_savepoint, kill_9_while_the_health_sensor_ticks,
                   restart_from_snapshot, produce_more, cancel_streaming_job],
        dependencies={
            "wait_until_healthy": {"started": dg.DependencyDefinition("submit_streaming_job")},
            "trigger_savepoint": {"after": dg.DependencyDefinition("wait_until_healthy")},
            "kill_9_while_the_health_sensor_ticks": {"snapshot": dg.DependencyDefinition("trigger_savepoint")},
            "restart_from_snapshot": {"snapshot": dg.DependencyDefinition("kill_9_while_the_health_sensor_ticks")},
            "produce_more": {"after": dg.DependencyDefinition("restart_from_snapshot")},
            caught_up_again: {"started": dg.DependencyDefinition("restart_from_snapshot"),
                              "after": dg.DependencyDefinition("produce_more")},
            "cancel_streaming_job": {"after": dg.DependencyDefinition("caught_up_again")},
        },
    ).to_job(resource_defs={CKPT_RESOURCE: ckpt})
    # min_batches above what the topic holds: healthy once the query caught up (idle), after its last batch
    caught_up = {"job": env.job, "min_batches": 1000, "timeout": 240, "poll_interval": 0.5}
    config: dict[str, Any] = {"ops": {
        "submit_streaming_job": {"config": {
            "job": env.job, "job_file": str(JOB_FILE), "code_version": "v1", "poll_interval": 0.5,
            "env": {"CKPT_TEST_TOPIC": env.topic, "CKPT_TEST_BOOTSTRAP": env.kafka.bootstrap_servers,
                    "CKPT_TEST_OUT": str(env.out), "CKPT_TEST_MAX_OFFSETS": "200"},
            "settings": {"checkpoint": str(tmp_path / "checkpoint"), "heartbeat_interval": "1",
                         "restart_strategy": "fixed-delay", "restart_attempts": "1"},
            "start_timeout": 240}},
        "wait_until_healthy": {"config": caught_up},
        "trigger_savepoint": {"config": {"job": env.job, "timeout": 180, "poll_interval": 0.5}},
        "restart_from_snapshot": {"config": {"job": env.job, "start_timeout": 240, "poll_interval": 0.5}},
        "caught_up_again": {"config": caught_up},
        "cancel_streaming_job": {"config": {"job": env.job, "timeout": 180, "poll_interval": 0.5}},
    }}
    try:
        result = job.execute_in_process(run_config=config, raise_on_error=False)
        log = read_launch(env.store())
        tail = Path(str(log.log_file)).read_text(errors="replace")[-4000:] if log and log.log_file else ""
        assert result.success, tail
    finally:
        _stop_supervisor(env)

    store = env.store()
    launch = read_launch(store)
    assert launch is not None and "(dagster:submit_kill_restore.restart_from_snapshot" in launch.launched_by, launch
    assert launch.launched_by.startswith("restart restart-")  # by the restart operation's actor, in the op's process
    submitted = result.output_for_node("submit_streaming_job")
    assert (submitted["epoch"], submitted["state"]) == (1, "RUNNING")
    caught_up_1 = result.output_for_node("wait_until_healthy")
    assert (caught_up_1["status"], caught_up_1["epoch"], caught_up_1["batch_id"]) == ("healthy", 1, LAST_BATCH)
    savepoint = result.output_for_node("trigger_savepoint")
    assert (savepoint["action"], savepoint["outcome"], savepoint["batch_id"]) == ("savepoint", "completed", LAST_BATCH)
    manifest = load_manifest(store, savepoint["snapshot_id"])  # the snapshot exists, complete
    assert (manifest.kind, manifest.trigger, manifest.batch_id, manifest.job) == (
        Kind.SAVEPOINT, Trigger.MANUAL, LAST_BATCH, env.job)
    assert savepoint["snapshot_uri"] == store.snapshot_uri(savepoint["snapshot_id"])

    # The supervisor owned the restart; the sensor saw it in progress and never asked for a restart run.
    killed = result.output_for_node("kill_9_while_the_health_sensor_ticks")
    assert (killed["killed_epoch"], killed["running_epoch"]) == (1, 2)
    assert sum(n for n, _ in killed["ticks"]) == 0, killed["ticks"]
    assert any("restarts it" in message or "RESTARTING by the supervisor" in message
               for _, message in killed["ticks"]), killed["ticks"]

    restored = result.output_for_node("restart_from_snapshot")
    assert (restored["epoch"], restored["restarted_by"], restored["restore"]) == (
        3, "operation", savepoint["snapshot_id"])
    caught_up_2 = result.output_for_node("caught_up_again")
    cancelled = result.output_for_node("cancel_streaming_job")
    assert (cancelled["action"], cancelled["outcome"]) == ("cancel", "completed")
    final = read_status(store)
    assert final is not None and (final.state, final.epoch) == (JobState.STOPPED, 3)
    assert final.batch_id is not None and final.batch_id > LAST_BATCH
    assert (caught_up_2["status"], caught_up_2["epoch"], caught_up_2["batch_id"]) == ("healthy", 3, final.batch_id)
    assert final.restored_from == savepoint["snapshot_id"]
    commits = env.commits()
    assert [b for b, _ in commits[1]] == list(range(LAST_BATCH + 1))  # each batch committed once
    # The more records went in one batch or more, as the driver's triggers met the producer: each committed once,
    # from the savepoint's next batch on, by epoch 3 only.
    assert [b for b, _ in commits.get(2, [])] == []
    assert [b for b, _ in commits[3]] == list(range(LAST_BATCH + 1, final.batch_id + 1))
    assert env.consumed(final) == RECORDS + MORE
    assert env.final_counts() == expected_counts(RECORDS + MORE)


EXAMPLES = Path(examples.__file__).parent
#: orders_v1 submitted through the op, caught up, then upgraded by the upgrade op (the ``after`` edges order them).
SUBMIT_AND_UPGRADE = dg.GraphDefinition(
    name="submit_and_upgrade",
    node_defs=[submit_streaming_job, wait_until_healthy, upgrade_streaming_job],
    dependencies={"wait_until_healthy": {"started": dg.DependencyDefinition("submit_streaming_job")},
                  "upgrade_streaming_job": {"after": dg.DependencyDefinition("wait_until_healthy")}},
)


SAVEPOINT_AND_CANCEL = dg.GraphDefinition(
    name="savepoint_and_cancel", node_defs=[trigger_savepoint, cancel_streaming_job],
    dependencies={"cancel_streaming_job": {"after": dg.DependencyDefinition("trigger_savepoint")}})


@pytest.mark.full(proven_by="test_a_job_submitted_through_dagster_ops_rides_out_a_kill_9_... (the ops on real "
                            "Spark) and integration/test_rescale.py::test_ckpt_job_rescale_moves_a_deployment_... (the "
                            "driver the upgrade op runs, launcher/upgrade.JobUpgrade, end to end); the op itself: "
                            "unit/dagster/test_upgrade.py")
def test_the_upgrade_op_takes_orders_to_v2_with_its_state_refuses_an_incompatible_one_then_savepoint_and_cancel_ops(
    env: JobEnv, tmp_path: Path, launched_here: None
) -> None:
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, 300)
    # verify_batches unset: the job is caught up with no new input, so it is verified running without a batch (a
    # number would be required: 1 batch of v2 would wait for input that never comes and roll back).
    upgrade = {"job": env.job, "code_version": "v2", "job_file": str(EXAMPLES / "orders_v2.py"),
               "check_timeout": 240, "stop_timeout": 180, "verify_timeout": 240, "poll_interval": 0.5}
    config: dict[str, Any] = {"ops": {
        "submit_streaming_job": {"config": {
            "job": env.job, "job_file": str(EXAMPLES / "orders_v1.py"), "code_version": "v1", "poll_interval": 0.5,
            "env": {"ORDERS_BOOTSTRAP": env.kafka.bootstrap_servers, "ORDERS_TOPIC": env.topic,
                    "ORDERS_OUT": str(env.out), "ORDERS_GROUP": f"ckpt-{env.job}", "ORDERS_MAX_PER_BATCH": "100"},
            "settings": {"checkpoint": str(tmp_path / "checkpoint"), "heartbeat_interval": "1"},
            "start_timeout": 240}},
        "wait_until_healthy": {"config": {"job": env.job, "min_batches": 1000, "timeout": 240,  # caught up
                                          "poll_interval": 0.5}},
        "upgrade_streaming_job": {"config": upgrade},
    }}
    ckpt = resource(env)
    store = env.store()
    try:
        result = SUBMIT_AND_UPGRADE.to_job(resource_defs={CKPT_RESOURCE: ckpt}).execute_in_process(
            run_config=config, raise_on_error=False)
        assert result.success, [str(e.event_specific_data) for e in result.all_events if e.is_failure]
        assert read_totals(env.out) == expected_totals(300)  # v1's, before the upgrade
        upgraded = result.output_for_node("upgrade_streaming_job")
        assert (upgraded["from_version"], upgraded["to_version"], upgraded["upgrade_mode"], upgraded["epoch"]) == (
            "v1", "v2", "savepoint", 2)
        running = env.status()
        assert running is not None and (running.code_version, running.epoch) == ("v2", 2)
        assert str(running.restored_from).endswith(upgraded["snapshot_id"])  # the stop's savepoint
        produce_orders(env.kafka.bootstrap_servers, env.topic, 300, 150)
        deadline = time.monotonic() + 180
        while read_totals(env.out) != expected_totals(450):  # v1's totals carried on by v2: the state was kept
            assert time.monotonic() < deadline, read_totals(env.out)
            time.sleep(0.5)

        # orders_incompatible.py (a new grouping key): refused by the restore check, v2 runs on untouched.
        lease, requests = read_lease(store), store.storage.list(CONTROL)
        refused = dg.GraphDefinition(name="upgrade", node_defs=[upgrade_streaming_job]).to_job(
            resource_defs={CKPT_RESOURCE: ckpt}).execute_in_process(raise_on_error=False, run_config={"ops": {
                "upgrade_streaming_job": {"config": upgrade | {"job_file": str(EXAMPLES / "orders_incompatible.py"),
                                                               "code_version": "bad"}}}})
        [failed] = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
        data = failed.step_failure_data.user_failure_data
        assert data is not None
        message = str(data.description)
        assert "refused before anything was stopped: restore check of snapshot " in message, message
        assert "with the new code: incompatible" in message and message.endswith("the job runs as before")
        after = env.status()
        assert after is not None and (after.state, after.epoch, after.code_version) == (JobState.RUNNING, 2, "v2")
        assert read_lease(store) == lease and store.storage.list(CONTROL) == requests  # not even a stop requested

        # A savepoint of v2's state through the op, then a cancel through the op.
        ops: dict[str, Any] = {"job": env.job, "timeout": 180, "poll_interval": 0.5}
        done = SAVEPOINT_AND_CANCEL.to_job(resource_defs={CKPT_RESOURCE: ckpt}).execute_in_process(
            raise_on_error=False, run_config={"ops": {"trigger_savepoint": {"config": ops},
                                                      "cancel_streaming_job": {"config": ops}}})
        assert done.success, [str(e.event_specific_data) for e in done.all_events if e.is_failure]
        final = env.status()
        savepoint = done.output_for_node("trigger_savepoint")
        assert (savepoint["action"], savepoint["outcome"]) == ("savepoint", "completed"), savepoint
        manifest = load_manifest(store, savepoint["snapshot_id"])  # the snapshot exists, complete
        assert (manifest.kind, manifest.trigger, manifest.batch_id, manifest.code_version) == (
            Kind.SAVEPOINT, Trigger.MANUAL, savepoint["batch_id"], "v2"), manifest
        assert savepoint["snapshot_uri"] == store.snapshot_uri(savepoint["snapshot_id"])
        assert done.output_for_node("cancel_streaming_job")["outcome"] == "completed"
        assert final is not None and (final.state, final.epoch) == (JobState.STOPPED, 2), final
        assert read_totals(env.out) == expected_totals(450)
    finally:
        status = env.status()
        if status is not None and status.state is JobState.RUNNING:
            env.request(RequestAction.CANCEL, status.epoch)
        _stop_supervisor(env)
