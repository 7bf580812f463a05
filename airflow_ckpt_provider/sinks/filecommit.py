"""Committing a batch of the ``ckpt-files`` sink: the manifest made visible exactly once, per timeline.

Runs in the Spark driver (``commit()`` of the sink's stream writer, sinks/files.py). A replay keeps
the earlier output and deletes its own files; a batch that comes back with other content after a
restore of an older snapshot forks a new timeline (sinks/timelines.py decides); the manifest is
created with create-if-absent (layout and manifests: sinks/filelayout.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import ConflictError
from airflow_ckpt_provider.core.snapshots.checkpoint import id_ranges
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.sinks.filelayout import (
    COMMITS,
    IDENTITY,
    VERSION,
    BatchManifest,
    fenced_error,
    manifest_key,
    now_iso,
    query_manifests,
    query_timelines,
    raise_fence,
    read_manifest,
    read_timelines,
    timeline_key,
)
from airflow_ckpt_provider.sinks.timelines import (
    REFUSED,
    Action,
    Decision,
    Observed,
    Shown,
    TimelineRecord,
    decide,
    effective,
    split,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitOutcome:
    """What commit_batch did: committed this attempt (``forked``: as the first batch of a new timeline),
    or skipped it (the same batch was already committed)."""

    committed: bool
    manifest: BatchManifest
    deleted: tuple[str, ...] = ()
    forked: TimelineRecord | None = None


def commit_batch(storage: Storage, manifest: BatchManifest,
                 crash: Callable[[str], None] = lambda point: None) -> CommitOutcome:
    """Make ``manifest``'s files visible, unless the same batch is committed already.

    ``manifest`` must record its coverage (``covering``). A replay (a restart, or a zombie attempt)
    keeps the earlier output and deletes this attempt's files. A batch that comes back with other
    content (time travel) is committed as the first batch of a new timeline, which hides the batches
    of the old one from this batch on. A batch that does not follow the shown batch before it is
    refused with ConflictError (nothing becomes visible).
    """
    if manifest.coverage is None:
        raise ValueError("commit_batch needs the batch's coverage: build the manifest with .covering(...)")
    coverage = Coverage(manifest.batch_id, manifest.coverage, manifest.previous, tuple(manifest.offsets or ()))
    missing = _missing_files(storage, manifest)
    if missing:
        # gc (with a grace shorter than this batch took) or a hand deleted them: committing would publish
        # a batch that cannot be read. Failing makes Spark replay the batch, which writes new files.
        raise ConflictError(f"ckpt-files job {manifest.job} batch {manifest.batch_id}: {len(missing)} files its "
                            f"tasks wrote are gone before the commit (e.g. {missing[0]}): the batch is replayed; "
                            "if `ckpt sink gc` ran, give it an --older-than longer than any batch takes")
    what = f"job {manifest.job} query {manifest.query_id} batch {manifest.batch_id}"
    for _ in range(5):  # a lost create-if-absent race is observed again
        seen, existing = _observe(storage, manifest.query_id, manifest.batch_id)
        decision = decide(coverage, seen)
        if decision.action is Action.SKIP:
            assert existing is not None
            return _skip(storage, manifest, existing, decision.reason)
        if decision.action is Action.REFUSE:
            delete_files(storage, [f.key for f in manifest.files])
            raise ConflictError(f"{REFUSED} ckpt-files {what} refused, nothing committed: {decision.reason}")
        forked = None
        if decision.action is Action.FORK:
            _fence(storage, manifest, what)
            forked = _fork(storage, manifest, coverage, decision)
            if forked is None:
                continue
            crash("files.commit.after-fork-record")
        target = replace(manifest, timeline=decision.timeline)
        crash("files.commit.before-manifest")
        _fence(storage, manifest, what)  # the last read before the create: a newer driver's fence refuses this one
        created = storage.create(target.key, target.to_bytes())
        crash("files.commit.after-manifest")
        if created:
            if forked is not None:
                log.warning("ckpt-files %s: TIMELINE %d starts here (fork of timeline %d): %s; batches %s of timeline "
                            "%d are hidden from readers and kept until `ckpt sink gc`", what, forked.timeline,
                            forked.parent, decision.reason, id_ranges(forked.abandoned), forked.parent)
            log.info("ckpt-files committed %s (timeline %d, offsets %s): %d files, %d rows, %d bytes", what,
                     target.timeline, coverage.short(), len(target.files), target.rows, target.total_bytes)
            return CommitOutcome(True, target, forked=forked)
    raise ConflictError(f"ckpt-files {what}: the sink's commits kept changing while committing; another driver "
                        "of the job is writing: check the job's lease, then let Spark retry the batch")


def _fence(storage: Storage, manifest: BatchManifest, what: str) -> None:
    """Refuse the commit of a driver a newer one replaced (the sink's fence is higher than its epoch); raise the
    fence to this driver's epoch otherwise. A commit without an epoch (no ckpt runtime) is not fenced."""
    if manifest.epoch is None:
        return
    fence = raise_fence(storage, manifest.job, manifest.epoch)
    if fence.epoch > manifest.epoch:
        delete_files(storage, [f.key for f in manifest.files])
        raise fenced_error(storage, what, manifest.epoch, fence)


def _skip(storage: Storage, manifest: BatchManifest, existing: BatchManifest, why: str) -> CommitOutcome:
    keep = {f.key for f in existing.files}
    mine = tuple(f.key for f in manifest.files if f.key not in keep)
    storage.delete(mine)
    log.info("ckpt-files skipped replay of job %s query %s batch %d (timeline %d): %s, at %s; deleted this "
             "attempt's %d files", manifest.job, manifest.query_id, manifest.batch_id, existing.timeline, why,
             existing.committed_at, len(mine))
    return CommitOutcome(False, existing, mine)


def _observe(storage: Storage, query_id: str, batch_id: int) -> tuple[Observed, BatchManifest | None]:
    """The query's timelines and the shown batches ``batch_id`` and ``batch_id - 1`` (one listing, few reads)."""
    records = read_timelines(storage, query_id)
    started = {(r.timeline, r.fork_batch) for r in records
               if storage.exists(manifest_key(query_id, r.fork_batch, r.timeline))}
    timelines = effective(records, started)
    pending = tuple(r for r in records if r.parent == timelines.current and r.timeline > timelines.current
                    and (r.timeline, r.fork_batch) not in started)
    at = read_manifest(storage, manifest_key(query_id, batch_id, timelines.holder(batch_id)))
    before = (read_manifest(storage, manifest_key(query_id, batch_id - 1, timelines.holder(batch_id - 1)))
              if batch_id > 0 else None)
    abandoned_before: tuple[str, ...] = ()
    if before is None and batch_id > 0:
        others = [read_manifest(storage, o.key) for o in storage.list(f"{COMMITS}/{query_id}/{batch_id - 1:020d}")]
        abandoned_before = tuple(m.coverage for m in others if m is not None and m.coverage)
    seen = Observed(timelines, None if at is None else Shown(at.coverage),
                    None if before is None else Shown(before.coverage), pending,
                    max((r.timeline for r in records), default=0) + 1, abandoned_before)
    return seen, at


def _fork(storage: Storage, manifest: BatchManifest, coverage: Coverage, decision: Decision) -> TimelineRecord | None:
    """Record the new timeline (create-if-absent); None if another writer took its number first."""
    manifests = query_manifests(storage, manifest.query_id)
    shown, _ = split(manifests, query_timelines(storage, manifest.query_id, manifests))
    hidden = [m for m in shown if m.batch_id >= manifest.batch_id]
    newer = [m for m in hidden if manifest.epoch is not None and m.epoch is not None and m.epoch > manifest.epoch]
    if newer:  # an older driver resumed (a pause, a partition) and would hide a newer one's batches: fenced
        delete_files(storage, [f.key for f in manifest.files])
        raise ConflictError(
            f"ckpt-files job {manifest.job} query {manifest.query_id} batch {manifest.batch_id}: expected this driver "
            f"(epoch {manifest.epoch}) to hold the job, found batch {newer[0].batch_id} committed by a newer driver "
            f"(epoch {newer[0].epoch}): this driver is fenced, nothing committed")
    abandoned = tuple(sorted(m.batch_id for m in hidden))
    record = TimelineRecord(manifest.query_id, decision.timeline, decision.parent, manifest.batch_id,
                            coverage.digest, now_iso(), abandoned, decision.reason, epoch=manifest.epoch)
    if not storage.create(timeline_key(manifest.query_id, decision.timeline), record.to_bytes()):
        return None
    _upgrade_identity(storage)
    return record


def _upgrade_identity(storage: Storage) -> None:
    """A version-1 sink that forked can no longer be read by version-1 readers (they would show both timelines)."""
    try:
        ident = json.loads(storage.read(IDENTITY))
    except (FileNotFoundError, ValueError):
        return
    if isinstance(ident, dict) and ident.get("version", VERSION) < VERSION:
        storage.write(IDENTITY, json.dumps({**ident, "version": VERSION}, sort_keys=True).encode())


def _missing_files(storage: Storage, manifest: BatchManifest) -> list[str]:
    """The manifest's files that are not in storage (one listing per batch directory)."""
    present: set[str] = set()
    for directory in sorted({f.key.rsplit("/", 1)[0] + "/" for f in manifest.files}):
        present.update(o.key for o in storage.list(directory))
    return [f.key for f in manifest.files if f.key not in present]



def delete_files(storage: Storage, keys: Iterable[str]) -> None:
    """Best-effort delete of an aborted attempt's files (gc catches what this misses)."""
    try:
        storage.delete(list(keys))
    except Exception as err:
        log.warning("ckpt-files: could not delete aborted files under %s (%s); gc will", storage.url, err)
