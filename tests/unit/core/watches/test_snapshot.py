"""SnapshotWatch on a real local job store: the newest completed snapshot created after a time, of a kind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.core.watches.snapshot import SnapshotWatch
from tests.support.ckptfactory import write_batch

# -- snapshots ------------------------------------------------------------------------------------------


def test_snapshot_watch_reports_the_newest_completed_snapshot_after_the_time(
    store: JobStore, checkpoint: LocalStorage
) -> None:
    old = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    after = time.time()
    assert old.manifest.created.timestamp() < after
    watch = SnapshotWatch(store, after=after)
    assert watch.poll() is None
    assert "no completed snapshot" in watch.waiting_for()
    write_batch(Path(checkpoint.root), 3)
    first = create_snapshot(store, checkpoint, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    second = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    newest = max((first, second), key=lambda r: (r.manifest.created_at, r.manifest.batch_id))
    event = watch.poll()
    assert event is not None and newest.uri in event.pop("message")
    assert event == {
        "status": "completed", "snapshot_id": newest.manifest.snapshot_id, "kind": newest.manifest.kind.value,
        "batch_id": 3, "uri": newest.uri, "created_at": newest.manifest.created_at, "job": "orders",
    }


def test_snapshot_watch_filters_by_kind(store: JobStore, checkpoint: LocalStorage) -> None:
    watch = SnapshotWatch(store, after=time.time() - 1, kind="savepoint")
    create_snapshot(store, checkpoint, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    assert watch.poll() is None
    savepoint = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    event = watch.poll()
    assert event is not None and (event["snapshot_id"], event["kind"]) == (savepoint.manifest.snapshot_id,
                                                                          "savepoint")
    with pytest.raises(ConfigError, match="kind"):
        SnapshotWatch(store, after=0, kind="backup")


def test_snapshot_watch_skips_a_corrupt_manifest(store: JobStore, checkpoint: LocalStorage) -> None:
    watch = SnapshotWatch(store, after=time.time() - 1)
    result = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    key = store.manifest_key(result.manifest.snapshot_id)
    store.storage.write(key, store.storage.read(key).replace(b'"batch_id":2', b'"batch_id":1'))
    assert watch.poll() is None  # its checksum no longer matches: not a completed snapshot
