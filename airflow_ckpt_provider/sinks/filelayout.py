"""Layout, commit manifests, reader, verify and gc of the ``ckpt-files`` sink (no pyspark import).

Under the sink path (docs/sink-files.md)::

    _ckpt_sink.json                                      identity: job, format version, created
    data/<query id>/<batch:020d>/part-<p:05d>-<attempt>-<n>.parquet   one attempt's files
    _commits/<query id>/<batch:020d>.json                manifest: a batch is visible iff it exists

Manifests are created with ``Storage.create`` (create-if-absent), so exactly one attempt of a
(query id, batch id) becomes visible; files no manifest names are never read and gc deletes them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.storage import ObjectInfo, S3Options, Storage, open_storage

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

FORMAT = "ckpt-files"
VERSION = 1
IDENTITY = "_ckpt_sink.json"
DATA = "data"
COMMITS = "_commits"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def data_key(query_id: str, batch_id: int, partition: int, attempt: str, n: int) -> str:
    """The key of one file of one task attempt: unique per attempt, so attempts never overwrite."""
    return f"{DATA}/{query_id}/{batch_id:020d}/part-{partition:05d}-{attempt}-{n}.parquet"


def manifest_key(query_id: str, batch_id: int) -> str:
    return f"{COMMITS}/{query_id}/{batch_id:020d}.json"


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
    """The commit record of one batch of one query: the only thing that makes files visible."""

    job: str
    query_id: str
    batch_id: int
    files: tuple[DataFile, ...]
    committed_at: str = field(default_factory=_now)
    schema: dict[str, Any] | None = None  # Spark's StructType.jsonValue()
    arrow_schema: str | None = None  # hex of the IPC-serialized pyarrow schema, for empty reads

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def key(self) -> str:
        return manifest_key(self.query_id, self.batch_id)

    def to_json(self) -> bytes:
        d = asdict(self)
        d.update(format=FORMAT, version=VERSION, rows=self.rows, bytes=self.total_bytes)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BatchManifest:
        d = json.loads(data)
        return cls(job=d["job"], query_id=d["query_id"], batch_id=int(d["batch_id"]),
                   files=tuple(DataFile(**f) for f in d["files"]), committed_at=d["committed_at"],
                   schema=d.get("schema"), arrow_schema=d.get("arrow_schema"))


@dataclass(frozen=True)
class CommitOutcome:
    """What commit_batch did: committed this attempt, or skipped it (batch already committed)."""

    committed: bool
    manifest: BatchManifest
    deleted: tuple[str, ...] = ()


def commit_batch(storage: Storage, manifest: BatchManifest,
                 crash: Callable[[str], None] = lambda point: None) -> CommitOutcome:
    """Make ``manifest``'s files visible by creating its manifest if absent; otherwise delete them.

    A batch whose manifest exists (a replay after a restart, or a zombie attempt) keeps its earlier
    output; this attempt's files that the existing manifest does not name are deleted.
    """
    missing = _missing_files(storage, manifest)
    if missing:
        # gc (with a grace shorter than this batch took) or a hand deleted them: committing would publish
        # a batch that cannot be read. Failing makes Spark replay the batch, which writes new files.
        raise ConflictError(f"ckpt-files job {manifest.job} batch {manifest.batch_id}: {len(missing)} files its "
                            f"tasks wrote are gone before the commit (e.g. {missing[0]}): the batch is replayed; "
                            "if `ckpt sink gc` ran, give it an --older-than longer than any batch takes")
    crash("files.commit.before-manifest")
    created = storage.create(manifest.key, manifest.to_json())
    crash("files.commit.after-manifest")
    if created:
        log.info("ckpt-files committed job %s query %s batch %d: %d files, %d rows, %d bytes",
                 manifest.job, manifest.query_id, manifest.batch_id, len(manifest.files), manifest.rows,
                 manifest.total_bytes)
        return CommitOutcome(True, manifest)
    existing = BatchManifest.from_json(storage.read(manifest.key))
    keep = {f.key for f in existing.files}
    mine = tuple(f.key for f in manifest.files if f.key not in keep)
    storage.delete(mine)
    log.info("ckpt-files skipped replay of job %s query %s batch %d: committed at %s; deleted this "
             "attempt's %d files", manifest.job, manifest.query_id, manifest.batch_id, existing.committed_at,
             len(mine))
    return CommitOutcome(False, existing, mine)


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
    """The keys batch ``batch_id`` of ``query_id`` committed, or None if it is not committed."""
    try:
        return {f.key for f in BatchManifest.from_json(storage.read(manifest_key(query_id, batch_id))).files}
    except FileNotFoundError:
        return None


def committed_batches(path: str | Storage, s3: S3Options | None = None) -> list[BatchManifest]:
    """Every committed batch's manifest: queries in the order of their first commit, then batch id."""
    storage = _storage(path, s3)
    keys = [o.key for o in storage.list(COMMITS + "/") if o.key.endswith(".json")]
    with ThreadPoolExecutor(8) as pool:
        manifests = list(pool.map(lambda k: BatchManifest.from_json(storage.read(k)), keys))
    first: dict[str, str] = {}
    for m in manifests:
        first[m.query_id] = min(first.get(m.query_id, m.committed_at), m.committed_at)
    return sorted(manifests, key=lambda m: (first[m.query_id], m.query_id, m.batch_id))


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
    """verify_sink's findings: problems make ``ok`` false; orphans (uncommitted files) do not."""

    url: str
    job: str | None = None
    batches: dict[str, list[int]] = field(default_factory=dict)
    files: int = 0
    rows: int = 0
    bytes: int = 0
    orphans: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok,
                "queries": {q: {"batches": len(b), "first": b[0], "last": b[-1]} for q, b in self.batches.items()}}


def verify_sink(path: str | Storage, s3: S3Options | None = None, *, checksums: bool = False) -> SinkReport:
    """Check every manifest's files exist with the recorded size (and SHA-256 with ``checksums``)."""
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
    for key in sorted(k for k in objects if k.startswith(COMMITS + "/")):
        try:
            m = BatchManifest.from_json(storage.read(key))
        except (ValueError, KeyError, TypeError) as err:
            report.problems.append(f"{key}: unreadable manifest ({err})")
            continue
        if key != m.key:
            report.problems.append(f"{key}: names query {m.query_id} batch {m.batch_id}, expected at {m.key}")
        if report.job and m.job != report.job:
            report.problems.append(f"{key}: written by job {m.job!r}, the sink belongs to {report.job!r}")
        report.batches.setdefault(m.query_id, []).append(m.batch_id)
        report.rows += m.rows
        _check_files(report, storage, m, key, objects=objects, referenced=referenced, checksums=checksums)
    _classify_rest(report, objects, referenced)
    return report


def _check_files(report: SinkReport, storage: Storage, m: BatchManifest, key: str, *, objects: dict[str, ObjectInfo],
                 referenced: dict[str, str], checksums: bool) -> None:
    """Each file of manifest ``key``: listed once, present, of the recorded size (and checksum)."""
    for f in m.files:
        report.files += 1
        report.bytes += f.size
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
        elif key != IDENTITY and not key.startswith((DATA + "/", COMMITS + "/")):
            report.problems.append(f"{key}: not part of the ckpt-files layout")
    for batches in report.batches.values():
        batches.sort()


@dataclass
class GcResult:
    """Orphan data files gc deleted (or would delete) and the young ones it kept."""

    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gc_sink(path: str | Storage, s3: S3Options | None = None, *, older_than_s: float, dry_run: bool = False,
            clock: Callable[[], float] = time.time) -> GcResult:
    """Delete data files no manifest references and older than ``older_than_s``; never manifests.

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
    referenced = {f.key for m in committed_batches(storage) for f in m.files}
    result = GcResult()
    now = clock()
    for o in data:
        if o.key in referenced:
            continue
        if now - o.mtime < older_than_s:
            result.kept_young += 1
            continue
        result.deleted.append(o.key)
        result.deleted_bytes += o.size
    if not dry_run and result.deleted:
        storage.delete(result.deleted)
        log.info("ckpt-files gc of %s deleted %d orphan files (%d bytes)", storage.url, len(result.deleted),
                 result.deleted_bytes)
    return result


def delete_files(storage: Storage, keys: Iterable[str]) -> None:
    """Best-effort delete of an aborted attempt's files (gc catches what this misses)."""
    try:
        storage.delete(list(keys))
    except Exception as err:
        log.warning("ckpt-files: could not delete aborted files under %s (%s); gc will", storage.url, err)
