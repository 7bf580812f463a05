"""Layout, commit manifests, reader, verify and gc of the ``ckpt-files`` sink (no pyspark import).

Under the sink path (docs/sink-files.md)::

    _ckpt_sink.json                                      identity: job, format version, created
    data/<query id>/<batch:020d>/part-<p:05d>-<attempt>-<n>.parquet   one attempt's files
    _commits/<query id>/<batch:020d>.json                manifest of a batch of timeline 0
    _commits/<query id>/<batch:020d>-t<k:05d>.json       manifest of a batch of timeline k
    _timelines/<query id>/<k:05d>.json                   timeline k: its parent and first batch

Manifests are created with ``Storage.create`` (create-if-absent), so exactly one attempt of a
(query id, batch id, timeline) becomes visible; files no manifest names are never read and gc
deletes them. Each manifest records what its batch covered (core/coverage.py): a batch that comes
back with other content after a restore of an older snapshot starts a new timeline
(sinks/timelines.py), and readers show only the batches of the timeline the query follows.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.checkpoint import id_ranges
from airflow_ckpt_provider.core.coverage import Coverage
from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.storage import ObjectInfo, S3Options, Storage, open_storage
from airflow_ckpt_provider.sinks.timelines import (
    REFUSED,
    Action,
    Decision,
    Observed,
    Shown,
    TimelineRecord,
    Timelines,
    decide,
    effective,
    split,
)

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

FORMAT = "ckpt-files"
VERSION = 2  # 2: timelines (a version-1 sink is read as one timeline and upgraded at its first fork)
IDENTITY = "_ckpt_sink.json"
DATA = "data"
COMMITS = "_commits"
TIMELINES = "_timelines"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def data_key(query_id: str, batch_id: int, partition: int, attempt: str, n: int) -> str:
    """The key of one file of one task attempt: unique per attempt, so attempts never overwrite."""
    return f"{DATA}/{query_id}/{batch_id:020d}/part-{partition:05d}-{attempt}-{n}.parquet"


def manifest_key(query_id: str, batch_id: int, timeline: int = 0) -> str:
    suffix = f"-t{timeline:05d}" if timeline else ""
    return f"{COMMITS}/{query_id}/{batch_id:020d}{suffix}.json"


def timeline_key(query_id: str, timeline: int) -> str:
    return f"{TIMELINES}/{query_id}/{timeline:05d}.json"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- identity ----------------------------------------------------------------------------------


def open_sink(storage: Storage, job: str, *, create: bool = True) -> dict[str, Any]:
    """Check that ``storage`` is this job's ckpt-files sink (or empty, then claim it); return the identity.

    Raises ConflictError for another job's sink or a path holding files ckpt-files did not write.
    """
    for _ in range(3):
        try:
            ident = json.loads(storage.read(IDENTITY))
        except FileNotFoundError:
            ident = None
        except ValueError as err:
            raise ConflictError(f"{storage.uri(IDENTITY)} is not a ckpt-files identity record ({err}); "
                                "expected JSON written by ckpt-files: use another sink path") from err
        if ident is not None:
            if ident.get("format") != FORMAT or not isinstance(ident.get("version"), int):
                raise ConflictError(f"{storage.uri(IDENTITY)} is not a ckpt-files identity record (found "
                                    f"{ident!r}): use another sink path")
            if ident["version"] > VERSION:
                raise ConfigError(f"sink {storage.url} has format version {ident['version']}, this ckpt-files "
                                  f"reads up to {VERSION}: upgrade airflow-ckpt-provider")
            if ident.get("job") != job:
                raise ConflictError(
                    f"sink path {storage.url} belongs to job {ident.get('job')!r}, not to job {job!r}: "
                    "one sink path holds one job's output; use another path, or the owning job's name"
                )
            return dict(ident)
        if not create:
            raise ConfigError(f"{storage.url} is not a ckpt-files sink: {IDENTITY} is missing")
        foreign = storage.list()[:3]
        if foreign:
            raise ConflictError(
                f"sink path {storage.url} is not empty and has no {IDENTITY}: it holds files ckpt-files did not "
                f"write (e.g. {', '.join(o.key for o in foreign)}); use an empty or new path"
            )
        ident = {"format": FORMAT, "version": VERSION, "job": job, "created_at": _now()}
        if storage.create(IDENTITY, json.dumps(ident, sort_keys=True).encode()):
            log.info("ckpt-files sink %s created for job %s", storage.url, job)
            return ident
    raise ConflictError(f"sink path {storage.url}: the identity record kept changing; retry")


# -- manifests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written by a task attempt."""

    key: str
    size: int
    sha256: str
    rows: int
    partition: int


@dataclass(frozen=True)
class BatchManifest:
    """The commit record of one batch of one query: the only thing that makes files visible.

    ``coverage``/``previous``: digests of the batch's and the previous batch's offsets log entries
    (core/coverage.py; None in manifests of version 1); ``timeline``: the timeline it belongs to.
    """

    job: str
    query_id: str
    batch_id: int
    files: tuple[DataFile, ...]
    committed_at: str = field(default_factory=_now)
    schema: dict[str, Any] | None = None  # Spark's StructType.jsonValue()
    arrow_schema: str | None = None  # hex of the IPC-serialized pyarrow schema, for empty reads
    timeline: int = 0
    coverage: str | None = None
    previous: str | None = None
    offsets: list[Any] | None = None  # the sources' end offsets of the batch, for people reading the sink

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def key(self) -> str:
        return manifest_key(self.query_id, self.batch_id, self.timeline)

    def covering(self, coverage: Coverage) -> BatchManifest:
        """This manifest recording ``coverage`` (what the batch read)."""
        return replace(self, coverage=coverage.digest, previous=coverage.previous, offsets=list(coverage.offsets))

    def to_json(self) -> bytes:
        d = asdict(self)
        d.update(format=FORMAT, version=VERSION, rows=self.rows, bytes=self.total_bytes)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BatchManifest:
        d = json.loads(data)
        return cls(job=d["job"], query_id=d["query_id"], batch_id=int(d["batch_id"]),
                   files=tuple(DataFile(**f) for f in d["files"]), committed_at=d["committed_at"],
                   schema=d.get("schema"), arrow_schema=d.get("arrow_schema"), timeline=int(d.get("timeline", 0)),
                   coverage=d.get("coverage"), previous=d.get("previous"), offsets=d.get("offsets"))


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
            forked = _fork(storage, manifest, coverage, decision)
            if forked is None:
                continue
            crash("files.commit.after-fork-record")
        target = replace(manifest, timeline=decision.timeline)
        crash("files.commit.before-manifest")
        created = storage.create(target.key, target.to_json())
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
    at = _read_manifest(storage, manifest_key(query_id, batch_id, timelines.holder(batch_id)))
    before = (_read_manifest(storage, manifest_key(query_id, batch_id - 1, timelines.holder(batch_id - 1)))
              if batch_id > 0 else None)
    abandoned_before: tuple[str, ...] = ()
    if before is None and batch_id > 0:
        others = [_read_manifest(storage, o.key) for o in storage.list(f"{COMMITS}/{query_id}/{batch_id - 1:020d}")]
        abandoned_before = tuple(m.coverage for m in others if m is not None and m.coverage)
    seen = Observed(timelines, None if at is None else Shown(at.coverage),
                    None if before is None else Shown(before.coverage), pending,
                    max((r.timeline for r in records), default=0) + 1, abandoned_before)
    return seen, at


def _fork(storage: Storage, manifest: BatchManifest, coverage: Coverage, decision: Decision) -> TimelineRecord | None:
    """Record the new timeline (create-if-absent); None if another writer took its number first."""
    manifests = query_manifests(storage, manifest.query_id)
    shown, _ = split(manifests, _timelines_of(storage, manifest.query_id, manifests))
    abandoned = tuple(sorted(m.batch_id for m in shown if m.batch_id >= manifest.batch_id))
    record = TimelineRecord(manifest.query_id, decision.timeline, decision.parent, manifest.batch_id,
                            coverage.digest, _now(), abandoned, decision.reason)
    if not storage.create(timeline_key(manifest.query_id, decision.timeline),
                          json.dumps(record.to_dict(), sort_keys=True).encode()):
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


def _read_manifest(storage: Storage, key: str) -> BatchManifest | None:
    try:
        return BatchManifest.from_json(storage.read(key))
    except FileNotFoundError:
        return None


def read_timelines(storage: Storage, query_id: str) -> list[TimelineRecord]:
    """Every timeline record of ``query_id``, oldest first (including forks whose first batch never committed)."""
    keys = sorted(o.key for o in storage.list(f"{TIMELINES}/{query_id}/") if o.key.endswith(".json"))
    return [TimelineRecord.from_dict(json.loads(storage.read(k))) for k in keys]


def _timelines_of(storage: Storage, query_id: str, manifests: list[BatchManifest]) -> Timelines:
    """The effective timelines of ``query_id``, given all its manifests."""
    return effective(read_timelines(storage, query_id), {(m.timeline, m.batch_id) for m in manifests})


def _storage(path: str | Storage, s3: S3Options | None) -> Storage:
    """A sink path given as a Storage or a URL (S3 settings from the environment unless given)."""
    return path if isinstance(path, Storage) else open_storage(path, s3 or S3Options.from_env())


def _missing_files(storage: Storage, manifest: BatchManifest) -> list[str]:
    """The manifest's files that are not in storage (one listing per batch directory)."""
    present: set[str] = set()
    for directory in sorted({f.key.rsplit("/", 1)[0] + "/" for f in manifest.files}):
        present.update(o.key for o in storage.list(directory))
    return [f.key for f in manifest.files if f.key not in present]


def committed_files(storage: Storage, query_id: str, batch_id: int) -> set[str] | None:
    """The keys any committed attempt of batch ``batch_id`` of ``query_id`` names (in any timeline), or None."""
    prefix = f"{COMMITS}/{query_id}/{batch_id:020d}"
    keys = [o.key for o in storage.list(prefix) if o.key.endswith(".json")]
    found = [m for m in (_read_manifest(storage, k) for k in keys) if m is not None]
    return {f.key for m in found for f in m.files} if found else None


def _read_all(storage: Storage, prefix: str) -> list[BatchManifest]:
    keys = [o.key for o in storage.list(prefix) if o.key.endswith(".json")]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda k: BatchManifest.from_json(storage.read(k)), keys))


def query_manifests(storage: Storage, query_id: str) -> list[BatchManifest]:
    """Every manifest of ``query_id``, of every timeline."""
    return _read_all(storage, f"{COMMITS}/{query_id}/")


@dataclass(frozen=True)
class SinkView:
    """The sink's committed batches: ``shown`` (the output, in order), ``abandoned`` (batches of timelines
    that a later fork left; kept until gc) and each query's effective timelines."""

    shown: list[BatchManifest]
    abandoned: list[BatchManifest]
    timelines: dict[str, Timelines]


def sink_view(path: str | Storage, s3: S3Options | None = None) -> SinkView:
    """Read every manifest and timeline record once and split shown from abandoned batches."""
    storage = _storage(path, s3)
    manifests = _read_all(storage, COMMITS + "/")
    by_query: dict[str, list[BatchManifest]] = {}
    for m in manifests:
        by_query.setdefault(m.query_id, []).append(m)
    first = {q: min(m.committed_at for m in ms) for q, ms in by_query.items()}
    shown: list[BatchManifest] = []
    abandoned: list[BatchManifest] = []
    timelines: dict[str, Timelines] = {}
    for q in sorted(by_query, key=lambda q: (first[q], q)):
        timelines[q] = _timelines_of(storage, q, by_query[q])
        s, a = split(by_query[q], timelines[q])
        shown += sorted(s, key=lambda m: m.batch_id)
        abandoned += sorted(a, key=lambda m: (m.batch_id, m.timeline))
    return SinkView(shown, abandoned, timelines)


def committed_batches(path: str | Storage, s3: S3Options | None = None) -> list[BatchManifest]:
    """The output's batches: queries in the order of their first commit, then batch id; batches of
    abandoned timelines (after a restore went back in time) are not part of it."""
    return sink_view(path, s3).shown


# -- readers -----------------------------------------------------------------------------------


def read_committed(path: str | Storage, s3: S3Options | None = None, *, batch_id_column: str | None = None,
                   query_id_column: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """Exactly the rows of committed batches, in batch order, as one pyarrow Table.

    ``batch_id_column``/``query_id_column`` add the batch id (int64) / query id (string) as columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    storage = _storage(path, s3)
    manifests = committed_batches(storage)
    jobs = [(m, f) for m in manifests for f in m.files]

    def load(item: tuple[BatchManifest, DataFile]) -> pa.Table:
        m, f = item
        local = storage.local_path(f.key)
        table = pq.read_table(str(local) if local else io.BytesIO(storage.read(f.key)), columns=columns)
        if batch_id_column:
            table = table.append_column(batch_id_column, pa.array([m.batch_id] * table.num_rows, pa.int64()))
        if query_id_column:
            table = table.append_column(query_id_column, pa.array([m.query_id] * table.num_rows, pa.string()))
        return table

    with ThreadPoolExecutor(8) as pool:
        tables = list(pool.map(load, jobs))
    if tables:
        return pa.concat_tables(tables, promote_options="default")
    schema = _empty_schema(manifests, columns)
    if batch_id_column:
        schema = schema.append(pa.field(batch_id_column, pa.int64()))
    if query_id_column:
        schema = schema.append(pa.field(query_id_column, pa.string()))
    return schema.empty_table()


def _empty_schema(manifests: list[BatchManifest], columns: list[str] | None) -> pa.Schema:
    import pyarrow as pa

    for m in reversed(manifests):
        if m.arrow_schema:
            schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(m.arrow_schema)))
            return pa.schema([schema.field(c) for c in columns]) if columns else schema
    return pa.schema([])


def read_pandas(path: str | Storage, s3: S3Options | None = None, **kwargs: Any) -> pd.DataFrame:
    """read_committed(...) as a pandas DataFrame."""
    return read_committed(path, s3, **kwargs).to_pandas()


def read_spark(spark: Any, path: str, s3: S3Options | None = None, *, via: str = "auto") -> Any:
    """A Spark DataFrame of exactly the committed rows.

    ``via="spark"`` reads the committed files with spark.read.parquet (a local path, or S3 when Spark
    has hadoop-aws: the path is given as s3a://); ``"arrow"`` reads them with pyarrow on the driver and
    calls createDataFrame (no hadoop-aws; data must fit in the driver); ``"auto"``: spark for local paths.
    """
    from pyspark.sql.types import StructType

    storage = open_storage(path, s3 or S3Options.from_env())
    manifests = committed_batches(storage)
    local = storage.local_path("x") is not None
    if via == "arrow" or (via == "auto" and not local):
        return spark.createDataFrame(read_committed(storage))
    schema = next((StructType.fromJson(m.schema) for m in reversed(manifests) if m.schema), None)
    files = [storage.uri(f.key) for m in manifests for f in m.files]
    if not local:
        files = ["s3a" + u[u.index("://"):] for u in files]
    if not files:
        return spark.createDataFrame([], schema or StructType([]))
    reader = spark.read.schema(schema) if schema else spark.read
    return reader.parquet(*files)


# -- verify and gc -----------------------------------------------------------------------------


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
    storage = _storage(path, s3)
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
            m = BatchManifest.from_json(storage.read(key))
        except (ValueError, KeyError, TypeError) as err:
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
        elif key != IDENTITY and not key.startswith((DATA + "/", COMMITS + "/", TIMELINES + "/")):
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
    storage = _storage(path, s3)
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


def delete_files(storage: Storage, keys: Iterable[str]) -> None:
    """Best-effort delete of an aborted attempt's files (gc catches what this misses)."""
    try:
        storage.delete(list(keys))
    except Exception as err:
        log.warning("ckpt-files: could not delete aborted files under %s (%s); gc will", storage.url, err)
