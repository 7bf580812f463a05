"""The transactional ``ckpt-kafka`` sink: ``df.writeStream.format("ckpt-kafka")``, exactly once on Apache Kafka.

Each Spark task (sink partition p of batch N) writes inside one Kafka transaction whose
transactional.id ``{prefix}-{job}-{p}`` is stable, so a retried task fences the earlier attempt. The
commit marker of (job, query id, p) is a consumer-group offset committed with
``send_offsets_to_transaction`` in the same transaction: it exists if and only if the records are
committed, and a replayed (N, p) that finds it skips. Options and marker encoding: kafka/writeroptions.py;
the protocol and the settings users must get right: docs/sink-kafka.md.

This module imports pyspark at module level (the writer subclasses its classes); it runs only in
Spark's driver and Python workers.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamWriter, WriterCommitMessage

from airflow_ckpt_provider.core.coverage import checkpoint_storage, read_coverage
from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.faults import crash_point
from airflow_ckpt_provider.core.streambatch import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, worker_logging
from airflow_ckpt_provider.kafka.clientlog import configured, serve
from airflow_ckpt_provider.kafka.writeroptions import (
    HEADER,
    AttemptTag,
    MarkerAction,
    SinkOptions,
    check_schema,
    marker_decision,
    marker_offset,
    new_attempt,
    parse_sink_options,
    read_marker,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)



@dataclass
class KafkaSinkCommit(WriterCommitMessage):
    """What one task did: written (``records``), ``skipped`` (marker already there) or ``empty``."""

    partition: int
    batch_id: int
    query_id: str
    transactional_id: str
    attempt: str
    records: int = 0
    skipped: bool = False
    empty: bool = False
    rewritten: bool = False  # written again after a restore went back in time (the marker was ahead)


# --------------------------------------------------------------------------------------------
# Query start (driver)
# --------------------------------------------------------------------------------------------

def stream_writer(options: Mapping[str, str], schema: Any, overwrite: bool) -> DataSourceStreamWriter:
    """Validate options, columns and topics (errors fail ``start()``, nothing written) and build the writer.

    Spark also calls this for every batch's commit/abort in a fresh Python worker: the checks are one
    metadata request, bounded by ``timeoutMs``.
    """
    parsed = parse_sink_options(options)
    check_schema(schema, parsed)
    checkpoint_storage(parsed.checkpoint)  # a missing or unreadable checkpointLocation fails the start
    check_topics(parsed)
    return CkptKafkaStreamWriter(parsed)


def check_topics(options: SinkOptions) -> None:
    """The output and marker topics must exist (the sink never creates topics)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    wanted = sorted({t for t in (options.topic, options.marker_topic) if t})
    admin = AdminClient(configured({"client.id": f"ckpt-kafka-sink-{options.job}", **options.client_config()},
                                   job=options.job))
    try:
        # All topics, not list_topics(topic=...): a metadata request for one topic may auto-create it.
        topics = admin.list_topics(timeout=options.timeout_s).topics
    except KafkaException as err:
        raise ConfigError(f"could not list the topics of {options.bootstrap_servers} within {options.timeout_s:g} s "
                          f"for the ckpt-kafka sink: {err}. Check kafka.bootstrap.servers and the brokers") from err
    finally:
        serve(admin)
        del admin
    for name in wanted:
        meta = topics.get(name)
        if meta is None or meta.error is not None:
            found = "does not exist" if meta is None else f"has error {meta.error}"
            raise ConfigError(
                f"topic {name!r} for the ckpt-kafka sink (job {options.job}) {found} on {options.bootstrap_servers}: "
                f"create it first (e.g. kafka-topics.sh --create --topic {name} --bootstrap-server ...); the sink "
                "never creates topics"
            )


# --------------------------------------------------------------------------------------------
# Producers cached per Python worker
# --------------------------------------------------------------------------------------------

@dataclass
class _Clients:
    """The transactional producer of one transactional.id and the marker consumer of one group."""

    producer: Any
    consumer: Any
    group: str
    fresh: bool = True

    def close(self) -> None:
        """Release the clients without waiting for the broker.

        Producer.close() aborts the open transaction and flushes with no timeout: a fenced producer whose
        abort never completes (tansu drops the connection of a fenced EndTxn) blocks there forever, and
        the task with it. What it has queued or in flight is void anyway: purge, then let it go.
        """
        try:
            self.consumer.close()
        except Exception:
            log.debug("closing the marker consumer of %s failed", self.group, exc_info=True)
        try:
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
            self.producer.flush(0)
        except Exception:
            log.debug("purging the producer of %s failed", self.group, exc_info=True)


_CACHE: dict[str, _Clients] = {}
_LOCK = threading.Lock()


def _clients(options: SinkOptions, partition: int, group: str) -> _Clients:
    """The cached clients of ``partition`` (Python workers are reused), or new ones after init_transactions.

    init_transactions of a new producer fences every older producer of the same transactional.id and
    completes or aborts its open transaction before returning.
    """
    from confluent_kafka import Consumer, Producer

    txid = options.transactional_id(partition)
    with _LOCK:
        cached = _CACHE.get(txid)
        if cached is not None and cached.group == group:
            cached.fresh = False
            return cached
        if cached is not None:
            _CACHE.pop(txid).close()
    producer = Producer(configured(options.producer_config(partition), job=options.job))
    consumer = None
    try:
        producer.init_transactions(options.timeout_s)
        # Never polled: no stats (they would pile up in its queue); its failures raise from committed().
        consumer = Consumer(configured({**options.client_config(), "group.id": group, "enable.auto.commit": False,
                                        "isolation.level": "read_committed",
                                        "client.id": f"ckpt-kafka-sink-{options.job}"}, job=options.job, stats=False))
    except BaseException:
        producer.purge(in_queue=True, in_flight=True, blocking=False)  # not close(): see _Clients.close
        raise
    clients = _Clients(producer, consumer, group)
    with _LOCK:
        _CACHE[txid] = clients
    log.info("producer of %s initialised (job %s, marker group %s)", txid, options.job, group)
    return clients


def _drop(txid: str) -> None:
    with _LOCK:
        clients = _CACHE.pop(txid, None)
    if clients is not None:
        clients.close()


@atexit.register
def _close_all() -> None:
    for txid in list(_CACHE):
        _drop(txid)


# --------------------------------------------------------------------------------------------
# One task: one transaction
# --------------------------------------------------------------------------------------------

def write_partition(options: SinkOptions, batches: Iterator[pa.RecordBatch], *, query_id: str, batch_id: int,
                    partition: int) -> KafkaSinkCommit:
    """Write one sink partition of one batch in one transaction, or skip it if its marker says so."""
    from confluent_kafka import KafkaException, TopicPartition

    txid = options.transactional_id(partition)
    group = options.marker_group(query_id, partition)
    attempt = new_attempt(time.time_ns(), uuid.uuid4().hex[:8])  # sortable: later attempts compare greater
    result = KafkaSinkCommit(partition, batch_id, query_id, txid, attempt)
    first = next(batches, None)
    if first is None:
        # Nothing to write, nothing a replay could duplicate: no transaction at all.
        result.empty = True
        return result
    # One read per task: the marker keeps only the batch's own digest, so offsets/N-1 is not needed.
    coverage = read_coverage(checkpoint_storage(options.checkpoint), batch_id, previous=False)
    for retry in (False, True):
        clients = _clients(options, partition, group)
        try:
            # require_stable (librdkafka sends it for read_committed): waits for pending transactional offsets.
            (tp,) = clients.consumer.committed([TopicPartition(options.marker_topic, 0)], timeout=options.timeout_s)
            if tp.error is not None:
                raise KafkaException(tp.error)
            marker = read_marker(tp.offset)
            action = marker_decision(marker, batch_id, coverage.digest)
            if action is MarkerAction.SKIP:
                log.info("batch %d partition %d of job %s (query %s, offsets %s) is already committed: skipped",
                         batch_id, partition, options.job, query_id, coverage.short())
                result.skipped = True
                return result
            if action is MarkerAction.REWRITE and marker is not None:
                log.warning("batch %d partition %d of job %s (query %s, offsets %s): the sink's marker is at batch %d "
                            "of another timeline: the query was restored to an older snapshot; writing this batch "
                            "(consumers have also seen the records of the abandoned batches up to %d, Kafka cannot "
                            "unpublish them)", batch_id, partition, options.job, query_id, coverage.short(),
                            marker.batch_id, marker.batch_id)
                result.rewritten = True
            clients.producer.begin_transaction()
            # The marker goes first: it is only applied if the transaction commits, and its
            # AddOffsetsToTxn request tells a fenced cached producer before any input is consumed.
            clients.producer.send_offsets_to_transaction(
                [TopicPartition(options.marker_topic, 0, marker_offset(batch_id, coverage.digest))],
                clients.consumer.consumer_group_metadata(), options.timeout_s)
            break
        except KafkaException as err:
            _abort_quietly(clients, options, err)
            _drop(txid)
            if retry or clients.fresh:
                raise
            log.warning("cached producer of %s failed to start batch %d (%s): recreating it once (job %s)",
                        txid, batch_id, err, options.job)
    try:
        headers = [(HEADER, AttemptTag(query_id, batch_id, partition, attempt).encode())]
        for rb in itertools.chain((first,), batches):
            result.records += produce_batch(clients.producer, rb, options.topic, headers)
        remaining = clients.producer.flush(options.timeout_s)
        if remaining:
            raise CkptError(f"{remaining} records of batch {batch_id} partition {partition} (job {options.job}) "
                            f"were not delivered within {options.timeout_s:g} s: the transaction is aborted")
        # Both points: records on the broker inside the open transaction, marker sent, not committed.
        crash_point("kafka.task.after-produce", batch_id)
        crash_point("kafka.task.before-commit", batch_id)
        clients.producer.commit_transaction(options.timeout_s)
    except BaseException as err:
        _abort_quietly(clients, options, err)
        _drop(txid)
        raise
    # The marker the task found says why it wrote (a replay that wrote again shows which marker it missed).
    found = f"batch {marker.batch_id}" if marker is not None else "none"
    log.info("batch %d partition %d of job %s (query %s): %d records committed by %s (marker found: %s)", batch_id,
             partition, options.job, query_id, result.records, txid, found)
    crash_point("kafka.task.after-commit", batch_id)
    return result


def _abort_quietly(clients: _Clients, options: SinkOptions, err: BaseException) -> None:
    """Best effort: if this fails, the next init_transactions of the id or transaction.timeout.ms aborts it.

    A fatal error (fenced by a newer producer of the id) leaves nothing this producer may abort.
    """
    fatal = getattr(err.args[0], "fatal", None) if err.args else None
    if callable(fatal) and fatal():
        return
    try:
        clients.producer.abort_transaction(min(options.timeout_s, 10.0))
    except Exception:  # no transaction in progress, fenced, or broker down
        log.debug("abort_transaction failed (job %s)", options.job, exc_info=True)


def produce_batch(producer: Any, rb: pa.RecordBatch, topic: str | None,
                  headers: list[tuple[str, bytes]] | None) -> int:
    """Produce one Arrow batch (columns as Spark's Kafka sink); ``topic`` overrides a topic column."""
    names = rb.schema.names
    values = rb.column(names.index("value")).to_pylist()
    n = len(values)
    keys = rb.column(names.index("key")).to_pylist() if "key" in names else itertools.repeat(None, n)
    topics = itertools.repeat(topic, n) if topic else rb.column(names.index("topic")).to_pylist()
    parts = rb.column(names.index("partition")).to_pylist() if "partition" in names else itertools.repeat(None, n)
    user = rb.column(names.index("headers")).to_pylist() if "headers" in names else itertools.repeat(None, n)
    produce = producer.produce
    for value, key, top, part, hdrs in zip(values, keys, topics, parts, user, strict=False):
        if top is None:
            raise ConfigError("a row of the ckpt-kafka sink has a null 'topic' and no 'topic' option is set")
        record_headers = headers if not hdrs else [(h["key"], h["value"]) for h in hdrs] + (headers or [])
        kwargs: dict[str, Any] = {"key": key, "headers": record_headers}
        if part is not None:
            kwargs["partition"] = part
        while True:
            try:
                produce(top, value, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let deliveries drain
    producer.poll(0)
    return n


# --------------------------------------------------------------------------------------------
# The Spark writer
# --------------------------------------------------------------------------------------------

class CkptKafkaStreamWriter(DataSourceStreamArrowWriter):
    """``write`` on executors (one transaction per task); ``commit``/``abort`` on the driver only log."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkCommit:
        from pyspark import TaskContext

        worker_logging()
        context = TaskContext.get()
        if context is None:
            raise CkptError("the ckpt-kafka sink's write() ran outside a Spark task")
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        if batch is None or not query_id:
            raise CkptError(f"the ckpt-kafka sink needs Spark's local properties {BATCH_ID_PROPERTY} and "
                            f"{QUERY_ID_PROPERTY} (found {batch!r}, {query_id!r}): use it in a streaming query")
        return write_partition(self.options, iterator, query_id=query_id, batch_id=int(batch),
                               partition=context.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        worker_logging()
        crash_point("kafka.commit.driver", batchId)
        done = [m for m in messages if isinstance(m, KafkaSinkCommit)]
        written = sorted(m.partition for m in done if not m.skipped and not m.empty)
        skipped = sorted(m.partition for m in done if m.skipped)
        rewritten = sorted(m.partition for m in done if m.rewritten)
        queries = sorted({m.query_id for m in done})
        log.info("batch %d of job %s (query %s) committed: partitions written %s, skipped %s, %d empty, %d records%s",
                 batchId, self.options.job, ",".join(queries) or "-", written, skipped,
                 sum(m.empty for m in done), sum(m.records for m in done),
                 f"; partitions {rewritten} written again after a restore to an older snapshot" if rewritten else "")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, KafkaSinkCommit)]
        # Committed partitions stay (their markers make the replay skip them); open transactions are
        # aborted by the next attempt's init_transactions or by transaction.timeout.ms.
        log.warning("batch %d of job %s aborted: %d of %d tasks had committed (%d records); the batch is "
                    "replayed and those partitions skipped", batchId, self.options.job,
                    sum(not m.skipped and not m.empty for m in done), len(messages), sum(m.records for m in done))


def kafka_sink(df: DataFrame, *, job: str, **options: str) -> DataStreamWriter:
    """``df.writeStream`` set up for the ckpt-kafka sink after its checks, run now rather than at the first batch.

    Options as for ``format("ckpt-kafka")`` (``kafka.bootstrap.servers``, ``topic``, ...). Spark 4.3
    builds a Python sink's writer only when the first batch is planned; calling this in a job's build
    function refuses bad options, columns and missing topics before the runtime takes the lease.
    """
    parsed = parse_sink_options({**options, "job": job})
    check_schema(df.schema, parsed)
    check_topics(parsed)
    return df.writeStream.format("ckpt-kafka").options(**options).option("job", job)
