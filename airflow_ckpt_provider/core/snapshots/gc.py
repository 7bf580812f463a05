"""Garbage collection of objects that no manifest references, safe against concurrent snapshots.

Protocol (the writer's half: core/snapshots/snapshotwrite.py): gc creates ``locks/gc.json`` with a
conditional create (one gc at a time), flags the generation token (core/records/generation.py) "held", then looks for
pending snapshot markers; if one is fresh it defers. A writer writes its pending marker and then reads the token;
held, it waits while the lock exists. Either gc sees the writer or the writer sees gc, so an object a new
snapshot reuses is never deleted under it. Since a writer uploads while it does so, gc also writes a new token
before its first delete and again, not held, after its last: a writer that reads the same token, not held,
before its uploads and after its handshake knows no deletion overlapped them.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError, SnapshotError, StorageError
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.records.generation import Generation, read_generation, write_generation
from airflow_ckpt_provider.core.records.lease import LeaseRecord, pid_alive, read_lease
from airflow_ckpt_provider.core.records.pending import PendingMarker, human_age, writer_gone
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, pending_markers
from airflow_ckpt_provider.core.snapshots.snapshotwrite import STALE_AFTER_S
from airflow_ckpt_provider.core.store.jobstore import GC_GENERATION, GC_LOCK, LEASE, OBJECTS, JobStore

log = logging.getLogger(__name__)

#: Why gc clears the marker of a snapshot that is complete: its writer finished but did not delete it.
LEFT_BEHIND = "its snapshot is complete (the writer left its marker behind)"


class GcLock(Record, frozen=True, kw_only=True):
    """Held while gc runs: created with a conditional create (one gc at a time) and deleted by its holder only
    while it is still the holder's (the bytes it wrote: ``token`` makes them its own); one older than the
    writers' stale limit is broken by the next gc. Written by gc (core/snapshots/gc.collect_garbage); a snapshot writer
    waits while a fresh one exists (core/snapshots/snapshotwrite.py); only its age and its bytes are ever read."""

    WHAT = "gc lock"
    KEY = "locks/gc.json"

    host: str
    pid: int
    token: str


@dataclass(frozen=True)
class ClearedMarker:
    """A pending marker gc cleared (or, in a dry run, would clear): whose it was and why it could go."""

    snapshot_id: str
    owner: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"snapshot_id": self.snapshot_id, "owner": self.owner, "reason": self.reason}


@dataclass(frozen=True)
class GcResult:
    """What gc did: ``deferred`` names why nothing was deleted, if so; ``cleared_pending`` the pending markers it
    cleared."""

    deleted_objects: int
    deleted_bytes: int
    kept_objects: int
    deferred: str | None = None
    cleared_pending: tuple[ClearedMarker, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted_objects": self.deleted_objects,
            "deleted_bytes": self.deleted_bytes,
            "kept_objects": self.kept_objects,
            "deferred": self.deferred,
            "cleared_pending": [m.to_dict() for m in self.cleared_pending],
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


def collect_garbage(
    store: JobStore, *, min_age_s: float = 600.0, dry_run: bool = False, clear_pending: Collection[str] = ()
) -> GcResult:
    """Delete objects referenced by no completed snapshot and older than ``min_age_s``.

    Pending markers are listed BEFORE manifests: a writer that finishes in between has its
    manifest listed; one that starts in between waits for the lock. A marker whose writer is
    provably gone (core/records/pending.py) is cleared; ``clear_pending`` names markers the user clears
    explicitly (refused for a writer that is alive on this host).
    """
    body = GcLock(host=socket.gethostname(), pid=os.getpid(), token=secrets.token_hex(8)).to_bytes()
    now = _take_lock(store, body)
    if now is None:
        return GcResult(0, 0, 0, deferred=f"another gc holds {store.storage.uri(GC_LOCK)}")
    try:
        if dry_run:
            return _collect(store, now, min_age_s, clear_pending, None)
        held = _Held(store)  # before the pending markers are listed
        try:
            return _collect(store, now, min_age_s, clear_pending, held)
        finally:
            held.release()
    finally:
        _release_lock(store, body)


def _collect(store: JobStore, now: float, min_age_s: float, clear_pending: Collection[str],
             held: _Held | None) -> GcResult:
    """gc's work under its lock; ``held`` None: a dry run."""
    dry_run = held is None
    pending = pending_markers(store)
    _check_clear_requests(store, pending, clear_pending)
    try:
        manifests = list_snapshots(store, strict=True)
    except SnapshotError as err:
        return GcResult(0, 0, 0, deferred=f"a manifest cannot be read, so its objects cannot be told apart: {err}")
    done = {m.snapshot_id for m in manifests}
    lease = _lease(store) if any(m.snapshot_id not in done for m in pending) else (None, None)
    finished, cleared = [], []
    for marker in pending:
        gone = None if marker.snapshot_id in done else _gone(store, marker, now, lease, clear_pending)
        if marker.snapshot_id not in done and gone is None:
            return GcResult(0, 0, 0, deferred=_still_written(store, marker, now))
        if gone is not None:
            log.log(logging.WARNING if marker.snapshot_id in clear_pending else logging.INFO,
                    "job %s snapshot %s: %s the pending marker of %s: %s", store.job, marker.snapshot_id,
                    "would clear" if dry_run else "clearing", marker.owner(), gone)
        cleared.append(ClearedMarker(marker.snapshot_id, marker.owner(), gone or LEFT_BEHIND))
        finished.append(store.pending_key(marker.snapshot_id))
    referenced = {store.object_key(f.sha256) for m in manifests for f in m.stored_files}  # inline: no object
    objects = store.storage.list(OBJECTS)
    garbage = [o for o in objects if o.key not in referenced and now - o.mtime >= min_age_s]
    if held is not None:
        if garbage:
            held.deleting()
            store.storage.delete([o.key for o in garbage])
        store.storage.delete(finished)
    result = GcResult(len(garbage), sum(o.size for o in garbage), len(objects) - len(garbage),
                      cleared_pending=tuple(cleared))
    log.info(
        "job %s: gc %s %d unreferenced objects (%d bytes), kept %d referenced or recent",
        store.job, "would delete" if dry_run else "deleted", result.deleted_objects,
        result.deleted_bytes, result.kept_objects,
    )
    return result


class _Held:
    """gc's side of the generation token (core/records/generation.py): held from before gc looks for writers' markers
    until after its last delete, and a new token before the first delete and with the release after the last."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._token = read_generation(store, create_first=False, by="gc")[0].token
        self._deleted = False
        write_generation(store, Generation(self._token, held=True))

    def deleting(self) -> None:
        """Before the first delete: a writer that kept a list of the objects lists them again, even if gc dies."""
        self._deleted = True
        write_generation(self._store, Generation.new(held=True))

    def release(self) -> None:
        """After the last delete (or none): a writer that read the token before its uploads, while deletes ran,
        sees a new one. A failure is logged: writers then take the token for held and list the objects again."""
        generation = Generation.new(held=False) if self._deleted else Generation(self._token, held=False)
        try:
            write_generation(self._store, generation)
        except StorageError as err:
            log.warning("job %s: gc could not clear its flag on %s (%s); snapshot writers list the objects again "
                        "until the next gc clears it", self._store.job, self._store.storage.uri(GC_GENERATION), err)


def _lease(store: JobStore) -> tuple[LeaseRecord | None, float | None]:
    """The job's lease and its store-side modification time (None, None without one)."""
    try:
        lease = read_lease(store)
    except StorageError as err:  # an unreadable lease only means gc cannot use the epoch rule
        log.warning("job %s: gc cannot read the lease, so it ignores lease epochs of pending markers: %s",
                    store.job, err)
        return None, None
    info = store.storage.stat(LEASE) if lease is not None else None
    return lease, info.mtime if info is not None else None


def _gone(store: JobStore, marker: PendingMarker, now: float, lease: tuple[LeaseRecord | None, float | None],
          clear: Collection[str]) -> str | None:
    """Why this marker may go, or None while its writer may still be writing."""
    gone = writer_gone(marker, now=now, stale_after=STALE_AFTER_S, lease=lease[0], lease_mtime=lease[1])
    if gone is None and marker.snapshot_id in clear:
        return "cleared on request (--clear-pending)"
    return gone


def _still_written(store: JobStore, marker: PendingMarker, now: float) -> str:
    """The deferral message: which snapshot, whose, how old, and how to clear a marker of a dead writer."""
    age = human_age(now - marker.mtime)
    return (f"snapshot {marker.snapshot_id} is being written by {marker.owner()}: its pending marker "
            f"{store.storage.uri(store.pending_key(marker.snapshot_id))} is {age} old. gc clears it by itself "
            f"once that writer is provably gone (its pid gone on the host it ran on, a newer lease epoch, or the "
            f"marker {human_age(STALE_AFTER_S)} old). If you know the writer is dead, clear it now: "
            f"`ckpt snapshot gc --clear-pending {marker.snapshot_id}`")


def _check_clear_requests(store: JobStore, pending: list[PendingMarker], clear: Collection[str]) -> None:
    """Refuse to clear a marker that does not exist, or whose writer runs on this host right now."""
    by_id = {m.snapshot_id: m for m in pending}
    for snapshot_id in clear:
        marker = by_id.get(snapshot_id)
        if marker is None:
            listed = ", ".join(sorted(by_id)) or "none"
            raise ConfigError(
                f"job {store.job}: no pending marker for snapshot {snapshot_id!r} to clear (pending markers: "
                f"{listed}); pass an id that `ckpt snapshot gc` names as being written"
            )
        if marker.host == socket.gethostname() and marker.pid is not None and pid_alive(marker.pid):
            raise ConflictError(
                f"job {store.job}: snapshot {snapshot_id} is being written by {marker.owner()}, which is alive; "
                f"its marker is not cleared. Wait for it to finish, or stop pid {marker.pid} first"
            )
