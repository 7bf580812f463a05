"""The sensors and asset checks, evaluated with real Dagster on a local job store: they announce what the same
watches as the Airflow triggers see (a new savepoint, an unhealthy job, committed batches) and nothing twice."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import dagster as dg

from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.dagster import (
    CKPT_RESOURCE,
    CkptResource,
    job_health_sensor,
    job_output_asset,
    job_output_checks,
    job_output_sensor,
    snapshot_sensor,
)
from tests.support.operatorfakes import make_snapshots

RESTART = dg.GraphDefinition(name="restart", node_defs=[]).to_job()


def report(store: JobStore, **changes: Any) -> JobStatus:
    now = time.time()
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": now,
                            "started_at": now - 60, "batch_id": 7, "batch_at": now - 1}
    status = JobStatus(**body | changes)
    assert write_status(store, status)
    return status


def tick(sensor: dg.SensorDefinition, ckpt: CkptResource, cursor: str | None = None) -> Any:
    with dg.build_sensor_context(resources={CKPT_RESOURCE: ckpt}, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def test_each_new_savepoint_is_one_run_and_one_materialization_with_its_id_batch_and_uri(
    store: JobStore, ckpt: CkptResource, tmp_path: Path
) -> None:
    asset = dg.AssetKey(["orders", "savepoints"])
    sensor = snapshot_sensor("orders", run_job=RESTART, asset_key=asset)
    [old] = make_snapshots(store, tmp_path / "a", [Kind.SAVEPOINT])
    baseline = tick(sensor, ckpt)  # what is there when the sensor starts is not announced
    assert baseline.run_requests == [] and json.loads(baseline.cursor) == {"seen": [old]}
    new = make_snapshots(store, tmp_path / "b", [Kind.CHECKPOINT, Kind.SAVEPOINT])
    announced = tick(sensor, ckpt, baseline.cursor)
    [run] = announced.run_requests
    savepoint = new[1]  # the checkpoint is not a savepoint
    assert run.run_key == savepoint
    assert (run.tags["ckpt/snapshot_id"], run.tags["ckpt/batch_id"], run.tags["ckpt/uri"]) == (
        savepoint, "1", store.snapshot_uri(savepoint))
    [materialization] = announced.asset_events
    assert materialization.asset_key == asset
    assert materialization.metadata["snapshot_id"].value == savepoint
    assert materialization.metadata["batch_id"].value == 1
    assert materialization.metadata["uri"].value == store.snapshot_uri(savepoint)
    again = tick(sensor, ckpt, announced.cursor)
    assert again.run_requests == [] and again.asset_events == []


def test_an_unhealthy_job_is_one_restart_run_per_epoch_and_reason(store: JobStore, ckpt: CkptResource) -> None:
    sensor = job_health_sensor("orders", restart_job=RESTART, name="orders_health_failed")
    report(store)
    healthy = tick(sensor, ckpt)
    assert healthy.run_requests == []
    assert "job orders: watching for a fault; last seen: RUNNING" in healthy.skip_message
    report(store, state=JobState.FAILED, reason="sink raised")
    [run] = tick(sensor, ckpt).run_requests
    assert run.run_key == "orders-unhealthy-3-failed"
    assert (run.tags["ckpt/job"], run.tags["ckpt/reason"]) == ("orders", "failed")


def test_a_silent_driver_nobody_restarts_is_unhealthy_without_a_heartbeat(store: JobStore,
                                                                           ckpt: CkptResource) -> None:
    sensor = job_health_sensor("orders", restart_job=RESTART, name="orders_health_silent")
    report(store, updated_at=time.time() - 600, heartbeat_interval=5.0)
    [run] = tick(sensor, ckpt).run_requests
    assert run.run_key == "orders-unhealthy-3-no_heartbeat"


def test_committed_batches_are_materialized_once_per_window(store: JobStore, ckpt: CkptResource) -> None:
    asset = job_output_asset("orders")
    sensor = job_output_sensor("orders", asset)
    report(store, batch_id=7, lag=12)
    first = tick(sensor, ckpt)
    [m] = first.asset_events
    assert (m.asset_key, m.metadata["first_batch_id"].value, m.metadata["batch_id"].value,
            m.metadata["lag"].value) == (dg.AssetKey(["orders", "output"]), 7, 7, 12)
    assert tick(sensor, ckpt, first.cursor).asset_events == []  # no new batch: nothing
    report(store, batch_id=10)
    [m] = tick(sensor, ckpt, first.cursor).asset_events
    assert (m.metadata["first_batch_id"].value, m.metadata["batch_id"].value) == (8, 10)


def check_results(ckpt: CkptResource, **kwargs: Any) -> dict[str, tuple[bool, str | None]]:
    asset = job_output_asset("orders")
    job = dg.define_asset_job("checks", selection=dg.AssetSelection.checks_for_assets(asset.key))
    defs = dg.Definitions(assets=[asset], asset_checks=job_output_checks("orders", asset, **kwargs), jobs=[job],
                          resources={CKPT_RESOURCE: ckpt})
    result = defs.resolve_job_def("checks").execute_in_process()
    return {e.check_name: (e.passed, e.description) for e in result.get_asset_check_evaluations()}


def test_the_freshness_and_lag_checks_pass_for_a_live_job_within_its_limits(store: JobStore,
                                                                              ckpt: CkptResource) -> None:
    report(store, lag=40)
    assert check_results(ckpt, max_batch_age=60, max_lag=100) == {
        "fresh": (True, None), "lag": (True, "job orders: 40 records behind (at most 100)")}


def test_the_checks_fail_for_a_stale_heartbeat_an_old_batch_and_a_high_lag(store: JobStore,
                                                                          ckpt: CkptResource) -> None:
    report(store, updated_at=time.time() - 120, heartbeat_interval=5.0, lag=500)
    results = check_results(ckpt, max_batch_age=60, max_lag=100)
    assert results["fresh"][0] is False
    assert "job orders: expected RUNNING with a heartbeat within 20 s, found RUNNING with the last heartbeat" \
           in str(results["fresh"][1])
    assert results["lag"] == (False, "job orders: 500 records behind (at most 100)")
    report(store, batch_at=time.time() - 300, data_waiting=True)
    fresh = check_results(ckpt, max_batch_age=60)["fresh"]
    assert fresh[0] is False
    # 300 s, or a few more on a loaded machine where the check runs seconds after the report
    assert re.search(r"job orders: expected a batch within 60 s while data waits, found the last one \(batch 7\) "
                     r"30\d s ago", str(fresh[1]))
