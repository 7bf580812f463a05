"""A corrupt manifest is reported once per snapshot by a running driver, not after every batch."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.generation import Generation
from airflow_ckpt_provider.core.snapshots import catalog as snapshots_module
from airflow_ckpt_provider.core.snapshots.catalog import (
    apply_retention,
    dispose_snapshot,
    forget_manifests,
    list_snapshots,
    verify_snapshot,
)
from airflow_ckpt_provider.core.snapshots.gc import collect_garbage
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.snapshots.snapshotwrite import KNOWN_MAX_AGE_S, forget_objects, known_objects
from airflow_ckpt_provider.core.store.jobstore import GC_GENERATION, OBJECTS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime.snapshotter import SnapshotJob, Snapshotter
from tests.support.ckptfactory import make_checkpoint, write_batch

#: This module proves the object protocol (the gc handshake, the known objects, retention): the factory's files are a
#: few bytes each, so here none goes into the manifest (tests/unit/core/test_inline_files.py proves inline files).
create_snapshot = functools.partial(snapshots_module.create_snapshot, inline_max=0)


def test_a_corrupt_manifest_is_warned_about_once_per_snapshot_not_after_every_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    bad = [create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT).manifest.snapshot_id for _ in range(2)]
    for snapshot_id in bad:
        manifest = tmp_path / "store" / "orders" / "snapshots" / snapshot_id / "manifest.json"
        manifest.write_bytes(manifest.read_bytes().replace(b'"batch_id":1', b'"batch_id":0'))
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


# --------------------------------------------------------------------------------------------
# The object list a writer keeps between snapshots (core/snapshots/snapshotwrite.known_objects)
# --------------------------------------------------------------------------------------------


def count_object_lists(store: JobStore) -> list[str]:
    """Record each LIST of the store's objects/ prefix."""
    calls: list[str] = []
    original = store.storage.list

    def counted(prefix: str = "") -> Any:
        if prefix == OBJECTS:
            calls.append(prefix)
        return original(prefix)

    store.storage.list = counted  # type: ignore[method-assign]  # a test spy on one instance
    return calls


@pytest.fixture(autouse=True)
def _no_cached_lists() -> Any:
    forget_objects()
    forget_manifests()
    yield
    forget_objects()
    forget_manifests()


def test_a_second_snapshot_in_the_process_lists_no_objects_while_no_gc_deleted_any(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lists = count_object_lists(store)
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    write_batch(ckpt, 2)
    second = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    assert lists == []  # a new store (its first writer made the token): nothing to list; then the process's list
    stored = {f.sha256 for f in first.manifest.files}
    reused = [f for f in second.manifest.files if f.sha256 in stored]
    assert reused and second.stats.skipped_files == len(reused)  # what the first stored is not sent again
    assert verify_snapshot(store, second.manifest.snapshot_id).ok
    lists.clear()  # verify listed them too
    forget_objects()  # another process, e.g. the CLI: one LIST of the store it finds
    third = create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT)
    assert len(lists) == 1 and third.stats.files == 0


def test_a_gc_that_deleted_objects_makes_the_next_snapshot_list_them_again_and_store_what_went(
        tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lists = count_object_lists(store)
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    dispose_snapshot(store, first.manifest.snapshot_id)
    result = collect_garbage(store, min_age_s=0)
    assert result.deleted_objects == len({f.sha256 for f in first.manifest.files})
    assert not Generation.parse(store.storage.read(GC_GENERATION)).held  # released after the objects went
    again = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    assert len(lists) == 2  # gc's, then the next snapshot's after its handshake found a new token
    assert again.stats.skipped_files == 0  # every object stored again
    assert verify_snapshot(store, again.manifest.snapshot_id).ok


def spy_generation(store: JobStore) -> list[str]:
    """Record each request for the store's gc generation token: "read", "create" or "write"."""
    calls: list[str] = []
    for name in ("read", "create", "write"):
        original = getattr(store.storage, name)

        def counted(key: str, *args: Any, _original: Any = original, _name: str = name) -> Any:
            if key == GC_GENERATION:
                calls.append(_name)
            return _original(key, *args)

        setattr(store.storage, name, counted)
    return calls


def test_the_first_writer_of_a_new_store_creates_its_generation_in_one_request_and_keeps_an_existing_one(
        tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.snapshots import snapshotwrite

    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    new = JobStore(LocalStorage(tmp_path / "new"), "orders")
    calls = spy_generation(new)
    create_snapshot(new, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    assert calls == ["create", "read"]  # created before the uploads, read again after the handshake
    created = new.storage.read(GC_GENERATION)
    assert json.loads(created)["by"] == "writer"
    assert snapshotwrite._listed[new.url].token == Generation.parse(created).token

    old = JobStore(LocalStorage(tmp_path / "old"), "orders")
    old.storage.write(GC_GENERATION, b'{"token": "from-gc"}')
    calls = spy_generation(old)
    create_snapshot(old, LocalStorage(ckpt), kind=Kind.CHECKPOINT)  # first in this process: keeps gc's token
    assert calls == ["create", "read", "read"]
    create_snapshot(old, LocalStorage(ckpt), kind=Kind.CHECKPOINT)  # later snapshots: the handshake's read only
    assert calls == ["create", "read", "read", "read"]
    assert old.storage.read(GC_GENERATION) == b'{"token": "from-gc"}'
    assert snapshotwrite._listed[old.url].token == "from-gc"


def test_a_gc_that_deleted_nothing_keeps_the_generation_and_an_old_list_is_listed_again(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    generation = Generation.parse(store.storage.read(GC_GENERATION))  # made by the first writer
    assert collect_garbage(store, min_age_s=0).deleted_objects == 0
    assert Generation.parse(store.storage.read(GC_GENERATION)) == generation
    forget_objects()
    now = [0.0]

    def known_how() -> str:
        with ThreadPoolExecutor(max_workers=1) as pool:
            token, listing, how = known_objects(store, pool, clock=lambda: now[0])
            assert token == generation.token and listing.result()
            return how

    assert known_how() == "listed"  # no list of this clock yet
    now[0] = KNOWN_MAX_AGE_S - 1
    assert known_how() == "kept"
    now[0] = KNOWN_MAX_AGE_S + 1
    assert known_how() == "listed"  # too old: listed again


def count_reads(store: JobStore) -> list[str]:
    """Record each key read from the store."""
    reads: list[str] = []
    original = store.storage.read

    def counted(key: str) -> bytes:
        reads.append(key)
        return original(key)

    store.storage.read = counted  # type: ignore[method-assign]  # a test spy on one instance
    return reads


def test_listing_snapshots_again_reads_only_new_or_changed_manifests(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    ids = [create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT).manifest.snapshot_id for _ in range(3)]
    reads = count_reads(store)
    assert [m.snapshot_id for m in list_snapshots(store)] == ids
    assert sorted(reads) == sorted(store.manifest_key(i) for i in ids)  # the process's first listing reads each
    assert [m.snapshot_id for m in list_snapshots(store)] == ids
    assert len(reads) == len(ids)  # nothing read again: the LIST's size and tag are unchanged
    newest = create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT).manifest.snapshot_id
    changed = store.manifest_key(ids[0])
    store.storage.write(changed, store.storage.read(changed) + b" ")  # the same manifest, another size and tag
    reads.clear()
    assert [m.snapshot_id for m in list_snapshots(store)] == [*ids, newest]
    assert reads == [changed]  # not the newest: this process created it, and its tag is the one listed


def test_a_manifest_changed_after_this_process_created_it_is_read_by_its_next_listing(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT).manifest
    assert list_snapshots(store) == [first]
    write_batch(ckpt, 2)
    second = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT).manifest
    key = store.manifest_key(second.snapshot_id)
    body = store.storage.read(key)
    store.storage.write(key, body.replace(b'"batch_id":2', b'"batch_id":3'))  # the same size: its tag tells
    reads = count_reads(store)
    assert list_snapshots(store) == [first]  # read, found corrupt (its checksum), skipped
    assert reads == [key]


def gc_generation_writes(monkeypatch: pytest.MonkeyPatch) -> list[Generation]:
    """Record each generation token gc writes."""
    from airflow_ckpt_provider.core.snapshots import gc as gc_module

    written: list[Generation] = []
    real = gc_module.write_generation

    def spy(store: JobStore, generation: Generation) -> None:
        written.append(generation)
        real(store, generation)

    monkeypatch.setattr(gc_module, "write_generation", spy)
    return written


def test_gc_flags_its_token_while_at_work_and_renews_it_before_and_after_its_deletes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    token = Generation.parse(store.storage.read(GC_GENERATION)).token
    written = gc_generation_writes(monkeypatch)

    assert collect_garbage(store, min_age_s=0, dry_run=True).deleted_objects == 0
    assert written == []  # a dry run leaves the token alone

    assert collect_garbage(store, min_age_s=0).deleted_objects == 0  # all referenced
    assert written == [Generation(token, held=True), Generation(token, held=False)]  # nothing deleted: same token

    written.clear()
    dispose_snapshot(store, first.manifest.snapshot_id)
    assert collect_garbage(store, min_age_s=0).deleted_objects > 0
    held, before, after = written
    assert (held, before.held, after.held) == (Generation(token, held=True), True, False)
    assert len({token, before.token, after.token}) == 3  # new before the first delete, new again after the last
    assert Generation.parse(store.storage.read(GC_GENERATION)) == after

    written.clear()
    store.storage.write(store.pending_key("savepoint-9-20261122T000000Z-abcdef"), b"{}")  # a writer at work
    assert collect_garbage(store, min_age_s=0).deferred is not None
    assert written == [Generation(after.token, held=True), Generation(after.token, held=False)]


def test_a_gc_that_fails_while_deleting_still_renews_and_releases_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    dispose_snapshot(store, create_snapshot(store, LocalStorage(ckpt)).manifest.snapshot_id, force=True)
    written = gc_generation_writes(monkeypatch)
    real_delete = store.storage.delete

    def failing(keys: Any) -> None:
        keys = list(keys)
        real_delete(keys[:1])  # one object went, then the store failed
        if keys:
            raise StorageError("injected: delete failed midway")

    monkeypatch.setattr(store.storage, "delete", failing)
    with pytest.raises(StorageError, match="midway"):
        collect_garbage(store, min_age_s=0)
    assert [g.held for g in written] == [True, True, False]
    assert len({g.token for g in written}) == 3  # renewed before the deletes and again after the failure
    assert not Generation.parse(store.storage.read(GC_GENERATION)).held


def test_a_writer_that_finds_the_token_held_by_a_gc_that_died_lists_the_objects_again_and_commits(
        tmp_path: Path) -> None:
    """gc died after flagging the token (its lock removed by hand, or stale): the writer does not wait for a gc
    that is gone, and trusts no list read before: it lists again."""
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    token = Generation.parse(store.storage.read(GC_GENERATION)).token
    store.storage.write(GC_GENERATION, Generation(token, held=True).body("gc"))  # no lock: that gc is gone
    lists = count_object_lists(store)
    write_batch(ckpt, 2)
    again = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    assert len(lists) == 1  # listed again after the handshake, though the process kept a list
    assert verify_snapshot(store, again.manifest.snapshot_id).ok


def test_a_store_wiped_and_made_again_is_listed_again_not_taken_for_the_one_listed_before(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lists = count_object_lists(store)
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    shutil.rmtree(tmp_path / "store" / "orders")  # by hand, within the list's age: no gc, no token
    again = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
    assert len(lists) == 1 and again.stats.skipped_files == 0  # its handshake found a new token: listed again
    assert verify_snapshot(store, again.manifest.snapshot_id).ok


def test_a_disposed_manifest_leaves_the_process_cache_at_the_next_listing(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    ids = [create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT).manifest.snapshot_id for _ in range(2)]
    list_snapshots(store)
    assert sorted(m.snapshot_id for m in snapshots_module._manifests[store.url].values()) == sorted(ids)
    dispose_snapshot(store, ids[0], force=True)
    assert [m.snapshot_id for m in list_snapshots(store)] == ids[1:]
    assert [m.snapshot_id for m in snapshots_module._manifests[store.url].values()] == ids[1:]


def test_a_checkpoint_reads_the_lease_once_at_its_commit_point_and_a_savepoint_also_before_uploading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit point's lease check follows the gc handshake, which may wait for gc: a driver fenced meanwhile
    (gc then clears its marker after pending.FENCED_GRACE_S) never publishes."""
    from airflow_ckpt_provider.core.snapshots import snapshotwrite
    from airflow_ckpt_provider.runtime import snapshotter as snapshotter_module

    monkeypatch.setattr(snapshotter_module, "RETENTION_INTERVAL_S", 3600.0)  # no retention by the clock
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    steps: list[str] = []
    real_handshake = snapshotwrite._handshake

    def handshake(*args: Any, **kwargs: Any) -> Any:
        token = real_handshake(*args, **kwargs)
        steps.append("handshake done")
        return token

    monkeypatch.setattr(snapshotwrite, "_handshake", handshake)
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=5),
                              fence=lambda: steps.append("fence"), on_done=lambda _outcome: None)
    try:
        snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))  # the first retention runs: fence first
        assert steps == ["handshake done", "fence", "fence"]
        steps.clear()
        write_batch(ckpt, 2)
        snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))  # within the retention interval
        assert steps == ["handshake done", "fence"]
        steps.clear()
        snapshotter.take(SnapshotJob(Kind.SAVEPOINT, Trigger.MANUAL))  # before upload, commit point, retention
        assert steps == ["fence", "handshake done", "fence", "fence"]
    finally:
        snapshotter.close()


def test_committed_checkpoints_markers_go_in_one_request_with_retention_and_gc_takes_them_for_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.runtime import snapshotter as snapshotter_module

    monkeypatch.setattr(snapshotter_module, "RETENTION_INTERVAL_S", 3600.0)  # no retention by the clock
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    deletes: list[list[str]] = []
    original = store.storage.delete

    def counted(keys: Any) -> None:
        keys = list(keys)
        if any(k.startswith("pending/") for k in keys):
            deletes.append(keys)
        original(keys)

    store.storage.delete = counted  # type: ignore[method-assign]  # a test spy on one instance
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=5),
                              fence=lambda: None, on_done=lambda _outcome: None)
    try:
        snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))  # the first retention: its marker goes
        assert store.storage.list("pending/") == []
        ids = []
        for batch in (2, 3):  # within the retention interval: the markers stay, their snapshots committed
            write_batch(ckpt, batch)
            ids.append(snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC)).manifest.snapshot_id)
        assert [o.key for o in store.storage.list("pending/")] == [store.pending_key(i) for i in sorted(ids)]
        assert collect_garbage(store).deferred is None  # gc takes them for finished, not for writers at work
        assert store.storage.list("pending/") == []
        write_batch(ckpt, 4)
        last = snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC)).manifest.snapshot_id
    finally:
        snapshotter.close()
    assert store.storage.list("pending/") == []  # close() deleted the last one
    # three requests: the first retention's, gc's (with its garbage), and close()'s for all three committed since
    assert len(deletes) == 3 and deletes[-1] == [store.pending_key(i) for i in [*ids, last]]


def test_disposing_a_snapshot_takes_its_leftover_marker_so_gc_never_mistakes_it_for_a_writer_at_work(
        tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = LocalStorage(make_checkpoint(tmp_path / "ckpt", 2))
    # markers a killed driver left behind: snapshots committed, their markers not yet deleted in a batch
    first = create_snapshot(store, ckpt, kind=Kind.CHECKPOINT, keep_marker=True).manifest.snapshot_id
    write_batch(tmp_path / "ckpt", 2)
    second = create_snapshot(store, ckpt, kind=Kind.CHECKPOINT, keep_marker=True).manifest.snapshot_id
    write_batch(tmp_path / "ckpt", 3)
    third = create_snapshot(store, ckpt, kind=Kind.SAVEPOINT, keep_marker=True).manifest.snapshot_id
    assert len(store.storage.list("pending/")) == 3
    apply_retention(store, RetentionPolicy(checkpoints_keep=1))  # disposes the first checkpoint
    dispose_snapshot(store, third, force=True)
    assert [o.key for o in store.storage.list("pending/")] == [store.pending_key(second)]
    result = collect_garbage(store, min_age_s=0)
    assert result.deferred is None and result.deleted_objects > 0
    assert store.storage.list("pending/") == []
    assert [m.snapshot_id for m in list_snapshots(store)] == [second] and first != second


def test_a_fenced_driver_publishes_no_checkpoint(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.records.lease import FencedError

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)

    def fence() -> None:
        raise FencedError("job orders: this driver was fenced")

    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=5),
                              fence=fence, on_done=lambda _outcome: None)
    try:
        with pytest.raises(FencedError):
            snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))
    finally:
        snapshotter.close()
    assert list_snapshots(store) == []
    assert store.storage.list("pending/") == []


def test_the_snapshotter_applies_retention_after_a_savepoint_and_after_checkpoints_at_most_every_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.runtime import snapshotter as snapshotter_module

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=2),
                              fence=lambda: None, on_done=lambda _outcome: None)

    def checkpoints() -> int:
        return len(list_snapshots(store, Kind.CHECKPOINT))

    try:
        for batch in range(2, 7):  # five checkpoints within the interval: retention ran after the first only
            write_batch(ckpt, batch)
            snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))
        assert checkpoints() == 5
        snapshotter.take(SnapshotJob(Kind.SAVEPOINT, Trigger.MANUAL))  # a savepoint: retention now
        assert checkpoints() == 2
        for batch in range(7, 9):
            write_batch(ckpt, batch)
            snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))
        assert checkpoints() == 4
        monkeypatch.setattr(snapshotter_module, "RETENTION_INTERVAL_S", 0.0)  # the interval has passed
        write_batch(ckpt, 9)
        snapshotter.take(SnapshotJob(Kind.CHECKPOINT, Trigger.PERIODIC))
        assert checkpoints() == 2
    finally:
        snapshotter.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.parametrize("lower", [10, 0])  # the default snapshot_nice, and 0: the driver's own priority
def test_the_snapshot_thread_and_the_threads_it_starts_run_at_a_lower_cpu_priority_than_the_driver(
        tmp_path: Path, lower: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = nice()
    seen: list[int] = []
    done = threading.Event()

    def on_done(outcome: Any) -> None:  # called on the snapshot thread, after the snapshot
        assert outcome.error is None
        seen.append(nice())
        with ThreadPoolExecutor(1) as pool:  # a thread it starts, as the uploads' are
            seen.append(pool.submit(nice).result())
        done.set()

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    snapshotter = Snapshotter(store, LocalStorage(make_checkpoint(tmp_path / "ckpt", 2)),
                              retention=RetentionPolicy(checkpoints_keep=5), fence=lambda: None, on_done=on_done,
                              nice=lower)
    try:
        snapshotter.checkpoint_now()
        assert done.wait(30), "no checkpoint snapshot within 30 s"
    finally:
        snapshotter.close()
    assert seen == [min(19, before + lower)] * 2
    assert nice() == before  # the driver's own threads keep theirs


def test_retention_disposes_of_every_due_snapshot_in_one_delete_request_and_retries_a_failed_one_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    ids = []
    for batch in range(2, 6):
        write_batch(ckpt, batch)
        ids.append(create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT).manifest.snapshot_id)
    deletes: list[list[str]] = []
    real = store.storage.delete
    failing = [True]

    def delete(keys: Any) -> None:
        deletes.append(list(keys))
        if failing[0]:
            raise StorageError("delete under the store: 2 objects were not deleted, first x: SlowDown")
        real(deletes[-1])

    monkeypatch.setattr(store.storage, "delete", delete)
    policy = RetentionPolicy(checkpoints_keep=1)
    assert apply_retention(store, policy) == []  # failed: nothing reported disposed, nothing gone
    assert [m.snapshot_id for m in list_snapshots(store)] == ids
    failing[0] = False
    disposed = apply_retention(store, policy)
    assert sorted(d.snapshot_id for d in disposed) == sorted(ids[:3])
    assert [m.snapshot_id for m in list_snapshots(store)] == ids[3:]
    expected = sorted(k for i in ids[:3] for k in (store.manifest_key(i), store.pending_key(i)))
    assert len(deletes) == 2 and sorted(deletes[0]) == sorted(deletes[1]) == expected  # one request per pass


def test_checkpoints_paused_by_the_benchs_file_are_skipped_and_savepoints_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/runtime_bench.py measures one job with and without checkpoint snapshots, in turns: while the file named
    by CKPT_BENCH_PAUSE_CHECKPOINTS exists, a batch's checkpoint request is skipped; a savepoint is taken."""
    from airflow_ckpt_provider.core.policy.faults import PAUSE_ENV

    pause = tmp_path / "pause"
    monkeypatch.setenv(PAUSE_ENV, str(pause))
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    outcomes: list[Any] = []
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=5),
                              fence=lambda: None, on_done=outcomes.append, inline_max=0)
    try:
        snapshotter.checkpoint_now()  # batch 1
        assert snapshotter.drain(30)
        pause.touch()
        write_batch(ckpt, 2)
        snapshotter.checkpoint_now()
        assert snapshotter.drain(30)
        snapshotter.savepoint(Trigger.MANUAL, "r-1")
        assert snapshotter.drain(30)
        pause.unlink()
        write_batch(ckpt, 3)
        snapshotter.checkpoint_now()
        assert snapshotter.drain(30)
    finally:
        snapshotter.close()
    taken = [(o.job.kind, o.result.manifest.batch_id) for o in outcomes if o.result is not None]
    assert taken == [(Kind.CHECKPOINT, 1), (Kind.SAVEPOINT, 2), (Kind.CHECKPOINT, 3)]
    assert [o.error for o in outcomes] == [None, None, None]
