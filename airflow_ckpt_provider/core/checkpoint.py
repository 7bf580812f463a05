"""The Spark Structured Streaming checkpoint model: completed batches and the files that restore one.

Pure Python over :class:`Storage` (no pyspark). A batch N is completed when ``commits/N`` exists; a
restore at N needs ``metadata``, the offsets/commits entries Spark reads on restart, the source logs,
and, for every state store, exactly the files that load state version N+1. Each rule, where it comes
from in Spark 4.3 and how it was confirmed: docs/spark-checkpoint-internals.md.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from airflow_ckpt_provider.core.ckptfiles import (
    STATE_FILE,
    LogEntry,
    json_object,
    lz4_stream_problem,
    parse_log_entry,
    schema_key,
    sst_problem,
    zip_problem,
)
from airflow_ckpt_provider.core.errors import CheckpointError
from airflow_ckpt_provider.core.storage import Storage

HDFS = "hdfs"
ROCKSDB = "rocksdb"
DEFAULT_STORE = "default"

_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
_PROVIDERS = {
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider": HDFS,
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider": ROCKSDB,
}
# checkpointFormatVersion 2 names files "<version>_<uniqueId>.<kind>" (CommitMetadataV2 docs).
_STATE_FILE_V2 = re.compile(r"^(\d+)_[0-9a-fA-F-]{8,}\.(delta|snapshot|zip|changelog)$")
_STORE_SUBDIRS = ("_metadata", "SSTs", "logs")
_MAX_PROBLEMS_SHOWN = 8
_MAX_LOG_VERSION = 2  # OffsetSeqLog.MAX_VERSION and CommitLog.MAX_VERSION in Spark 4.3
_FORMAT_V2 = (
    "the query uses state store checkpoint format version 2 "
    "(spark.sql.streaming.stateStore.checkpointFormatVersion=2: commits/N lists stateUniqueIds and "
    "state files are named <version>_<uniqueId>), which this provider does not support; run the "
    "query on a new checkpoint with format version 1 (the default)"
)


@dataclass(frozen=True)
class CheckpointFile:
    """One file a restore needs: its key relative to the checkpoint root, and its size in bytes."""

    path: str
    size: int


@dataclass(frozen=True)
class StateOperator:
    """One stateful operator: its state stores, partitions and the provider that wrote them."""

    operator_id: int
    name: str | None
    partitions: int
    store_names: tuple[str, ...]
    provider: str  # HDFS or ROCKSDB
    changelog: bool  # RocksDB changelog checkpointing files are in use

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict, for manifests."""
        return {
            "operator_id": self.operator_id,
            "name": self.name,
            "partitions": self.partitions,
            "store_names": list(self.store_names),
            "provider": self.provider,
            "changelog": self.changelog,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StateOperator:
        """The operator ``to_json`` described."""
        return cls(
            operator_id=int(d["operator_id"]),
            name=d.get("name"),
            partitions=int(d["partitions"]),
            store_names=tuple(d["store_names"]),
            provider=str(d["provider"]),
            changelog=bool(d["changelog"]),
        )


@dataclass(frozen=True)
class BatchView:
    """What a snapshot at completed batch N must hold so that Spark resumes at batch N+1."""

    batch_id: int
    query_id: str
    files: tuple[CheckpointFile, ...]
    offsets: list[str | None]
    next_offsets: list[str | None] | None
    operators: tuple[StateOperator, ...]
    conf: dict[str, str]
    batch_watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    # Broken files of the live checkpoint the view works around (e.g. a truncated snapshot
    # replaced by an older one and more deltas), and stale absolute paths: worth a log line.
    warnings: tuple[str, ...] = ()

    @property
    def state_version(self) -> int:
        """The state store version every store is loaded at on resume (batch N commits N+1)."""
        return self.batch_id + 1


# --------------------------------------------------------------------------------------------
# The listing: one point-in-time view of the checkpoint's files.
# --------------------------------------------------------------------------------------------


def _ignored(key: str) -> bool:
    # Hidden files are Hadoop's ".<name>.crc" checksums and in-flight ".<name>.<uuid>.tmp" files
    # (CheckpointFileManager.createAtomic renames them into place); Spark never reads either.
    return key.rsplit("/", 1)[-1].startswith(".")


def _numbered(sizes: dict[str, int], directory: str) -> dict[int, str]:
    """Batch id -> key for the files named by a plain integer directly under ``directory``."""
    out: dict[int, str] = {}
    for key in sizes:
        if key.startswith(directory + "/"):
            name = key[len(directory) + 1 :]
            if name.isdigit():
                out[int(name)] = key
    return out


@dataclass
class _Plan:
    """Files chosen so far and problems found while building a BatchView."""

    sizes: dict[str, int]
    read: Callable[[str], bytes]
    uri: Callable[[str], str]
    verify: bool
    chosen: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # a restore from the view would fail
    warnings: list[str] = field(default_factory=list)  # the live checkpoint has broken files
    batch: int | None = None

    def add(self, problem: str) -> None:
        """Record a problem once."""
        if problem not in self.problems:
            self.problems.append(problem)

    def need(self, key: str, why: str) -> bool:
        """Choose ``key``; record a problem if the listing does not have it."""
        if key not in self.sizes:
            self.problems.append(f"{key} is missing: {why}")
            return False
        self.chosen.add(key)
        return True

    def load(self, key: str) -> bytes | None:
        """The bytes of a listed file, or None (problem recorded) if it vanished meanwhile."""
        try:
            return self.read(key)
        except FileNotFoundError:
            self.problems.append(
                f"{key} was deleted while the checkpoint was read (Spark maintenance purges old "
                "files); take the view again"
            )
            return None


class SparkCheckpoint:
    """A Spark checkpoint location, read through ``storage``; safe on a query that is running."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def completed_batches(self) -> list[int]:
        """Every batch whose ``commits/N`` file exists, ascending."""
        return sorted(_numbered(self._sizes("commits/"), "commits"))

    def latest_completed_batch(self) -> int | None:
        """The newest completed batch; None when no batch completed yet. The one definition."""
        batches = self.completed_batches()
        return batches[-1] if batches else None

    def view(self, batch_id: int | None = None, *, write_ahead: bool = True, verify: bool = False) -> BatchView:
        """The files and facts a snapshot at ``batch_id`` (default: latest completed) must hold.

        ``write_ahead`` includes ``offsets/N+1`` when Spark already wrote it (see the docs for why).
        ``verify`` also reads every state file and checks it is complete (LZ4 end mark, zip CRCs,
        SST footer); without it only small files are read (logs, zips). Raises CheckpointError.
        """
        view, plan = self._build(batch_id, write_ahead=write_ahead, verify=verify)
        if view is None or plan.problems:
            raise CheckpointError(_problem_message(self.storage.url, plan))
        return view

    def validate(self, batch_id: int | None = None, *, write_ahead: bool = True) -> list[str]:
        """Problems found at ``batch_id``, reading every file it needs; empty if consistent.

        Also lists broken files of the live checkpoint that the view avoids (e.g. a truncated
        snapshot it replaces with an older one and more deltas): Spark itself may trip on them.
        """
        _view, plan = self._build(batch_id, write_ahead=write_ahead, verify=True)
        return plan.problems + plan.warnings

    # -- building -------------------------------------------------------------------------

    def _sizes(self, prefix: str = "") -> dict[str, int]:
        return {o.key: o.size for o in self.storage.list(prefix) if not _ignored(o.key)}

    def _build(self, batch_id: int | None, *, write_ahead: bool, verify: bool) -> tuple[BatchView | None, _Plan]:
        # Commits are listed first, then everything: all a batch needs is written before its
        # commit file, so the second listing holds it even if the walk itself is not atomic.
        commits = sorted(_numbered(self._sizes("commits/"), "commits"))
        plan = _Plan(self._sizes(), self.storage.read, self.storage.uri, verify)
        if "metadata" not in plan.sizes:
            plan.problems.append(_not_a_checkpoint(plan.sizes))
            return None, plan
        batch = _pick_batch(commits, batch_id)
        if isinstance(batch, str):
            plan.problems.append(batch)
            return None, plan
        plan.batch = batch
        return _build_view(plan, batch, write_ahead=write_ahead), plan


def is_spark_checkpoint(storage: Storage) -> bool:
    """True if ``storage`` holds a Spark checkpoint (its ``metadata`` file names a query id)."""
    try:
        meta = json.loads(storage.read("metadata").decode("utf-8"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("id"), str)


def _problem_message(url: str, plan: _Plan) -> str:
    shown = plan.problems[:_MAX_PROBLEMS_SHOWN]
    more = len(plan.problems) - len(shown)
    text = "; ".join(shown) + (f"; and {more} more problems" if more > 0 else "")
    at = f" at batch {plan.batch}" if plan.batch is not None else ""
    return f"no restorable view of checkpoint {url}{at}: {text}"


def _not_a_checkpoint(sizes: dict[str, int]) -> str:
    found = f"{len(sizes)} other files" if sizes else "no files"
    return (
        f"not a Spark checkpoint: expected a 'metadata' file with the query id, found {found}; "
        "pass the directory given as checkpointLocation to the query"
    )


def _pick_batch(commits: list[int], batch_id: int | None) -> int | str:
    """The batch to view, or a problem description."""
    if not commits:
        return "no batch has completed yet: commits/ is empty; wait until the query commits its first batch"
    if batch_id is None:
        return commits[-1]
    if batch_id not in commits:
        return (
            f"batch {batch_id} is not completed: commits/{batch_id} is missing; completed batches "
            f"still in the checkpoint: {id_ranges(commits)}"
        )
    return batch_id


def id_ranges(ids: Iterable[int]) -> str:
    """Compact "0-4, 7" text for batch ids (any order); "none" for none."""
    ordered = sorted(ids)
    if not ordered:
        return "none"
    parts: list[str] = []
    start = prev = ordered[0]
    for i in [*ordered[1:], -2]:
        if i != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ", ".join(parts)


def _build_view(plan: _Plan, batch: int, *, write_ahead: bool) -> BatchView | None:
    query_id = _query_id(plan)
    logs = _logs(plan, batch, write_ahead=write_ahead)
    if logs is None or query_id is None:
        return None
    current, following = logs
    conf = {str(k): str(v) for k, v in (current.metadata.get("conf") or {}).items()}
    _source_logs(plan, following or current)
    operators = _state(plan, batch, conf)
    return BatchView(
        batch_id=batch,
        query_id=query_id,
        files=tuple(CheckpointFile(k, plan.sizes[k]) for k in sorted(plan.chosen)),
        offsets=current.offsets,
        next_offsets=following.offsets if following else None,
        operators=operators,
        conf=conf,
        batch_watermark_ms=int(current.metadata.get("batchWatermarkMs", 0)),
        batch_timestamp_ms=int(current.metadata.get("batchTimestampMs", 0)),
        warnings=tuple(plan.warnings),
    )


def _query_id(plan: _Plan) -> str | None:
    plan.chosen.add("metadata")
    data = plan.load("metadata")
    if data is None:
        return None
    try:
        query_id = json_object(data.decode("utf-8"), "metadata file").get("id")
    except (ValueError, UnicodeDecodeError) as err:
        query_id = None
        plan.problems.append(f"metadata is corrupt: {err}")
    if not isinstance(query_id, str):
        plan.problems.append('metadata has no query id: expected {"id": "<uuid>"}')
        return None
    return query_id


# --------------------------------------------------------------------------------------------
# offsets/ and commits/: what MicroBatchExecution.populateStartOffsets reads on restart.
# --------------------------------------------------------------------------------------------


def _logs(plan: _Plan, batch: int, *, write_ahead: bool) -> tuple[LogEntry, LogEntry | None] | None:
    """Choose and parse the log entries Spark reads when it resumes after ``batch``."""
    commit = _read_log(plan, f"commits/{batch}", "commits", "it marks the batch completed")
    current = _read_log(plan, f"offsets/{batch}", "offsets", f"the offsets of completed batch {batch}")
    following = None
    if write_ahead and f"offsets/{batch + 1}" in plan.sizes:
        # Spark resumes by re-running batch N+1 with exactly these offsets.
        following = _read_log(plan, f"offsets/{batch + 1}", "offsets", "write-ahead entry")
    elif batch > 0:
        # populateStartOffsets (validateOffsetLogAndGetPrevOffset) reads the entry before the
        # latest one: without offsets/N+1 the latest is N, so offsets/N-1 must be there.
        _read_log(plan, f"offsets/{batch - 1}", "offsets", "Spark reads the entry before the latest")
    if commit is None or current is None:
        return None
    _check_commit(plan, batch, commit)
    _check_source_count(plan, batch, current, following)
    return current, following


def _read_log(plan: _Plan, key: str, kind: str, why: str) -> LogEntry | None:
    if not plan.need(key, f"{why}; Spark cannot resume without it"):
        return None
    data = plan.load(key)
    if data is None:
        return None
    try:
        entry = parse_log_entry(data, kind=kind)
    except (ValueError, UnicodeDecodeError) as err:
        plan.problems.append(f"{key} is truncated or corrupt: {err}")
        return None
    if entry.version > _MAX_LOG_VERSION:
        plan.problems.append(
            f"{key} has log format v{entry.version}; this provider reads v1 and v2 only (written by a newer Spark?)"
        )
    return entry


def _check_commit(plan: _Plan, batch: int, commit: LogEntry) -> None:
    if commit.metadata.get("stateUniqueIds"):
        plan.add(f"commits/{batch}: {_FORMAT_V2}")


def _check_source_count(plan: _Plan, batch: int, current: LogEntry, following: LogEntry | None) -> None:
    if following is not None and len(following.offsets) != len(current.offsets):
        plan.problems.append(
            f"offsets/{batch} has {len(current.offsets)} source offsets but offsets/{batch + 1} "
            f"has {len(following.offsets)}: one of them is truncated"
        )


# --------------------------------------------------------------------------------------------
# sources/: the logs some sources keep (FileStreamSource's file log, Kafka's initial offsets).
# --------------------------------------------------------------------------------------------


def _source_logs(plan: _Plan, entry: LogEntry) -> None:
    """Choose the files under ``sources/<i>/`` that match the newest chosen offsets entry."""
    dirs = sorted({k.split("/")[1] for k in plan.sizes if k.startswith("sources/") and k.count("/") >= 2})
    for source in dirs:
        keys = [k for k in plan.sizes if k.startswith(f"sources/{source}/")]
        log_offset = _file_log_offset(entry, source)
        if log_offset is None:
            plan.chosen.update(keys)  # unknown source: keep its whole log
        else:
            _file_source_log(plan, source, keys, log_offset)


def _file_log_offset(entry: LogEntry, source: str) -> int | None:
    """The FileStreamSourceOffset ``{"logOffset": k}`` of source ``source``, if it is one."""
    if entry.source_ids is not None:
        texts = dict(zip(entry.source_ids, entry.offsets, strict=True))
        text = texts.get(source)
    else:
        index = int(source) if source.isdigit() else -1
        text = entry.offsets[index] if 0 <= index < len(entry.offsets) else None
    if text is None:
        return None
    value = json.loads(text)
    offset = value.get("logOffset") if isinstance(value, dict) and len(value) == 1 else None
    return offset if isinstance(offset, int) else None


def _file_source_log(plan: _Plan, source: str, keys: list[str], log_offset: int) -> None:
    # CompactibleFileStreamLog.allFiles: the newest "<c>.compact" holds every entry up to c; the
    # plain entries after it, up to the offset the batch read, complete the log.
    ids: dict[int, str] = {}
    compacts: dict[int, str] = {}
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        if name.isdigit():
            ids[int(name)] = key
        elif name.endswith(".compact") and name[: -len(".compact")].isdigit():
            compacts[int(name[: -len(".compact")])] = key
    usable = [c for c in compacts if c <= log_offset]
    start = max(usable) + 1 if usable else 0
    if usable:
        plan.chosen.add(compacts[max(usable)])
    for i in range(start, log_offset + 1):
        plan.need(f"sources/{source}/{i}", f"file source log entry up to logOffset {log_offset}")


# --------------------------------------------------------------------------------------------
# state/: operators, their stores, and the files that load version N+1 of each store.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _OperatorInfo:
    name: str | None
    partitions: int | None
    stores: tuple[str, ...]


def _state(plan: _Plan, batch: int, conf: dict[str, str]) -> tuple[StateOperator, ...]:
    op_ids = sorted({int(k.split("/")[1]) for k in plan.sizes if re.match(r"state/\d+/", k)})
    return tuple(op for op in (_operator(plan, o, batch, conf) for o in op_ids) if op is not None)


def _operator(plan: _Plan, op: int, batch: int, conf: dict[str, str]) -> StateOperator | None:
    prefix = f"state/{op}/"
    keys = [k for k in plan.sizes if k.startswith(prefix)]
    info = _operator_metadata(plan, op, batch, keys)
    parts = sorted({int(k.split("/")[2]) for k in keys if k.split("/")[2].isdigit()})
    partitions = info.partitions if info.partitions is not None else len(parts)
    stores = info.stores or _stores_from_listing(keys, op)
    provider = _provider(plan, op, conf, keys)
    if provider is None:
        return None
    plan.chosen.update(k for k in keys if k.endswith("/_metadata/schema"))
    for partition in range(partitions):
        for store in stores:
            _store_files(plan, _store_dir(op, partition, store), provider, batch + 1, conf)
    changelog = provider == ROCKSDB and any(k.endswith(".changelog") for k in keys)
    return StateOperator(op, info.name, partitions, tuple(stores), provider, changelog)


def _store_dir(op: int, partition: int, store: str) -> str:
    # StateStoreId.storeCheckpointLocation: the default store lives in the partition directory.
    base = f"state/{op}/{partition}"
    return base if store == DEFAULT_STORE else f"{base}/{store}"


def _operator_metadata(plan: _Plan, op: int, batch: int, keys: list[str]) -> _OperatorInfo:
    """Store names and partitions from ``_metadata/v2/<b>`` (newest <= batch) or ``_metadata/metadata``."""
    v2 = _numbered(plan.sizes, f"state/{op}/_metadata/v2")
    usable = [b for b in v2 if b <= batch]
    if usable:
        return _read_operator_metadata(plan, v2[max(usable)], with_schemas=True)
    v1 = f"state/{op}/_metadata/metadata"
    if v1 in plan.sizes:
        return _read_operator_metadata(plan, v1, with_schemas=False)
    return _OperatorInfo(None, None, ())


def _read_operator_metadata(plan: _Plan, key: str, *, with_schemas: bool) -> _OperatorInfo:
    plan.chosen.add(key)
    data = plan.load(key)
    if data is None:
        return _OperatorInfo(None, None, ())
    try:
        _head, _, body = data.decode("utf-8").partition("\n")
        meta = json_object(body, "operator metadata")
    except (ValueError, UnicodeDecodeError) as err:
        plan.problems.append(f"{key} is truncated or corrupt: {err}")
        return _OperatorInfo(None, None, ())
    infos = meta.get("stateStoreInfo") or []
    if with_schemas:
        _schema_files(plan, key, infos)
    parts = {int(s.get("numPartitions", 0)) for s in infos}
    name = (meta.get("operatorInfo") or {}).get("operatorName")
    stores = tuple(str(s["storeName"]) for s in infos if "storeName" in s)
    return _OperatorInfo(name, max(parts) if parts else None, stores)


def _schema_files(plan: _Plan, key: str, infos: list[dict[str, Any]]) -> None:
    # OperatorStateMetadataV2 names its schema files by ABSOLUTE path; map them back to keys.
    # Spark 4.3 reads every one when it plans the next batch (StateSchemaMetadata.
    # createStateSchemaMetadata) and fails if one is missing, so they are required files.
    for info in infos:
        for path in info.get("stateSchemaFilePaths") or []:
            schema = schema_key(str(path))
            if schema is None or schema not in plan.sizes:
                plan.add(
                    f"{key} names state schema file {path}, which is not in the checkpoint "
                    f"(expected {schema or 'a path under state/<op>/_stateSchema/'}); Spark cannot "
                    "plan the query without it"
                )
                continue
            plan.chosen.add(schema)
            if not _same_location(str(path), plan.uri(schema)):
                plan.warnings.append(
                    f"{key} names state schema file {path} in another location than this checkpoint "
                    f"({plan.uri(schema)}): it was copied without relocate(), and Spark reads the other "
                    "location (and fails when it is gone)"
                )


def _same_location(a: str, b: str) -> bool:
    """Do two URIs name the same object? s3, s3a and s3n are one; file:/x and file:///x are one."""
    pa, pb = urlparse(a), urlparse(b)
    schemes = {pa.scheme.replace("s3a", "s3").replace("s3n", "s3"), pb.scheme.replace("s3a", "s3").replace("s3n", "s3")}
    return len(schemes) == 1 and pa.netloc == pb.netloc and pa.path.lstrip("/") == pb.path.lstrip("/")


def _stores_from_listing(keys: list[str], op: int) -> tuple[str, ...]:
    """Store names seen in the listing (checkpoints written before operator metadata existed)."""
    names: set[str] = set()
    for key in keys:
        parts = key.split("/")
        if len(parts) == 4 and parts[2].isdigit() and STATE_FILE.match(parts[3]):
            names.add(DEFAULT_STORE)
        elif len(parts) >= 5 and parts[2].isdigit() and parts[3] not in _STORE_SUBDIRS:
            names.add(parts[3])
    return tuple(sorted(names))


def _provider(plan: _Plan, op: int, conf: dict[str, str], keys: list[str]) -> str | None:
    """HDFS or ROCKSDB from the conf the offsets log recorded, checked against the file names."""
    if any(_STATE_FILE_V2.match(k.rsplit("/", 1)[-1]) for k in keys):
        if not any(_FORMAT_V2 in p for p in plan.problems):
            plan.add(f"state/{op}/: {_FORMAT_V2}")
        return None
    kinds = {m.group(2) for k in keys if (m := STATE_FILE.match(k.rsplit("/", 1)[-1]))}
    by_files = ROCKSDB if kinds & {"zip", "changelog"} else HDFS if kinds else None
    cls = conf.get(_PROVIDER_CONF)
    by_conf = _PROVIDERS.get(cls) if cls else None
    if cls and by_conf is None:
        plan.problems.append(
            f"state store provider {cls} is not supported: expected HDFSBackedStateStoreProvider "
            "or RocksDBStateStoreProvider"
        )
        return None
    provider = by_conf or by_files or HDFS  # HDFS-backed is Spark's default provider
    if by_files is not None and by_files != provider:
        plan.problems.append(f"state/{op}/ holds {sorted(kinds)} files but the offsets log records provider {cls}")
    return provider


def _store_files(plan: _Plan, store: str, provider: str, version: int, conf: dict[str, str]) -> None:
    """Choose the files that load ``version`` of one store."""
    files: dict[str, dict[int, str]] = {"delta": {}, "snapshot": {}, "zip": {}, "changelog": {}}
    for key in plan.sizes:
        if key.startswith(store + "/") and "/" not in key[len(store) + 1 :]:
            match = STATE_FILE.match(key[len(store) + 1 :])
            if match:
                files[match.group(2)][int(match.group(1))] = key
    codec = conf.get(_CODEC_CONF, "lz4")
    if provider == HDFS:
        _hdfs_files(plan, store, files, version, codec)
    else:
        _rocksdb_files(plan, store, files, version, codec)


def _hdfs_files(plan: _Plan, store: str, files: dict[str, dict[int, str]], version: int, codec: str) -> None:
    # HDFSBackedStateStoreProvider.loadMap: the newest readable <s>.snapshot with s <= version,
    # then every <d>.delta for s < d <= version (no snapshot: all deltas from 1).
    deltas, snapshots = files["delta"], files["snapshot"]
    first_missing: list[int] | None = None
    for snap in [*sorted((s for s in snapshots if s <= version), reverse=True), 0]:
        problem = _stream_problem(plan, snapshots[snap], codec) if snap else None
        if problem:
            plan.warnings.append(f"{snapshots[snap]} is {problem}; an older snapshot is used instead")
            continue  # a broken snapshot: fall back to an older one and more deltas
        missing = [d for d in range(snap + 1, version + 1) if d not in deltas]
        if not missing:
            base = [snapshots[snap]] if snap else []
            _choose_stream_files(plan, base, deltas, start=snap, version=version, codec=codec)
            return
        first_missing = first_missing or missing
    have = ", ".join(sorted((k.rsplit("/", 1)[-1] for k in deltas.values()), key=_version_of)[:8])
    plan.problems.append(
        f"{store}/{(first_missing or [version])[0]}.delta is missing: HDFS-backed state version "
        f"{version} needs the newest <v>.snapshot <= {version} and every later .delta up to "
        f"{version}.delta (deltas found: {have or 'none'}); the files were purged or never "
        "copied, restore another batch"
    )


def _version_of(name: str) -> int:
    return int(name.split(".", 1)[0].split("_", 1)[0])


def _choose_stream_files(
    plan: _Plan, base: list[str], logs: dict[int, str], *, start: int, version: int, codec: str
) -> None:
    for key in base + [logs[v] for v in range(start + 1, version + 1)]:
        plan.chosen.add(key)
        problem = _stream_problem(plan, key, codec) if key not in base else None
        if problem:
            plan.problems.append(f"{key} is {problem}; Spark cannot load it, restore another batch")


def _stream_problem(plan: _Plan, key: str, codec: str) -> str | None:
    """With ``plan.verify`` and lz4: why this compressed stream is incomplete, else None."""
    if not plan.verify or codec != "lz4":
        return None
    data = plan.load(key)
    return lz4_stream_problem(data) if data is not None else "deleted while being read"


def _rocksdb_files(plan: _Plan, store: str, files: dict[str, dict[int, str]], version: int, codec: str) -> None:
    # RocksDB.load: the newest <s>.zip with s <= version (version.zip itself when it exists),
    # its SST/log files, then <c>.changelog for s < c <= version (changelog checkpointing).
    zips, changelogs = files["zip"], files["changelog"]
    rejected: list[str] = []
    missing: list[int] = []
    for snap in [*sorted((s for s in zips if s <= version), reverse=True), 0]:
        missing = [c for c in range(snap + 1, version + 1) if c not in changelogs]
        if missing:
            break  # older zips need even more changelogs
        if snap:
            immutable = _zip_files(plan, store, zips[snap], rejected)
            if immutable is None:
                continue  # a broken zip: fall back to an older one and more changelogs
            plan.chosen.add(zips[snap])
            plan.chosen.update(immutable)
        plan.warnings.extend(f"{r}; an older snapshot is used instead" for r in rejected)
        _choose_stream_files(plan, [], changelogs, start=snap, version=version, codec=codec)
        return
    plan.problems.append(_rocksdb_problem(store, version, rejected, missing, files))


def _rocksdb_problem(
    store: str, version: int, rejected: list[str], missing: list[int], files: dict[str, dict[int, str]]
) -> str:
    found = ", ".join(f"{v}.{kind}" for kind in ("zip", "changelog") for v in sorted(files[kind]) if v <= version)
    need = f"the newest older <v>.zip followed by every .changelog up to {version}.changelog"
    if rejected:
        head = f"{'; '.join(rejected)}, and no {need} replaces it ({store}/{missing[0]}.changelog is missing)"
    else:
        head = (
            f"{store}/{version}.zip and {store}/{missing[0]}.changelog are missing: RocksDB state "
            f"version {version} needs {version}.zip, or {need}"
        )
    return f"{head} (found: {found or 'none'}); the files were purged or never copied, restore another batch"


def _zip_files(plan: _Plan, store: str, key: str, rejected: list[str]) -> list[str] | None:
    """The SST/log keys a RocksDB zip's metadata lists, or None (reason in ``rejected``)."""
    data = plan.load(key)
    if data is None:
        return None
    problem = zip_problem(data, deep=plan.verify)
    listed: list[tuple[str, int]] = []
    if problem is None:
        listed, problem = _zip_metadata(data)
    if problem is None:
        problem = _immutable_problem(plan, [(f"{store}/{p}", n) for p, n in listed])
    if problem is not None:
        rejected.append(f"{key} is unusable: {problem}")
        return None
    return [f"{store}/{p}" for p, _ in listed]


def _immutable_problem(plan: _Plan, files: list[tuple[str, int]]) -> str | None:
    """Why the SST/log files a zip lists cannot be used: missing, wrong size, truncated."""
    # RocksDBFileManager.loadImmutableFilesFromDfs fails when a copied file's size differs.
    wrong = [
        f"{k} ({'missing' if k not in plan.sizes else f'{plan.sizes[k]} bytes, expected {n}'})"
        for k, n in files
        if plan.sizes.get(k) != n
    ]
    if wrong:
        return "it lists " + ", ".join(wrong[:4]) + (" ..." if len(wrong) > 4 else "")
    for key, _size in files if plan.verify else []:
        data = plan.load(key)
        problem = sst_problem(data) if data is not None and key.endswith(".sst") else None
        if problem:
            return f"{key} is {problem}"
    return None


def _zip_metadata(data: bytes) -> tuple[list[tuple[str, int]], str | None]:
    """(path under the store dir, size) of every immutable file a zip's ``metadata`` lists."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        text = zf.read("metadata").decode("utf-8")
    head, _, body = text.partition("\n")
    if head.strip() != "v1":
        return [], f"its metadata has version {head.strip()!r}, RocksDBCheckpointMetadata v1 expected"
    try:
        meta = json_object(body, "zip metadata")
        # RocksDBFileManager: SST files live in SSTs/, archived WAL files in logs/.
        out = [(f"SSTs/{f['dfsSstFileName']}", int(f["sizeBytes"])) for f in meta.get("sstFiles") or []]
        out += [(f"logs/{f['dfsLogFileName']}", int(f["sizeBytes"])) for f in meta.get("logFiles") or []]
    except (ValueError, KeyError, TypeError) as err:
        return [], f"its metadata is corrupt ({err!r})"
    return out, None
