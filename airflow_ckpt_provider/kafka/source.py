"""The ``ckpt-kafka`` streaming source: Kafka for PySpark on confluent-kafka, without the JVM connector.

Usage (options and schema as Spark's Kafka source; see docs/kafka.md)::

    from airflow_ckpt_provider.kafka.source import register

    register(spark)
    df = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", "broker:9092")
        .option("subscribe", "orders,payments")  # or subscribePattern
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100_000)
        .load()
    )

The source's offset in the Spark checkpoint is ``{"topic": {"partition": next_offset}}``
(kafka/offsets.py); a batch reads exactly [previous end, end) of every partition, so a replayed
batch reads the same records. Batch 0 of a new query reads nothing: it only records the resolved
startingOffsets in the offsets log, because Spark calls ``initialOffset()`` again whenever batch 0
is planned or replayed and Python sources have no ``sources/`` log to pin it. The reader never
commits offsets to Kafka (``commit`` is a no-op); executors read with assign() only.

This module imports pyspark at module level (the DataSource classes need it); nothing in the
Airflow layer imports it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
from airflow_ckpt_provider.core.gate import gate_closed
from airflow_ckpt_provider.kafka.offsets import (
    COMMIT_KEY,
    DataLossError,
    Offsets,
    flatten,
    format_offsets,
    parse_offsets,
    to_json_dict,
)
from airflow_ckpt_provider.kafka.options import SourceOptions, check_client_config, parse_options
from airflow_ckpt_provider.kafka.reader import Range, read_range
from airflow_ckpt_provider.kafka.writer import stream_writer

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

NAME = "ckpt-kafka"
#: The start of batch 0. Not an offset: the first latestOffset() resolves startingOffsets into
#: batch 0's end, and batch 0 reads nothing ('$' cannot appear in a Kafka topic name).
INITIAL_OFFSET: dict[str, Any] = {"$initial": "startingOffsets are resolved by batch 0"}
#: Timeout of each driver metadata request.
REQUEST_TIMEOUT_S = 30.0

TP = tuple[str, int]


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
# Observing the cluster (driver)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Subscribed partitions with their earliest and latest offsets at one moment.

    ``high`` is the end a consumer of the configured isolation level can read (the last stable
    offset under read_committed). Partitions that exist but whose offsets could not be listed are
    in ``unknown``; topics whose metadata carried an error are in ``unavailable_topics``: neither
    is mistaken for a deleted partition.
    """

    low: Mapping[TP, int]
    high: Mapping[TP, int]
    unknown: frozenset[TP] = frozenset()
    unavailable_topics: frozenset[str] = frozenset()


class Metadata(Protocol):
    """What the planner asks the cluster; a fake in unit tests, BrokerMetadata in production."""

    def snapshot(self) -> Snapshot: ...

    def offsets_for_timestamp(self, partitions: Sequence[TP], timestamp_ms: int) -> dict[TP, int]: ...

    def close(self) -> None: ...


class BrokerMetadata:
    """Metadata and offsets from the brokers with one AdminClient; retried per fetchOffset.* options."""

    def __init__(self, options: SourceOptions, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.options = options
        self._sleep = sleep
        self._admin: Any = None

    def _client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            config: dict[str, str | int | float | bool] = {**self.options.admin_config()}
            self._admin = AdminClient(config)
        return self._admin

    def _retrying(self) -> Any:
        from confluent_kafka import KafkaException
        from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_attempt, wait_fixed

        return Retrying(
            retry=retry_if_exception_type(KafkaException),
            stop=stop_after_attempt(self.options.fetch_retries),
            wait=wait_fixed(self.options.fetch_retry_interval_ms / 1000),
            reraise=True,
            before_sleep=before_sleep_log(log, logging.WARNING),
            sleep=self._sleep,
        )

    def snapshot(self) -> Snapshot:
        partitions, unavailable = self._retrying()(self._subscribed_partitions)
        low, low_unknown = self._offsets(partitions, _offset_spec("earliest"))
        high, high_unknown = self._offsets(partitions, _offset_spec("latest"))
        unknown = low_unknown | high_unknown
        return Snapshot(
            low={tp: o for tp, o in low.items() if tp not in unknown},
            high={tp: o for tp, o in high.items() if tp not in unknown},
            unknown=frozenset(unknown),
            unavailable_topics=frozenset(unavailable),
        )

    def offsets_for_timestamp(self, partitions: Sequence[TP], timestamp_ms: int) -> dict[TP, int]:
        found, unknown = self._offsets(partitions, _offset_spec("for_timestamp", timestamp_ms))
        if unknown:
            raise DataLossError(
                f"Cannot find offsets for startingTimestamp {timestamp_ms} of {_names(unknown)}: the brokers did "
                "not answer; check the cluster and restart the query"
            )
        return found

    def close(self) -> None:
        self._admin = None  # AdminClient has no close(); its threads end when it is collected

    def _subscribed_partitions(self) -> tuple[list[TP], set[str]]:
        """List all topics (naming one would auto-create it on some brokers) and keep the subscribed ones."""
        from confluent_kafka import KafkaError

        metadata = self._client().list_topics(timeout=REQUEST_TIMEOUT_S)
        partitions: list[TP] = []
        unavailable: set[str] = set()
        for name, topic in metadata.topics.items():
            if not self.options.subscribed(name):
                continue
            if topic.error is not None:
                if topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    unavailable.add(name)
                continue
            partitions.extend((name, p) for p in topic.partitions)
        return sorted(partitions), unavailable

    def _offsets(self, partitions: Sequence[TP], spec: Any) -> tuple[dict[TP, int], set[TP]]:
        """Offsets of ``partitions`` for ``spec``; partitions still failing after the retries are returned apart."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

        level = (
            IsolationLevel.READ_COMMITTED
            if self.options.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        found: dict[TP, int] = {}
        failed: dict[TP, str] = {}

        def attempt() -> None:
            remaining = [tp for tp in partitions if tp not in found]
            if not remaining:
                return
            failed.clear()
            futures = self._client().list_offsets(
                {TopicPartition(t, p): spec for t, p in remaining},
                isolation_level=level,
                request_timeout=REQUEST_TIMEOUT_S,
            )
            for tp, future in futures.items():
                try:  # every partition carries its own error, even when the request succeeded
                    found[(tp.topic, tp.partition)] = int(future.result(timeout=REQUEST_TIMEOUT_S).offset)
                except KafkaException as err:
                    failed[(tp.topic, tp.partition)] = str(err.args[0])
            if failed:
                raise KafkaException(f"list offsets failed for {_names(failed)}: {next(iter(failed.values()))}")

        try:
            self._retrying()(attempt)
        except KafkaException as err:
            log.warning("offsets unknown, retried next trigger: %s", err)
        return found, set(failed)


def _offset_spec(kind: str, timestamp_ms: int = 0) -> Any:
    """OffsetSpec.earliest() / latest() / for_timestamp(ms) of AdminClient.list_offsets."""
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # re-exported, not in __all__

    spec: Any = OffsetSpec
    return spec.for_timestamp(timestamp_ms) if kind == "for_timestamp" else getattr(spec, kind)()


# --------------------------------------------------------------------------------------------
# Planning batches (driver): pure decisions over a Snapshot
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowLimits:
    """Admission control for one batch, counted in offsets as Spark's Kafka source counts them."""

    min_rows: int | None = None
    max_rows: int | None = None


class OffsetPlanner:
    """Decides each batch's end offsets and splits [start, end) into ranges; all broker IO goes through Metadata."""

    def __init__(
        self, options: SourceOptions, metadata: Metadata, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.options = options
        self.metadata = metadata
        self.clock = clock
        self.latest_seen: Offsets | None = None
        self._target: Snapshot | None = None
        self._last_trigger = clock()
        self._warned: set[str] = set()

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: fix the end of the run now; later data waits for the next run."""
        self._target = self.metadata.snapshot()
        log.info("available-now target: %s", format_offsets(_nest(self._target.high)))

    def latest(self, start: Offsets | None, limits: RowLimits) -> Offsets:
        """The end of the next batch starting at ``start`` (None: batch 0, which resolves startingOffsets)."""
        snap = self._target if self._target is not None else self.metadata.snapshot()
        self.latest_seen = _nest(snap.high)
        if start is None:
            resolved = self._starting_offsets(snap)
            log.info("startingOffsets %s resolved to %s", self.options.starting.kind, format_offsets(resolved))
            return resolved
        begin = flatten(start)
        snap = self._confirm_missing(snap, begin)
        end: dict[TP, int] = {}
        readable: dict[TP, int] = {}  # partition -> offset its next records start at
        reset = False
        for tp in sorted(set(begin) | set(snap.high)):
            offset, from_offset = self._partition_end(tp, begin.get(tp), snap)
            if offset is not None:
                end[tp] = offset
            if from_offset is not None:
                readable[tp] = from_offset
            elif offset is None or offset != begin.get(tp):
                reset = True  # data loss skipped with failOnDataLoss=false: record it in this batch
        available = {tp: end[tp] - s for tp, s in readable.items() if end[tp] > s}
        total = sum(available.values())
        if self._delay(total, limits, reset):
            return start
        if limits.max_rows is not None and total > limits.max_rows:
            for tp, n in allot(available, limits.max_rows).items():
                end[tp] = readable[tp] + n
        nested = _nest(end)
        if nested != start:
            self._last_trigger = self.clock()
        return nested

    def _confirm_missing(self, snap: Snapshot, begin: Mapping[TP, int]) -> Snapshot:
        """Ask again before calling a partition deleted: one metadata answer can miss a topic."""
        missing = {tp for tp in begin if not _known(tp, snap)}
        if not missing:
            return snap
        again = self.metadata.snapshot()
        transient = {tp for tp in missing if _known(tp, again)}
        if transient:
            log.info("partitions %s missing from metadata, then back: no progress this trigger", _names(transient))
        return Snapshot(snap.low, snap.high, snap.unknown | transient, snap.unavailable_topics)

    def _partition_end(self, tp: TP, start: int | None, snap: Snapshot) -> tuple[int | None, int | None]:
        """(end offset or None to drop the partition, offset reading resumes from or None if nothing to read)."""
        if tp not in snap.high:
            if tp in snap.unknown or tp[0] in snap.unavailable_topics:
                return start, None  # no progress until the brokers answer again
            if start is not None:
                self._data_loss(f"partition {_name(tp)} no longer exists; records from offset {start} on were not read")
            return None, None
        low, high = snap.low[tp], snap.high[tp]
        if start is None:
            log.info("new partition %s: reading from offset 0", _name(tp))
            start = 0
        if start < low:
            self._data_loss(f"offsets [{start}, {low}) of {_name(tp)} were deleted before they were read")
            return low, None
        if start > high:
            self._data_loss(
                f"{_name(tp)} ends at offset {high} but the query already read up to {start}: the partition was "
                "truncated or the topic recreated; continuing from its earliest offset"
            )
            return low, None
        return high, start

    def ranges(self, start: Offsets | None, end: Offsets) -> list[Range]:
        """[start, end) per partition (new partitions from 0); batch 0 (start None) reads nothing."""
        if start is None:
            return []
        begin = flatten(start)
        planned = [
            Range(t, p, begin.get((t, p), 0), e)
            for (t, p), e in sorted(flatten(end).items())
            if e > begin.get((t, p), 0)
        ]
        planned = split(planned, self.options.min_partitions)
        log.debug("planned %d ranges: %s", len(planned), ", ".join(map(str, planned)))
        return planned

    def _delay(self, total: int, limits: RowLimits, reset: bool) -> bool:
        """minOffsetsPerTrigger: wait for more records until maxTriggerDelay passed (never in AvailableNow)."""
        if limits.min_rows is None or total >= limits.min_rows or reset or self._target is not None or total == 0:
            return False
        waited_ms = (self.clock() - self._last_trigger) * 1000
        if waited_ms >= self.options.max_trigger_delay_ms:
            return False
        log.debug(
            "%d of minOffsetsPerTrigger=%d offsets available after %.0f ms: waiting", total, limits.min_rows, waited_ms
        )
        return True

    def _starting_offsets(self, snap: Snapshot) -> Offsets:
        if snap.unknown or snap.unavailable_topics:
            raise DataLossError(
                f"Cannot resolve startingOffsets: offsets of {_names(snap.unknown)} and topics "
                f"{sorted(snap.unavailable_topics)} are unavailable on {self.options.bootstrap_servers}. Expected "
                "every subscribed partition to answer; check the brokers and restart the query"
            )
        starting = self.options.starting
        if starting.kind == "earliest":
            return _nest(snap.low)
        if starting.kind == "latest":
            return _nest(snap.high)
        if starting.kind == "timestamp":
            assert starting.timestamp_ms is not None
            found = self.metadata.offsets_for_timestamp(sorted(snap.high), starting.timestamp_ms)
            # -1: no record at or after the timestamp yet, so start at the end.
            return _nest({tp: snap.high[tp] if found.get(tp, -1) < 0 else found[tp] for tp in snap.high})
        assert starting.specific is not None
        return _nest(self._specific(flatten(starting.specific), snap))

    def _specific(self, given: dict[TP, int], snap: Snapshot) -> dict[TP, int]:
        unsubscribed = sorted({t for t, _ in given if not self.options.subscribed(t)})
        if unsubscribed:
            raise ConfigError(
                f"startingOffsets names topics {unsubscribed} outside {self.options.describe_subscription()}: "
                "expected only subscribed topics; remove them or subscribe to them"
            )
        missing, extra = sorted(set(snap.high) - set(given)), sorted(set(given) - set(snap.high))
        if missing or extra:
            raise ConfigError(
                f"startingOffsets must list every partition of the subscribed topics, as in Spark: missing "
                f"{_names(missing) or 'none'}, not existing {_names(extra) or 'none'}. Add the missing ones with -2 "
                "(earliest) or -1 (latest) and remove partitions that do not exist"
            )
        resolved: dict[TP, int] = {}
        for tp, offset in given.items():
            low, high = snap.low[tp], snap.high[tp]
            if offset in (-2, -1):
                resolved[tp] = low if offset == -2 else high
            elif low <= offset <= high:
                resolved[tp] = offset
            else:
                self._data_loss(
                    f"startingOffsets asks for offset {offset} of {_name(tp)}, which holds [{low}, {high}); "
                    "starting from its earliest offset"
                )
                resolved[tp] = low
        return resolved

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {message}. Expected every record since the last batch to still be on the broker. "
                "Set failOnDataLoss=false to skip lost records with a warning, or restore an older checkpoint"
            )
        if message not in self._warned:
            self._warned.add(message)
            log.warning("data loss (failOnDataLoss=false, skipping): %s", message)


def allot(available: Mapping[TP, int], max_rows: int) -> dict[TP, int]:
    """Split ``max_rows`` over partitions in proportion to what each has; the sum is exactly the bound."""
    total = sum(available.values())
    if total <= max_rows:
        return dict(available)
    shares = {tp: divmod(max_rows * n, total) for tp, n in available.items()}
    out = {tp: whole for tp, (whole, _) in shares.items()}
    rest = max_rows - sum(out.values())
    # Largest remainders first: no partition is starved for long, however small.
    for tp in sorted(shares, key=lambda tp: (-shares[tp][1], tp))[:rest]:
        out[tp] += 1
    return out


def split(ranges: list[Range], min_partitions: int | None) -> list[Range]:
    """minPartitions: split big ranges (proportionally) so a batch has at least that many tasks."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[Range] = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(size, round(size * min_partitions / total)))
        bounds = [r.start + size * i // parts for i in range(parts + 1)]
        out.extend(Range(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds))
    return out


def _known(tp: TP, snap: Snapshot) -> bool:
    """Whether ``snap`` shows the partition, or cannot tell (unknown offsets, topic with an error)."""
    return tp in snap.high or tp in snap.unknown or tp[0] in snap.unavailable_topics


def _nest(flat: Mapping[TP, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[partition] = offset
    return out


def _name(tp: TP) -> str:
    return f"{tp[0]}/{tp[1]}"


def _names(tps: Any) -> str:
    return ", ".join(_name(tp) for tp in sorted(tps))


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
        if start is not None and gate_closed():
            # A stop-with-savepoint is in progress: plan no new batch (equal offsets mean no new data).
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
