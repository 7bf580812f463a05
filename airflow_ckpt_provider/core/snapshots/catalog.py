"""Create, list, show, verify and dispose snapshots of a Spark checkpoint in a job store.

Creation is incremental (content-addressed objects shared by all snapshots of a job) and atomic:
the manifest is written last with a conditional create, so a crash at any step leaves no visible
snapshot, only unreferenced objects that gc removes later (the writing itself: core/snapshots/snapshotwrite.py).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_ckpt_provider.core.errors import ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.policy.settings import INLINE_MAX
from airflow_ckpt_provider.core.records.pending import PendingMarker, read_markers
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import (
    Kind,
    Manifest,
    ManifestFile,
    NewerFormatError,
    Trigger,
    new_snapshot_id,
    snapshot_order,
)
from airflow_ckpt_provider.core.snapshots.retention import Disposal, RetentionPolicy, plan_retention
from airflow_ckpt_provider.core.snapshots.snapshotwrite import StepHook, write_snapshot
from airflow_ckpt_provider.core.store.jobstore import OBJECTS, SNAPSHOTS, JobStore, check_snapshot_id
from airflow_ckpt_provider.core.store.progress import TransferStats
from airflow_ckpt_provider.core.store.storage import ObjectInfo, Storage

log = logging.getLogger(__name__)


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


def _now() -> datetime:
    return datetime.now(UTC)


def create_snapshot(
    store: JobStore,
    checkpoint: Storage,
    *,
    kind: Kind = Kind.SAVEPOINT,
    trigger: Trigger = Trigger.MANUAL,
    batch_id: int | None = None,
    write_ahead: bool = True,
    code_version: str | None = None,
    spark_version: str | None = None,
    labels: dict[str, str] | None = None,
    concurrency: int = 8,
    report: Callable[[str], None] | None = None,
    on_step: StepHook | None = None,
    epoch: int | None = None,
    keep_marker: bool = False,
    inline_max: int = INLINE_MAX,
) -> SnapshotResult:
    """Snapshot the checkpoint at batch ``batch_id`` (default: the latest completed batch).

    Safe while the query keeps running: the files of a completed batch are immutable. ``epoch`` is
    the writing driver's lease epoch, recorded in the pending marker so gc can tell a fenced writer.
    ``write_ahead=False`` leaves out a planned batch N+1 (a rescale's check batch). ``keep_marker`` leaves the
    pending marker of a snapshot that committed for the caller to delete later, with others in one request (gc
    takes a marker whose manifest exists for finished); a failed snapshot's marker is always deleted. Files up to
    ``inline_max`` bytes go into the manifest (core/snapshots/manifest.py; 0: none).
    """
    step = on_step or (lambda _name: None)
    started = time.monotonic()
    view = SparkCheckpoint(checkpoint).view(batch_id, write_ahead=write_ahead)
    now = _now()
    snapshot_id = new_snapshot_id(kind, view.batch_id, now)
    what = f"job {store.job} snapshot {snapshot_id} (batch {view.batch_id})"
    log.info("%s: creating %s from %s, %d files", what, kind.value, checkpoint.url, len(view.files))

    manifest, stats, stored = write_snapshot(
        store, checkpoint, view, snapshot_id=snapshot_id, kind=kind, trigger=trigger, now=now, step=step,
        concurrency=concurrency, report=report, meta=(code_version, spark_version), labels=labels or {},
        epoch=epoch, keep_marker=keep_marker, inline_max=inline_max, started=started,
    )
    _remember(store, stored, manifest)
    uri = store.snapshot_uri(snapshot_id)
    seconds = time.monotonic() - started
    log.info(
        "%s: completed %s at %s: %d files, %d bytes, %d uploaded (%d bytes), %d reused, %.2f s",
        what, kind.value, uri, len(manifest.files), manifest.total_bytes, stats.files, stats.bytes,
        stats.skipped_files, seconds,
    )
    return SnapshotResult(manifest, uri, stats, seconds)


#: Manifests already warned about: a driver lists snapshots after every batch (retention), and one
#: corrupt manifest must not repeat its warning each time.
_warned: set[str] = set()
_warned_lock = threading.Lock()
_WARNED_MAX = 200_000


def _first_warning(uri: str) -> bool:
    """True the first time this process warns about the manifest at ``uri``."""
    with _warned_lock:
        if uri in _warned:
            return False
        if len(_warned) >= _WARNED_MAX:
            _warned.clear()
        _warned.add(uri)
        return True


#: Manifests this process read or created, per job store URL, by (key, size, version tag from the LIST): a manifest
#: is written once (create if absent) and never changed, so a snapshot's retention reads none of them again (one LIST
#: page per 1,000 snapshots, not one GET per manifest), not even the one it has just created; a changed tag reads it
#: again. Each listing replaces its store's entry with what it listed, so disposed manifests leave the cache.
_manifests: dict[str, dict[tuple[str, int, str], Manifest]] = {}
_manifests_lock = threading.Lock()
_STORES_MAX = 1_000  # stores whose manifests are kept (a triggerer may watch many jobs)


def forget_manifests() -> None:
    """Drop the manifests this process read or created (benchmarks measuring a cold process)."""
    with _manifests_lock:
        _manifests.clear()


def _cache_key(info: ObjectInfo) -> tuple[str, int, str] | None:
    """A manifest's key in ``_manifests``: None when the store tells no version tag (such a manifest is read)."""
    return (info.key, info.size, info.version) if info.version else None


def _remember(store: JobStore, stored: ObjectInfo, manifest: Manifest) -> None:
    """Keep a manifest this process created for its next listing of the store, under the tag that listing will show;
    only for a store this process has listed before (one that never lists keeps none)."""
    cache_key = _cache_key(stored)
    with _manifests_lock:
        known = _manifests.get(store.url)
        if known is not None and cache_key is not None:
            known[cache_key] = manifest


def list_snapshots(store: JobStore, kind: Kind | None = None, *, strict: bool = False,
                   refuse_newer: bool = False) -> list[Manifest]:
    """Completed snapshots, oldest first.

    A corrupt or unreadable manifest is skipped with a warning, or raises SnapshotError if
    ``strict`` (gc must not mistake the objects of a snapshot it cannot read for garbage). A manifest a newer
    version wrote (a format above READ_FORMATS) raises NewerFormatError if ``refuse_newer``: a restore of "the
    latest" must not silently take an older snapshot this version can read. Manifests read before are taken
    from the process's cache (``_manifests``) while their LISTed size and tag are unchanged.
    """
    listed = [o for o in store.storage.list(SNAPSHOTS) if o.key.endswith("/manifest.json")]
    with _manifests_lock:
        known = dict(_manifests.get(store.url, {}))

    def load(info: ObjectInfo) -> tuple[tuple[str, int, str] | None, Manifest | None]:
        key = info.key
        cache_key = _cache_key(info)
        cached = known.get(cache_key) if cache_key else None
        if cached is not None:
            return cache_key, cached
        try:
            return cache_key, Manifest.from_bytes(store.storage.read(key), store.storage.uri(key))
        except FileNotFoundError:  # disposed while we listed
            return None, None
        except SnapshotError as err:
            if strict or (refuse_newer and isinstance(err, NewerFormatError)):
                raise
            snapshot_id = key[len(SNAPSHOTS) : -len("/manifest.json")]
            log.log(logging.WARNING if _first_warning(store.storage.uri(key)) else logging.DEBUG,
                    "job %s snapshot %s: skipped, its manifest cannot be trusted (said once per process): %s",
                    store.job, snapshot_id, err)
            return None, None

    unread = sum(1 for o in listed if _cache_key(o) not in known)
    if unread <= 1:  # a driver's retention after its own snapshots: nothing to read, no threads to start
        loaded = [load(o) for o in listed]
    else:
        with ThreadPoolExecutor(max_workers=min(8, unread)) as pool:
            loaded = list(pool.map(load, listed))
    with _manifests_lock:
        if store.url not in _manifests and len(_manifests) >= _STORES_MAX:
            _manifests.clear()
        _manifests[store.url] = {k: m for k, m in loaded if k is not None and m is not None}
    found = [m for _, m in loaded if m is not None]
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
    """Files of ``manifest`` whose object is missing or has the wrong size: path -> problem (one LIST; a file inline
    in the manifest has no object, and was checked when the manifest was read)."""
    stored = {o.key: o.size for o in store.storage.list(OBJECTS)}
    problems = {}
    for f in manifest.stored_files:
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
        digest = hashlib.sha256(store.storage.read(key) if f.data is None else f.data).hexdigest()
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
    store.storage.delete(_disposal_keys(store, snapshot_id))
    log.info("job %s snapshot %s: disposed (%s, batch %d)", store.job, snapshot_id, manifest.kind.value,
             manifest.batch_id)
    return manifest


def _disposal_keys(store: JobStore, snapshot_id: str) -> list[str]:
    """The manifest, and the snapshot's pending marker if its writer left it (a driver deletes its committed
    snapshots' markers in batches): without its manifest a marker would look like a writer at work and make gc
    defer. A snapshot with a manifest is written, so its marker protects nothing."""
    return [store.manifest_key(snapshot_id), store.pending_key(snapshot_id)]


def pending_markers(store: JobStore) -> list[PendingMarker]:
    """Snapshots announced but not completed, with their writers."""
    return read_markers(store)


def apply_retention(
    store: JobStore, policy: RetentionPolicy, *, now: datetime | None = None, dry_run: bool = False
) -> list[Disposal]:
    """Dispose of what the policy selects, in one delete request; a failed request is logged and retried next
    time (its deletes are idempotent)."""
    plan = plan_retention(list_snapshots(store), policy, now or _now())
    if dry_run or not plan:
        return plan
    try:
        store.storage.delete([key for d in plan for key in _disposal_keys(store, d.snapshot_id)])
    except StorageError as err:
        log.warning("job %s: disposal of %d snapshots (%s) failed, will retry: %s", store.job, len(plan),
                    ", ".join(d.snapshot_id for d in plan), err)
        return []
    for d in plan:
        log.info("job %s snapshot %s: disposed by retention (%s)", store.job, d.snapshot_id, d.reason)
    return plan


def dispose_snapshots(store: JobStore, snapshot_ids: Iterable[str] | None, *, keep_checkpoints: int,
                      keep_savepoints: int | None, max_savepoint_age_s: float | None,
                      preview: bool = False) -> tuple[list[dict[str, Any]], str]:
    """Dispose of the named snapshots, or (none named) of those the retention settings select; with ``preview``
    nothing is disposed of. Returns ``[{"snapshot_id", "kind", "reason"}]`` (what was, or would be, disposed of)
    and the line to log. The settings are checked only when they are used (no ids named). The Airflow operator
    and the Dagster op both call this."""
    ids = list(snapshot_ids or ())
    if ids:
        disposed = []
        for snapshot_id in ids:
            manifest = None if preview else dispose_snapshot(store, snapshot_id)
            disposed.append({"snapshot_id": snapshot_id, "kind": manifest.kind.value if manifest else None,
                             "reason": "requested"})
    else:
        age = None if max_savepoint_age_s is None else timedelta(seconds=max_savepoint_age_s)
        policy = RetentionPolicy(keep_checkpoints, keep_savepoints, age)
        disposed = [{"snapshot_id": d.snapshot_id, "kind": d.kind.value, "reason": d.reason}
                    for d in apply_retention(store, policy, dry_run=preview)]
    verb = "would dispose of" if preview else "disposed of"
    line = (f"job {store.job}: {verb} {len(disposed)} snapshots"
            + "".join(f"\n  {d['snapshot_id']} ({d['reason']})" for d in disposed))
    return disposed, line
