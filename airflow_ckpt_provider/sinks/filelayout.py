"""Layout, identity, commit manifests and readers of the ``ckpt-files`` sink (no pyspark import).

Design notes: docs/sink-files.md#design-notes-sinksfilelayoutpy."""

from __future__ import annotations

import io
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.records.base import Record, Upgrade
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage
from airflow_ckpt_provider.sinks.timelines import TimelineRecord, Timelines, effective, split

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no py.typed; pandas-stubs is not installed
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

log = logging.getLogger(__name__)

FORMAT = "ckpt-files"
VERSION = 2  # 2: timelines (a version-1 sink is read as one timeline and upgraded at its first fork)
IDENTITY = "_ckpt_sink.json"
DATA = "data"
COMMITS = "_commits"
TIMELINES = "_timelines"
FENCE = "_fence.json"


def now_iso() -> str:
    """Now in UTC, ISO 8601 with milliseconds: when an identity, a manifest or a timeline record was written."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def data_key(query_id: str, batch_id: int, partition: int, attempt: str, n: int) -> str:
    """The key of one file of one task attempt: unique per attempt, so attempts never overwrite."""
    return f"{DATA}/{query_id}/{batch_id:020d}/part-{partition:05d}-{attempt}-{n}.parquet"


def manifest_key(query_id: str, batch_id: int, timeline: int = 0) -> str:
    suffix = f"-t{timeline:05d}" if timeline else ""
    return f"{COMMITS}/{query_id}/{batch_id:020d}{suffix}.json"


def timeline_key(query_id: str, timeline: int) -> str:
    return f"{TIMELINES}/{query_id}/{timeline:05d}.json"


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
        ident = {"format": FORMAT, "version": VERSION, "job": job, "created_at": now_iso()}
        if storage.create(IDENTITY, json.dumps(ident, sort_keys=True).encode()):
            log.info("ckpt-files sink %s created for job %s", storage.url, job)
            return ident
    raise ConflictError(f"sink path {storage.url}: the identity record kept changing; retry")


# -- fence -------------------------------------------------------------------------------------


class FenceRecord(Record, frozen=True, kw_only=True):
    """The highest lease epoch of a driver that opened the sink or committed to it (``raised_at``: when). Raised by
    every driver's sink when its query starts and at each commit (compare-and-swap, never lowered); read by each
    commit right before its manifest is created: a commit of a lower epoch is a driver a newer one replaced (a
    pause, a partition) and commits nothing (sinks/filecommit.py; docs/reliability.md, finding 6)."""

    WHAT = "ckpt-files fence"
    KEY = "<sink>/_fence.json"

    job: str
    epoch: int
    raised_at: str = msgspec.field(default_factory=now_iso)


def raise_fence(storage: Storage, job: str, epoch: int) -> FenceRecord:
    """Raise the sink's fence to ``epoch`` unless it is there or higher already; return the fence as it now is
    (one read; a write only when raising)."""
    for _ in range(5):  # a lost compare-and-swap is read again
        found = storage.read_versioned(FENCE)
        current = FenceRecord.from_bytes(found.data, storage.uri(FENCE)) if found is not None else None
        if current is not None and current.epoch >= epoch:
            return current
        raised = FenceRecord(job=job, epoch=epoch)
        if storage.write_if(FENCE, raised.to_bytes(), None if found is None else found.tag):
            log.info("ckpt-files sink %s: job %s fenced at epoch %d (was %s): commits of older drivers are refused",
                     storage.url, job, epoch, "none" if current is None else current.epoch)
            return raised
    raise ConflictError(f"ckpt-files sink {storage.url}: its fence kept changing while raising it to epoch {epoch}; "
                        "more than one driver of the job is starting: check the job's lease")


def fenced_error(storage: Storage, what: str, epoch: int, fence: FenceRecord) -> FencedError:
    """The error of a commit (or a query start) of a driver that a newer one replaced."""
    return FencedError(
        f"ckpt-files {what}: expected this driver (epoch {epoch}) to hold the job, found the sink fenced at epoch "
        f"{fence.epoch} since {fence.raised_at} ({storage.uri(FENCE)}): a newer driver runs the job, this one is "
        "fenced and commits nothing. If the job's store was recreated (its epochs started again at 1), stop every "
        f"driver of the job and delete {storage.uri(FENCE)}")


# -- manifests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written by a task attempt."""

    key: str
    size: int
    sha256: str
    rows: int
    partition: int


class BatchManifest(Record, frozen=True, kw_only=True):
    """The commit record of batch ``batch_id`` of query ``query_id`` on timeline ``timeline``: the only thing that
    makes its Parquet ``files`` visible. ``coverage``/``previous``: digests of the batch's and the previous batch's
    offsets log entries (core/snapshots/coverage.py; None in manifests of version 1); ``offsets``: the sources' end
    offsets, for people reading the sink; ``schema``: Spark's StructType of the rows; ``epoch``: the committing
    driver's lease epoch, its fencing token; ``rows`` and ``bytes`` are written for people too. Written once
    (create-if-absent) by the sink's driver-side commit (sinks/filecommit.py); read by every reader of the sink,
    its verify and gc, and the next commits."""

    SCHEMA = VERSION
    WHAT = "ckpt-files commit manifest"
    KEY = "<sink>/_commits/<query id>/<batch id>[-t<timeline>].json"
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: dict}  # version 2 added timelines: a version 1 one is of timeline 0

    schema: int = msgspec.field(default=0, name="version")  # the record's version, the sink's VERSION
    format: str = FORMAT
    job: str
    query_id: str
    batch_id: int
    files: tuple[DataFile, ...]
    committed_at: str = msgspec.field(default_factory=now_iso)
    spark_schema: dict[str, Any] | None = msgspec.field(default=None, name="schema")  # StructType.jsonValue()
    arrow_schema: str | None = None  # hex of the IPC-serialized pyarrow schema, for empty reads
    timeline: int = 0
    coverage: str | None = None
    previous: str | None = None
    offsets: list[Any] | None = None  # the sources' end offsets of the batch, for people reading the sink
    epoch: int | None = None  # the committing driver's lease epoch (None: a release before, or no ckpt runtime)

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
        return msgspec.structs.replace(self, coverage=coverage.digest, previous=coverage.previous,
                                       offsets=list(coverage.offsets))

    def to_bytes(self) -> bytes:
        return _ENCODER.encode({**self.to_dict(), self.version_key(): self.written_schema(), "rows": self.rows,
                                "bytes": self.total_bytes})


_ENCODER = msgspec.json.Encoder(order="sorted")


def read_manifest(storage: Storage, key: str) -> BatchManifest | None:
    try:
        return BatchManifest.from_bytes(storage.read(key), storage.uri(key))
    except FileNotFoundError:
        return None


def read_timelines(storage: Storage, query_id: str) -> list[TimelineRecord]:
    """Every timeline record of ``query_id``, oldest first (including forks whose first batch never committed)."""
    keys = sorted(o.key for o in storage.list(f"{TIMELINES}/{query_id}/") if o.key.endswith(".json"))
    return [TimelineRecord.from_bytes(storage.read(k), storage.uri(k)) for k in keys]


def query_timelines(storage: Storage, query_id: str, manifests: list[BatchManifest]) -> Timelines:
    """The effective timelines of ``query_id``, given all its manifests."""
    return effective(read_timelines(storage, query_id), {(m.timeline, m.batch_id) for m in manifests})


def sink_storage(path: str | Storage, s3: S3Options | None) -> Storage:
    """A sink path given as a Storage or a URL (S3 settings from the environment unless given)."""
    return path if isinstance(path, Storage) else open_storage(path, s3 or S3Options.from_env())


def committed_files(storage: Storage, query_id: str, batch_id: int) -> set[str] | None:
    """The keys any committed attempt of batch ``batch_id`` of ``query_id`` names (in any timeline), or None."""
    prefix = f"{COMMITS}/{query_id}/{batch_id:020d}"
    keys = [o.key for o in storage.list(prefix) if o.key.endswith(".json")]
    found = [m for m in (read_manifest(storage, k) for k in keys) if m is not None]
    return {f.key for m in found for f in m.files} if found else None


def _read_all(storage: Storage, prefix: str) -> list[BatchManifest]:
    keys = [o.key for o in storage.list(prefix) if o.key.endswith(".json")]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda k: BatchManifest.from_bytes(storage.read(k), storage.uri(k)), keys))


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
    storage = sink_storage(path, s3)
    manifests = _read_all(storage, COMMITS + "/")
    by_query: dict[str, list[BatchManifest]] = {}
    for m in manifests:
        by_query.setdefault(m.query_id, []).append(m)
    first = {q: min(m.committed_at for m in ms) for q, ms in by_query.items()}
    shown: list[BatchManifest] = []
    abandoned: list[BatchManifest] = []
    timelines: dict[str, Timelines] = {}
    for q in sorted(by_query, key=lambda q: (first[q], q)):
        timelines[q] = query_timelines(storage, q, by_query[q])
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
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

    storage = sink_storage(path, s3)
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
    schema = next((StructType.fromJson(m.spark_schema) for m in reversed(manifests) if m.spark_schema), None)
    files = [storage.uri(f.key) for m in manifests for f in m.files]
    if not local:
        files = ["s3a" + u[u.index("://"):] for u in files]
    if not files:
        return spark.createDataFrame([], schema or StructType([]))
    reader = spark.read.schema(schema) if schema else spark.read
    return reader.parquet(*files)
