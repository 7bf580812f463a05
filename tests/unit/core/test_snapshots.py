"""A corrupt manifest is reported once per snapshot by a running driver, not after every batch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.manifest import Kind, Trigger
from airflow_ckpt_provider.core.retention import RetentionPolicy
from airflow_ckpt_provider.core.snapshots import create_snapshot, list_snapshots
from airflow_ckpt_provider.core.storage import LocalStorage
from airflow_ckpt_provider.runtime.snapshotter import SnapshotJob, Snapshotter
from tests.support.ckptfactory import make_checkpoint, write_batch


def test_a_corrupt_manifest_is_warned_about_once_per_snapshot_not_after_every_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    bad = [create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT).manifest.snapshot_id for _ in range(2)]
    for snapshot_id in bad:
        manifest = tmp_path / "store" / "orders" / "snapshots" / snapshot_id / "manifest.json"
        manifest.write_bytes(manifest.read_bytes().replace(b'"batch_id": 1', b'"batch_id": 0'))
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=3),
                              fence=lambda: None, on_done=lambda _outcome: None, labels={"epoch": "1"})
    try:
        with caplog.at_level(logging.WARNING):
            for batch in range(2, 6):  # four batches, each followed by a checkpoint and retention
                write_batch(ckpt, batch)
                snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))
            list_snapshots(store)  # e.g. the CLI or a trigger in the same process
    finally:
        snapshotter.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # manifests are read in parallel: the two warnings may come in either order
    assert sorted(w.split(":", 1)[0] for w in warnings) == [f"job orders snapshot {sid}" for sid in sorted(bad)]
    assert all("skipped, its manifest cannot be trusted" in w and "is corrupt" in w for w in warnings)
