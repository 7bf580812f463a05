"""The ``ckpt-kafka`` streaming source: Kafka for PySpark on confluent-kafka, without the JVM connector.
This module imports pyspark at module level; nothing in the Airflow layer imports it.

Design notes: docs/kafka.md#design-notes-kafkasourcepy."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.gate import hold_at_gate
from airflow_ckpt_provider.kafka.metadata import BrokerMetadata
from airflow_ckpt_provider.kafka.offsets import COMMIT_KEY, Offsets, parse_offsets, to_json_dict
from airflow_ckpt_provider.kafka.options import SourceOptions, check_client_config, parse_options
from airflow_ckpt_provider.kafka.planner import OffsetPlanner, RowLimits
from airflow_ckpt_provider.kafka.reader import Range, read_range
from airflow_ckpt_provider.kafka.writer import stream_writer

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
    from pyspark.sql import SparkSession

NAME = "ckpt-kafka"
#: The start of batch 0. Not an offset: the first latestOffset() resolves startingOffsets into
#: batch 0's end, and batch 0 reads nothing ('$' cannot appear in a Kafka topic name).
INITIAL_OFFSET: dict[str, Any] = {"$initial": "startingOffsets are resolved by batch 0"}


def kafka_schema(include_headers: bool = False) -> StructType:
    """Spark's Kafka source schema; ``headers`` only with includeHeaders=true."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)



# --------------------------------------------------------------------------------------------
# Spark's Python Data Source API
# --------------------------------------------------------------------------------------------


class CkptKafkaDataSource(DataSource):
    """``spark.readStream.format("ckpt-kafka")``: options are validated when the query is defined and started."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return kafka_schema(parse_options(self.options).include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_options(self.options)
        expected = kafka_schema(options.include_headers)
        if schema != expected:
            raise ConfigError(
                f"ckpt-kafka has the fixed schema of Spark's Kafka source {expected.simpleString()}, found "
                f"{schema.simpleString()}: remove .schema(...) and cast or parse the columns instead"
            )
        check_client_config(options)
        return CkptKafkaStreamReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("ckpt-kafka")``: the transactional sink (kafka/writer.py, docs/sink-kafka.md)."""
        return stream_writer(self.options, schema, overwrite)


class CkptKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches on the driver (one long-lived instance per query) and reads ranges on executors.

    Spark pickles the reader to the executors: it carries only the options; the planner and its
    admin client are created on first use in the driver's source process.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planner: OffsetPlanner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_planner": None}

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            self._planner = OffsetPlanner(self.options, BrokerMetadata(self.options))
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        return dict(INITIAL_OFFSET)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if start is not None and not hold_at_gate():
            # The gate is closed (a stop with savepoint, a restore check): no new data (equal offsets).
            return start
        end: dict[str, Any] = to_json_dict(self.planner.latest(_decode(start), self._limits(limit)))
        if self.options.commit_group_id:
            # The reader runs in a Python worker without the SparkSession: the group travels in the
            # offset, and the listener that register() installs in the driver commits it.
            end[COMMIT_KEY] = {"group": self.options.commit_group_id, "servers": self.options.bootstrap_servers}
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        seen = self._planner.latest_seen if self._planner is not None else None
        return to_json_dict(seen) if seen is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [InputPartition(r) for r in self.planner.ranges(_decode(start), parse_offsets(end))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng = partition.value
        assert isinstance(rng, Range), f"expected a ckpt-kafka Range, found {rng!r}"
        return read_range(self.options, rng)

    def commit(self, end: dict[str, Any]) -> None:
        """Never commits to Kafka: offsets live in the checkpoint (commit-on-completion is a listener)."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.metadata.close()

    def _limits(self, limit: ReadLimit) -> RowLimits:
        # Python has no composite limit: the engine hands back one of ours and the options supply the other.
        if isinstance(limit, ReadAllAvailable):
            return RowLimits()
        if isinstance(limit, ReadMaxRows):
            return RowLimits(self.options.min_offsets_per_trigger, limit.max_rows)
        if isinstance(limit, ReadMinRows):
            return RowLimits(limit.min_rows, self.options.max_offsets_per_trigger)
        return RowLimits(self.options.min_offsets_per_trigger, self.options.max_offsets_per_trigger)


def _decode(offset: Mapping[str, Any]) -> Offsets | None:
    """The checkpoint's offset JSON; None for the initial offset (start of batch 0)."""
    return None if "$initial" in offset else parse_offsets(offset, "checkpoint offsets")


def register(spark: SparkSession, commit_conf: Mapping[str, str] | None = None) -> None:
    """Make ``spark.readStream.format("ckpt-kafka")`` available in this session.

    Also installs the listener that commits completed batches' offsets for queries whose source
    sets ``commitGroupId``; ``commit_conf`` holds the librdkafka settings (security) it needs.
    """
    from airflow_ckpt_provider.kafka.committer import ensure_source_router

    spark.dataSource.register(CkptKafkaDataSource)
    ensure_source_router(spark, dict(commit_conf or {}))
