"""Pending markers: a snapshot being written announces itself (and its owner) so gc keeps its objects.

The marker names its writer (host, pid, lease epoch when a driver writes it, start time), so gc can
tell a writer that is provably gone (a dead pid on gc's own host, a lease epoch a newer driver has
fenced, or a marker older than the age limit) from one that may still be uploading.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_ckpt_provider.core.records.base import Record, RecordError
from airflow_ckpt_provider.core.records.lease import LeaseRecord, pid_alive
from airflow_ckpt_provider.core.store.jobstore import PENDING, JobStore

#: A writer of epoch E checks the lease right before its manifest (its commit point), and a fenced
#: driver stops itself within its poll interval: once a newer epoch has held the lease this long, a
#: writer of an older epoch has either committed or never will.
FENCED_GRACE_S = 60.0


class PendingRecord(Record, frozen=True, kw_only=True):
    """Who writes snapshot ``snapshot_id`` and since when: the writer's host and pid, and the lease epoch of the
    driver that writes it (None: not a driver, e.g. `ckpt snapshot create`). Written by the snapshot's writer
    (core/snapshots/snapshotwrite.py) before its first upload, deleted once its manifest exists; read by gc
    (core/records/pending.writer_gone), which keeps every object while a writer may still be uploading. Every field may
    be missing (markers of older versions were empty): the writer is then unknown, and only age proves it gone."""

    WHAT = "pending marker"
    KEY = "pending/<snapshot id>.json"

    snapshot_id: str | None = None
    started_at: str | None = None
    host: str | None = None
    pid: int | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class PendingMarker:
    """``pending/<id>.json``: who writes snapshot ``snapshot_id`` and since when.

    ``mtime`` is the store's own modification time of the marker (the clock gc measures ages with);
    ``host``/``pid``/``created_at`` are None for markers of older versions or unreadable ones.
    """

    snapshot_id: str
    mtime: float
    host: str | None = None
    pid: int | None = None
    epoch: int | None = None
    created_at: str | None = None

    @staticmethod
    def body(snapshot_id: str, now: datetime, epoch: int | None) -> bytes:
        """The marker this process writes for ``snapshot_id``."""
        return PendingRecord(snapshot_id=snapshot_id, started_at=now.astimezone(UTC).isoformat(timespec="seconds"),
                             host=socket.gethostname(), pid=os.getpid(), epoch=epoch).to_bytes()

    @classmethod
    def parse(cls, snapshot_id: str, mtime: float, data: bytes | None) -> PendingMarker:
        """A marker from its bytes; an unreadable or foreign body gives a marker with an unknown owner."""
        try:
            record = PendingRecord.from_bytes(data, f"{PENDING}{snapshot_id}.json") if data else PendingRecord()
        except RecordError:
            record = PendingRecord()
        return cls(snapshot_id, mtime, host=record.host, pid=record.pid, epoch=record.epoch,
                   created_at=record.started_at)

    def owner(self) -> str:
        """``pid 42 on host h (lease epoch 3)``, or what is known of it."""
        if self.host is None or self.pid is None:
            who = "an unknown writer (the marker does not name its owner)"
        else:
            who = f"pid {self.pid} on host {self.host}"
        return who + (f" (lease epoch {self.epoch})" if self.epoch is not None else "")


def read_markers(store: JobStore) -> list[PendingMarker]:
    """Every pending marker of the job with its owner (a marker deleted meanwhile is left out)."""
    found = []
    for o in store.storage.list(PENDING):
        if not o.key.endswith(".json"):
            continue
        try:
            data: bytes | None = store.storage.read(o.key)
        except FileNotFoundError:  # its writer finished while we listed
            continue
        found.append(PendingMarker.parse(o.key[len(PENDING) : -len(".json")], o.mtime, data))
    return found


def writer_gone(
    marker: PendingMarker,
    *,
    now: float,
    stale_after: float,
    lease: LeaseRecord | None,
    lease_mtime: float | None,
    host: str | None = None,
    alive: Callable[[int], bool] = pid_alive,
) -> str | None:
    """Why the marker's writer is provably gone (its marker may go), or None if it may still write.

    ``now`` and ``lease_mtime`` are the store's clock (gc's lock and the lease's modification times).
    """
    age = now - marker.mtime
    if age >= stale_after:
        return f"the marker is {human_age(age)} old (older than {human_age(stale_after)})"
    this_host = host if host is not None else socket.gethostname()
    if marker.host == this_host and marker.pid is not None and not alive(marker.pid):
        return f"its writer, pid {marker.pid} on this host ({this_host}), no longer exists"
    if (marker.epoch is not None and lease is not None and lease.epoch > marker.epoch
            and lease_mtime is not None and now - lease_mtime >= FENCED_GRACE_S):
        return (f"its writer's lease epoch {marker.epoch} was fenced by epoch {lease.epoch} "
                f"{human_age(now - lease_mtime)} ago")
    return None


def human_age(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2 h 5 min``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"
