"""The State Processor: the keyed state of any snapshot as a table, read by Spark's own state data sources
(``state-metadata``, ``statestore``) from a copy restored on this host; keys deleted from that copy by Spark's own
state rewriter into a new batch, which the restore check proves and saves as a NEW savepoint. The snapshot is never
touched. Pinned to the Spark versions it is tested with.

Design notes: docs/state-processor.md#design-notes-runtimestateprocessorpy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import Manifest
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots.scratch import make_scratch, sweep_scratch
from airflow_ckpt_provider.core.snapshots.statestore import STATE_FORMAT_CONF
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The Spark versions (major.minor) whose state data sources this reader is tested with.
TESTED_SPARK = ("4.3",)
#: The local copies of snapshots being read: ``<temp dir>/ckpt-state-<job>-*`` (swept when their process is gone).
SCRATCH_PREFIX = "ckpt-state-"
FORMATS = ("parquet", "csv", "json")
#: stream-stream join stores: Spark's reader takes the side, not the store (it joins the side's two stores).
JOIN_SIDES = {"left-keyToNumValues": "left", "right-keyToNumValues": "right"}
#: transformWithState's timers: one internal variable (``$eventTimers_...``/``$procTimers_...``) Spark's reader reads
#: with ``readRegisteredTimers``; named ``timers`` here.
TIMERS = "TimerState"


def check_spark(version: str) -> None:
    """Refuse a Spark whose state data sources this reader was not tested with (their options and output are
    marked experimental by Spark and change between versions)."""
    if ".".join(version.split(".")[:2]) not in TESTED_SPARK:
        raise ConfigError(f"the State Processor is tested with Spark {', '.join(TESTED_SPARK)}; found Spark "
                          f"{version}. Spark's state data sources are experimental and change between versions: "
                          f"read the state with a pyspark {TESTED_SPARK[-1]}.x install")


@dataclass(frozen=True)
class StateTable:
    """One table of a snapshot's state: an operator's store (a join's side), or one state variable of a
    transformWithState operator."""

    operator_id: int
    operator: str
    store: str
    partitions: int
    variable: str | None = None  # a transformWithState state variable
    variable_type: str | None = None  # ValueState, ListState, MapState, TimerState

    @property
    def name(self) -> str:
        """How ``ckpt state read --table`` names it: ``<operator id>/<store or join side>[/<variable>]``."""
        where = JOIN_SIDES.get(self.store, self.store)
        return f"{self.operator_id}/{where}" + (f"/{self.variable}" if self.variable else "")

    def options(self, batch_id: int) -> dict[str, str]:
        """The ``statestore`` reader's options for this table at ``batch_id``."""
        options = {"batchId": str(batch_id), "operatorId": str(self.operator_id)}
        if self.store in JOIN_SIDES:
            options["joinSide"] = JOIN_SIDES[self.store]
        elif self.variable is None:
            options["storeName"] = self.store
        if self.variable_type == TIMERS:
            options["readRegisteredTimers"] = "true"
        elif self.variable is not None:
            options["stateVarName"] = self.variable
        return options


@contextlib.contextmanager
def snapshot_copy(store: JobStore, snapshot_id: str) -> Iterator[tuple[Manifest, str]]:
    """Restore ``snapshot_id`` into a scratch directory of this host; yields its manifest and the copy's path,
    removed after."""
    sweep_scratch(SCRATCH_PREFIX, store.job)
    root = make_scratch(f"{SCRATCH_PREFIX}{store.job}-", store.job)
    try:
        manifest = load_manifest(store, snapshot_id)
        target = LocalStorage(root / "checkpoint")
        restore_snapshot(store, snapshot_id, target)
        yield manifest, str(root / "checkpoint")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _local(checkpoint: str) -> str:
    """A local checkpoint's path from its path or ``file://`` URL."""
    return checkpoint.removeprefix("file://")


def _match_format(spark: SparkSession, checkpoint: str | Storage) -> None:
    """Spark's state readers (and its rewriter) load a checkpoint only in a session of its state checkpoint format
    (a v2 checkpoint read by a v1 session fails to parse the unique-id file names)."""
    storage = checkpoint if isinstance(checkpoint, Storage) else LocalStorage(checkpoint)
    found, _batch = SparkCheckpoint(storage).state_format()
    if found is not None:
        spark.conf.set(STATE_FORMAT_CONF, str(found))


def state_tables(spark: SparkSession, checkpoint: str) -> list[StateTable]:
    """Every table of a checkpoint's state, from Spark's ``state-metadata`` source: each operator's stores (a
    join: its two sides), each transformWithState state variable (timers included)."""
    check_spark(spark.version)
    _match_format(spark, _local(checkpoint))
    tables: list[StateTable] = []
    joins_seen: set[tuple[int, str]] = set()
    for row in spark.read.format("state-metadata").load(checkpoint).orderBy("operatorId", "stateStoreName").collect():
        op, name, store, partitions = int(row.operatorId), str(row.operatorName), str(row.stateStoreName), \
            int(row.numPartitions)
        if store.endswith("-keyWithIndexToValue"):
            continue  # read with its side's keyToNumValues
        if store in JOIN_SIDES:
            if (op, store) in joins_seen:
                continue
            joins_seen.add((op, store))
        properties = json.loads(row.operatorProperties) if row.operatorProperties else {}
        variables = properties.get("stateVariables") or []
        if variables:
            tables += [StateTable(op, name, store, partitions,
                                  "timers" if v["stateVariableType"] == TIMERS else str(v["stateName"]),
                                  str(v["stateVariableType"])) for v in variables]
        else:
            tables.append(StateTable(op, name, store, partitions))
    return tables


def find_table(tables: list[StateTable], name: str) -> StateTable:
    """The table ``name`` (``StateTable.name``); ConfigError naming the snapshot's tables otherwise."""
    for table in tables:
        if table.name == name:
            return table
    known = ", ".join(t.name for t in tables) or "none (a stateless query)"
    raise ConfigError(f"no state table {name!r} in the snapshot; expected one of: {known}. "
                      "`ckpt state list` shows each with its operator")


def read_state(spark: SparkSession, checkpoint: str, batch_id: int, table: StateTable) -> DataFrame:
    """The table's rows at ``batch_id`` with the operator and store (or variable) as columns, then the key's,
    the value's (list element's, map entry's) and ``partition_id``, nested fields flattened as ``key_<name>``."""
    from pyspark.sql import functions as F

    check_spark(spark.version)
    _match_format(spark, checkpoint)
    reader = spark.read.format("statestore")
    for option, value in table.options(batch_id).items():
        reader = reader.option(option, value)
    frame = reader.load(checkpoint)
    columns = [F.lit(table.operator_id).alias("operator_id"), F.lit(table.name).alias("table")]
    return frame.select(*columns, *_flat(frame.schema, ()))


def _flat(schema: Any, prefix: tuple[str, ...], name: tuple[str, ...] = ()) -> list[Any]:
    """``schema``'s leaf fields under ``prefix`` as columns named by their path joined with ``_`` (the path's
    first part replaced by ``name``, if given)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    out: list[Any] = []
    for f in schema.fields:
        path, named = (*prefix, f.name), (*(name or prefix), f.name)
        if isinstance(f.dataType, StructType):
            out += _flat(f.dataType, path, named)
        else:
            out.append(F.col(".".join(f"`{p}`" for p in path)).alias("_".join(named)))
    return out


def export_state(frame: DataFrame, fmt: str, output: str) -> int:
    """Write ``frame`` to ``output`` as ``fmt`` (a new directory: an existing one is refused); returns the rows."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    frame = frame.cache()
    try:
        rows = frame.count()
        writer = frame.write.mode("errorifexists").format(fmt)
        if fmt == "csv":
            writer = writer.option("header", "true")
        writer.save(output)
        return rows
    finally:
        frame.unpersist()


# --------------------------------------------------------------------------------------------
# Rewriting: keys deleted into a new batch of a copy
# --------------------------------------------------------------------------------------------

#: Spark's state rewriter (internal in Spark 4.3: its offline repartition's): reads every operator's state of one
#: committed batch and writes it, through a function over each store's rows, as a later batch.
REWRITER = "org.apache.spark.sql.execution.streaming.state.StateRewriter"
#: The columns of the rows the rewriter hands over, besides the key's (``key_<field>``, added here): the state
#: partitioning key, the key and value as Spark encodes them (opaque), and the column family (store or variable).
RAW_COLUMNS = ("partition_key", "key_bytes", "value_bytes", "column_family_name")
#: A transform of one operator's rows (``key_columns``) into those kept.
Transform = Callable[["DataFrame"], "DataFrame"]


@dataclass(frozen=True)
class KeyDeletion:
    """Delete from operator ``operator_id``'s state (every store, join side, state variable, timer and TTL entry)
    the keys ``where`` selects: a Spark SQL predicate over the operator's key columns as ``ckpt state read``
    names them (``key_<field>``, nested fields ``key_<field>_<field>``)."""

    operator_id: int
    where: str

    @classmethod
    def parse(cls, text: str) -> KeyDeletion:
        """``OPERATOR:PREDICATE``, e.g. ``0:key_user = 'u-17'``."""
        op, sep, where = text.partition(":")
        if not sep or not op.strip().isdigit() or not where.strip():
            raise ConfigError(f"invalid key deletion {text!r}: expected OPERATOR:PREDICATE, an operator id and a "
                              "Spark SQL predicate over its key columns, e.g. \"0:key_user = 'u-17'\" (`ckpt state "
                              "list` shows the operators, `ckpt state read` their key columns)")
        return cls(int(op), where.strip())

    def __str__(self) -> str:
        return f"{self.operator_id}:{self.where}"

    def transform(self) -> Transform:
        """The rows of the operator that are kept: those whose key ``where`` does not select."""
        return lambda rows: rows.filter(f"NOT coalesce(({self.where}), false)")


@dataclass
class StoreRewrite:
    """One store (or column family set) of one operator rewritten: its rows before and after."""

    operator_id: int
    store: str
    rows_before: int
    rows_after: int


@dataclass
class Rewrite:
    """What ``rewrite_state`` did: the batch it wrote, and each changed store's rows."""

    batch_id: int
    stores: list[StoreRewrite] = field(default_factory=list)

    @property
    def rows_removed(self) -> int:
        return sum(s.rows_before - s.rows_after for s in self.stores)

    def describe(self) -> str:
        changed = [f"operator {s.operator_id} store {s.store}: {s.rows_before} -> {s.rows_after} rows"
                   for s in self.stores]
        return f"batch {self.batch_id}: " + ("; ".join(changed) if changed else "no operator's rows changed")


def key_columns(frame: DataFrame) -> DataFrame:
    """The rewriter's rows with the state partitioning key's fields as ``key_<field>`` columns in front (nested
    fields ``key_<field>_<field>``, as ``read_state`` names a table's key columns)."""
    return frame.select(*_flat(frame.schema["partition_key"].dataType, ("partition_key",), ("key",)),
                        *RAW_COLUMNS)


def rewrite_state(spark: SparkSession, checkpoint: Storage, batch_id: int,
                  transforms: Mapping[int, Transform]) -> Rewrite:
    """Write the state of committed batch ``batch_id`` of the local copy ``checkpoint`` as batch ``batch_id + 1``,
    each operator's rows through ``transforms[operator id]`` (the others' as they are), by Spark's state rewriter;
    then that batch's offsets (those of ``batch_id``: the batch reads nothing) and its commit (with format v2, the
    new state files' unique ids). A transform gets the rows of one store with the key's columns
    (``key_columns``) and returns those to keep, with the same columns: a different schema, or a row it did not
    get, is refused (ConfigError) before anything is written to the store's new version."""
    from pyspark.java_gateway import ensure_callback_server_started

    check_spark(spark.version)
    _match_format(spark, checkpoint)
    operators = {t.operator_id for t in state_tables(spark, checkpoint.url)}
    unknown = sorted(set(transforms) - operators)
    if unknown:
        raise ConfigError(f"no operator {', '.join(map(str, unknown))} with state in the snapshot; expected one of "
                          f"{sorted(operators)} (`ckpt state list`)")
    from airflow_ckpt_provider.runtime.restore_check_verdict import plan_empty_batch

    new_batch = plan_empty_batch(checkpoint, batch_id)
    result = Rewrite(new_batch)
    callback = _StoreCallback(spark, transforms, result)
    ensure_callback_server_started(spark.sparkContext._gateway)  # type: ignore[no-untyped-call]  # pyspark leaves it unannotated
    jvm = spark._jvm
    assert jvm is not None  # a classic (not Connect) session: check_spark's caller made it
    session = spark._jsparkSession
    option = jvm.scala.Option
    rewriter = getattr(jvm, REWRITER)(session, batch_id, new_batch, checkpoint.url,
                                      session.sessionState().newHadoopConf(), option.empty(), option.apply(callback),
                                      option.empty())
    try:
        ids = rewriter.run()
    except Exception:
        if callback.error is not None:
            raise callback.error from None
        raise
    metadata = jvm.org.apache.spark.sql.execution.streaming.runtime.StreamingQueryCheckpointMetadata(
        session, checkpoint.url, False)
    commits = metadata.commitLog()
    if not commits.add(new_batch, commits.get(batch_id).get().withStateUniqueIds(ids)):
        raise ConfigError(f"the copy at {checkpoint.url} has a commit of batch {new_batch} already: expected none "
                          "(a copy is rewritten once); rewrite again")
    return result


class _StoreCallback:
    """The rewriter's ``transformFunc`` (a ``scala.Function1`` implemented in Python through py4j's callback
    server): finds the store's operator in the frame's plan and applies that operator's transform."""

    def __init__(self, spark: SparkSession, transforms: Mapping[int, Transform], result: Rewrite) -> None:
        self.spark = spark
        self.transforms = transforms
        self.result = result
        self.error: Exception | None = None

    def apply(self, jdf: Any) -> Any:
        from pyspark.sql import DataFrame

        try:
            # the frame's plan: Spark's UnresolvedDataSource with the reader's options (a Scala map)
            options = jdf.queryExecution().logical().options()
            operator_id, store = int(options.get("operatorId").get()), str(options.get("storeName").get())
            transform = self.transforms.get(operator_id)
            if transform is None:
                return jdf
            rows = DataFrame(jdf, self.spark)
            return self._transformed(rows, operator_id, store, transform)._jdf
        except Exception as err:  # raised again by rewrite_state: py4j would only pass its text on
            self.error = err
            raise

    def _transformed(self, rows: DataFrame, operator_id: int, store: str, transform: Transform) -> DataFrame:
        from pyspark.sql import functions as F

        given = key_columns(rows)
        kept = transform(given)
        if kept.schema != given.schema:
            raise ConfigError(
                f"the state transform of operator {operator_id} returned other columns than it was given: "
                f"expected {given.schema.simpleString()}, found {kept.schema.simpleString()}. A rewrite keeps the "
                "state's schema: return the rows to keep with the same columns (change a schema with an upgrade)")
        kept = kept.select(*RAW_COLUMNS).cache()
        added = kept.exceptAll(rows).count()
        if added:
            kept.unpersist()
            raise ConfigError(
                f"the state transform of operator {operator_id} returned {added} rows it was not given: expected a "
                "subset of the rows (a rewrite deletes keys; it does not add or change them in this version)")
        before, after = rows.count(), kept.count()
        log.info("state rewrite: operator %d store %s: %d rows, %d kept", operator_id, store, before, after)
        self.result.stores.append(StoreRewrite(operator_id, store, before, after))
        partitions = rows.rdd.getNumPartitions()
        # Each partition of the frame is written as the state partition of its index: rows a transform moved
        # (a shuffle) go back where Spark's hash partitioning of the state's key puts them.
        return kept.repartition(partitions, F.col("partition_key"))

    def toString(self) -> str:  # the Java method py4j calls
        return "ckpt state rewrite"

    class Java:
        implements = ("scala.Function1",)
