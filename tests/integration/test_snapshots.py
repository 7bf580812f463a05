"""The snapshot engine on both backends (local directory and SeaweedFS S3) with synthetic checkpoints."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import CheckpointError, ConflictError, SnapshotError
from airflow_ckpt_provider.core.records.lease import Lease
from airflow_ckpt_provider.core.snapshots import catalog as snapshots_module
from airflow_ckpt_provider.core.snapshots import gc as gc_module
from airflow_ckpt_provider.core.snapshots import snapshotwrite
from airflow_ckpt_provider.core.snapshots.catalog import (
    apply_retention,
    dispose_snapshot,
    latest_completed,
    list_snapshots,
    load_manifest,
    pending_markers,
    verify_snapshot,
)
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.gc import collect_garbage
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.store.jobstore import GC_LOCK, OBJECTS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage
from tests.support.ckptfactory import make_checkpoint, write_batch

#: This module proves the object store's side of snapshots (content-addressed objects, gc, corruption, crashes): the
#: factory's files are a few bytes each, so here none goes into the manifest (tests/unit/core/test_inline_files.py
#: proves inline files, and every Spark test restores snapshots that have them).
create_snapshot = functools.partial(snapshots_module.create_snapshot, inline_max=0)

pytestmark = pytest.mark.integration


def distinct_contents(ckpt: Path, first: int | None = None) -> int:
    """How many objects a snapshot of this checkpoint stores (identical files share one)."""
    files = SparkCheckpoint(LocalStorage(ckpt)).view().files[:first]
    return len({hashlib.sha256((ckpt / f.path).read_bytes()).digest() for f in files})


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(store_root: Storage) -> JobStore:
    return JobStore(store_root, "orders")


def test_create_list_verify_restore_round_trip(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    lines: list[str] = []
    result = create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL,
                             code_version="v1", report=lines.append)
    m = result.manifest
    assert (m.batch_id, m.resume_batch, m.kind, m.trigger, m.code_version) == (2, 3, Kind.SAVEPOINT,
                                                                               Trigger.MANUAL, "v1")
    assert result.stats.files == len(m.files) and result.stats.skipped_files == 0
    assert lines and "files" in lines[-1] and "/s" in lines[-1]  # progress: files, bytes, rate
    assert [s.snapshot_id for s in list_snapshots(store)] == [m.snapshot_id]
    assert load_manifest(store, m.snapshot_id) == m
    assert verify_snapshot(store, m.snapshot_id).ok
    assert store.storage.list("pending/") == []

    target = tmp_path / "restored"
    restored = restore_snapshot(store, m.snapshot_id, LocalStorage(target))
    assert restored.to_dict()["resume_batch"] == 3
    original = tree(ckpt)
    assert tree(target) == {f.path: original[f.path] for f in m.files}


def test_second_snapshot_uploads_only_new_files(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 4, payload=1000)
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    for b in (4, 5):
        write_batch(ckpt, b, payload=1000)
    second = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    old = {f.sha256 for f in first.manifest.files}
    new_files = [f for f in second.manifest.files if f.sha256 not in old]
    assert second.manifest.batch_id == 5
    assert second.stats.files == len(new_files) > 0
    assert second.stats.bytes == sum(f.size for f in new_files)
    assert second.stats.skipped_files == len(second.manifest.files) - len(new_files)
    assert len(store.storage.list(OBJECTS)) == len(old | {f.sha256 for f in second.manifest.files})


@pytest.mark.parametrize("step", ["pending", "upload", "file", "uploaded", "manifest"])
def test_crash_at_each_step_leaves_no_visible_snapshot(store: JobStore, tmp_path: Path, step: str) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)

    def crash(name: str) -> None:
        if name == step:
            raise RuntimeError(f"injected crash at {name}")

    with pytest.raises(RuntimeError, match="injected crash"):
        create_snapshot(store, LocalStorage(ckpt), on_step=crash)
    assert list_snapshots(store) == []
    assert store.storage.list("snapshots/") == []
    assert store.storage.list("pending/") == []  # its marker deleted, even one the handshake was still writing
    ok = create_snapshot(store, LocalStorage(ckpt))
    assert [m.snapshot_id for m in list_snapshots(store)] == [ok.manifest.snapshot_id]
    assert verify_snapshot(store, ok.manifest.snapshot_id).ok


def _create_and_die(store_root: Storage, ckpt: str, step: str) -> None:
    seen: list[str] = []
    store = JobStore(store_root, "orders")

    def die(name: str) -> None:
        seen.append(name)
        if name == step and (step != "file" or seen.count("file") == 2):
            # The handshake runs beside the uploads: before "pending" the marker may still be on its way
            deadline = time.monotonic() + 30
            while not pending_markers(store) and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(137)  # like kill -9: no finally, no cleanup

    create_snapshot(store, LocalStorage(ckpt), on_step=die, concurrency=1)


@pytest.mark.parametrize("step", ["upload", "file", "uploaded", "pending", "manifest"])
def test_killed_writer_leaves_no_snapshot_and_gc_clears_its_marker_at_once_on_its_host(
    store: JobStore, tmp_path: Path, step: str, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    proc = multiprocessing.get_context("fork").Process(target=_create_and_die, args=(store.root, str(ckpt), step))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 137
    assert list_snapshots(store) == []
    # The dead writer's pending marker names it; its pid no longer exists on this host, so gc clears
    # the marker at once instead of deferring for 6 hours.
    [marker] = pending_markers(store)
    assert (marker.host, marker.pid, marker.epoch) == (socket.gethostname(), proc.pid, None)
    with caplog.at_level(logging.INFO, logger="airflow_ckpt_provider.core.snapshots.gc"):
        result = collect_garbage(store, min_age_s=0)
    assert result.deferred is None
    assert [r.getMessage() for r in caplog.records if "pending marker" in r.getMessage()] == [
        f"job orders snapshot {marker.snapshot_id}: clearing the pending marker of pid {proc.pid} on host "
        f"{socket.gethostname()}: its writer, pid {proc.pid} on this host ({socket.gethostname()}), no longer exists"]
    assert store.storage.list(OBJECTS) == [] and store.storage.list("pending/") == []
    expected = {"upload": 0, "file": distinct_contents(ckpt, first=2)}.get(step, distinct_contents(ckpt))
    assert result.deleted_objects == expected


def test_bad_inputs_change_nothing(store: JobStore, tmp_path: Path) -> None:
    not_ckpt = tmp_path / "random"
    not_ckpt.mkdir()
    (not_ckpt / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError):
        create_snapshot(store, LocalStorage(not_ckpt))
    with pytest.raises(CheckpointError):
        create_snapshot(store, LocalStorage(tmp_path / "missing"))
    assert store.storage.list() == []

    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    # a target that holds a checkpoint is refused, and kept intact
    other = make_checkpoint(tmp_path / "other", 5)
    before = tree(other)
    with pytest.raises(ConflictError, match="already holds a Spark checkpoint"):
        restore_snapshot(store, m.snapshot_id, LocalStorage(other))
    assert tree(other) == before
    restore_snapshot(store, m.snapshot_id, LocalStorage(other), replace=True)
    assert set(tree(other)) == {f.path for f in m.files}

    # a snapshot of another job, copied into this job's store
    thief = JobStore(store.root, "billing")
    thief.storage.write(thief.manifest_key(m.snapshot_id), store.storage.read(store.manifest_key(m.snapshot_id)))
    with pytest.raises(SnapshotError, match="belongs to job 'orders'"):
        restore_snapshot(thief, m.snapshot_id, LocalStorage(tmp_path / "t1"))
    with pytest.raises(SnapshotError, match="not found in job store"):
        load_manifest(JobStore(store.root, "nobody"), m.snapshot_id)
    assert not (tmp_path / "t1").exists()


def test_corrupt_object_and_manifest_are_detected(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    victim = m.files[-1]
    key = store.object_key(victim.sha256)
    store.storage.write(key, b"X" * victim.size)  # same size, wrong content
    report = verify_snapshot(store, m.snapshot_id)
    assert not report.ok and victim.path in report.problems[0] and "SHA-256" in report.problems[0]
    assert verify_snapshot(store, m.snapshot_id, deep=False).ok  # sizes alone cannot see it
    with pytest.raises(SnapshotError, match=f"snapshot file {victim.path} is corrupt"):
        restore_snapshot(store, m.snapshot_id, LocalStorage(tmp_path / "t"))
    assert not (tmp_path / "t").exists()
    assert not [p for p in tmp_path.iterdir() if "ckpt-restore" in p.name]  # staging cleaned up

    store.storage.delete([key])
    with pytest.raises(SnapshotError, match="is incomplete"):
        restore_snapshot(store, m.snapshot_id, LocalStorage(tmp_path / "t"))

    manifest_key = store.manifest_key(m.snapshot_id)
    store.storage.write(manifest_key, store.storage.read(manifest_key).replace(b'"batch_id":1', b'"batch_id":0'))
    with pytest.raises(SnapshotError, match="is corrupt"):
        load_manifest(store, m.snapshot_id)
    assert list_snapshots(store) == []  # skipped with a warning, never trusted


def test_retention_dispose_and_gc_keep_what_is_referenced(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 1)
    made = []
    for b in range(1, 6):
        write_batch(ckpt, b)
        kind = Kind.SAVEPOINT if b in (1, 2) else Kind.CHECKPOINT
        made.append(create_snapshot(store, LocalStorage(ckpt), kind=kind).manifest)
        time.sleep(0.002)  # distinct creation timestamps (millisecond resolution)
    sp1, sp2, cp3, cp4, cp5 = made
    with pytest.raises(ConflictError, match="newest completed savepoint"):
        dispose_snapshot(store, sp2.snapshot_id)
    done = apply_retention(store, RetentionPolicy(checkpoints_keep=1, savepoints_max_count=1))
    assert {d.snapshot_id for d in done} == {sp1.snapshot_id, cp3.snapshot_id, cp4.snapshot_id}
    left = list_snapshots(store)
    assert [m.snapshot_id for m in left] == [sp2.snapshot_id, cp5.snapshot_id]
    assert latest_completed(left) == cp5

    result = collect_garbage(store, min_age_s=0)
    referenced = {store.object_key(f.sha256) for m in left for f in m.files}
    disposed = {store.object_key(f.sha256) for m in (sp1, cp3, cp4) for f in m.files}
    assert {o.key for o in store.storage.list(OBJECTS)} == referenced
    assert result.deleted_objects == len(disposed - referenced) > 0
    for m in left:
        assert verify_snapshot(store, m.snapshot_id).ok
    # min_age keeps young unreferenced objects (a snapshot may be about to reference them)
    store.storage.write(store.object_key("f" * 64), b"young")
    assert collect_garbage(store, min_age_s=3600).deleted_objects == 0


def test_a_snapshot_waits_while_gc_is_at_work_and_gc_then_defers_to_its_marker(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    first = create_snapshot(store, LocalStorage(ckpt)).manifest
    dispose_snapshot(store, first.snapshot_id, force=True)  # unreferenced now: gc would delete what the next reuses
    at_work, go_on, waiting = threading.Event(), threading.Event(), threading.Event()
    real_pending, real_wait = gc_module.pending_markers, snapshotwrite.wait_for_gc

    def paused(s: JobStore) -> Any:  # gc holds its lock and has flagged the token, before it looks for writers
        at_work.set()
        go_on.wait(30)
        return real_pending(s)

    def wait_for_gc(*args: Any, **kwargs: Any) -> None:
        waiting.set()
        real_wait(*args, **kwargs)

    monkeypatch.setattr(gc_module, "pending_markers", paused)
    monkeypatch.setattr(snapshotwrite, "wait_for_gc", wait_for_gc)
    results: list[Any] = []
    gc = threading.Thread(target=lambda: results.append(collect_garbage(store, min_age_s=0)))
    gc.start()
    assert at_work.wait(30)
    done: list[str] = []
    t = threading.Thread(target=lambda: done.append(create_snapshot(store, LocalStorage(ckpt)).manifest.snapshot_id))
    t.start()
    assert waiting.wait(30) and not done  # its marker stored, the token read held: it waits for gc's lock
    [marker] = pending_markers(store)
    assert "another gc holds" in str(collect_garbage(store, min_age_s=0).deferred)
    go_on.set()
    gc.join(30)
    [result] = results
    assert result.deleted_objects == 0 and str(result.deferred).startswith(
        f"snapshot {marker.snapshot_id} is being written by pid {os.getpid()}")
    t.join(30)
    assert done == [marker.snapshot_id]
    assert verify_snapshot(store, done[0]).ok
    assert collect_garbage(store, min_age_s=0).deleted_objects == 0  # the new snapshot references them all


@pytest.mark.parametrize("when", ["upload", "uploaded"])
def test_a_gc_that_deletes_objects_while_a_snapshot_uploads_makes_it_store_them_again_before_it_commits(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handshake runs beside the uploads: a gc that ran before the writer's marker was stored may delete what
    the snapshot reuses ("upload": objects of a disposed snapshot, in the process's list) or has just sent
    ("uploaded": gc with no minimum age). The new generation token tells the writer, which lists and stores again."""
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    first = create_snapshot(store, LocalStorage(ckpt)).manifest
    dispose_snapshot(store, first.snapshot_id, force=True)
    if when == "uploaded":
        snapshotwrite.forget_objects()
        collect_garbage(store, min_age_s=0)  # nothing stored: every file is sent
    release = threading.Event()
    real_marker = snapshotwrite.write_marker

    def slow_marker(*args: Any) -> None:  # the marker's PUT is slower than the uploads
        assert release.wait(30)
        real_marker(*args)

    gc_results: list[Any] = []

    def gc_then_marker(name: str) -> None:
        if name == when:
            assert pending_markers(store) == []
            gc_results.append(collect_garbage(store, min_age_s=0))
            release.set()

    monkeypatch.setattr(snapshotwrite, "write_marker", slow_marker)
    with caplog.at_level(logging.INFO, logger="airflow_ckpt_provider.core.snapshots.snapshotwrite"):
        result = create_snapshot(store, LocalStorage(ckpt), on_step=gc_then_marker)
    [deleted] = gc_results
    contents = distinct_contents(ckpt)
    assert deleted.deleted_objects == contents  # all it needed were gone before its marker was stored
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "listed the objects again" in r.getMessage()] \
        == [f"gc was at work or deleted objects while the snapshot uploaded (its generation token held or changed); "
            f"listed the objects again: {contents} of {contents} objects missing, storing them again"]
    assert len(store.storage.list(OBJECTS)) == contents
    assert verify_snapshot(store, result.manifest.snapshot_id).ok
    assert (result.stats.files, result.stats.skipped_files) == (contents, 0)  # each file counted once
    assert result.stats.bytes == (2 if when == "uploaded" else 1) * result.manifest.total_bytes  # what was sent


def test_gc_defers_while_a_snapshot_is_being_written(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    dispose_snapshot(store, m.snapshot_id, force=True)
    sid = "savepoint-9-20261122T000000Z-abcdef"
    store.storage.write(store.pending_key(sid), b"{}")  # a marker of an older version: no owner
    result = collect_garbage(store, min_age_s=0)
    assert result.deferred is not None
    assert result.deferred.startswith(f"snapshot {sid} is being written by an unknown writer (the marker does not "
                                      "name its owner): its pending marker ")
    assert result.deferred.endswith(f"`ckpt snapshot gc --clear-pending {sid}`")
    assert len(store.storage.list(OBJECTS)) == distinct_contents(ckpt)  # nothing deleted
    assert not store.storage.exists(GC_LOCK)  # released
    monkeypatch.setattr("airflow_ckpt_provider.core.snapshots.gc.STALE_AFTER_S", 0.0)  # older than the age limit
    assert collect_garbage(store, min_age_s=0).deleted_objects == distinct_contents(ckpt)
    assert store.storage.list("pending/") == []


def test_gc_clears_the_marker_of_a_writer_fenced_by_a_newer_lease_epoch(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver on another host took a snapshot at epoch 1 and died; a newer driver holds epoch 2."""
    sid = "checkpoint-9-20261122T000000Z-abcdef"
    store.storage.write(store.pending_key(sid), json.dumps(
        {"snapshot_id": sid, "host": "gone-host", "pid": 1, "epoch": 1, "started_at": "2026-11-22T00:00:00+00:00"}
    ).encode())
    Lease(store).acquire()
    Lease(store).acquire()  # epoch 2
    deferred = collect_garbage(store, min_age_s=0).deferred  # fenced just now: it may still be at its commit
    assert deferred is not None and deferred.startswith(
        f"snapshot {sid} is being written by pid 1 on host gone-host (lease epoch 1)")
    monkeypatch.setattr("airflow_ckpt_provider.core.records.pending.FENCED_GRACE_S", 0.0)
    assert collect_garbage(store, min_age_s=0).deferred is None
    assert store.storage.list("pending/") == []


def test_large_files_stream_through_files_and_round_trip(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2, payload=17 * 1024 * 1024)  # offsets files above LARGE_FILE
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    assert max(f.size for f in m.files) > 16 * 1024 * 1024
    target = tmp_path / "restored"
    restore_snapshot(store, m.snapshot_id, LocalStorage(target))
    original = tree(ckpt)
    assert tree(target) == {f.path: original[f.path] for f in m.files}


def test_unchanged_files_are_not_read_again(store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    first = create_snapshot(store, LocalStorage(ckpt))
    checked: list[str] = []
    real = snapshotwrite.verify_file
    monkeypatch.setattr(snapshotwrite, "verify_file",
                        lambda path, data, **kw: checked.append(path) or real(path, data, **kw))
    write_batch(ckpt, 3)
    second = create_snapshot(store, LocalStorage(ckpt))
    new_paths = {f.path for f in second.manifest.files} - {f.path for f in first.manifest.files}
    assert set(checked) == new_paths  # only files the first snapshot did not see were read and checked
    assert second.stats.files == 1  # offsets/3; commits/3 has the same content as commits/2
    assert second.stats.skipped_files == len(second.manifest.files) - 1


def test_gc_sees_a_writer_that_commits_between_its_listings(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc lists pending markers, then manifests: a writer finishing in between is never missed."""
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    old = create_snapshot(store, LocalStorage(ckpt)).manifest
    dispose_snapshot(store, old.snapshot_id, force=True)  # its objects are unreferenced now
    at_manifest, finish = threading.Event(), threading.Event()

    def hold(name: str) -> None:
        if name == "manifest":
            at_manifest.set()
            finish.wait(30)

    done: list[str] = []
    writer = threading.Thread(target=lambda: done.append(
        create_snapshot(store, LocalStorage(ckpt), on_step=hold).manifest.snapshot_id))
    writer.start()
    assert at_manifest.wait(30)  # the writer reused the old objects and is about to commit

    def first_listing(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if not finish.is_set():  # let the writer commit and drop its marker right after gc's first listing
                finish.set()
                writer.join(30)
            return result
        return wrapped

    monkeypatch.setattr(gc_module, "pending_markers", first_listing(gc_module.pending_markers))
    monkeypatch.setattr(gc_module, "list_snapshots", first_listing(gc_module.list_snapshots))
    result = collect_garbage(store, min_age_s=0)
    assert len(done) == 1
    assert result.deleted_objects == 0  # the writer committed before gc listed manifests: all referenced
    assert verify_snapshot(store, done[0]).ok


def test_gc_deletes_nothing_while_a_manifest_is_unreadable(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    key = store.manifest_key(m.snapshot_id)
    store.storage.write(key, store.storage.read(key).replace(b'"format":1', b'"format":2'))  # a newer writer
    before = store.storage.list(OBJECTS)
    result = collect_garbage(store, min_age_s=0)
    assert result.deferred is not None and "cannot be read" in result.deferred
    assert store.storage.list(OBJECTS) == before


def test_restore_refuses_targets_that_overlap_the_store_or_hold_other_data(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    if isinstance(store.root, LocalStorage):
        for target in (store.root.root, store.root.root / "orders" / "ckpt", store.root.root.parent):
            with pytest.raises(ConflictError, match="overlaps the job store"):
                restore_snapshot(store, m.snapshot_id, LocalStorage(target), replace=True)
    else:
        with pytest.raises(ConflictError, match="overlaps the job store"):
            restore_snapshot(store, m.snapshot_id, store.root.child("orders"), replace=True)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ConflictError, match="only a Spark checkpoint is ever replaced"):
        restore_snapshot(store, m.snapshot_id, LocalStorage(precious), replace=True)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert verify_snapshot(store, m.snapshot_id).ok


def test_local_writes_survive_concurrent_deletes_of_their_directory(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    errors: list[BaseException] = []

    def churn(name: str) -> None:
        try:
            for i in range(500):
                storage.write(f"pending/{name}.json", str(i).encode())
                storage.delete([f"pending/{name}.json"])
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=churn, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_snapshot_with_inline_files_restores_into_s3_byte_for_byte(s3_root: Storage, tmp_path: Path) -> None:
    """The files inline in the manifest (the default: this module's other tests turn it off) land on an S3 target
    like the objects: every key, every byte, and the target's checkpoint resumes at the snapshot's batch."""
    store = JobStore(s3_root.child("stores"), "orders")
    target = s3_root.child("live").child("inline-ckpt")
    ckpt = make_checkpoint(tmp_path / "a", 2)
    write_batch(ckpt, 2, payload=30_000)  # offsets/2 above the inline threshold: an object
    m = snapshots_module.create_snapshot(store, LocalStorage(ckpt)).manifest
    assert [f.path for f in m.stored_files] == ["offsets/2"] and len(m.files) - len(m.stored_files) >= 3
    restore_snapshot(store, m.snapshot_id, target)
    assert {f.path: target.read(f.path) for f in m.files} == {f.path: (ckpt / f.path).read_bytes() for f in m.files}
    assert {o.key for o in target.list()} == {f.path for f in m.files}
    assert SparkCheckpoint(target).latest_completed_batch() == 2


def test_restore_into_s3_is_verified_before_the_target_is_touched(
    s3_root: Storage, tmp_path: Path
) -> None:
    store = JobStore(s3_root.child("stores"), "orders")
    target = s3_root.child("live").child("orders-ckpt")
    m1 = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "a", 3))).manifest
    restore_snapshot(store, m1.snapshot_id, target)
    restored = {o.key for o in target.list()}
    assert restored == {f.path for f in m1.files}
    assert SparkCheckpoint(target).latest_completed_batch() == 2

    m2 = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "b", 5))).manifest
    victim = next(f for f in m2.files if f.sha256 not in {g.sha256 for g in m1.files})
    store.storage.write(store.object_key(victim.sha256), b"Z" * victim.size)
    with pytest.raises(SnapshotError, match="is corrupt"):
        restore_snapshot(store, m2.snapshot_id, target, replace=True)
    assert {o.key for o in target.list()} == restored  # the old checkpoint is untouched
    assert SparkCheckpoint(target).latest_completed_batch() == 2
