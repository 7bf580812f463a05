"""Writing one snapshot into a job store: its files as content-addressed objects, then the manifest.

Runs wherever a snapshot is taken (the Spark driver's snapshotter, ``ckpt snapshot create``), for
``create_snapshot`` (core/snapshots.py). Each file of a BatchView is checked, hashed and uploaded
unless the store already holds its content (a per-process digest cache skips files hashed before);
the manifest is created last with a conditional create, the commit point. Around it, the writer's
half of the gc handshake (core/gc.py): a pending marker names the writer, and the writer waits
while gc holds its lock.

Which objects the store holds is LISTed once per process and then kept (``known_objects``): only gc deletes
objects, and it writes a new generation token (GC_GENERATION) before it does, so a writer that reads the
token it listed under (one GET, after its marker and the lock check) knows the list still holds; a new token,
or a list older than KNOWN_MAX_AGE_S (something outside the provider may delete objects), lists again. A
snapshot's requests thus stay the same as the job's history grows, instead of one LIST page per 1,000 objects.
What this relies on: every process that runs gc on the store writes the token (upgrade `ckpt snapshot gc`
runners with the workers), and no S3 lifecycle rule expires ``objects/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from airflow_ckpt_provider.core.checkpoint import BatchView, CheckpointFile
from airflow_ckpt_provider.core.ckptfiles import verify_file
from airflow_ckpt_provider.core.errors import ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.jobstore import GC_GENERATION, GC_LOCK, OBJECTS, JobStore
from airflow_ckpt_provider.core.manifest import Kind, Manifest, ManifestFile, Trigger
from airflow_ckpt_provider.core.pending import PendingMarker
from airflow_ckpt_provider.core.progress import Progress, TransferStats
from airflow_ckpt_provider.core.storage import LARGE_FILE, Storage, sha256_file

log = logging.getLogger(__name__)

_CODEC = "spark.sql.streaming.stateStore.compression.codec"
#: A lock or pending marker older than this belongs to a crashed process and is ignored.
STALE_AFTER_S = 6 * 3600.0

#: Test hook: called with the name of each creation step: "pending", "upload", "file" (after each
#: file is stored), "uploaded", "manifest" (before it is created) and "committed".
StepHook = Callable[[str], None]

#: A process's object list of a store is LISTed again after this long even when no gc ran in between.
KNOWN_MAX_AGE_S = 600.0


@dataclass
class _Listed:
    generation: bytes  # GC_GENERATION's body when the objects were listed
    listed_at: float  # time.monotonic()
    digests: set[str]


#: Objects each job store (by URL) held when this process last listed them, plus what it stored since.
_listed: dict[str, _Listed] = {}
_listed_lock = threading.Lock()


def _generation(store: JobStore, *, first: bool) -> bytes:
    """GC_GENERATION's body; a store without one gets one first (create if absent), so that a store wiped and
    made again (no token before, none after) never passes for the one this process listed. ``first`` (no list of
    this store in this process yet, often a new store) tries the create first: one request for a new store, two for
    an old one, once per process; later snapshots read it (one request)."""
    token = json.dumps({"token": secrets.token_hex(8), "by": "writer"}).encode()
    if not first:
        try:
            return store.storage.read(GC_GENERATION)
        except FileNotFoundError:
            pass
    if store.storage.create(GC_GENERATION, token):
        return token  # created: the store holds these bytes
    return store.storage.read(GC_GENERATION)  # it exists (another process created it, or gc wrote it)


def known_objects(store: JobStore, clock: Callable[[], float] = time.monotonic) -> tuple[set[str], bool]:
    """The digests the store holds, and whether they were LISTed now (False: this process's list still holds).

    Call it only after the writer's pending marker is written and gc's lock is seen released: from then on
    gc defers to the writer, so nothing listed before can go until the marker is dropped.
    """
    with _listed_lock:
        first = store.url not in _listed
    generation = _generation(store, first=first)
    with _listed_lock:
        cached = _listed.get(store.url)
        if cached is not None and cached.generation == generation and clock() - cached.listed_at < KNOWN_MAX_AGE_S:
            return set(cached.digests), False
    listed_at = clock()
    digests = {o.key[len(OBJECTS) :] for o in store.storage.list(OBJECTS)}
    with _listed_lock:
        _listed[store.url] = _Listed(generation, listed_at, set(digests))
    return digests, True


def remember_objects(store: JobStore, digests: set[str]) -> None:
    """Add what a committed snapshot references to the process's list (they exist: the manifest needs them)."""
    with _listed_lock:
        cached = _listed.get(store.url)
        if cached is not None:
            cached.digests |= digests


def forget_objects() -> None:
    """Drop every cached list (tests; a process that learns objects were deleted behind gc's back)."""
    with _listed_lock:
        _listed.clear()


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


def _reused(src: Storage, f: CheckpointFile, known: set[str], progress: Progress) -> ManifestFile | None:
    """The file as checked and hashed by an earlier snapshot of this process, if the store holds its content."""
    identity = _file_identity(src.local_path(f.path), f.size)
    cached = _digests.get(identity) if identity else None
    if cached is None or cached not in known:
        return None
    progress.skipped(f.size)
    return ManifestFile(f.path, f.size, cached)


def _store_one(
    src: Storage, store: JobStore, f: CheckpointFile, known: set[str], progress: Progress, *, codec: str
) -> ManifestFile:
    """Check and hash one checkpoint file; upload it unless the job store already has its content."""
    local = src.local_path(f.path)
    identity = _file_identity(local, f.size)
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
            store.storage.write_object(key, data, digest)
            progress.add_bytes(size)
        progress.file_done()
    return ManifestFile(f.path, size, digest)

def write_snapshot(
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
    known, listed = known_objects(store)
    log.debug("%s: %d objects known (%s)", what, len(known), "listed now" if listed else "cached, no gc since")
    progress = Progress(what, len(view.files), sum(f.size for f in view.files), report=report)
    step("upload")
    codec = view.conf.get(_CODEC, "lz4")

    def store_one(f: CheckpointFile) -> ManifestFile:
        stored = _store_one(checkpoint, store, f, known, progress, codec=codec)
        step("file")
        return stored

    # A periodic snapshot finds most files reused (a stat each) and a few new: threads only for those few.
    reused = {f.path: m for f in view.files if (m := _reused(checkpoint, f, known, progress)) is not None}
    new_files = [f for f in view.files if f.path not in reused]
    for _ in reused:
        step("file")
    if len(new_files) > 1 and concurrency > 1:
        with ThreadPoolExecutor(max_workers=min(concurrency, len(new_files))) as pool:
            stored = dict(zip((f.path for f in new_files), pool.map(store_one, new_files), strict=True))
    else:
        stored = {f.path: store_one(f) for f in new_files}
    files = [reused.get(f.path) or stored[f.path] for f in view.files]
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
    remember_objects(store, {f.sha256 for f in files})
    step("committed")
    return manifest, stats


def drop_marker(store: JobStore, snapshot_id: str) -> None:
    """Best effort: a marker left behind only delays gc; it must not hide the snapshot's outcome."""
    try:
        store.storage.delete([store.pending_key(snapshot_id)])
    except StorageError as err:
        log.warning("job %s snapshot %s: could not delete its pending marker %s (%s); gc clears it once this "
                    "writer is provably gone, or now with `ckpt snapshot gc --clear-pending %s`", store.job,
                    snapshot_id, store.storage.uri(store.pending_key(snapshot_id)), err, snapshot_id)


def drop_committed_markers(store: JobStore, snapshot_ids: list[str]) -> bool:
    """Delete the pending markers of these committed snapshots in one request; False (with a warning) if it failed.

    Nothing depends on it: gc takes a marker whose manifest exists for finished and deletes it, and disposing a
    snapshot deletes its marker with its manifest."""
    try:
        store.storage.delete([store.pending_key(i) for i in snapshot_ids])
    except StorageError as err:
        log.warning("job %s: could not delete the pending markers of %d committed snapshots under %s (%s): %s; "
                    "retried with the next retention; gc removes them itself, since their snapshots are committed",
                    store.job, len(snapshot_ids), store.storage.uri("pending/"), ", ".join(snapshot_ids[:5])
                    + (f" and {len(snapshot_ids) - 5} more" if len(snapshot_ids) > 5 else ""), err)
        return False
    return True


def _is_fresh(store: JobStore, key: str, now: float) -> bool:
    info = store.storage.stat(key)
    return info is not None and now - info.mtime < STALE_AFTER_S


def write_marker(store: JobStore, snapshot_id: str, now: datetime, epoch: int | None) -> None:
    """Announce a snapshot being written, naming its writer (host, pid, lease epoch, start time).

    Writer and gc each write their own marker and then look for the other's (the Dekker pattern on
    a strongly consistent store): gc backs off when it sees a writer, so at least one always
    sees the other and gc never deletes an object a new snapshot reuses.
    """
    store.storage.write(store.pending_key(snapshot_id), PendingMarker.body(snapshot_id, now, epoch))


def wait_for_gc(store: JobStore, wait_s: float = 120.0) -> None:
    """Wait while gc holds its lock (the writer's marker is already written)."""
    deadline = time.monotonic() + wait_s
    while _is_fresh(store, GC_LOCK, time.time()):
        if time.monotonic() > deadline:
            raise ConflictError(
                f"job {store.job}: garbage collection has held {store.storage.uri(GC_LOCK)} for more "
                f"than {wait_s:.0f} s; retry later, or delete that lock if no gc is running"
            )
        time.sleep(0.2)
