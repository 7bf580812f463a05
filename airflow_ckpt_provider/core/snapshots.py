"""Create, list, show, verify and dispose snapshots of a Spark checkpoint in a job store.

Creation is incremental (content-addressed objects shared by all snapshots of a job) and atomic:
the manifest is written last with a conditional create, so a crash at any step leaves no visible
snapshot, only unreferenced objects that gc removes later.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.checkpoint import BatchView, CheckpointFile, SparkCheckpoint
from airflow_ckpt_provider.core.ckptfiles import verify_file
from airflow_ckpt_provider.core.errors import ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.jobstore import (
    GC_LOCK,
    OBJECTS,
    SNAPSHOTS,
    JobStore,
    check_snapshot_id,
)
from airflow_ckpt_provider.core.manifest import (
    Kind,
    Manifest,
    ManifestFile,
    Trigger,
    new_snapshot_id,
    snapshot_order,
)
from airflow_ckpt_provider.core.pending import PendingMarker, read_markers
from airflow_ckpt_provider.core.progress import Progress, TransferStats
from airflow_ckpt_provider.core.retention import Disposal, RetentionPolicy, plan_retention
from airflow_ckpt_provider.core.storage import Storage

log = logging.getLogger(__name__)

_CODEC = "spark.sql.streaming.stateStore.compression.codec"
#: Files of this size or more are hashed and transferred as files (multipart), never through memory.
LARGE_FILE = 16 * 1024 * 1024
#: A lock or pending marker older than this belongs to a crashed process and is ignored.
STALE_AFTER_S = 6 * 3600.0

#: Test hook: called with the name of each creation step: "pending", "upload", "file" (after each
#: file is stored), "uploaded", "manifest" (before it is created) and "committed".
StepHook = Callable[[str], None]


@dataclass(frozen=True)
class SnapshotResult:
    """What a new snapshot is and what creating it cost."""

    manifest: Manifest
    uri: str
    stats: TransferStats
    seconds: float  # the whole creation, listing and manifest included

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "snapshot_id": m.snapshot_id,
            "uri": self.uri,
            "job": m.job,
            "kind": m.kind.value,
            "trigger": m.trigger.value,
            "batch_id": m.batch_id,
            "files": len(m.files),
            "bytes": m.total_bytes,
            "uploaded_files": self.stats.files,
            "uploaded_bytes": self.stats.bytes,
            "reused_files": self.stats.skipped_files,
            "seconds": round(self.seconds, 3),
        }


def sha256_file(path: os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


#: SHA-256 of local checkpoint files by (path, size, mtime): Spark never rewrites a file in place,
#: so periodic snapshots in one process read and hash only files they have not seen.
_digests: dict[tuple[str, int, int], str] = {}
_digests_lock = threading.Lock()
_DIGESTS_MAX = 200_000


def _file_identity(local: Path | None, size: int) -> tuple[str, int, int] | None:
    if local is None:
        return None
    try:
        st = local.stat()
    except FileNotFoundError:
        return None
    return (str(local), size, st.st_mtime_ns) if st.st_size == size else None


def _store_one(
    src: Storage, store: JobStore, f: CheckpointFile, known: set[str], progress: Progress, *, codec: str
) -> ManifestFile:
    """Check and hash one checkpoint file; upload it unless the job store already has its content."""
    local = src.local_path(f.path)
    identity = _file_identity(local, f.size)
    cached = _digests.get(identity) if identity else None
    if cached is not None and cached in known:
        progress.skipped(f.size)  # checked and hashed by an earlier snapshot, content already stored
        return ManifestFile(f.path, f.size, cached)
    try:
        if local is not None and f.size >= LARGE_FILE:
            digest = sha256_file(local)
            data = None
        else:
            data = src.read(f.path)
            digest = hashlib.sha256(data).hexdigest()
    except FileNotFoundError as err:
        raise SnapshotError(
            f"checkpoint file {src.uri(f.path)} disappeared while the snapshot was taken (Spark "
            "cleans up old state files and logs); take the snapshot again"
        ) from err
    size = f.size if data is None else len(data)
    if size != f.size:
        raise SnapshotError(
            f"checkpoint file {src.uri(f.path)} changed size while the snapshot was taken "
            f"(listed {f.size} bytes, read {size}); Spark files are immutable once written, so "
            "something else writes into this checkpoint; take the snapshot again"
        )
    problem = verify_file(f.path, data, codec=codec) if data is not None else None
    if problem:
        raise SnapshotError(
            f"checkpoint file {src.uri(f.path)} is broken: {problem}; the checkpoint cannot be snapshotted "
            "at this batch. Run `ckpt snapshot create --batch` with an older completed batch, or restore "
            "the latest snapshot"
        )
    if identity:
        with _digests_lock:
            if len(_digests) >= _DIGESTS_MAX:
                _digests.clear()
            _digests[identity] = digest
    if digest in known:
        progress.skipped(size)
    else:
        key = store.object_key(digest)
        if data is None:
            assert local is not None
            store.storage.upload(local, key, callback=progress.add_bytes)
        else:
            store.storage.write(key, data)
            progress.add_bytes(size)
        progress.file_done()
    return ManifestFile(f.path, size, digest)


def create_snapshot(
    store: JobStore,
    checkpoint: Storage,
    *,
    kind: Kind = Kind.SAVEPOINT,
    trigger: Trigger = Trigger.MANUAL,
    batch_id: int | None = None,
    code_version: str | None = None,
    spark_version: str | None = None,
    labels: dict[str, str] | None = None,
    concurrency: int = 8,
    report: Callable[[str], None] | None = None,
    on_step: StepHook | None = None,
    epoch: int | None = None,
) -> SnapshotResult:
    """Snapshot the checkpoint at batch ``batch_id`` (default: the latest completed batch).

    Safe while the query keeps running: the files of a completed batch are immutable. ``epoch`` is
    the writing driver's lease epoch, recorded in the pending marker so gc can tell a fenced writer.
    """
    step = on_step or (lambda _name: None)
    started = time.monotonic()
    view = SparkCheckpoint(checkpoint).view(batch_id)
    now = _now()
    snapshot_id = new_snapshot_id(kind, view.batch_id, now)
    what = f"job {store.job} snapshot {snapshot_id} (batch {view.batch_id})"
    log.info("%s: creating %s from %s, %d files", what, kind.value, checkpoint.url, len(view.files))

    _write_marker(store, snapshot_id, now, epoch)  # nothing to clean up if even this fails
    try:
        _wait_for_gc(store)
        manifest, stats = _write_snapshot(
            store, checkpoint, view, snapshot_id=snapshot_id, kind=kind, trigger=trigger, now=now, step=step,
            concurrency=concurrency, report=report, meta=(code_version, spark_version), labels=labels or {},
        )
    finally:
        # On success the manifest exists; on failure nothing references the uploaded objects (gc
        # removes them). Either way the marker has served. After kill -9 it stays until gc sees
        # that its writer is gone (core/pending.py).
        _drop_marker(store, snapshot_id)
    uri = store.snapshot_uri(snapshot_id)
    seconds = time.monotonic() - started
    log.info(
        "%s: completed %s at %s: %d files, %d bytes, %d uploaded (%d bytes), %d reused, %.2f s",
        what, kind.value, uri, len(manifest.files), manifest.total_bytes, stats.files, stats.bytes,
        stats.skipped_files, seconds,
    )
    return SnapshotResult(manifest, uri, stats, seconds)


def _write_snapshot(
    store: JobStore,
    checkpoint: Storage,
    view: BatchView,
    *,
    snapshot_id: str,
    kind: Kind,
    trigger: Trigger,
    now: datetime,
    step: StepHook,
    concurrency: int,
    report: Callable[[str], None] | None,
    meta: tuple[str | None, str | None],
    labels: dict[str, str],
) -> tuple[Manifest, TransferStats]:
    """Upload the objects the job store lacks, then create the manifest: the commit point."""
    what = f"job {store.job} snapshot {snapshot_id} (batch {view.batch_id})"
    step("pending")
    known = {o.key[len(OBJECTS) :] for o in store.storage.list(OBJECTS)}
    progress = Progress(what, len(view.files), sum(f.size for f in view.files), report=report)
    step("upload")
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        codec = view.conf.get(_CODEC, "lz4")

        def store_one(f: CheckpointFile) -> ManifestFile:
            stored = _store_one(checkpoint, store, f, known, progress, codec=codec)
            step("file")
            return stored

        files = list(pool.map(store_one, view.files))
    stats = progress.finish()
    step("uploaded")
    manifest = Manifest(
        job=store.job,
        snapshot_id=snapshot_id,
        kind=kind,
        trigger=trigger,
        batch_id=view.batch_id,
        created_at=now.isoformat(timespec="milliseconds"),
        query_id=view.query_id,
        checkpoint=checkpoint.url,
        files=tuple(files),
        offsets=list(view.offsets),
        next_offsets=list(view.next_offsets) if view.next_offsets is not None else None,
        operators=[op.to_json() for op in view.operators],
        conf=dict(view.conf),
        code_version=meta[0],
        spark_version=meta[1],
        labels=labels,
    )
    step("manifest")
    if not store.storage.create(store.manifest_key(snapshot_id), manifest.to_bytes()):
        raise ConflictError(f"{what}: a manifest with this id already exists; take the snapshot again")
    step("committed")
    return manifest, stats


def _drop_marker(store: JobStore, snapshot_id: str) -> None:
    """Best effort: a marker left behind only delays gc; it must not hide the snapshot's outcome."""
    try:
        store.storage.delete([store.pending_key(snapshot_id)])
    except StorageError as err:
        log.warning("job %s snapshot %s: could not delete its pending marker %s (%s); gc clears it once this "
                    "writer is provably gone, or now with `ckpt snapshot gc --clear-pending %s`", store.job,
                    snapshot_id, store.storage.uri(store.pending_key(snapshot_id)), err, snapshot_id)


def _is_fresh(store: JobStore, key: str, now: float) -> bool:
    info = store.storage.stat(key)
    return info is not None and now - info.mtime < STALE_AFTER_S


def _write_marker(store: JobStore, snapshot_id: str, now: datetime, epoch: int | None) -> None:
    """Announce a snapshot being written, naming its writer (host, pid, lease epoch, start time).

    Writer and gc each write their own marker and then look for the other's (the Dekker pattern on
    a strongly consistent store): gc backs off when it sees a writer, so at least one always
    sees the other and gc never deletes an object a new snapshot reuses.
    """
    store.storage.write(store.pending_key(snapshot_id), PendingMarker.body(snapshot_id, now, epoch))


def _wait_for_gc(store: JobStore, wait_s: float = 120.0) -> None:
    """Wait while gc holds its lock (the writer's marker is already written)."""
    deadline = time.monotonic() + wait_s
    while _is_fresh(store, GC_LOCK, time.time()):
        if time.monotonic() > deadline:
            raise ConflictError(
                f"job {store.job}: garbage collection has held {store.storage.uri(GC_LOCK)} for more "
                f"than {wait_s:.0f} s; retry later, or delete that lock if no gc is running"
            )
        time.sleep(0.2)


#: Manifests already warned about: a driver lists snapshots after every batch (retention), and one
#: corrupt manifest must not repeat its warning each time.
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _first_warning(uri: str) -> bool:
    """True the first time this process warns about the manifest at ``uri``."""
    with _warned_lock:
        if uri in _warned:
            return False
        if len(_warned) >= _DIGESTS_MAX:
            _warned.clear()
        _warned.add(uri)
        return True


def list_snapshots(store: JobStore, kind: Kind | None = None, *, strict: bool = False) -> list[Manifest]:
    """Completed snapshots, oldest first.

    A corrupt or unreadable manifest is skipped with a warning, or raises SnapshotError if
    ``strict`` (gc must not mistake the objects of a snapshot it cannot read for garbage).
    """
    keys = [o.key for o in store.storage.list(SNAPSHOTS) if o.key.endswith("/manifest.json")]

    def load(key: str) -> Manifest | None:
        try:
            return Manifest.from_bytes(store.storage.read(key), store.storage.uri(key))
        except FileNotFoundError:  # disposed while we listed
            return None
        except SnapshotError as err:
            if strict:
                raise
            snapshot_id = key[len(SNAPSHOTS) : -len("/manifest.json")]
            log.log(logging.WARNING if _first_warning(store.storage.uri(key)) else logging.DEBUG,
                    "job %s snapshot %s: skipped, its manifest cannot be trusted (said once per process): %s",
                    store.job, snapshot_id, err)
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = [m for m in pool.map(load, keys) if m is not None]
    return sorted((m for m in found if kind is None or m.kind == kind), key=snapshot_order)


def latest_completed(manifests: Iterable[Manifest], kinds: Iterable[Kind] = tuple(Kind)) -> Manifest | None:
    """THE definition of "latest completed": the most recently created completed snapshot of these kinds.

    By creation time, not batch id: after restoring an older savepoint (time travel), new snapshots
    carry lower batch ids than the abandoned timeline's, and they are the ones to resume from.
    """
    wanted = set(kinds)
    return max((m for m in manifests if m.kind in wanted), key=snapshot_order, default=None)


def load_manifest(store: JobStore, snapshot_id: str) -> Manifest:
    """The manifest of one snapshot of this job; SnapshotError if it is missing, corrupt or foreign."""
    check_snapshot_id(snapshot_id)
    key = store.manifest_key(snapshot_id)
    try:
        data = store.storage.read(key)
    except FileNotFoundError:
        raise SnapshotError(
            f"snapshot {snapshot_id} not found in job store {store.url}; `ckpt snapshot list` shows "
            "the snapshots of this job"
        ) from None
    manifest = Manifest.from_bytes(data, store.storage.uri(key))
    if manifest.job != store.job or manifest.snapshot_id != snapshot_id:
        raise SnapshotError(
            f"snapshot at {store.storage.uri(key)} belongs to job {manifest.job!r} (id "
            f"{manifest.snapshot_id}), not to job {store.job!r}; it was copied from another job's store: "
            f"restore it with --job {manifest.job}"
        )
    return manifest


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of verifying a snapshot: problems found (empty when the snapshot is intact)."""

    snapshot_id: str
    files: int
    bytes_checked: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def object_problems(store: JobStore, manifest: Manifest) -> dict[str, str]:
    """Files of ``manifest`` whose object is missing or has the wrong size: path -> problem (one LIST)."""
    stored = {o.key: o.size for o in store.storage.list(OBJECTS)}
    problems = {}
    for f in manifest.files:
        key = store.object_key(f.sha256)
        if key not in stored:
            problems[f.path] = f"{f.path}: object {key} is missing"
        elif stored[key] != f.size:
            problems[f.path] = f"{f.path}: object {key} has {stored[key]} bytes, expected {f.size}"
    return problems


def verify_snapshot(store: JobStore, snapshot_id: str, *, deep: bool = True, concurrency: int = 8) -> VerifyReport:
    """Check that every object exists with the right size and, if ``deep``, the right SHA-256.

    A manifest that exists but is corrupt (or another job's) is a problem found, not an error;
    a snapshot that does not exist raises SnapshotError.
    """
    try:
        manifest = load_manifest(store, snapshot_id)
    except SnapshotError as err:
        if not store.storage.exists(store.manifest_key(snapshot_id)):
            raise
        log.error("job %s snapshot %s: verified its manifest: %s", store.job, snapshot_id, err)
        return VerifyReport(snapshot_id, 0, 0, (str(err),))
    found = object_problems(store, manifest)
    present = [f for f in manifest.files if f.path not in found]

    def check(f: ManifestFile) -> str | None:
        key = store.object_key(f.sha256)
        digest = hashlib.sha256(store.storage.read(key)).hexdigest()
        if digest == f.sha256:
            return None
        return f"{f.path}: object {key} content has SHA-256 {digest}, expected {f.sha256}"

    if deep:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            found.update((f.path, p) for f, p in zip(present, pool.map(check, present), strict=True) if p)
    problems = tuple(found[f.path] for f in manifest.files if f.path in found)
    checked = sum(f.size for f in present) if deep else 0
    level = logging.INFO if not problems else logging.ERROR
    log.log(level, "job %s snapshot %s: verified %d files, %d problems", store.job, snapshot_id,
            len(manifest.files), len(problems))
    return VerifyReport(snapshot_id, len(manifest.files), checked, problems)


def dispose_snapshot(store: JobStore, snapshot_id: str, *, force: bool = False) -> Manifest:
    """Delete a snapshot's manifest (its objects go with the next gc).

    The newest completed savepoint is kept unless ``force``: it is the last safe restore point.
    """
    manifest = load_manifest(store, snapshot_id)
    if manifest.kind == Kind.SAVEPOINT and not force:
        newest = latest_completed(list_snapshots(store, Kind.SAVEPOINT))
        if newest is not None and newest.snapshot_id == snapshot_id:
            raise ConflictError(
                f"snapshot {snapshot_id} is the newest completed savepoint of job {store.job}; it is "
                "kept as the last safe restore point. Take a newer savepoint first, or pass force"
            )
    store.storage.delete([store.manifest_key(snapshot_id)])
    log.info("job %s snapshot %s: disposed (%s, batch %d)", store.job, snapshot_id, manifest.kind.value,
             manifest.batch_id)
    return manifest


def pending_markers(store: JobStore) -> list[PendingMarker]:
    """Snapshots announced but not completed, with their writers."""
    return read_markers(store)


def apply_retention(
    store: JobStore, policy: RetentionPolicy, *, now: datetime | None = None, dry_run: bool = False
) -> list[Disposal]:
    """Dispose of what the policy selects; a failed disposal is logged and retried next time."""
    plan = plan_retention(list_snapshots(store), policy, now or _now())
    done = []
    for d in plan:
        if dry_run:
            done.append(d)
            continue
        try:
            store.storage.delete([store.manifest_key(d.snapshot_id)])
        except StorageError as err:
            log.warning("job %s snapshot %s: disposal failed, will retry: %s", store.job, d.snapshot_id, err)
            continue
        log.info("job %s snapshot %s: disposed by retention (%s)", store.job, d.snapshot_id, d.reason)
        done.append(d)
    return done
