"""Garbage collection of objects that no manifest references, safe against concurrent snapshots.

Protocol (see snapshots._begin_write): gc creates ``locks/gc.json`` with a conditional create,
then looks for pending snapshot markers; if one is fresh it releases the lock and defers. A writer
writes its pending marker first and then waits while the lock exists. Either gc sees the writer or
the writer sees gc, so an object a new snapshot reuses is never deleted under it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.errors import SnapshotError, StorageError
from airflow_ckpt_provider.core.jobstore import GC_LOCK, OBJECTS, JobStore
from airflow_ckpt_provider.core.snapshots import STALE_AFTER_S, list_snapshots, pending_markers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    """What gc did: ``deferred`` names why nothing was deleted, if so."""

    deleted_objects: int
    deleted_bytes: int
    kept_objects: int
    deferred: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted_objects": self.deleted_objects,
            "deleted_bytes": self.deleted_bytes,
            "kept_objects": self.kept_objects,
            "deferred": self.deferred,
        }


def _take_lock(store: JobStore, body: bytes) -> float | None:
    """Create the gc lock; return its server-side time (the clock gc compares ages with), or None."""
    if not store.storage.create(GC_LOCK, body):
        info = store.storage.stat(GC_LOCK)
        if info is None or time.time() - info.mtime < STALE_AFTER_S:
            return None
        log.warning("job %s: breaking a stale gc lock from %.0f s ago", store.job, time.time() - info.mtime)
        store.storage.delete([GC_LOCK])
        if not store.storage.create(GC_LOCK, body):
            return None
    info = store.storage.stat(GC_LOCK)
    return info.mtime if info is not None else time.time()


def _release_lock(store: JobStore, body: bytes) -> None:
    """Delete the lock only if it is still ours; a failure is logged (the lock goes stale)."""
    try:
        if store.storage.read(GC_LOCK) == body:
            store.storage.delete([GC_LOCK])
    except (FileNotFoundError, StorageError) as err:
        log.warning("job %s: could not release the gc lock: %s", store.job, err)


def collect_garbage(store: JobStore, *, min_age_s: float = 600.0, dry_run: bool = False) -> GcResult:
    """Delete objects referenced by no completed snapshot and older than ``min_age_s``.

    Pending markers are listed BEFORE manifests: a writer that finishes in between has its
    manifest listed; one that starts in between waits for the lock.
    """
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)}).encode()
    now = _take_lock(store, body)
    if now is None:
        return GcResult(0, 0, 0, deferred=f"another gc holds {store.storage.uri(GC_LOCK)}")
    try:
        pending = pending_markers(store)
        try:
            manifests = list_snapshots(store, strict=True)
        except SnapshotError as err:
            return GcResult(0, 0, 0, deferred=f"a manifest cannot be read, so its objects cannot be told apart: {err}")
        done = {m.snapshot_id for m in manifests}
        finished = []
        for snapshot_id, mtime in pending:
            if snapshot_id in done or now - mtime >= STALE_AFTER_S:
                finished.append(store.pending_key(snapshot_id))
            else:
                return GcResult(0, 0, 0, deferred=f"snapshot {snapshot_id} is being written")
        referenced = {store.object_key(f.sha256) for m in manifests for f in m.files}
        objects = store.storage.list(OBJECTS)
        garbage = [o for o in objects if o.key not in referenced and now - o.mtime >= min_age_s]
        if not dry_run:
            store.storage.delete([o.key for o in garbage] + finished)
        result = GcResult(len(garbage), sum(o.size for o in garbage), len(objects) - len(garbage))
        log.info(
            "job %s: gc %s %d unreferenced objects (%d bytes), kept %d referenced or recent",
            store.job, "would delete" if dry_run else "deleted", result.deleted_objects,
            result.deleted_bytes, result.kept_objects,
        )
        return result
    finally:
        _release_lock(store, body)
