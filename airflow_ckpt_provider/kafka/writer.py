"""The transactional ``ckpt-kafka`` sink: exactly once on Apache Kafka, one transaction per task.
This module imports pyspark at module level; it runs only in Spark's driver and Python workers.

Design notes: docs/sink-kafka.md#design-notes-kafkawriterpy."""

from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamWriter, WriterCommitMessage

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.streambatch import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    SinkOutcome,
    before_query_start,
    commit_after_snapshot,
    sink_outcome,
    worker_logging,
)
from airflow_ckpt_provider.core.snapshots.coverage import checkpoint_storage, read_coverage
from airflow_ckpt_provider.core.snapshots.durableplan import await_durable
from airflow_ckpt_provider.kafka.clientlog import configured, serve
from airflow_ckpt_provider.kafka.txnlock import decided, txn_end_slot
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

#: The module of Spark's Python worker that builds a streaming sink's writer again for each batch's commit or abort.
COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


def stream_writer(options: Mapping[str, str], schema: Any, overwrite: bool) -> DataSourceStreamWriter:
    """Validate options, columns and topics (errors fail ``start()``, nothing written) and build the writer.

    Spark calls this again for every batch: to plan its write, and for its commit/abort (``COMMIT_RUNNER``), each
    in a Python worker of the driver that Spark reuses. A driver cut from the brokers, whose executors still reach
    them, must not fail a batch on a topic check (docs/reliability.md, finding 14): the topics are checked once per
    worker (``_CHECKED``), and never for a commit, which only logs and records the partition count.
    """
    parsed = parse_sink_options(options)
    check_schema(schema, parsed)
    checkpoint_storage(parsed.checkpoint)  # a missing or unreadable checkpointLocation fails the start
    if _for_commit():
        return CkptKafkaStreamWriter(parsed)
    key = (parsed.bootstrap_servers, parsed.topic, parsed.marker_topic)
    if key not in _CHECKED:
        _CHECKED[key] = check_topics(parsed)
    return CkptKafkaStreamWriter(decided(parsed, _CHECKED[key]))


#: (bootstrap servers, topic, marker topic) whose topics this process found, with the brokers' cluster id.
_CHECKED: dict[tuple[str, str | None, str], str | None] = {}


def _for_commit() -> bool:
    """Whether Spark's commit runner is the caller (its frame is on this thread's stack)."""
    # The caller's module is the only sign of why Spark built the writer (the options are the same).
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == COMMIT_RUNNER:
            return True
        frame = frame.f_back
    return False


def check_topics(options: SinkOptions) -> str | None:
    """The output and marker topics must exist (the sink never creates topics); the broker's cluster id."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    wanted = sorted({t for t in (options.topic, options.marker_topic) if t})
    admin = AdminClient(configured({"client.id": f"ckpt-kafka-sink-{options.job}", **options.client_config()},
                                   job=options.job))
    try:
        # All topics, not list_topics(topic=...): a metadata request for one topic may auto-create it.
        metadata = admin.list_topics(timeout=options.timeout_s)
    except KafkaException as err:
        raise ConfigError(f"could not list the topics of {options.bootstrap_servers} within {options.timeout_s:g} s "
                          f"for the ckpt-kafka sink: {err}. Check kafka.bootstrap.servers and the brokers") from err
    finally:
        serve(admin)
        del admin
    for name in wanted:
        meta = metadata.topics.get(name)
        if meta is None or meta.error is not None:
            found = "does not exist" if meta is None else f"has error {meta.error}"
            raise ConfigError(
                f"topic {name!r} for the ckpt-kafka sink (job {options.job}) {found} on {options.bootstrap_servers}: "
                f"create it first (e.g. kafka-topics.sh --create --topic {name} --bootstrap-server ...); the sink "
                "never creates topics"
            )
    return metadata.cluster_id


# --------------------------------------------------------------------------------------------
# Clients: a producer per task, a marker consumer per group and Python worker
# --------------------------------------------------------------------------------------------

_CONSUMERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _marker_consumer(options: SinkOptions, group: str) -> Any:
    """The consumer that reads and commits (inside transactions) the marker of ``group``, cached per Python worker.

    It never joins the group and is never polled (no stats pile up in its queue): a reader, so two workers
    holding one for the same group never disturb each other, unlike two producers of one transactional.id.
    """
    from confluent_kafka import Consumer

    with _LOCK:
        consumer = _CONSUMERS.get(group)
        if consumer is None:
            consumer = Consumer(configured({**options.client_config(), "group.id": group, "enable.auto.commit": False,
                                            "isolation.level": "read_committed",
                                            "client.id": f"ckpt-kafka-sink-{options.job}"}, job=options.job,
                                           stats=False))
            _CONSUMERS[group] = consumer
    return consumer


def new_producer(options: SinkOptions, partition: int) -> Any:
    """A transactional producer of ``partition``'s transactional.id, after init_transactions.

    One per task, never cached: init_transactions fences every older producer of the id (a zombie attempt,
    or the previous task of this sink partition in another Python worker) and completes or aborts its open
    transaction before returning. A producer cached per worker would be fenced by the other workers' tasks of
    the same sink partition in normal running (Spark moves a partition's tasks between workers).
    """
    from confluent_kafka import Producer

    producer = Producer(configured(options.producer_config(partition), job=options.job))
    try:
        # Ends the id's open transaction on the broker, if any: one of the ends serializeTxnEnds covers.
        with txn_end_slot(options, f"init_transactions of {options.transactional_id(partition)}"):
            producer.init_transactions(options.timeout_s)
    except BaseException:
        release(producer)
        raise
    return producer


def release(producer: Any) -> None:
    """Let a producer go without waiting for the broker.

    Producer.close() aborts the open transaction and flushes with no timeout: a fenced producer whose abort
    never completes (tansu drops the connection of a fenced EndTxn) blocks there forever, and the task with
    it. What it has queued or in flight is void anyway: purge, then drop it.
    """
    try:
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        producer.flush(0)
    except Exception:
        log.debug("purging a producer failed", exc_info=True)


@atexit.register
def _close_all() -> None:
    with _LOCK:
        consumers = list(_CONSUMERS.values())
        _CONSUMERS.clear()
    for consumer in consumers:
        try:
            consumer.close()
        except Exception:
            log.debug("closing a marker consumer failed", exc_info=True)


# --------------------------------------------------------------------------------------------
# One task: one transaction
# --------------------------------------------------------------------------------------------

def _read_marker(consumer: Any, options: SinkOptions) -> int:
    """The committed offset of the marker group (NO_OFFSET when it has none)."""
    from confluent_kafka import KafkaException, TopicPartition

    # require_stable (librdkafka sends it for read_committed): waits for pending transactional offsets.
    (tp,) = consumer.committed([TopicPartition(options.marker_topic, 0)], timeout=options.timeout_s)
    if tp.error is not None:
        raise KafkaException(tp.error)
    return int(tp.offset)


def write_partition(options: SinkOptions, batches: Iterator[pa.RecordBatch], *, query_id: str, batch_id: int,
                    partition: int, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> KafkaSinkCommit:
    """Write one sink partition of one batch in one transaction, or skip it if its marker says so."""
    from confluent_kafka import TopicPartition

    options = _decided(options)
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
    live = checkpoint_storage(options.checkpoint)
    coverage = read_coverage(live, batch_id, previous=False)
    consumer = _marker_consumer(options, group)
    # Fencing first: an older attempt of this sink partition can no longer commit once the marker is read.
    producer = new_producer(options, partition)
    try:
        marker = read_marker(_read_marker(consumer, options))
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
        wanted = marker_offset(batch_id, coverage.digest)
        try:
            producer.begin_transaction()
            # The marker goes first: it is only applied if the transaction commits.
            producer.send_offsets_to_transaction([TopicPartition(options.marker_topic, 0, wanted)],
                                                 consumer.consumer_group_metadata(), options.timeout_s)
            headers = [(HEADER, AttemptTag(query_id, batch_id, partition, attempt).encode())]
            for rb in itertools.chain((first,), batches):
                result.records += produce_batch(producer, rb, options.topic, headers)
            remaining = producer.flush(options.timeout_s)
            if remaining:
                raise CkptError(f"{remaining} records of batch {batch_id} partition {partition} (job {options.job}) "
                                f"were not delivered within {options.timeout_s:g} s: the transaction is aborted")
            # Both points: records on the broker inside the open transaction, marker sent, not committed.
            crash_point("kafka.task.after-produce", batch_id)
            # Not before the job store can replay this batch as planned (the runtime's durable plans; off: None).
            durable = await_durable(live, query_id=query_id, batch_id=batch_id, timeout_s=options.timeout_s,
                                    job=options.job)
            if durable is not None and durable >= 1.0:
                log.info("batch %d partition %d of job %s: waited %.1f s for the job store to hold the batch's plan",
                         batch_id, partition, options.job, durable)
            crash_point("kafka.task.before-commit", batch_id)
            with txn_end_slot(options, f"the commit of batch {batch_id} partition {partition}"):
                producer.commit_transaction(options.timeout_s)
        except BaseException as err:
            _abort_quietly(producer, options, err)
            raise
    finally:
        release(producer)
    waited = _await_marker(consumer, options, group, wanted, batch_id=batch_id, partition=partition, clock=clock,
                           sleep=sleep)
    # The marker the task found says why it wrote (a replay that wrote again shows which marker it missed).
    found = f"batch {marker.batch_id}" if marker is not None else "none"
    log.info("batch %d partition %d of job %s (query %s): %d records committed by %s (marker found: %s%s)", batch_id,
             partition, options.job, query_id, result.records, txid, found,
             f"; the broker applied the new marker after {waited:.1f} s" if waited >= 1.0 else "")
    crash_point("kafka.task.after-commit", batch_id)
    return result


class MarkerNotApplied(CkptError):
    """The broker committed a transaction but does not show its marker: a replay could write the batch again."""


def _await_marker(consumer: Any, options: SinkOptions, group: str, wanted: int, *, batch_id: int, partition: int,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> float:
    """Wait until the committed transaction's marker reads back; seconds waited, or MarkerNotApplied.

    Apache Kafka shows it at once (OffsetFetch with require_stable waits for the commit to complete).
    tansu 0.6 applies a transaction's offsets only when no overlapping transaction on the same topic
    partitions is still open, so the marker of the first of two concurrent tasks shows when the second
    commits (docs/sink-kafka.md). Until the marker reads back a replay cannot tell that the batch was
    written, so the task does not report success before it does.
    """
    start = clock()
    pause = 0.02
    while True:
        found = _read_marker(consumer, options)
        if found == wanted:
            return clock() - start
        waited = clock() - start
        if waited >= options.timeout_s:
            seen = read_marker(found)
            raise MarkerNotApplied(
                f"batch {batch_id} partition {partition} of job {options.job}: expected the committed transaction's "
                f"marker (group {group}) to read batch {batch_id} within "
                f"{options.timeout_s:g} s (timeoutMs), found {f'batch {seen.batch_id}' if seen else 'no marker'}. "
                "The broker committed the records but has not applied the marker, so a replay could not tell "
                "that this batch was written: the task fails rather than report success. Apache Kafka applies "
                "it with the commit; tansu 0.6 defers it while another transaction that wrote the same topic "
                f"partitions is open: look for producers holding transactions open on topic {options.topic}")
        sleep(min(pause, max(options.timeout_s - waited, 0.0)))
        pause = min(pause * 2, 0.5)


def _decided(options: SinkOptions) -> SinkOptions:
    """``options`` with serializeTxnEnds decided (the Spark writer's are; a direct caller's may still be auto)."""
    return options if options.serialize_txn_ends is not None else decided(options, check_topics(options))


def _abort_quietly(producer: Any, options: SinkOptions, err: BaseException) -> None:
    """Best effort: if this fails, the next init_transactions of the id or transaction.timeout.ms aborts it.

    A fatal error (fenced by a newer producer of the id) leaves nothing this producer may abort.
    """
    fatal = getattr(err.args[0], "fatal", None) if err.args else None
    if callable(fatal) and fatal():
        return
    try:
        with txn_end_slot(options, "an abort"):
            producer.abort_transaction(min(options.timeout_s, 10.0))
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
# Lingering transactions (driver)
# --------------------------------------------------------------------------------------------

#: The partition counts this process knows are recorded (never lowered): a commit runner that Spark reuses asks the
#: brokers only when a batch has more partitions than that (a driver cut from the brokers commits without waiting).
_RECORDED: dict[str, int] = {}


def recorded_partitions(options: SinkOptions) -> int:
    """How many sink partitions the job's batches have had (0: none recorded), from its partitions group."""
    return max(_read_marker(_marker_consumer(options, options.partitions_group()), options), 0)


def record_partitions(options: SinkOptions, partitions: int) -> None:
    """Raise the recorded number of sink partitions to ``partitions`` (never lowers it); outside any transaction."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    group = options.partitions_group()
    if partitions <= _RECORDED.get(group, 0) or partitions <= recorded_partitions(options):
        _RECORDED[group] = max(partitions, _RECORDED.get(group, 0))
        return
    admin = AdminClient(configured({"client.id": f"ckpt-kafka-sink-{options.job}", **options.client_config()},
                                   job=options.job))
    try:
        futures = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(options.marker_topic, 0, partitions)])],
            request_timeout=options.timeout_s)
        (tp,) = futures[group].result(timeout=options.timeout_s + 1.0).topic_partitions
        if tp.error is not None:
            raise KafkaException(tp.error)
    finally:
        serve(admin)
        del admin
    _RECORDED[group] = partitions
    log.info("job %s: the ckpt-kafka sink now has %d partitions (recorded in group %s: the transactional ids "
             "whose lingering transactions a restart aborts)", options.job, partitions, group)


def abort_lingering(options: SinkOptions) -> int:
    """Abort the transactions that a killed driver's tasks left open; the number of transactional ids fenced.

    init_transactions on every transactional id the sink has used (as Flink's KafkaSink does on recovery):
    the broker aborts an open transaction of the id, or completes one that is committing, before it answers.
    Run before the query starts (``kafka_sink``): until then an open transaction holds the last stable
    offset of its partitions for transaction.timeout.ms (for ever on tansu 0.6), and on tansu it also keeps
    the markers of other committed transactions on those partitions from being applied, so a replay of
    their batches would not see them.
    """
    from concurrent.futures import ThreadPoolExecutor

    options = _decided(options)
    partitions = recorded_partitions(options)
    if partitions == 0:
        return 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(partitions, 8), thread_name_prefix="ckpt-kafka-fence") as pool:
        for producer in pool.map(lambda p: new_producer(options, p), range(partitions)):
            release(producer)
    log.info("job %s: fenced the ckpt-kafka sink's %d transactional ids %s..%s before the query starts (open "
             "transactions of earlier attempts aborted) in %.2f s", options.job, partitions,
             options.transactional_id(0), options.transactional_id(partitions - 1), time.monotonic() - started)
    return partitions


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
        try:
            record_partitions(self.options, len(messages))
        except Exception as err:  # the batch is committed in Kafka: a lost count must not fail it
            log.warning("batch %d of job %s: could not record its %d sink partitions (%s); a restart aborts the "
                        "lingering transactions of the partitions recorded before", batchId, self.options.job,
                        len(messages), err)
        written = sorted(m.partition for m in done if not m.skipped and not m.empty)
        skipped = sorted(m.partition for m in done if m.skipped)
        rewritten = sorted(m.partition for m in done if m.rewritten)
        queries = sorted({m.query_id for m in done})
        log.info("batch %d of job %s (query %s) committed: partitions written %s, skipped %s, %d empty, %d records%s",
                 batchId, self.options.job, ",".join(queries) or "-", written, skipped,
                 sum(m.empty for m in done), sum(m.records for m in done),
                 f"; partitions {rewritten} written again after a restore to an older snapshot" if rewritten else "")
        replayed = bool(done) and all(m.skipped for m in done)  # every partition's marker was there already
        sink_outcome("ckpt-kafka", SinkOutcome.SKIPPED if replayed else SinkOutcome.COMMITTED, batchId,
                     sum(m.records for m in done if not m.skipped), path=self.options.outcomes)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, KafkaSinkCommit)]
        # Committed partitions stay (their markers make the replay skip them); open transactions are
        # aborted by the next attempt's init_transactions or by transaction.timeout.ms.
        log.warning("batch %d of job %s aborted: %d of %d tasks had committed (%d records); the batch is "
                    "replayed and those partitions skipped", batchId, self.options.job,
                    sum(not m.skipped and not m.empty for m in done), len(messages), sum(m.records for m in done))
        sink_outcome("ckpt-kafka", SinkOutcome.ABORTED, batchId, path=self.options.outcomes)


def kafka_sink(df: DataFrame, *, job: str, **options: str) -> DataStreamWriter:
    """``df.writeStream`` set up for the ckpt-kafka sink after its checks, run now rather than at the first batch.

    Options as for ``format("ckpt-kafka")`` (``kafka.bootstrap.servers``, ``topic``, ...). Spark 4.3
    builds a Python sink's writer only when the first batch is planned; calling this in a job's build
    function refuses bad options, columns and missing topics before the runtime takes the lease. The runtime
    then aborts the transactions an earlier driver left open before each start of the query (``abort_lingering``;
    call it yourself before ``start()`` when the query does not run under ``ckpt run``).
    """
    parsed = parse_sink_options({**options, "job": job})
    check_schema(df.schema, parsed)
    parsed = decided(parsed, cluster := check_topics(parsed))
    if parsed.serialize_txn_ends:
        log.info("job %s: the ckpt-kafka sink ends its transactions one at a time on each host (serializeTxnEnds; "
                 "broker cluster id %s): tansu loses the markers of concurrent ends over the same partitions",
                 job, cluster)
    # Not now: the lease is not taken yet, and a running driver of the job may still be writing.
    before_query_start(f"ckpt-kafka:{parsed.job}", lambda: abort_lingering(parsed))
    if parsed.commit_after_snapshot is not False:
        commit_after_snapshot(f"ckpt-kafka:{parsed.job}", parsed.commit_after_snapshot)
    return df.writeStream.format("ckpt-kafka").options(**options).option("job", job)
