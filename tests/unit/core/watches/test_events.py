"""SnapshotEventWatch on a real local job store (each new snapshot once, across re-creation from its cursor),
and the Crossing hysteresis."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.catalog import SnapshotResult, create_snapshot, dispose_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import SNAPSHOTS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.core.watches.events import Crossing, SnapshotEventWatch
from tests.support.ckptfactory import write_batch


def snap(store: JobStore, checkpoint: LocalStorage, kind: Kind, batch: int) -> SnapshotResult:
    write_batch(Path(checkpoint.root), batch)
    return create_snapshot(store, checkpoint, kind=kind, trigger=Trigger.MANUAL)


def drain(watch: SnapshotEventWatch) -> list[str]:
    out = []
    while (event := watch.poll()) is not None:
        out.append(event["snapshot_id"])
    return out


def test_each_new_savepoint_is_announced_once_oldest_first_and_the_baseline_never(
    store: JobStore, checkpoint: LocalStorage
) -> None:
    before = snap(store, checkpoint, Kind.SAVEPOINT, 3)
    watch = SnapshotEventWatch(store)
    assert watch.poll() is None and watch.baseline
    assert watch.cursor() == {"seen": [before.manifest.snapshot_id]}
    first = snap(store, checkpoint, Kind.SAVEPOINT, 4)
    snap(store, checkpoint, Kind.CHECKPOINT, 5)
    second = snap(store, checkpoint, Kind.SAVEPOINT, 6)
    event = watch.poll()
    assert not watch.baseline
    assert event is not None and first.uri in event.pop("message")
    assert event == {"status": "completed", "job": "orders", "snapshot_id": first.manifest.snapshot_id,
                     "kind": "savepoint", "batch_id": 4, "uri": first.uri, "created_at": first.manifest.created_at,
                     "trigger": "manual"}
    assert drain(watch) == [second.manifest.snapshot_id]
    assert drain(watch) == []


def test_a_watch_recreated_from_its_cursor_neither_repeats_nor_skips(store: JobStore, checkpoint: LocalStorage) -> None:
    watch = SnapshotEventWatch(store, kinds=["savepoint", "checkpoint"])
    assert drain(watch) == []
    a = snap(store, checkpoint, Kind.CHECKPOINT, 3)
    assert drain(watch) == [a.manifest.snapshot_id]
    cursor = watch.cursor()
    b = snap(store, checkpoint, Kind.SAVEPOINT, 4)  # while no watch runs (a triggerer restart)
    again = SnapshotEventWatch(store, kinds=["checkpoint", "savepoint"], cursor=cursor)
    assert drain(again) == [b.manifest.snapshot_id]
    assert not again.baseline


def test_disposed_snapshots_leave_the_cursor_and_foreign_or_corrupt_ones_are_skipped(
    store: JobStore, checkpoint: LocalStorage
) -> None:
    old = snap(store, checkpoint, Kind.SAVEPOINT, 3)
    watch = SnapshotEventWatch(store)
    drain(watch)
    dispose_snapshot(store, old.manifest.snapshot_id, force=True)
    bad = "savepoint-9-20260101T000000Z-abcdef"
    store.storage.write(f"{SNAPSHOTS}{bad}/manifest.json", b"{not json")
    new = snap(store, checkpoint, Kind.SAVEPOINT, 4)
    assert drain(watch) == [new.manifest.snapshot_id]
    assert watch.cursor() == {"seen": sorted([bad, new.manifest.snapshot_id])}
    assert watch.waiting_for().endswith("last seen: 2 snapshots, 0 new")


def test_unknown_kinds_are_refused_with_the_allowed_values(store: JobStore) -> None:
    with pytest.raises(ConfigError, match="expected one of checkpoint, savepoint"):
        SnapshotEventWatch(store, kinds=["savepoints"])
    with pytest.raises(ConfigError, match="no snapshot kinds"):
        SnapshotEventWatch(store, kinds=[])


def test_crossing_fires_once_per_rise_and_rearms_below_the_lower_mark() -> None:
    crossing = Crossing(100, rearm_below=50)
    fired = [crossing.update(v) for v in (10, 101, 500, 99, 60, 49, 150, 150)]
    assert fired == [False, True, False, False, False, False, True, False]
    restored = Crossing(100, rearm_below=50, cursor=crossing.cursor())
    assert crossing.cursor() == {"armed": False} and restored.update(150) is False
    assert Crossing(100).update(101) is True
    with pytest.raises(ConfigError, match="rearm_below 200 must be at most the threshold 100"):
        Crossing(100, rearm_below=200)
