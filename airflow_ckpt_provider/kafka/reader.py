"""Executor side of the ``ckpt-kafka`` source: read one offset range of one partition as Arrow batches.

A range [start, end) is done when the consumer's position reaches ``end``, not when end - start
records were seen: transaction markers, aborted records (read_committed) and compaction leave
offsets without records. confluent_kafka and pyarrow are imported inside functions: this module
is loaded on executors only.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.kafka.clientlog import configured
from airflow_ckpt_provider.kafka.offsets import DataLossError
from airflow_ckpt_provider.kafka.options import SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

log = logging.getLogger(__name__)

#: Records per Arrow batch handed to Spark, and a byte bound for large values.
BATCH_RECORDS = 10_000
BATCH_BYTES = 32 * 1024 * 1024
#: One consume() call waits at most this long, so the no-progress deadline is checked often.
_CONSUME_WAIT_S = 1.0
#: Broker calls made while recovering from an error (watermarks).
_REQUEST_TIMEOUT_S = 30.0


class KafkaReadError(CkptError):
    """A partition range could not be read: a fatal broker error, or no progress within the poll timeout."""


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} [{self.start}, {self.end})"


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of Spark's Kafka schema, exactly as pyspark's to_arrow_schema writes it."""
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


def read_range(
    options: SourceOptions,
    rng: Range,
    *,
    consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` as Arrow batches; the consumer is closed however this ends."""
    from confluent_kafka import Consumer, TopicPartition

    if rng.end <= rng.start:
        return
    consumer = (consumer_factory or Consumer)(configured(options.consumer_config()))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        yield from _RangeReader(options, rng, consumer, clock).batches()
    finally:
        consumer.close()


class _RangeReader:
    """The consume loop of one range: position tracking, EOF, data loss, stall detection."""

    def __init__(self, options: SourceOptions, rng: Range, consumer: Any, clock: Callable[[], float]) -> None:
        self.options = options
        self.rng = rng
        self.consumer = consumer
        self.clock = clock
        self.position = rng.start  # next offset this range still needs
        self.high_watermark: int | None = None
        self.schema = arrow_schema(options.include_headers)

    def batches(self) -> Iterator[pa.RecordBatch]:
        timeout = self.options.poll_timeout_ms / 1000
        deadline = self.clock() + timeout
        pending: list[Any] = []
        pending_bytes = 0
        while self.position < self.rng.end:
            wanted = min(BATCH_RECORDS, self.rng.end - self.position)
            messages = self.consumer.consume(num_messages=wanted, timeout=min(_CONSUME_WAIT_S, timeout))
            before = self.position
            records = self._in_range([m for m in messages if m.error() is None])
            if records:
                pending.extend(records)
                pending_bytes += sum(len(m) for m in records)  # len(): the value size
                self.position = max(self.position, records[-1].offset() + 1)
            # Events after the records: an EOF follows the last record it covers.
            for msg in messages:
                if msg.error() is not None and self.position < self.rng.end:
                    self._on_event(msg)
            if len(pending) >= BATCH_RECORDS or pending_bytes >= BATCH_BYTES:
                yield self._to_arrow(pending)
                pending, pending_bytes = [], 0
            if self.position > before:
                deadline = self.clock() + timeout
            elif self.position < self.rng.end and self.clock() > deadline:
                raise KafkaReadError(
                    f"Expected records of {self.rng} up to offset {self.rng.end}, found none past {self.position} "
                    f"within kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_ms} (high watermark "
                    f"{self.high_watermark}). Check that the brokers are up; raise the timeout if they are slow"
                )
        if pending:
            yield self._to_arrow(pending)
        log.debug("read %s", self.rng)

    def _on_event(self, msg: Any) -> None:
        from confluent_kafka import KafkaError

        err = msg.error()
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            self._on_eof(msg.offset())
        elif code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            self._on_out_of_range(err)
        elif code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC):
            # Also reported while metadata propagates: only a partition missing from a fresh listing is gone.
            if not self._partition_listed():
                self._data_loss(f"offsets [{self.position}, {self.rng.end}) cannot be read: {err.str()} (the "
                                "topic or partition was deleted)", resume_at=self.rng.end)
        elif err.fatal() or not (err.retriable() or code < 0):
            raise KafkaReadError(f"Cannot read {self.rng}: {err.str()} (code {err.name()})")
        else:
            # librdkafka's internal errors (negative codes: transport, timeouts) are retried by the
            # client itself; the no-progress deadline bounds how long we let it.
            log.debug("transient error reading %s: %s", self.rng, err.str())

    def _in_range(self, records: list[Any]) -> list[Any]:
        """Drop records before the position (never expected) and past the range end (a gap ended right at it)."""
        if records and records[0].offset() < self.position:
            records = [m for m in records if m.offset() >= self.position]
        if records and records[-1].offset() >= self.rng.end:
            records = records[: bisect.bisect_left([m.offset() for m in records], self.rng.end)]
            self.position = self.rng.end  # the first record past the end proves nothing is missing
        return records

    def _on_eof(self, offset: int) -> None:
        # The EOF event carries the fetch position, which is past control records (transaction
        # markers) and aborted records: this is what lets a range that ends in a gap finish.
        self.high_watermark = offset
        if offset > self.position:
            self.position = min(offset, self.rng.end)

    def _partition_listed(self) -> bool:
        # All topics: asking for one by name auto-creates it on brokers that allow that.
        topic = self.consumer.list_topics(timeout=_REQUEST_TIMEOUT_S).topics.get(self.rng.topic)
        return topic is not None and topic.error is None and self.rng.partition in topic.partitions

    def _on_out_of_range(self, err: Any) -> None:
        """The broker no longer (or not yet) has ``position``: retention, or a recreated topic."""
        from confluent_kafka import TopicPartition

        tp = TopicPartition(self.rng.topic, self.rng.partition)
        low, high = self.consumer.get_watermark_offsets(tp, timeout=_REQUEST_TIMEOUT_S, cached=False)
        if low > self.position:
            lost, resume = f"offsets [{self.position}, {min(low, self.rng.end)}) are", low
        else:  # the partition is shorter than the planned range: truncated or recreated
            lost = f"offsets [{self.position}, {self.rng.end}) are (the partition now ends at {high})"
            resume = self.rng.end
        self._data_loss(f"{lost} no longer on the broker ({err.str()})", resume_at=resume)

    def _data_loss(self, what: str, *, resume_at: int) -> None:
        message = f"{self.rng}: {what}; deleted by retention, or the topic was recreated, before this query read them"
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{message}. Restore an older checkpoint if the records still exist elsewhere, or set "
                "failOnDataLoss=false to skip to the earliest available offset"
            )
        log.warning("%s; skipping them (failOnDataLoss=false)", message)
        if resume_at < self.rng.end:
            from confluent_kafka import TopicPartition

            self.consumer.assign([TopicPartition(self.rng.topic, self.rng.partition, resume_at)])
        self.position = max(self.position, min(resume_at, self.rng.end))

    def _to_arrow(self, records: list[Any]) -> pa.RecordBatch:
        """Build the batch column by column (no per-row tuples)."""
        import pyarrow as pa

        n = len(records)
        stamps = [m.timestamp() for m in records]
        # confluent_kafka's timestamp types are 0 none, 1 create, 2 log-append; Spark's column holds
        # Kafka's ids (-1, 0, 1). A missing timestamp is -1 ms, as the Java client reports it.
        columns = [
            pa.array([m.key() for m in records], pa.binary()),
            pa.array([m.value() for m in records], pa.binary()),
            pa.repeat(pa.scalar(self.rng.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.rng.partition, pa.int32()), n),
            pa.array([m.offset() for m in records], pa.int64()),
            pa.array([s[1] * 1000 for s in stamps], pa.timestamp("us", tz="UTC")),
            pa.array([s[0] - 1 for s in stamps], pa.int32()),
        ]
        if self.options.include_headers:
            headers = [m.headers() for m in records]
            columns.append(
                pa.array(
                    [[{"key": k, "value": v} for k, v in h] if h else None for h in headers],
                    self.schema.field("headers").type,
                )
            )
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
