"""Scheduled on "a new savepoint of job X": an asset event per completed savepoint, from the triggerer.

The asset's watcher (``SnapshotEventTrigger``) polls the job store in the triggerer: no worker slot is held
while nothing happens. Each new savepoint (periodic, on request, at a stop or an upgrade) becomes one asset
event whose ``extra["payload"]`` carries the snapshot's id, kind, batch and URI; the run's task reads them from
``triggering_asset_events``. Events come at least once (docs/airflow.md, "Scheduling on savepoints and lag"):
key downstream work on the snapshot id. Unpause the DAG to start the watcher.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_ckpt_provider.triggers.events import SnapshotEventTrigger

JOB = os.environ.get("CKPT_EXAMPLE_JOB", "orders")
log = logging.getLogger(__name__)

# [START howto_on_savepoint]
savepoints = Asset(
    f"ckpt://ckpt_store_default/{JOB}/savepoints",  # ckpt://<job store connection>/<job>/savepoints
    watchers=[AssetWatcher(name=f"{JOB}_savepoints", trigger=SnapshotEventTrigger(job=JOB, poll_interval=5))],
)

with DAG(
    dag_id="ckpt_on_savepoint",
    schedule=[savepoints],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["ckpt", "example"],
) as dag:

    @task
    def use_savepoints(*, triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """One run may carry several savepoints (events queued while the DAG was busy): handle each."""
        done = []
        for event in triggering_asset_events[savepoints]:
            snapshot = event.extra["payload"]
            log.info("savepoint %s of batch %s: %s", snapshot["snapshot_id"], snapshot["batch_id"], snapshot["uri"])
            # Copy it off-site, register it in a catalog, restore a test environment from it...
            done.append({k: snapshot[k] for k in ("snapshot_id", "batch_id", "uri")})
        return done

    use_savepoints()
# [END howto_on_savepoint]
