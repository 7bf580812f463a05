"""Writing one snapshot into a job store: its files as content-addressed objects, then the manifest; the writer's
half of the gc handshake.

Design notes: docs/concepts.md#design-notes-coresnapshotssnapshotwritepy."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from airflow_ckpt_provider.core.errors import ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.policy.settings import INLINE_MAX, INLINE_TOTAL_MAX
from airflow_ckpt_provider.core.records.generation import read_generation
from airflow_ckpt_provider.core.records.pending import PendingMarker
from airflow_ckpt_provider.core.snapshots.checkpoint import BatchView, CheckpointFile
from airflow_ckpt_provider.core.snapshots.ckptfiles import verify_file
from airflow_ckpt_provider.core.snapshots.manifest import TOOK_SECONDS, Kind, Manifest, ManifestFile, Trigger
from airflow_ckpt_provider.core.store.jobstore import GC_LOCK, OBJECTS, JobStore
from airflow_ckpt_provider.core.store.progress import Progress, TransferStats
from airflow_ckpt_provider.core.store.storage import LARGE_FILE, ObjectInfo, Storage, sha256_file

log = logging.getLogger(__name__)

_CODEC = "spark.sql.streaming.stateStore.compression.codec"
#: A lock or pending marker older than this belongs to a crashed process and is ignored.
STALE_AFTER_S = 6 * 3600.0

#: Test hook: called with the name of each creation step: "upload" (the uploads begin), "file" (after each file
#: is stored), "uploaded", "pending" (the handshake is done: marker stored, gc defers to it), "manifest" (before it
#: is created) and "committed". The uploads and the handshake run side by side: "pending" follows "uploaded".
StepHook = Callable[[str], None]

#: A process's object list of a store is LISTed again after this long even when no gc ran in between.
KNOWN_MAX_AGE_S = 600.0


@dataclass
class _Listed:
    token: str  # the generation token, read (not held) before the objects were listed
    listed_at: float  # time.monotonic()
    digests: set[str]


#: Objects each job store (by URL) held when this process last listed them, plus what it stored since.
_listed: dict[str, _Listed] = {}
_listed_lock = threading.Lock()


def _list_objects(store: JobStore, token: str | None, listed_at: float) -> set[str]:
    """LIST the store's objects and keep the list for later snapshots (``token``: read before, not held; None:
    not kept)."""
    digests = {o.key[len(OBJECTS) :] for o in store.storage.list(OBJECTS)}
    if token is not None:
        with _listed_lock:
            _listed[store.url] = _Listed(token, listed_at, set(digests))
    return digests


def known_objects(
    store: JobStore, pool: ThreadPoolExecutor, clock: Callable[[], float] = time.monotonic
) -> tuple[str | None, Future[set[str]], str]:
    """The generation token read before any of a snapshot's uploads (None: read while gc was at work, so nothing
    is trusted), the digests the store held after it, and how they are known: "kept" (this process's list), "new
    store" (this call created the token: no LIST, nothing to reuse) or "listed" (a LIST started on ``pool``).

    Neither may be trusted before the handshake (``_handshake``) reads the same token again.
    """
    done: Future[set[str]] = Future()
    with _listed_lock:
        cached = _listed.get(store.url)
        if cached is not None and clock() - cached.listed_at < KNOWN_MAX_AGE_S:
            done.set_result(set(cached.digests))
            return cached.token, done, "kept"
    generation, created = read_generation(store, create_first=cached is None)
    if created:  # no writer or gc of this protocol has been here: a store made anew (an older store's objects
        # would only be uploaded again; KNOWN_MAX_AGE_S later a LIST finds them)
        done.set_result(set())
        with _listed_lock:
            _listed[store.url] = _Listed(generation.token, clock(), set())
        return generation.token, done, "new store"
    token = None if generation.held else generation.token
    return token, pool.submit(_list_objects, store, token, clock()), "listed"


def remember_objects(store: JobStore, token: str, digests: set[str]) -> None:
    """Add what a committed snapshot references to the process's list, if that list is still of ``token`` (the
    one the snapshot's handshake read: the objects existed then, and its manifest now references them)."""
    with _listed_lock:
        cached = _listed.get(store.url)
        if cached is not None and cached.token == token:
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


def _read_checked(src: Storage, f: CheckpointFile, local: Path | None, codec: str) -> tuple[str, bytes | None]:
    """The file's SHA-256 and, unless it is large and local (hashed from disk), its content; checked for size and,
    for Spark's own formats, for being whole (ckptfiles.verify_file)."""
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
    return digest, data


def _store_one(
    src: Storage, store: JobStore, f: CheckpointFile, known: Future[set[str]], progress: Progress, *, codec: str,
    count_file: bool = True, inline: bool = False,
) -> tuple[ManifestFile, bool]:
    """Check and hash one checkpoint file; upload it unless the job store already has its content (True: uploaded).
    ``inline``: a content the store lacks is kept for the manifest instead of uploaded (it counts as sent).

    ``known`` is awaited first only for a file this process hashed before (``_reused``); any other file is read and
    hashed first, so a LIST under way overlaps the hashing.
    """
    reused = _reused(src, f, known.result(), progress)  # hashed by an earlier snapshot of this process
    if reused is not None:
        return reused, False
    local = src.local_path(f.path)
    identity = _file_identity(local, f.size)
    digest, data = _read_checked(src, f, local, codec)
    if identity:
        with _digests_lock:
            if len(_digests) >= _DIGESTS_MAX:
                _digests.clear()
            _digests[identity] = digest
    if digest in known.result():
        progress.skipped(f.size)
        return ManifestFile(f.path, f.size, digest), False
    if inline and data is not None:
        progress.add_bytes(f.size)
        progress.file_done()
        return ManifestFile(f.path, f.size, digest, data), False
    key = store.object_key(digest)
    if data is None:
        assert local is not None
        store.storage.upload(local, key, callback=progress.add_bytes)
    else:
        store.storage.write_object(key, data, digest)
        progress.add_bytes(f.size)
    if count_file:  # False: sent again (its bytes count, the file was counted the first time)
        progress.file_done()
    return ManifestFile(f.path, f.size, digest), True


def _store_files(
    src: Storage, store: JobStore, view: BatchView, known: Future[set[str]], progress: Progress, *,
    step: StepHook, concurrency: int, codec: str, inline_max: int,
) -> tuple[list[ManifestFile], set[str]]:
    """Store the view's files the store lacks; their manifest entries in the view's order, and the paths uploaded.
    New files up to ``inline_max`` bytes go into the manifest, smallest first, up to INLINE_TOTAL_MAX bytes in all."""
    uploaded: set[str] = set()
    # A periodic snapshot finds most files reused (a stat each) and a few new: threads only for those few.
    reused: dict[str, ManifestFile] = {}
    if known.done():  # this process's list (a LIST still under way: every file goes to the threads)
        kept = known.result()
        reused = {f.path: m for f in view.files if (m := _reused(src, f, kept, progress)) is not None}
    new_files = [f for f in view.files if f.path not in reused]
    inline = _inline_candidates(new_files, inline_max)  # a reused file takes none of the manifest's budget
    for _ in reused:
        step("file")

    def store_one(f: CheckpointFile) -> ManifestFile:
        stored, sent = _store_one(src, store, f, known, progress, codec=codec, inline=f.path in inline)
        if sent:
            uploaded.add(f.path)
        step("file")
        return stored

    if len(new_files) > 1 and concurrency > 1:
        with ThreadPoolExecutor(max_workers=min(concurrency, len(new_files))) as pool:
            stored = dict(zip((f.path for f in new_files), pool.map(store_one, new_files), strict=True))
    else:
        stored = {f.path: store_one(f) for f in new_files}
    return [reused.get(f.path) or stored[f.path] for f in view.files], uploaded


def _inline_candidates(files: list[CheckpointFile] | tuple[CheckpointFile, ...], inline_max: int) -> set[str]:
    """The paths of the files that go into the manifest if the store lacks their content: each at most ``inline_max``
    bytes (0: none), smallest first, INLINE_TOTAL_MAX bytes in all (a file whose content is stored is referenced
    instead)."""
    chosen: set[str] = set()
    total = 0
    small = (f for f in files if inline_max > 0 and f.size <= min(inline_max, LARGE_FILE - 1))
    for f in sorted(small, key=lambda f: (f.size, f.path)):
        if total + f.size > INLINE_TOTAL_MAX:
            break
        chosen.add(f.path)
        total += f.size
    return chosen


def _store_again(
    src: Storage, store: JobStore, view: BatchView, files: list[ManifestFile], *, uploaded: set[str],
    token: str | None, progress: Progress, what: str, codec: str, concurrency: int,
) -> None:
    """gc was at work or deleted objects between the token read before the uploads and the handshake's (``token``),
    so objects listed as stored or just uploaded may be gone: LIST again (gc defers to the marker now) and store
    each missing content once, on ``concurrency`` threads."""
    listed: Future[set[str]] = Future()
    listed.set_result(_list_objects(store, token, time.monotonic()))
    missing: dict[str, CheckpointFile] = {}  # content -> one file that has it
    for f, m in zip(view.files, files, strict=True):
        if not m.inline and m.sha256 not in listed.result():
            missing.setdefault(m.sha256, f)
    log.info("%s: gc was at work or deleted objects while the snapshot uploaded (its generation token held or "
             "changed); listed the objects again: %d of %d objects missing, storing them again", what,
             len(missing), len({m.sha256 for m in files if not m.inline}))

    def again(item: tuple[str, CheckpointFile]) -> None:
        digest, f = item
        sent_before = f.path in uploaded
        if not sent_before:  # counted as already stored: it is an upload after all
            progress.skipped(-f.size, files=-1)
        stored, _ = _store_one(src, store, f, listed, progress, codec=codec, count_file=not sent_before)
        if stored.sha256 != digest:
            raise SnapshotError(f"checkpoint file {src.uri(f.path)} changed while the snapshot was taken (SHA-256 "
                                f"{digest} when first read, {stored.sha256} now); Spark files are immutable once "
                                "written, so something else writes into this checkpoint; take the snapshot again")

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(missing)))) as pool:
        list(pool.map(again, missing.items()))


def _handshake(store: JobStore, snapshot_id: str, now: datetime, epoch: int | None, *, sent: threading.Event,
               marked: threading.Event, before: threading.Event, stop: threading.Event) -> str | None:
    """The writer's half of the gc handshake: its marker stored (then ``marked`` is set), then the generation token
    read (after the one read before the uploads, ``before``): not held, gc defers to the marker from then on
    (core/records/generation.py); held, the writer waits for gc's lock to go and reads the token again. None: still held
    (a gc that died with it set, or could not clear it): nothing read before is trusted."""
    sent.set()
    write_marker(store, snapshot_id, now, epoch)
    marked.set()
    while not before.wait(0.05):
        if stop.is_set():
            raise SnapshotError(f"job {store.job} snapshot {snapshot_id}: failed before its uploads")
    generation, _ = read_generation(store, create_first=False)
    if generation.held:
        wait_for_gc(store, stop=stop)  # released, or stale: a gc that died, whose flag stays
        generation, _ = read_generation(store, create_first=False)
    return None if generation.held else generation.token


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
    epoch: int | None,
    keep_marker: bool,
    inline_max: int = INLINE_MAX,
    started: float | None = None,
) -> tuple[Manifest, TransferStats, ObjectInfo]:
    """Upload the objects the job store lacks beside the gc handshake, then create the manifest: the commit point.
    Returns the manifest, what the uploads did, and the manifest's object as a listing would show it.

    The pending marker is deleted at the end, unless the snapshot committed and ``keep_marker`` leaves it for the
    caller to delete with others (gc takes a marker whose manifest exists for finished). ``started`` (the caller's
    time.monotonic() when it began): the manifest's label TOOK_SECONDS says how long the snapshot took until its
    manifest was written.
    """
    what = f"job {store.job} snapshot {snapshot_id} (batch {view.batch_id})"
    codec = view.conf.get(_CODEC, "lz4")
    sent, marked, before, stop = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    committed = False
    try:
        progress = Progress(what, len(view.files), sum(f.size for f in view.files), report=report)
        # Two side threads: the handshake, and a LIST of the objects when this process has no list of the store.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckpt-snapshot-side") as side:
            try:
                handshake = side.submit(_handshake, store, snapshot_id, now, epoch, sent=sent, marked=marked,
                                        before=before, stop=stop)
                token, known, how = known_objects(store, side)
                before.set()
                step("upload")
                files, uploaded = _store_files(checkpoint, store, view, known, progress, step=step,
                                               concurrency=concurrency, codec=codec, inline_max=inline_max)
                step("uploaded")
                confirmed = handshake.result()
            finally:
                stop.set()  # a snapshot that failed stops waiting for gc's lock
        step("pending")
        log.debug("%s: %d objects known (%s)", what, len(known.result()), how)
        if token is None or confirmed != token:
            _store_again(checkpoint, store, view, files, uploaded=uploaded, token=confirmed, progress=progress,
                         what=what, codec=codec, concurrency=concurrency)
        stats = progress.finish()
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
            labels=labels if started is None else {**labels, TOOK_SECONDS: f"{time.monotonic() - started:.3f}"},
        )
        step("manifest")
        body, key = manifest.to_bytes(), store.manifest_key(snapshot_id)
        tag = store.storage.create_tagged(key, body)
        if tag is None:
            raise ConflictError(f"{what}: a manifest with this id already exists; take the snapshot again")
        committed = True
        if confirmed is not None:
            remember_objects(store, confirmed, {f.sha256 for f in files if not f.inline})  # inline: no object
        step("committed")
        return manifest, stats, ObjectInfo(key, len(body), time.time(), tag)
    finally:
        # On success the manifest exists; on failure nothing references the uploaded objects (gc removes them).
        # Either way the marker has served. After kill -9 it stays until gc sees that its writer is gone
        # (core/records/pending.py). The side threads are done here: the events no longer change. A marker whose PUT
        # failed may still have been stored: it is deleted too, quietly if that fails as well.
        if sent.is_set() and not (committed and keep_marker):
            drop_marker(store, snapshot_id, stored=marked.is_set())


def drop_marker(store: JobStore, snapshot_id: str, *, stored: bool = True) -> None:
    """Best effort: a marker left behind only delays gc; it must not hide the snapshot's outcome. ``stored``
    False: its PUT failed, so most likely there is nothing to delete and a failure is not worth a warning."""
    try:
        store.storage.delete([store.pending_key(snapshot_id)])
    except StorageError as err:
        log.log(logging.WARNING if stored else logging.DEBUG,
                "job %s snapshot %s: could not delete its pending marker %s (%s); gc clears it once this writer "
                "is provably gone, or now with `ckpt snapshot gc --clear-pending %s`", store.job, snapshot_id,
                store.storage.uri(store.pending_key(snapshot_id)), err, snapshot_id)


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

    Writer and gc each write their own mark and then look for the other's (the Dekker pattern on a strongly
    consistent store: the writer its marker, then gc's generation token; gc its "held" token, then the pending
    markers): gc backs off when it sees a writer, the writer waits when it sees gc, so at least one always sees
    the other and gc never deletes an object a new snapshot reuses.
    """
    store.storage.write(store.pending_key(snapshot_id), PendingMarker.body(snapshot_id, now, epoch))


def wait_for_gc(store: JobStore, wait_s: float = 120.0, stop: threading.Event | None = None) -> None:
    """Wait while gc holds its lock (the writer's marker is already written); ``stop`` ends the wait early."""
    deadline = time.monotonic() + wait_s
    stop = stop or threading.Event()
    while _is_fresh(store, GC_LOCK, time.time()):
        if stop.is_set():
            raise SnapshotError(f"job {store.job}: the snapshot failed while waiting for gc's lock")
        if time.monotonic() > deadline:
            raise ConflictError(
                f"job {store.job}: garbage collection has held {store.storage.uri(GC_LOCK)} for more "
                f"than {wait_s:.0f} s; retry later, or delete that lock if no gc is running"
            )
        stop.wait(0.2)
