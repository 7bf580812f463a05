"""The State Processor's writing side: a snapshot's state rewritten on a local copy into its next batch by Spark's
own state rewriter: keys deleted from an operator, or values of one table changed; the restore check then proves
the copy and saves it as a NEW savepoint (runtime/restore_check.py). The snapshot is never touched.

Design notes: docs/state-processor.md#design-notes-runtimestaterewritepy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.stateedit import KeyDeletion, ValueUpdate
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.runtime.stateprocessor import (
    JOIN_SIDES,
    StateTable,
    check_spark,
    find_table,
    flat_columns,
    match_format,
    state_tables,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Spark's state rewriter (internal in Spark 4.3: its offline repartition's): reads every operator's state of one
#: committed batch and writes it, through a function over each store's rows, as a later batch.
REWRITER = "org.apache.spark.sql.execution.streaming.state.StateRewriter"
#: The columns of the rows the rewriter hands over: the state partitioning key, the key and value as Spark encodes
#: them (UnsafeRow), and the column family (the store's, or a transformWithState variable's).
RAW_COLUMNS = ("partition_key", "key_bytes", "value_bytes", "column_family_name")
#: A function over a table's rows returning the rows to keep (with changed values, for a value change).
Transform = Callable[["DataFrame"], "DataFrame"]
#: The table kinds whose values can be changed: one row per key (not a join side's four stores, not a list, map
#: or timer variable).
CHANGEABLE = (None, "ValueState")


def edit_transform(edit: KeyDeletion | ValueUpdate) -> Transform:
    """The function over the rows ``edit`` applies: for a deletion, over an operator's rows (``key_columns``), the
    rows whose key its predicate does not select; for a value update, over its table's rows, those rows with the
    columns set where its predicate holds (cast to the columns' types)."""
    from pyspark.sql import functions as F

    if isinstance(edit, KeyDeletion):
        return lambda rows: rows.filter(f"NOT coalesce(({edit.where}), false)")

    def update(rows: DataFrame) -> DataFrame:
        chosen = F.coalesce(F.expr(edit.where), F.lit(False))
        return rows.withColumns({c: F.when(chosen, F.expr(e).cast(rows.schema[c].dataType)).otherwise(F.col(c))
                                 for c, e in edit.values.items()})
    return update


@dataclass
class StoreRewrite:
    """One store (or one column family of it) of one operator rewritten: its rows before and after, and the rows
    whose value changed."""

    operator_id: int
    store: str
    rows_before: int
    rows_after: int
    rows_changed: int = 0


@dataclass
class Rewrite:
    """What ``rewrite_state`` did: the batch it wrote, and each changed store's rows."""

    batch_id: int
    stores: list[StoreRewrite] = field(default_factory=list)

    @property
    def rows_removed(self) -> int:
        return sum(s.rows_before - s.rows_after for s in self.stores)

    @property
    def rows_changed(self) -> int:
        return sum(s.rows_changed for s in self.stores)

    def describe(self) -> str:
        changed = [f"operator {s.operator_id} store {s.store}: {s.rows_before} -> {s.rows_after} rows"
                   + (f", {s.rows_changed} values changed" if s.rows_changed else "") for s in self.stores]
        return f"batch {self.batch_id}: " + ("; ".join(changed) if changed else "no operator's rows changed")


def key_columns(frame: DataFrame) -> DataFrame:
    """The rewriter's rows with the state partitioning key's fields as ``key_<field>`` columns in front (nested
    fields ``key_<field>_<field>``, as ``read_state`` names a table's key columns)."""
    return frame.select(*flat_columns(frame.schema["partition_key"].dataType, ("partition_key",), ("key",)),
                        *RAW_COLUMNS)


def rewrite_state(spark: SparkSession, checkpoint: Storage, batch_id: int,
                  deletions: Mapping[int, Transform] | None = None,
                  changes: Mapping[str, Transform] | None = None) -> Rewrite:
    """Write the state of committed batch ``batch_id`` of the local copy ``checkpoint`` as batch ``batch_id + 1``
    by Spark's state rewriter, then that batch's offsets (those of ``batch_id``: the batch reads nothing) and its
    commit (with format v2, the new state files' unique ids).

    ``deletions[operator id]`` gets each store's rows of that operator with the key's columns (``key_columns``)
    and returns those to keep. ``changes[table name]`` gets that table's rows with its key's and value's columns
    (``key_*``, ``value_*``, as ``read_state`` names them) and returns those to keep, values changed. Either way
    a different schema, a row it was not given or a changed key is refused (ConfigError) before the store's new
    version is written; on any error the copy is half-written and only fit to be discarded."""
    from pyspark.java_gateway import ensure_callback_server_started

    check_spark(spark.version)
    match_format(spark, checkpoint)
    tables = state_tables(spark, checkpoint.url)
    operators = {t.operator_id for t in tables}
    unknown = sorted(set(deletions or {}) - operators)
    if unknown:
        raise ConfigError(f"no operator {', '.join(map(str, unknown))} with state in the snapshot; expected one of "
                          f"{sorted(operators)} (`ckpt state list`)")
    edits: dict[int, list[_Edit]] = {}
    for op, fn in (deletions or {}).items():
        edits.setdefault(op, []).append(_Deletion(op, fn))
    for name, fn in (changes or {}).items():
        change = _ValueChange.of(spark, checkpoint.url, batch_id, find_table(tables, name), fn)
        edits.setdefault(change.table.operator_id, []).append(change)
    from airflow_ckpt_provider.runtime.restore_check_verdict import plan_empty_batch

    new_batch = plan_empty_batch(checkpoint, batch_id)
    result = Rewrite(new_batch)
    callback = _StoreCallback(spark, edits, result)
    ensure_callback_server_started(spark.sparkContext._gateway)  # type: ignore[no-untyped-call]  # pyspark's is unannotated
    jvm = spark._jvm
    assert jvm is not None  # a classic (not Connect) session: check_spark's caller made it
    session = spark._jsparkSession
    option = jvm.scala.Option
    rewriter = getattr(jvm, REWRITER)(session, batch_id, new_batch, checkpoint.url,
                                      session.sessionState().newHadoopConf(), option.empty(), option.apply(callback),
                                      option.empty())
    py4j_log = logging.getLogger("py4j.clientserver")
    level = py4j_log.level
    py4j_log.setLevel(logging.CRITICAL)  # a refused transform is raised below; py4j would log it as its own error
    try:
        ids = rewriter.run()
    except Exception:
        if callback.error is not None:
            raise callback.error from None
        raise
    finally:
        py4j_log.setLevel(level)
        for edit in (e for found in edits.values() for e in found):
            for frame in edit.cached:
                frame.unpersist()
    metadata = jvm.org.apache.spark.sql.execution.streaming.runtime.StreamingQueryCheckpointMetadata(
        session, checkpoint.url, False)
    commits = metadata.commitLog()
    if not commits.add(new_batch, commits.get(batch_id).get().withStateUniqueIds(ids)):
        raise ConfigError(f"the copy at {checkpoint.url} has a commit of batch {new_batch} already: expected none "
                          "(a copy is rewritten once); rewrite again")
    return result


class _Edit:
    """One edit of an operator's rows: ``apply`` gets the rewriter's rows of one store and returns the new ones
    (None: this store is not its business), with the counts for the report. The frames it caches (counted, then
    written by the rewriter after ``apply`` returned) are kept in ``cached`` for ``rewrite_state`` to release."""

    cached: list[DataFrame]

    def apply(self, rows: DataFrame, store: str) -> tuple[DataFrame, StoreRewrite] | None:
        raise NotImplementedError

    def cache(self, frame: DataFrame) -> DataFrame:
        self.cached.append(frame.cache())
        return frame


@dataclass
class _Deletion(_Edit):
    operator_id: int
    keep: Transform
    cached: list[DataFrame] = field(default_factory=list)

    def apply(self, rows: DataFrame, store: str) -> tuple[DataFrame, StoreRewrite] | None:
        given = key_columns(rows)
        kept = self.keep(given)
        _same_columns(f"the state transform of operator {self.operator_id}", given, kept)
        kept = self.cache(kept.select(*RAW_COLUMNS))
        added = kept.exceptAll(rows).count()
        if added:
            raise ConfigError(
                f"the state transform of operator {self.operator_id} returned {added} rows it was not given: "
                "expected a subset of the rows (a deletion only removes rows)")
        return kept, StoreRewrite(self.operator_id, store, rows.count(), kept.count())


@dataclass
class _ValueChange(_Edit):
    table: StateTable
    column_family: str
    key: StructType
    value: StructType
    change: Transform
    cached: list[DataFrame] = field(default_factory=list)

    @classmethod
    def of(cls, spark: SparkSession, checkpoint: str, batch_id: int, table: StateTable,
           change: Transform) -> _ValueChange:
        """The change of ``table``'s values, refused unless its rows are one per key in one column family, of types
        the UnsafeRow codec writes (runtime/unsaferow.py)."""
        from pyspark.sql.types import StructType

        from airflow_ckpt_provider.runtime.unsaferow import unsupported

        if table.store in JOIN_SIDES or table.variable_type not in CHANGEABLE:
            kind = "a join side" if table.store in JOIN_SIDES else f"a {table.variable_type}"
            raise ConfigError(f"table {table.name} is {kind}: expected an operator's store or a ValueState to change "
                              f"values in; delete its keys instead (`ckpt state delete --operator "
                              f"{table.operator_id}`)")
        reader = spark.read.format("statestore")
        for option, setting in table.options(batch_id).items():
            reader = reader.option(option, setting)
        schema = reader.load(checkpoint).schema
        key, value = schema["key"].dataType, schema["value"].dataType
        assert isinstance(key, StructType)  # Spark's reader: the key and the value are structs
        assert isinstance(value, StructType)
        bad = unsupported(key) + unsupported(value)
        if bad:
            raise ConfigError(f"table {table.name} holds {', '.join(bad)}: expected numbers, strings, binary, dates, "
                              "timestamps or structs of them to change values; delete its keys instead")
        return cls(table, table.variable or "default", key, value, change)

    def apply(self, rows: DataFrame, store: str) -> tuple[DataFrame, StoreRewrite] | None:
        from pyspark.sql import functions as F

        if store != self.table.store:
            return None
        family = F.col("column_family_name") == self.column_family
        mine, rest = rows.filter(family), rows.filter(~family)
        decoded = self.cache(mine.select(_decoder(self.key)("key_bytes").alias("_key"),
                                         _decoder(self.value)("value_bytes").alias("_value"), *RAW_COLUMNS))
        what = f"table {self.table.name}"
        # Exact or refused: every row's key and value written back as they were read, bit for bit.
        inexact = decoded.filter((_encoder(self.key)("_key") != F.col("key_bytes"))
                                 | (_encoder(self.value)("_value") != F.col("value_bytes"))).count()
        if inexact:
            raise ConfigError(f"{what}: {inexact} rows are not encoded as the State Processor writes them (Spark's "
                              "UnsafeRow of the key's and value's schemas); no value can be changed safely, delete "
                              "the keys instead")
        given = decoded.select(*flat_columns(self.key, ("_key",), ("key",)),
                               *flat_columns(self.value, ("_value",), ("value",)), *RAW_COLUMNS)
        changed = self.change(given)
        _same_columns(f"the value change of {what}", given, changed)
        out = self.cache(changed.select(_nest(self.key, "key").alias("_key"),
                                        _nest(self.value, "value").alias("_value"), *RAW_COLUMNS))
        moved = out.filter(_encoder(self.key)("_key") != F.col("key_bytes")).count()
        strange = out.join(mine.select("key_bytes"), "key_bytes", "left_anti").count()
        twice = out.groupBy("key_bytes").count().filter("count > 1").count()
        if moved or strange or twice:
            raise ConfigError(f"the value change of {what} returned {moved} rows with a changed key, {strange} rows it "
                              f"was not given and {twice} keys more than once: expected each key at most once, as "
                              "given (a value change changes value columns; keys are deleted, not changed)")
        written = self.cache(out.select("partition_key", "key_bytes",
                                        _encoder(self.value)("_value").alias("value_bytes"), "column_family_name"))
        before = mine.select("key_bytes", F.col("value_bytes").alias("_before"))
        differ = written.join(before, "key_bytes").filter(F.col("value_bytes") != F.col("_before")).count()
        report = StoreRewrite(self.table.operator_id, f"{store} ({self.table.name})", decoded.count(),
                              written.count(), differ)
        return written.unionByName(rest), report


def _decoder(schema: StructType) -> Any:
    """A UDF from an UnsafeRow of ``schema`` to the struct (its values external, as Spark hands them to Python)."""
    from pyspark.sql import functions as F

    from airflow_ckpt_provider.runtime.unsaferow import decode

    return F.udf(lambda data: schema.fromInternal(decode(schema, data)), schema)


def _encoder(schema: StructType) -> Any:
    """A UDF from a struct of ``schema`` to its UnsafeRow."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    from airflow_ckpt_provider.runtime.unsaferow import encode

    return F.udf(lambda row: encode(schema, schema.toInternal(row)), BinaryType())


def _nest(schema: StructType, name: str) -> Column:
    """The struct of ``schema`` rebuilt from its flat columns (``<name>_<field>``, ``flat_columns``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    return F.struct(*[_nest(f.dataType, f"{name}_{f.name}").alias(f.name) if isinstance(f.dataType, StructType)
                      else F.col(f"`{name}_{f.name}`").alias(f.name) for f in schema.fields])


def _same_columns(what: str, given: DataFrame, returned: DataFrame) -> None:
    if returned.schema != given.schema:
        raise ConfigError(
            f"{what} returned other columns than it was given: expected {given.schema.simpleString()}, found "
            f"{returned.schema.simpleString()}. A rewrite keeps the state's schema: return the rows to keep with "
            "the same columns (change a schema with an upgrade)")


class _StoreCallback:
    """The rewriter's ``transformFunc`` (a ``scala.Function1`` implemented in Python through py4j's callback
    server): finds the store's operator in the frame's plan, applies that operator's edits and hash-partitions the
    rows on the state's key again (Spark writes frame partition i as state partition i)."""

    def __init__(self, spark: SparkSession, edits: Mapping[int, list[_Edit]], result: Rewrite) -> None:
        self.spark = spark
        self.edits = edits
        self.result = result
        self.error: Exception | None = None

    def apply(self, jdf: Any) -> Any:
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        try:
            # the frame's plan: Spark's UnresolvedDataSource with the reader's options (a Scala map)
            options = jdf.queryExecution().logical().options()
            operator_id, store = int(options.get("operatorId").get()), str(options.get("storeName").get())
            rows = DataFrame(jdf, self.spark)
            partitions, touched = jdf.rdd().getNumPartitions(), False
            for edit in self.edits.get(operator_id, []):
                done = edit.apply(rows, store)
                if done is not None:
                    rows, report = done
                    touched = True
                    log.info("state rewrite: operator %d store %s: %d rows, %d kept, %d values changed",
                             operator_id, report.store, report.rows_before, report.rows_after, report.rows_changed)
                    self.result.stores.append(report)
            return rows.repartition(partitions, F.col("partition_key"))._jdf if touched else jdf
        except Exception as err:  # raised again by rewrite_state: py4j would only pass its text on
            self.error = err
            raise

    def toString(self) -> str:  # the Java method py4j calls
        return "ckpt state rewrite"

    class Java:
        implements = ("scala.Function1",)
