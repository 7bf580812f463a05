"""The State Processor's reading side: the keyed state of any snapshot as a table, read by Spark's own state data
sources (``state-metadata``, ``statestore``) from a copy restored on this host; the snapshot is never touched
(runtime/staterewrite.py writes a changed copy). Pinned to the Spark versions it is tested with.

Design notes: docs/state-processor.md#design-notes-runtimestateprocessorpy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.statesample import SampledTable
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


def match_format(spark: SparkSession, checkpoint: str | Storage) -> None:
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
    match_format(spark, _local(checkpoint))
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
    match_format(spark, checkpoint)
    reader = spark.read.format("statestore")
    for option, value in table.options(batch_id).items():
        reader = reader.option(option, value)
    frame = reader.load(checkpoint)
    columns = [F.lit(table.operator_id).alias("operator_id"), F.lit(table.name).alias("table")]
    return frame.select(*columns, *flat_columns(frame.schema, ()))


def flat_columns(schema: Any, prefix: tuple[str, ...], name: tuple[str, ...] = ()) -> list[Any]:
    """``schema``'s leaf fields under ``prefix`` as columns named by their path joined with ``_`` (the path's
    first part replaced by ``name``, if given)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    out: list[Any] = []
    for f in schema.fields:
        path, named = (*prefix, f.name), (*(name or prefix), f.name)
        if isinstance(f.dataType, StructType):
            out += flat_columns(f.dataType, path, named)
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


def sample_state(spark: SparkSession, checkpoint: str, batch_id: int, rows: int) -> list[SampledTable]:
    """The first ``rows`` rows (values as text) and the row count of every table of the checkpoint at ``batch_id``:
    what the job page shows of a snapshot's state (``ckpt state sample``)."""
    sampled: list[SampledTable] = []
    for table in state_tables(spark, checkpoint):
        frame = read_state(spark, checkpoint, batch_id, table).drop("operator_id", "table")
        first = frame.limit(rows).collect()
        sampled.append(SampledTable(table.name, table.operator, table.partitions, table.variable_type,
                                    list(frame.columns), [["" if v is None else str(v) for v in r] for r in first],
                                    frame.count()))
    return sampled
