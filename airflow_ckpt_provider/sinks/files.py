"""The ``ckpt-files`` streaming sink: exactly-once Parquet files on S3 or a local directory.
This module imports pyspark at module level; nothing in the Airflow layer imports it.

Design notes: docs/sink-files.md#design-notes-sinksfilespy."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.streambatch import (
    BATCH_ID_PROPERTY,
    EPOCH_OPTION,
    OUTCOMES_OPTION,
    QUERY_ID_PROPERTY,
    SinkOutcome,
    epoch_option,
    outcomes_option,
    sink_outcome,
    worker_logging,
)
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.core.snapshots.coverage import checkpoint_storage, read_coverage
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage, sha256_file
from airflow_ckpt_provider.sinks.filecommit import commit_batch, delete_files
from airflow_ckpt_provider.sinks.filelayout import (
    IDENTITY,
    BatchManifest,
    DataFile,
    committed_files,
    data_key,
    fenced_error,
    open_sink,
    raise_fence,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)

NAME = "ckpt-files"
COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "brotli", "none")
#: Options Spark itself passes to every sink (lower case: Spark's option map is case-insensitive).
#: Spark's, and the runtime's epoch and outcomes file.
_SPARK_OPTIONS = {"checkpointlocation", "path", "queryname", EPOCH_OPTION, OUTCOMES_OPTION}
_OPTIONS = {"job", "compression", "s3.endpoint", "s3.region", "maxrecordsperfile"}
#: Rows buffered before a Parquet row group is written (Spark hands over ~10k-row Arrow batches).
ROW_GROUP_ROWS = 128 * 1024


@dataclass(frozen=True)
class SinkOptions:
    """The validated options of one ckpt-files sink."""

    path: str
    job: str
    compression: str = "snappy"
    endpoint: str | None = None
    region: str | None = None
    max_records_per_file: int = 0
    checkpoint: str = ""
    epoch: int | None = None  # the driver's lease epoch (the runtime's option), recorded with each commit
    outcomes: str | None = None  # the runtime's outcomes file (core/policy/streambatch.py OUTCOMES_OPTION)

    @classmethod
    def parse(cls, options: dict[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - _SPARK_OPTIONS - _OPTIONS)
        if unknown:
            raise ConfigError(f"ckpt-files: unsupported option(s) {', '.join(unknown)}; expected some of "
                              f"{', '.join(sorted(_OPTIONS | {'path'}))}")
        path, job = opts.get("path", "").strip(), opts.get("job", "").strip()
        if not path:
            raise ConfigError('ckpt-files: no path given: pass .option("path", "s3://BUCKET/PREFIX" or a directory)')
        if not job:
            raise ConfigError('ckpt-files: no job given: pass .option("job", NAME), the job that owns the sink path')
        compression = opts.get("compression", "snappy").lower()
        if compression not in COMPRESSIONS:
            raise ConfigError(f"ckpt-files: unsupported compression {compression!r}; expected one of "
                              f"{', '.join(COMPRESSIONS)}")
        try:
            max_records = int(opts.get("maxrecordsperfile", "0"))
        except ValueError:
            max_records = -1
        if max_records < 0:
            raise ConfigError(f"ckpt-files: maxRecordsPerFile must be an integer >= 0 (0: no limit), found "
                              f"{opts.get('maxrecordsperfile')!r}")
        return cls(path, job, compression, opts.get("s3.endpoint") or None, opts.get("s3.region") or None,
                   max_records, opts.get("checkpointlocation", "").strip(), epoch_option(opts),
                   outcomes_option(opts))

    def storage(self) -> Storage:
        """The sink's storage; S3 credentials from this process's environment (never pickled to tasks)."""
        return open_storage(self.path, S3Options.from_env(self.endpoint, self.region))


class CkptFilesDataSource(DataSource):
    """``format("ckpt-files")``: an exactly-once Parquet sink (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> CkptFilesWriter:
        # Spark 4.3 calls this when the query's first batch is planned (an error here terminates the
        # query before anything is written; awaitTermination raises it, start() does not) and again in
        # a fresh Python worker for every batch's commit/abort: the checks cost one identity read.
        opts = SinkOptions.parse(dict(self.options))
        if overwrite:
            raise ConfigError("ckpt-files: the complete output mode is not supported (it would rewrite the "
                              "whole output each batch); use append")
        checkpoint_storage(opts.checkpoint)  # refuses a missing or unreadable checkpointLocation now
        storage = opts.storage()
        open_sink(storage, opts.job)
        if opts.epoch is not None:  # the query of a newer driver fences older ones out before its first batch
            fence = raise_fence(storage, opts.job, opts.epoch)
            if fence.epoch > opts.epoch:
                raise fenced_error(storage, f"job {opts.job}", opts.epoch, fence)
        return CkptFilesWriter(opts, schema)


@dataclass
class FilesCommitMessage(WriterCommitMessage):
    """What one task wrote: its files (key, size, SHA-256, rows) for (query id, batch id)."""

    query_id: str
    batch_id: int
    partition: int
    files: list[DataFile]


class CkptFilesWriter(DataSourceStreamArrowWriter):
    """Tasks write Parquet files; the driver commits a batch by creating its manifest."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("ckpt-files: write() outside a Spark task")
        batch_id = int(ctx.getLocalProperty(BATCH_ID_PROPERTY) or -1)
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) or ""
        if batch_id < 0 or not query_id:
            raise RuntimeError(f"ckpt-files: no streaming batch id/query id in the task (batch {batch_id!r}, "
                               f"query {query_id!r}): the sink works in streaming queries only")
        partition = ctx.partitionId()
        storage = self.options.storage()
        files = _write_files(storage, iterator, self.options, query_id=query_id, batch_id=batch_id, partition=partition)
        crash_point("files.task.after-write", batch_id)
        return FilesCommitMessage(query_id, batch_id, partition, files)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        worker_logging()
        mine = [m for m in messages if isinstance(m, FilesCommitMessage)]
        query_ids = {m.query_id for m in mine}
        if not query_ids:
            log.info("ckpt-files job %s batch %d: no task reported (no partitions); nothing to commit",
                     self.options.job, batchId)
            return
        if len(query_ids) > 1 or any(m.batch_id != batchId for m in mine):
            raise RuntimeError(f"ckpt-files: tasks of batch {batchId} report queries {sorted(query_ids)} and batches "
                               f"{sorted({m.batch_id for m in mine})}")
        coverage = read_coverage(checkpoint_storage(self.options.checkpoint), batchId)
        manifest = BatchManifest(
            job=self.options.job, query_id=query_ids.pop(), batch_id=batchId,
            files=tuple(sorted((f for m in mine for f in m.files), key=lambda f: f.key)),
            spark_schema=self.schema.jsonValue(), arrow_schema=_arrow_schema_hex(self.schema), epoch=self.options.epoch,
        ).covering(coverage)
        try:
            done = commit_batch(self.options.storage(), manifest, lambda point: crash_point(point, batchId))
        except FencedError:
            sink_outcome(NAME, SinkOutcome.FENCED, batchId, path=self.options.outcomes)
            raise
        sink_outcome(NAME, SinkOutcome.COMMITTED if done.committed else SinkOutcome.SKIPPED, batchId,
                     done.manifest.rows if done.committed else 0, path=self.options.outcomes)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        mine = [m for m in messages if isinstance(m, FilesCommitMessage)]
        worker_logging()
        storage = self.options.storage()
        # Spark also aborts when commit() raised after the manifest was created (a PUT that succeeded but
        # reported an error, a dying commit worker): files a manifest names are committed and must stay.
        keep: set[str] = set()
        for query_id in {m.query_id for m in mine}:
            keep |= committed_files(storage, query_id, batchId) or set()
        keys = [f.key for m in mine for f in m.files if f.key not in keep]
        log.warning("ckpt-files job %s batch %d aborted: deleting %d files of finished tasks, keeping %d committed "
                    "(failed tasks' files stay as orphans for gc)", self.options.job, batchId, len(keys), len(keep))
        delete_files(storage, keys)
        sink_outcome(NAME, SinkOutcome.ABORTED, batchId, path=self.options.outcomes)


def _arrow_schema_hex(schema: StructType) -> str | None:
    try:
        from pyspark.sql.pandas.types import to_arrow_schema

        return str(to_arrow_schema(schema, timezone="UTC").serialize().to_pybytes().hex())
    except Exception as err:
        log.debug("ckpt-files: no Arrow schema for %s (%s)", schema.simpleString(), err)
        return None


def _write_files(storage: Storage, batches: Iterator[pa.RecordBatch], options: SinkOptions, *, query_id: str,
                 batch_id: int, partition: int) -> list[DataFile]:
    """Stream the task's rows into Parquet files (rolled at maxRecordsPerFile); an empty task writes none."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

    attempt = uuid.uuid4().hex[:16]
    files: list[DataFile] = []
    compression = None if options.compression == "none" else options.compression
    with tempfile.TemporaryDirectory(prefix="ckpt-files-") as tmp:
        writer: Any = None
        path = ""
        rows = 0
        buffered: list[pa.RecordBatch] = []

        def flush() -> None:
            if buffered:
                writer.write_table(pa.Table.from_batches(buffered), row_group_size=ROW_GROUP_ROWS * 8)
                buffered.clear()

        def finish() -> None:
            nonlocal writer, rows
            flush()
            writer.close()
            key = data_key(query_id, batch_id, partition, attempt, len(files))
            if storage.local_path(key) is not None:
                _fsync(path)
                _fsync(os.path.dirname(path))
            checksum = sha256_file(path)
            if storage.local_path(key) is None:
                storage.upload(Path(path), key)
            files.append(DataFile(key, os.path.getsize(path), checksum, rows, partition))
            writer, rows = None, 0

        for batch in batches:
            if batch.num_rows == 0:
                continue
            start = 0
            while start < batch.num_rows:
                if writer is None:
                    # Local sinks: write in place (the name is unique to this attempt, and only the
                    # manifest makes it visible); S3: a local temp file, uploaded when complete.
                    local = storage.local_path(data_key(query_id, batch_id, partition, attempt, len(files)))
                    if local is not None:
                        local.parent.mkdir(parents=True, exist_ok=True)
                    path = str(local) if local is not None else os.path.join(tmp, f"part-{len(files)}.parquet")
                    writer = pq.ParquetWriter(path, batch.schema, compression=compression)
                room = options.max_records_per_file - rows if options.max_records_per_file else batch.num_rows
                piece = batch.slice(start, min(room, batch.num_rows - start))
                buffered.append(piece)
                rows += piece.num_rows
                start += piece.num_rows
                if sum(b.num_rows for b in buffered) >= ROW_GROUP_ROWS:
                    flush()
                if options.max_records_per_file and rows >= options.max_records_per_file:
                    finish()
        if writer is not None:
            finish()
    return files


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def register(spark: Any) -> None:
    """Make ``format("ckpt-files")`` available in ``spark`` (runtime.datasources registers every source)."""
    spark.dataSource.register(CkptFilesDataSource)


def files_sink(writer: DataStreamWriter, path: str, *, job: str, **options: str) -> DataStreamWriter:
    """``writer`` set up for ckpt-files after the sink's checks, run now rather than at the first batch.

    Spark 4.3 builds a Python sink's writer only when the first batch is planned; calling this in a
    job's build function refuses bad input (another job's path, foreign files, bad options) before
    the runtime takes the lease or starts the query. Nothing is written: the path is claimed later.
    """
    opts = SinkOptions.parse({"path": path, "job": job, **options})
    storage = opts.storage()
    if storage.exists(IDENTITY):
        open_sink(storage, opts.job, create=False)
    elif storage.list()[:1]:
        open_sink(storage, opts.job)  # raises the foreign-files ConflictError (the path is not empty)
    return writer.format(NAME).option("path", path).option("job", job).options(**options)
