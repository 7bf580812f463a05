"""Restore a snapshot into a fresh checkpoint location, from which Spark resumes at batch N+1.

Every file is checked against its SHA-256 before it becomes visible. A local target is assembled in
a sibling staging directory and renamed into place, so it is either the complete checkpoint or
untouched; a remote target is written with ``metadata`` last and cleaned up on failure.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.errors import CheckpointError, ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.snapshots.catalog import (
    latest_completed,
    list_snapshots,
    load_manifest,
    object_problems,
)
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint, is_spark_checkpoint
from airflow_ckpt_provider.core.snapshots.ckptfiles import relocate
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.progress import Progress, TransferStats
from airflow_ckpt_provider.core.store.storage import LARGE_FILE, LocalStorage, Storage, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreResult:
    """Where a snapshot was restored and the batch Spark runs first."""

    manifest: Manifest
    target: str
    replaced: bool
    stats: TransferStats

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "snapshot_id": m.snapshot_id,
            "job": m.job,
            "kind": m.kind.value,
            "batch_id": m.batch_id,
            "resume_batch": m.resume_batch,
            "target": self.target,
            "replaced": self.replaced,
            "files": len(m.files),
            "bytes": m.total_bytes,
            "seconds": round(self.stats.seconds, 3),
        }


def describe_target(target: Storage) -> tuple[str, bool] | None:
    """What the target already holds and whether it is a Spark checkpoint, or None if it is empty."""
    existing = target.list()
    if not existing:
        return None
    if is_spark_checkpoint(target):
        ckpt = SparkCheckpoint(target)
        try:
            latest = ckpt.latest_completed_batch()
        except CheckpointError:
            latest = None
        return f"a Spark checkpoint ({len(existing)} files, latest completed batch {latest})", True
    return f"{len(existing)} files that are not a Spark checkpoint", False


def _location(storage: Storage) -> str:
    """A comparable form of a location: the absolute path, or bucket/prefix for s3:// and s3a://."""
    if isinstance(storage, LocalStorage):
        return storage.root.resolve().as_posix().rstrip("/") + "/"
    return storage.url.split("://", 1)[-1].rstrip("/") + "/"


def _check_target(store: JobStore, target: Storage, what: str, *, replace: bool) -> bool:
    """Refuse targets that overlap the job store or hold other data; True if a checkpoint is replaced."""
    ours, theirs = _location(store.root), _location(target)
    if ours.startswith(theirs) or theirs.startswith(ours):
        raise ConflictError(
            f"cannot restore {what} into {target.url}: it overlaps the job store {store.root.url}; "
            "choose a checkpoint location outside the job store"
        )
    if not isinstance(target, LocalStorage) and theirs.count("/") < 2:
        raise ConflictError(f"cannot restore {what} into {target.url}: a bucket root is never a checkpoint location")
    held = describe_target(target)
    if held is None:
        return False
    description, is_checkpoint = held
    if not replace or not is_checkpoint:
        hint = ("pass replace to discard it" if is_checkpoint
                else "only a Spark checkpoint is ever replaced: move those files away or choose another location")
        raise ConflictError(f"cannot restore {what} into {target.url}: it already holds {description}; {hint}")
    return True


def restore_snapshot(
    store: JobStore,
    snapshot_id: str,
    target: Storage,
    *,
    replace: bool = False,
    concurrency: int = 8,
    report: Callable[[str], None] | None = None,
) -> RestoreResult:
    """Materialize a snapshot at ``target``; refuse a non-empty target unless ``replace``."""
    manifest = load_manifest(store, snapshot_id)
    what = f"job {store.job} snapshot {snapshot_id} (batch {manifest.batch_id})"
    replaced = _check_target(store, target, what, replace=replace)
    _check_objects(store, manifest)
    _warn_time_travel(store, manifest)
    progress = Progress(f"restore {what}", len(manifest.files), manifest.total_bytes, report=report)
    if isinstance(target, LocalStorage):
        _restore_local(store, manifest, target.root, progress, concurrency)
    else:
        _restore_remote(store, manifest, target, progress, concurrency=concurrency)
    stats = progress.finish()
    log.info("%s: restored into %s; Spark resumes at batch %d", what, target.url, manifest.resume_batch)
    return RestoreResult(manifest, target.url, replaced, stats)


def _check_objects(store: JobStore, manifest: Manifest) -> None:
    problems = object_problems(store, manifest)
    if problems:
        raise SnapshotError(
            f"snapshot {manifest.snapshot_id} of job {manifest.job} is incomplete ({len(problems)} files), "
            f"first {next(iter(problems.values()))}; nothing was restored. Run `ckpt snapshot verify` and "
            "restore another snapshot"
        )


def _warn_time_travel(store: JobStore, manifest: Manifest) -> None:
    newest = latest_completed(list_snapshots(store), (Kind.CHECKPOINT, Kind.SAVEPOINT))
    if newest is not None and newest.batch_id > manifest.batch_id:
        log.warning(
            "job %s: TIME TRAVEL: restoring batch %d although snapshot %s holds batch %d: sources replay from "
            "the restored offsets; ckpt-files and the ledger will show the restored timeline, the ckpt-kafka "
            "sink's consumers see the abandoned batches' records too, other sinks see them again "
            "(docs/sinks.md#timelines)",
            store.job, manifest.batch_id, newest.snapshot_id, newest.batch_id,
        )


def _fetch(store: JobStore, f: ManifestFile, dest: LocalStorage, location: str, progress: Progress) -> None:
    """Copy one object into the staging directory ``dest``, checking size and SHA-256 first.

    ``location`` is the checkpoint's final URI: the few files that hold absolute paths are
    rewritten to point there (see ckptfiles.relocate). Large objects go through a file, never
    through memory (a state snapshot file can hold a whole partition's state).
    """
    key = store.object_key(f.sha256)
    try:
        _copy_object(store, f, dest, location, progress)
    except FileNotFoundError:
        raise SnapshotError(
            f"snapshot file {f.path} (object {store.storage.uri(key)}) disappeared during the restore: the "
            "snapshot was disposed and garbage-collected meanwhile; nothing was restored. Restore another snapshot"
        ) from None
    progress.file_done()


def _copy_object(store: JobStore, f: ManifestFile, dest: LocalStorage, location: str, progress: Progress) -> None:
    key = store.object_key(f.sha256)
    if f.data is not None:  # inline in the manifest (checked against size and SHA-256 when it was read)
        dest.write(f.path, relocate(f.path, f.data, location))
        progress.add_bytes(f.size)
    elif f.size >= LARGE_FILE:
        staged = dest.root / f.path  # private until the staging directory is renamed or uploaded
        store.storage.download(key, staged, callback=progress.add_bytes)
        _check(f, key, staged.stat().st_size, sha256_file(staged))
    else:
        data = store.storage.read(key)
        _check(f, key, len(data), hashlib.sha256(data).hexdigest())
        dest.write(f.path, relocate(f.path, data, location))
        progress.add_bytes(len(data))


def _check(f: ManifestFile, key: str, size: int, digest: str) -> None:
    if size != f.size or digest != f.sha256:
        raise SnapshotError(
            f"snapshot file {f.path} is corrupt: object {key} has {size} bytes and SHA-256 {digest}, "
            f"expected {f.size} bytes and {f.sha256}; nothing was restored. Restore another snapshot"
        )


def _restore_local(
    store: JobStore, manifest: Manifest, root: Path, progress: Progress, concurrency: int
) -> None:
    staging = root.parent / f".{root.name}.ckpt-restore-{uuid.uuid4().hex[:8]}"
    try:
        staged = LocalStorage(staging)
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            list(pool.map(lambda f: _fetch(store, f, staged, root.as_uri(), progress), manifest.files))
        if root.exists():
            old = root.parent / f".{root.name}.ckpt-replaced-{uuid.uuid4().hex[:8]}"
            os.replace(root, old)
            os.replace(staging, root)
            shutil.rmtree(old)
        else:
            root.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _restore_remote(
    store: JobStore, manifest: Manifest, target: Storage, progress: Progress, *, concurrency: int
) -> None:
    """Fetch and verify everything locally first; only then touch the target.

    Write order: state and source files, then ``metadata``, then ``offsets/`` and ``commits/`` last:
    Spark resumes from the logs, so until they are complete the location does not look resumable.
    Keys of a replaced checkpoint that the snapshot lacks are deleted at the end.
    """
    with tempfile.TemporaryDirectory(prefix="ckpt-restore-") as tmp:
        staged = LocalStorage(tmp)
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            list(pool.map(lambda f: _fetch(store, f, staged, target.url, progress), manifest.files))
        stale = {o.key for o in target.list()} - {f.path for f in manifest.files}
        order = sorted(manifest.files, key=lambda f: (f.path.split("/", 1)[0] in ("offsets", "commits"),
                                                      f.path == "metadata" or f.path.startswith("commits/")))
        written: list[str] = []
        try:
            for f in order:
                target.upload(staged.root / f.path, f.path)
                written.append(f.path)
        except BaseException:
            if not stale:  # a fresh location: leave nothing behind; a replaced one is already mixed
                _best_effort_delete(target, written)
            raise
        _best_effort_delete(target, sorted(stale))


def _best_effort_delete(target: Storage, keys: list[str]) -> None:
    try:
        target.delete(keys)
    except StorageError as err:
        log.warning("could not delete %d files under %s: %s", len(keys), target.url, err)
