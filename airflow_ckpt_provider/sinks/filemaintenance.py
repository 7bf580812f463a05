"""Verify and gc of the ``ckpt-files`` sink: what ``ckpt sink verify`` and ``ckpt sink gc`` run.

Runs on any host that reaches the sink path (the CLI, a maintenance task), never in the query:
``verify_sink`` checks every manifest's files and reports the timelines and the batches they
abandoned; ``gc_sink`` deletes files no shown batch references and, after a grace period, the
manifests of abandoned batches (layout and manifests: sinks/filelayout.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.store.storage import ObjectInfo, S3Options, Storage
from airflow_ckpt_provider.sinks.filelayout import (
    COMMITS,
    DATA,
    FENCE,
    IDENTITY,
    TIMELINES,
    BatchManifest,
    read_timelines,
    sink_storage,
    sink_view,
)
from airflow_ckpt_provider.sinks.timelines import TimelineRecord, Timelines, effective, split

log = logging.getLogger(__name__)


@dataclass
class SinkReport:
    """verify_sink's findings: problems make ``ok`` false; orphans (uncommitted files) and abandoned batches
    (hidden by a fork, kept until gc) do not. ``batches``, ``files``, ``rows``, ``bytes``: of the shown
    batches (every manifest's files are checked)."""

    url: str
    job: str | None = None
    batches: dict[str, list[int]] = field(default_factory=dict)
    files: int = 0
    rows: int = 0
    bytes: int = 0
    orphans: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    forks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    abandoned: dict[str, list[dict[str, int]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok,
                "queries": {q: {"batches": len(b), "first": b[0], "last": b[-1],
                                "timeline": self.forks[q][-1]["timeline"] if self.forks.get(q) else 0}
                            for q, b in self.batches.items() if b}}


def verify_sink(path: str | Storage, s3: S3Options | None = None, *, checksums: bool = False) -> SinkReport:
    """Check every manifest's files exist with the recorded size (and SHA-256 with ``checksums``); report
    the timelines (forks) and the batches they abandoned."""
    storage = sink_storage(path, s3)
    report = SinkReport(storage.url)
    objects = {o.key: o for o in storage.list()}
    if IDENTITY not in objects:
        report.problems.append(f"{IDENTITY}: missing: not a ckpt-files sink")
    else:
        try:
            report.job = json.loads(storage.read(IDENTITY))["job"]
        except (ValueError, KeyError) as err:
            report.problems.append(f"{IDENTITY}: unreadable ({err})")
    referenced: dict[str, str] = {}
    by_query: dict[str, list[BatchManifest]] = {}
    for key in sorted(k for k in objects if k.startswith(COMMITS + "/")):
        try:
            m = BatchManifest.from_bytes(storage.read(key), storage.uri(key))
        except (ValueError, KeyError, TypeError, StorageError) as err:
            report.problems.append(f"{key}: unreadable manifest ({err})")
            continue
        if key != m.key:
            report.problems.append(f"{key}: names query {m.query_id} batch {m.batch_id} timeline {m.timeline}, "
                                   f"expected at {m.key}")
        if report.job and m.job != report.job:
            report.problems.append(f"{key}: written by job {m.job!r}, the sink belongs to {report.job!r}")
        by_query.setdefault(m.query_id, []).append(m)
        _check_files(report, storage, m, key, objects=objects, referenced=referenced, checksums=checksums)
    for q, manifests in by_query.items():
        _check_timelines(report, storage, q, manifests)
    _classify_rest(report, objects, referenced)
    return report


def _check_timelines(report: SinkReport, storage: Storage, query_id: str, manifests: list[BatchManifest]) -> None:
    """Split a query's batches into shown and abandoned; a manifest of an unrecorded timeline is a problem."""
    try:
        records = read_timelines(storage, query_id)
    except (ValueError, KeyError, TypeError) as err:
        report.problems.append(f"{TIMELINES}/{query_id}/: unreadable timeline record ({err})")
        records = []
    timelines = effective(records, {(m.timeline, m.batch_id) for m in manifests})
    known = {0} | {r.timeline for r in records}
    for m in manifests:
        if m.timeline not in known:
            report.problems.append(f"{m.key}: batch of timeline {m.timeline}, which has no record in {TIMELINES}/")
    shown, abandoned = split(manifests, timelines)
    report.batches[query_id] = sorted(m.batch_id for m in shown)
    report.rows += sum(m.rows for m in shown)
    report.files += sum(len(m.files) for m in shown)
    report.bytes += sum(m.total_bytes for m in shown)
    started = {r.timeline for r in timelines.records}
    report.forks[query_id] = [
        {"timeline": r.timeline, "parent": r.parent, "fork_batch": r.fork_batch, "created_at": r.created_at,
         "abandoned": list(r.abandoned), "took_effect": r.timeline in started} for r in records]
    if abandoned:
        report.abandoned[query_id] = [{"batch_id": m.batch_id, "timeline": m.timeline, "rows": m.rows}
                                      for m in sorted(abandoned, key=lambda m: (m.timeline, m.batch_id))]
    if not report.forks[query_id]:
        del report.forks[query_id]


def _check_files(report: SinkReport, storage: Storage, m: BatchManifest, key: str, *, objects: dict[str, ObjectInfo],
                 referenced: dict[str, str], checksums: bool) -> None:
    """Each file of manifest ``key``: listed once, present, of the recorded size (and checksum)."""
    for f in m.files:
        if f.key in referenced:
            report.problems.append(f"{f.key}: listed by two manifests, {referenced[f.key]} and {key}")
        referenced[f.key] = key
        found = objects.get(f.key)
        if found is None:
            report.problems.append(f"{f.key}: missing (committed in {key})")
        elif found.size != f.size:
            report.problems.append(f"{f.key}: size {found.size}, expected {f.size} (committed in {key})")
        elif checksums and hashlib.sha256(storage.read(f.key)).hexdigest() != f.sha256:
            report.problems.append(f"{f.key}: SHA-256 differs from the one committed in {key}")


def _classify_rest(report: SinkReport, objects: Iterable[str], referenced: dict[str, str]) -> None:
    """Unreferenced data files are orphans; objects outside the layout are problems."""
    for key in objects:
        if key.startswith(DATA + "/") and key not in referenced:
            report.orphans.append(key)
        elif key not in (IDENTITY, FENCE) and not key.startswith((DATA + "/", COMMITS + "/", TIMELINES + "/")):
            report.problems.append(f"{key}: not part of the ckpt-files layout")


@dataclass
class GcResult:
    """Orphan data files gc deleted (or would delete), the young ones it kept, and the abandoned batches
    (manifests of timelines a fork left) it deleted with their files."""

    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: int = 0
    abandoned_batches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gc_sink(path: str | Storage, s3: S3Options | None = None, *, older_than_s: float, dry_run: bool = False,
            clock: Callable[[], float] = time.time) -> GcResult:
    """Delete data files no shown batch references and older than ``older_than_s``; the manifests of
    abandoned batches go too once their fork is older than ``older_than_s``; shown manifests never.

    An in-flight batch's files are unreferenced until its commit: the grace must exceed the longest
    batch (from the first file written to the commit), or gc deletes files about to be committed.
    """
    if older_than_s < 0:
        raise ConfigError(f"older_than_s must be >= 0, found {older_than_s}")
    storage = sink_storage(path, s3)
    if not storage.exists(IDENTITY):
        raise ConfigError(f"{storage.url} is not a ckpt-files sink ({IDENTITY} is missing): gc refuses to delete")
    # Data files first, manifests second: a file committed in between is seen as referenced.
    data = storage.list(DATA + "/")
    view = sink_view(storage)
    now = clock()
    result = GcResult()
    referenced = {f.key for m in view.shown for f in m.files}
    for m in view.abandoned:
        fork = _abandoning_fork(view.timelines[m.query_id], m)
        if fork is not None and now - _epoch(fork.created_at) >= older_than_s:
            result.abandoned_batches.append(m.key)
        else:
            referenced |= {f.key for f in m.files}
    for o in data:
        if o.key in referenced:
            continue
        if now - o.mtime < older_than_s:
            result.kept_young += 1
            continue
        result.deleted.append(o.key)
        result.deleted_bytes += o.size
    if not dry_run and (result.deleted or result.abandoned_batches):
        storage.delete(result.deleted)
        storage.delete(result.abandoned_batches)  # after their files: a crash in between leaves them readable
        log.info("ckpt-files gc of %s deleted %d orphan files (%d bytes) and %d abandoned batches' manifests",
                 storage.url, len(result.deleted), result.deleted_bytes, len(result.abandoned_batches))
    return result


def _abandoning_fork(timelines: Timelines, m: BatchManifest) -> TimelineRecord | None:
    """The fork that hid ``m``: the first effective timeline after ``m``'s that starts at or below its batch."""
    return next((r for r in timelines.records if r.timeline > m.timeline and r.fork_batch <= m.batch_id), None)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()
