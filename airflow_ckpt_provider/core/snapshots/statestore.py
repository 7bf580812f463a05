"""Spark's state stores in a checkpoint: the stateful operators and the files that load a store version.

Pure Python over a listing (no pyspark). For every operator under ``state/``, core/snapshots/checkpoint.py
asks :func:`state_operators` for its metadata and schema files and, for every store, the files that
load version N+1: HDFS-backed (the newest readable snapshot and the deltas after it) or RocksDB (the
newest usable zip, the SST/log files it lists, the changelogs after it; in state checkpoint format v2, the
files commits/N's unique ids name and the lineage in their changelog). Each rule, where it comes
from in Spark 4.3 and how it was confirmed: docs/spark-checkpoint-internals.md.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from airflow_ckpt_provider.core.snapshots.ckptfiles import (
    STATE_FILE,
    changelog_lineage,
    json_object,
    lz4_stream_problem,
    schema_key,
    sst_problem,
    zip_problem,
)
from airflow_ckpt_provider.core.snapshots.viewplan import FORMAT_V2, ViewPlan, numbered

HDFS = "hdfs"
ROCKSDB = "rocksdb"
DEFAULT_STORE = "default"

_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SHUFFLE_PARTITIONS_CONF = "spark.sql.shuffle.partitions"
#: The state checkpoint format a session writes for a NEW checkpoint (Spark 4.3: an existing one keeps its own).
STATE_FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
_CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
_PROVIDERS = {
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider": HDFS,
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider": ROCKSDB,
}
# checkpointFormatVersion 2 names files "<version>_<uniqueId>.<kind>" (RocksDBFileManager).
_STATE_FILE_V2 = re.compile(r"^(\d+)_([0-9a-fA-F-]{8,})\.(delta|snapshot|zip|changelog)$")
_STORE_SUBDIRS = ("_metadata", "SSTs", "logs")


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
class _OperatorInfo:
    name: str | None
    partitions: int | None
    stores: tuple[str, ...]


def state_operators(plan: ViewPlan, batch: int, conf: dict[str, str]) -> tuple[StateOperator, ...]:
    """Every operator under ``state/``, choosing the files that load its stores at version ``batch`` + 1."""
    op_ids = sorted({int(k.split("/")[1]) for k in plan.sizes if re.match(r"state/\d+/", k)})
    return tuple(op for op in (_operator(plan, o, batch, conf) for o in op_ids) if op is not None)


def _operator(plan: ViewPlan, op: int, batch: int, conf: dict[str, str]) -> StateOperator | None:
    prefix = f"state/{op}/"
    keys = [k for k in plan.sizes if k.startswith(prefix)]
    info = _operator_metadata(plan, op, batch, keys)
    parts = sorted({int(k.split("/")[2]) for k in keys if k.split("/")[2].isdigit()})
    partitions = state_partitions(conf) or info.partitions or len(parts)
    stores = info.stores or _stores_from_listing(keys, op)
    ids = None if plan.state_ids is None else plan.state_ids.get(str(op))
    provider = _provider(plan, op, conf, keys, ids is not None)
    if provider is None:
        return None
    plan.chosen.update(k for k in keys if k.endswith("/_metadata/schema"))
    for partition in range(partitions):
        if ids is not None:
            _v2_partition(plan, op, partition, stores, ids=ids, batch=batch, conf=conf)
            continue
        for store in stores:
            _store_files(plan, _store_dir(op, partition, store), provider, batch + 1, conf)
    changelog = provider == ROCKSDB and any(k.endswith(".changelog") for k in keys)
    return StateOperator(op, info.name, partitions, tuple(stores), provider, changelog)


def state_format_note(asked: str | None, found: int | None, batch: int | None) -> str | None:
    """What to tell a job whose session asks for a newer state checkpoint format (``asked``: the session's
    STATE_FORMAT_CONF, None: Spark's default 1) than its checkpoint holds (``found`` at completed ``batch``; None:
    a new checkpoint, which takes the asked one). None otherwise: an older one asked changes nothing either."""
    wanted = int(asked) if asked and asked.strip().isdigit() else 1
    if found is None or found >= wanted:
        return None
    return (f"the job asks for state checkpoint format v{wanted} ({STATE_FORMAT_CONF}={asked}), but its checkpoint "
            f"is format v{found} at batch {batch}: Spark 4.3 keeps an existing checkpoint's format, so it runs on "
            f"v{found}. Spark cannot convert state between formats (its offline repartition refuses a session of "
            "another format); to move, start the job on a new checkpoint (`ckpt run --restore none` with "
            "another --checkpoint), which rebuilds its state from the sources")


def state_partitions(conf: dict[str, str]) -> int | None:
    """The state partitions of every stateful operator at a batch: the offsets log's
    ``spark.sql.shuffle.partitions``, which Spark applies to the operators on restart (the session's value
    is ignored). Not the operator metadata: an offline repartition (StreamingCheckpointManager.repartition)
    writes the new count to the offsets log only and leaves ``_metadata/metadata`` at the original one, so
    the metadata's count would leave the new partitions' state out of a snapshot
    (docs/spark-checkpoint-internals.md). None if the log does not say."""
    value = conf.get(SHUFFLE_PARTITIONS_CONF)
    try:
        return int(value) if value is not None and int(value) > 0 else None
    except ValueError:
        return None


def _store_dir(op: int, partition: int, store: str) -> str:
    # StateStoreId.storeCheckpointLocation: the default store lives in the partition directory.
    base = f"state/{op}/{partition}"
    return base if store == DEFAULT_STORE else f"{base}/{store}"


def _operator_metadata(plan: ViewPlan, op: int, batch: int, keys: list[str]) -> _OperatorInfo:
    """Store names and partitions from ``_metadata/v2/<b>`` (newest <= batch) or ``_metadata/metadata``."""
    v2 = numbered(plan.sizes, f"state/{op}/_metadata/v2")
    usable = [b for b in v2 if b <= batch]
    if usable:
        return _read_operator_metadata(plan, v2[max(usable)], with_schemas=True)
    v1 = f"state/{op}/_metadata/metadata"
    if v1 in plan.sizes:
        return _read_operator_metadata(plan, v1, with_schemas=False)
    return _OperatorInfo(None, None, ())


def _read_operator_metadata(plan: ViewPlan, key: str, *, with_schemas: bool) -> _OperatorInfo:
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


def _schema_files(plan: ViewPlan, key: str, infos: list[dict[str, Any]]) -> None:
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


def _provider(plan: ViewPlan, op: int, conf: dict[str, str], keys: list[str], v2: bool) -> str | None:
    """HDFS or ROCKSDB from the conf the offsets log recorded, checked against the file names; format v2 (``v2``:
    the commit names the operator's unique ids) only with RocksDB, whose v2 files only with unique ids."""
    names = [k.rsplit("/", 1)[-1] for k in keys]
    if not v2 and any(_STATE_FILE_V2.match(n) for n in names) and not any(STATE_FILE.match(n) for n in names):
        if not any(FORMAT_V2 in p for p in plan.problems):
            plan.add(f"state/{op}/: {FORMAT_V2}")
        return None
    kinds = {m.group(2) for n in names if (m := STATE_FILE.match(n))}
    kinds |= {m.group(3) for n in names if (m := _STATE_FILE_V2.match(n))}
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
    if v2 and provider != ROCKSDB:
        plan.problems.append(f"state/{op}/: the commit names state checkpoint format v2 unique ids, which only "
                             f"RocksDBStateStoreProvider writes, but the offsets log records {cls or 'HDFS-backed'}")
        return None
    return provider


def _store_files(plan: ViewPlan, store: str, provider: str, version: int, conf: dict[str, str]) -> None:
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


def _hdfs_files(plan: ViewPlan, store: str, files: dict[str, dict[int, str]], version: int, codec: str) -> None:
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
    plan: ViewPlan, base: list[str], logs: dict[int, str], *, start: int, version: int, codec: str
) -> None:
    for key in base + [logs[v] for v in range(start + 1, version + 1)]:
        plan.chosen.add(key)
        problem = _stream_problem(plan, key, codec) if key not in base else None
        if problem:
            plan.problems.append(f"{key} is {problem}; Spark cannot load it, restore another batch")


def _stream_problem(plan: ViewPlan, key: str, codec: str) -> str | None:
    """With ``plan.verify`` and lz4: why this compressed stream is incomplete, else None."""
    if not plan.verify or codec != "lz4":
        return None
    data = plan.load(key)
    return lz4_stream_problem(data) if data is not None else "deleted while being read"


def _rocksdb_files(plan: ViewPlan, store: str, files: dict[str, dict[int, str]], version: int, codec: str) -> None:
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


def _zip_files(plan: ViewPlan, store: str, key: str, rejected: list[str]) -> list[str] | None:
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


def _immutable_problem(plan: ViewPlan, files: list[tuple[str, int]]) -> str | None:
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


# --------------------------------------------------------------------------------------------
# State checkpoint format v2 (docs/spark-checkpoint-internals.md, section 9): files by unique id.
# --------------------------------------------------------------------------------------------


def _v2_partition(plan: ViewPlan, op: int, partition: int, stores: tuple[str, ...] | list[str], *,
                  ids: list[list[str]], batch: int, conf: dict[str, str]) -> None:
    """Choose one partition's stores of a format v2 operator: commits/N names each store's unique id of version
    N+1, by the stores' position (CommitMetadataV2)."""
    named = ids[partition] if partition < len(ids) else []
    if len(named) != len(stores):
        plan.add(f"commits/{batch} names {len(named)} state unique ids for operator {op} partition {partition}, "
                 f"which has {len(stores)} stores ({', '.join(stores)}): the commit and the operator's metadata "
                 "disagree, restore another batch")
        return
    for store, unique_id in zip(stores, named, strict=True):
        _rocksdb_v2_files(plan, _store_dir(op, partition, store), batch + 1, unique_id,
                          conf.get(_CODEC_CONF, "lz4"))


def _rocksdb_v2_files(plan: ViewPlan, store: str, version: int, unique_id: str, codec: str) -> None:
    # RocksDB.loadWithCheckpointId: <version>_<id>.zip when it exists; else the lineage inside
    # <version>_<id>.changelog names the versions before it back to a snapshot: the newest
    # <v>_<id>.zip of it, then each later <v>_<id>.changelog (none: from empty when it starts at 1).
    zips: dict[tuple[int, str], str] = {}
    logs: dict[tuple[int, str], str] = {}
    for key in plan.sizes:
        if key.startswith(store + "/") and "/" not in key[len(store) + 1 :]:
            match = _STATE_FILE_V2.match(key[len(store) + 1 :])
            if match and match.group(3) in ("zip", "changelog"):
                (zips if match.group(3) == "zip" else logs)[(int(match.group(1)), match.group(2))] = key
    rejected: list[str] = []
    if (version, unique_id) in zips and _v2_zip(plan, store, zips[(version, unique_id)], rejected):
        return
    own = logs.get((version, unique_id))
    if own is None:
        plan.add(f"{store}/{version}_{unique_id}.zip and .changelog are missing: the commit names state version "
                 f"{version} by that unique id (found: {_v2_found(zips, logs, version)}); the files were purged "
                 "or never copied, restore another batch")
        return
    lineage = _v2_lineage(plan, own)
    if lineage is None:
        return
    chain = [*lineage, (version, unique_id)]
    start = next((i for i in range(len(chain) - 2, -1, -1)
                  if chain[i] in zips and _v2_zip(plan, store, zips[chain[i]], rejected)), None)
    if start is None and chain[0][0] != 1:
        plan.add(f"{own}'s lineage starts at version {chain[0][0]} and no snapshot zip of it is usable "
                 f"({'; '.join(rejected) or 'none found'}): Spark cannot load version {version} "
                 "(CANNOT_FIND_BASE_SNAPSHOT_CHECKPOINT); restore another batch")
        return
    plan.warnings.extend(f"{r}; an older snapshot is used instead" for r in rejected)
    needed = chain[(start + 1 if start is not None else 0):]
    if [v for v, _ in needed] != list(range(needed[0][0], version + 1)):
        plan.add(f"{own}'s lineage skips versions ({[v for v, _ in needed]}): expected every version from its "
                 f"snapshot to {version}; restore another batch")
        return
    missing = [f"{v}_{u}.changelog" for v, u in needed if (v, u) not in logs]
    if missing:
        plan.add(f"{store}/{missing[0]} is missing: state version {version} replays the changelogs of its lineage "
                 f"{', '.join(missing[:4])}; restore another batch")
        return
    _choose_stream_files(plan, [], {v: logs[(v, u)] for v, u in needed}, start=needed[0][0] - 1, version=version,
                         codec=codec)
    _companions(plan, [logs[(v, u)] for v, u in needed])


def _v2_lineage(plan: ViewPlan, key: str) -> list[tuple[int, str]] | None:
    """The lineage a v2 changelog starts with; None (a problem recorded) if it cannot be read."""
    data = plan.load(key)
    if data is None:
        return None
    try:
        lineage = changelog_lineage(data)
    except ValueError as err:
        plan.add(f"{key} is truncated or corrupt: its lineage cannot be read ({err}); restore another batch")
        return None
    if lineage is None:
        plan.add(f"{key} has no lineage: expected a format v2 changelog (v3 or v4 header); restore another batch")
    return lineage


def _v2_zip(plan: ViewPlan, store: str, key: str, rejected: list[str]) -> bool:
    """Choose a v2 snapshot zip with its SST/log files and checksum companions; False if it is unusable."""
    immutable = _zip_files(plan, store, key, rejected)
    if immutable is None:
        return False
    plan.chosen.add(key)
    plan.chosen.update(immutable)
    _companions(plan, [key])
    return True


def _companions(plan: ViewPlan, keys: list[str]) -> None:
    """The ``<file>.crc`` checksum files Spark writes beside format v2 zips and changelogs (it checks them when
    present, and only warns when one is missing)."""
    plan.chosen.update(k + ".crc" for k in keys if k + ".crc" in plan.sizes)


def _v2_found(zips: dict[tuple[int, str], str], logs: dict[tuple[int, str], str], version: int) -> str:
    near = sorted({*zips, *logs}, key=lambda vu: -vu[0])
    shown = [f"{v}_{u}" for v, u in near if v <= version][:4]
    return ", ".join(shown) or "none"
