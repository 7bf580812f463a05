"""Pure logic of the transactional ckpt-kafka sink: options, schema checks, markers, skips, the task
protocol over fake clients, and the test reader's attempt filtering. No broker, no Spark session."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.kafka import writer as sink
from airflow_ckpt_provider.kafka.writeroptions import (
    NO_OFFSET,
    AttemptTag,
    Marker,
    MarkerAction,
    check_schema,
    digest_bits,
    marker_decision,
    marker_offset,
    new_attempt,
    parse_sink_options,
    read_marker,
)
from tests.support.kafkasink import SinkRecord, last_attempts

BASE = {"kafka.bootstrap.servers": "b:9092", "topic": "out", "job": "orders"}


def test_options_defaults_and_ids() -> None:
    o = parse_sink_options({**BASE, "kafka.transaction.timeout.ms": "120000", "checkpointLocation": "/c"})
    assert (o.job, o.topic, o.prefix, o.marker_topic, o.timeout_s) == ("orders", "out", "ckpt", "out", 30.0)
    assert o.transactional_id(2) == "ckpt-orders-2"
    assert o.marker_group("q-1", 2) == "ckpt-orders-q-1-2"
    cfg = o.producer_config(2)
    assert cfg["transactional.id"] == "ckpt-orders-2" and cfg["enable.idempotence"] is True
    assert cfg["transaction.timeout.ms"] == "120000" and cfg["acks"] == "all"
    assert "transaction.timeout.ms" not in o.client_config()  # producer-only settings stay off the consumer
    custom = parse_sink_options({**BASE, "transactionalIdPrefix": "eo", "TOPIC": "t2", "markerTopic": "m"})
    assert (custom.transactional_id(0), custom.topic, custom.marker_topic) == ("eo-orders-0", "t2", "m")


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": "out", "job": "j"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "b", "topic": "out"}, "needs option 'job'"),
    ({**BASE, "job": "a b"}, "must match"),
    ({"kafka.bootstrap.servers": "b", "job": "j"}, "needs option 'markerTopic'"),
    ({**BASE, "kafka.transactional.id": "x"}, "cannot be set"),
    ({**BASE, "kafka.enable.idempotence": "false"}, "conflicts"),
    ({**BASE, "kafka.acks": "1"}, "conflicts"),
    ({**BASE, "subscribe": "in"}, "unknown option"),
    ({**BASE, "timeoutMs": "0"}, "positive"),
    ({**BASE, "serializeTxnEnds": "yes"}, "must be auto, true or false, found 'yes'"),
])
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sink_options(options)


@pytest.mark.parametrize(("given", "cluster_id", "serialized"), [
    ("auto", "tansu_cluster", True),  # tansu's default cluster id
    ("auto", "MkU3OEVBNTcwNTJENDM2Qk", False),  # an Apache Kafka cluster id
    ("auto", None, False),
    ("false", "tansu_cluster", False),  # the user's word wins
    ("TRUE", "MkU3OEVBNTcwNTJENDM2Qk", True),
])
def test_transaction_ends_are_serialized_on_tansu_unless_told_otherwise(given: str, cluster_id: str | None,
                                                                        serialized: bool) -> None:
    from airflow_ckpt_provider.kafka.txnlock import decided, lock_path

    options = parse_sink_options({**BASE, "serializeTxnEnds": given})
    assert decided(options, cluster_id).serialize_txn_ends is serialized
    assert lock_path("b:9092") == lock_path("b:9092") != lock_path("c:9092")  # one lock per broker cluster


def _schema(ddl: str) -> Any:
    """A StructType from 'name type, ...' (the few types used here; no Spark session needed)."""
    from pyspark.sql import types as t

    simple = {"string": t.StringType(), "binary": t.BinaryType(), "int": t.IntegerType(), "bigint": t.LongType(),
              "array<struct<key:string,value:binary>>": t.ArrayType(t.StructType(
                  [t.StructField("key", t.StringType()), t.StructField("value", t.BinaryType())]))}
    return t.StructType([t.StructField(name, simple[kind]) for name, kind in
                         (part.strip().split(" ", 1) for part in ddl.split(", "))])


def test_schema_checks() -> None:
    with_topic = parse_sink_options(BASE)
    no_topic = parse_sink_options({"kafka.bootstrap.servers": "b", "job": "j", "markerTopic": "m"})
    check_schema(_schema("key string, value binary, partition int, headers array<struct<key:string,value:binary>>"),
                 with_topic)
    check_schema(_schema("value string, topic string"), no_topic)
    for ddl, options, message in [
        ("key binary", with_topic, "needs a 'value' column"),
        ("value bigint", with_topic, "must be binary or string, found bigint"),
        ("value binary, partition bigint", with_topic, "'partition'.*must be int"),
        ("value binary", no_topic, "needs option 'topic' or a 'topic' column"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_schema(_schema(ddl), options)


DIGEST = "ab" * 32  # an offsets log digest (hex SHA-256)
OTHER = "cd" * 32


def test_marker_encodes_batch_and_offsets_digest_and_reads_version_1() -> None:
    assert read_marker(marker_offset(41, DIGEST)) == Marker(41, digest_bits(DIGEST))
    assert read_marker(marker_offset(2**32 - 1, OTHER)) == Marker(2**32 - 1, digest_bits(OTHER))
    assert 0 < marker_offset(2**32 - 1, "f" * 64) < 2**63  # a valid Kafka offset
    assert read_marker(42) == Marker(41)  # version 1: batch id + 1, no digest
    assert read_marker(NO_OFFSET) is None and read_marker(None) is None and read_marker(0) is None
    with pytest.raises(ValueError):
        marker_offset(-1, DIGEST)


def test_only_a_replay_of_the_marked_batch_is_skipped() -> None:
    assert marker_decision(None, 0, DIGEST) is MarkerAction.WRITE
    assert marker_decision(read_marker(marker_offset(4, DIGEST)), 5, DIGEST) is MarkerAction.WRITE
    assert marker_decision(read_marker(marker_offset(5, DIGEST)), 5, DIGEST) is MarkerAction.SKIP  # a replay
    assert marker_decision(Marker(5), 5, DIGEST) is MarkerAction.SKIP  # version 1: cannot tell, as before
    # Time travel: batch 5 planned again with other offsets, or a marker already at a later batch.
    assert marker_decision(read_marker(marker_offset(5, OTHER)), 5, DIGEST) is MarkerAction.REWRITE
    assert marker_decision(read_marker(marker_offset(9, DIGEST)), 5, DIGEST) is MarkerAction.REWRITE
    assert marker_decision(Marker(9), 5, DIGEST) is MarkerAction.REWRITE


# --------------------------------------------------------------------------------------------
# The task protocol over fake clients
# --------------------------------------------------------------------------------------------

class FakeConsumer:
    """The marker group: ``offset`` is what the broker shows; ``applies`` is whether a commit makes it show."""

    def __init__(self, offset: int = NO_OFFSET, *, applies: bool = True) -> None:
        self.offset = offset
        self.applies = applies
        self.reads = 0

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import TopicPartition

        self.reads += 1
        return [TopicPartition(partitions[0].topic, 0, self.offset)]

    def consumer_group_metadata(self) -> object:
        return object()


class FakeProducer:
    def __init__(self, consumer: FakeConsumer, fail_offsets: bool = False) -> None:
        self.consumer = consumer
        self.calls: list[str] = []
        self.records: list[tuple[str, Any, dict[str, Any]]] = []
        self.fail_offsets = fail_offsets
        self.full_once = True
        self.pending: int | None = None

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets: list[Any], meta: Any, timeout: float) -> None:
        self.calls.append(f"offsets:{offsets[0].offset}")
        self.pending = offsets[0].offset
        if self.fail_offsets:
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    def produce(self, topic: str, value: Any, **kwargs: Any) -> None:
        if self.full_once:
            self.full_once = False
            raise BufferError("queue full")
        self.records.append((topic, value, kwargs))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        return 0

    def purge(self, **kwargs: Any) -> None:
        self.calls.append("release")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        if self.consumer.applies and self.pending is not None:
            self.consumer.offset = self.pending

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _install(monkeypatch: pytest.MonkeyPatch, producer: FakeProducer) -> list[int]:
    """Every task gets ``producer`` and its consumer; returns the partitions producers were made for."""
    made: list[int] = []

    def fake_producer(options: Any, partition: int) -> FakeProducer:
        made.append(partition)
        return producer

    monkeypatch.setattr(sink, "new_producer", fake_producer)
    monkeypatch.setattr(sink, "check_topics", lambda options: "a-kafka-cluster")  # not tansu: no host lock
    monkeypatch.setattr(sink, "_marker_consumer", lambda options, group: producer.consumer)
    monkeypatch.setattr(sink, "checkpoint_storage", lambda location: location)
    monkeypatch.setattr(sink, "read_coverage", lambda storage, batch_id, **_: Coverage(batch_id, DIGEST, None))
    monkeypatch.setattr(sink, "await_durable", lambda live, **_: None)  # no durable-plan record: the gate is off
    return made


def _rows(n: int) -> Iterator[Any]:
    return iter([pa.RecordBatch.from_pydict({"key": [b"k"] * n, "value": [str(i) for i in range(n)]})])


def _write(producer: FakeProducer, rows: Iterator[Any], batch_id: int, partition: int = 0,
           clock: FakeClock | None = None) -> sink.KafkaSinkCommit:
    clock = clock or FakeClock()
    return sink.write_partition(parse_sink_options(BASE), rows, query_id="q", batch_id=batch_id, partition=partition,
                                clock=clock, sleep=clock.sleep)


def test_task_fences_then_writes_marker_first_then_records_commits_and_reads_its_marker_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = FakeConsumer(marker_offset(2, OTHER))
    producer = FakeProducer(consumer)
    made = _install(monkeypatch, producer)
    result = _write(producer, _rows(3), batch_id=3, partition=1)
    assert (result.records, result.skipped, result.empty, result.rewritten) == (3, False, False, False)
    assert made == [1]  # a producer of its own (init_transactions fenced older ones), never a cached one
    assert producer.calls == ["begin", f"offsets:{marker_offset(3, DIGEST)}", "flush", "commit", "release", "flush"]
    assert consumer.reads == 2  # the marker before, and the new marker read back after the commit
    topic, value, kwargs = producer.records[0]
    assert (topic, value, kwargs["key"]) == ("out", "0", b"k")
    assert kwargs["headers"] == [("ckpt", f"q/3/1/{result.attempt}".encode())]


def test_each_task_makes_its_own_producer_so_workers_never_fence_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer(FakeConsumer())
    made = _install(monkeypatch, producer)
    for batch in range(3):
        producer.full_once = False
        assert _write(producer, _rows(1), batch_id=batch, partition=2).records == 1
    assert made == [2, 2, 2]


def test_task_skips_committed_batch_and_empty_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer(FakeConsumer(marker_offset(3, DIGEST)))
    _install(monkeypatch, producer)
    assert _write(producer, _rows(3), batch_id=3).skipped
    assert producer.calls == ["release", "flush"]  # fenced, nothing begun
    assert _write(producer, iter([]), batch_id=4).empty


def test_task_rewrites_a_batch_planned_again_after_a_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer(FakeConsumer(marker_offset(7, OTHER)))
    _install(monkeypatch, producer)
    result = _write(producer, _rows(2), batch_id=3)
    assert (result.records, result.skipped, result.rewritten) == (2, False, True)
    assert producer.calls[:4] == ["begin", f"offsets:{marker_offset(3, DIGEST)}", "flush", "commit"]


def test_a_marker_the_broker_applies_late_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """tansu applies a transaction's offsets once the overlapping transactions ended: the task waits for it."""
    consumer = FakeConsumer(applies=False)
    producer = FakeProducer(consumer)
    _install(monkeypatch, producer)
    clock = FakeClock()
    reads_before_applied = 4

    def committed(partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import TopicPartition

        consumer.reads += 1
        shown = producer.pending if consumer.reads > reads_before_applied else NO_OFFSET
        return [TopicPartition(partitions[0].topic, 0, shown)]

    monkeypatch.setattr(consumer, "committed", committed)
    assert _write(producer, _rows(2), batch_id=5, clock=clock).records == 2
    assert consumer.reads == reads_before_applied + 1 and 0 < clock.now < 1


def test_a_marker_never_applied_fails_the_task_instead_of_reporting_success(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer(FakeConsumer(marker_offset(4, DIGEST), applies=False))
    _install(monkeypatch, producer)
    clock = FakeClock()
    with pytest.raises(sink.MarkerNotApplied, match=r"expected the committed transaction's marker .* to read batch 5 "
                                                    r"within 30 s .*found batch 4.*a replay could not tell"):
        _write(producer, _rows(2), batch_id=5, clock=clock)
    assert clock.now == pytest.approx(30.0)


def test_fenced_producer_is_a_real_zombie_and_is_not_asked_to_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import KafkaException

    producer = FakeProducer(FakeConsumer(), fail_offsets=True)
    _install(monkeypatch, producer)
    with pytest.raises(KafkaException):
        _write(producer, _rows(2), batch_id=0)
    # Nothing it may abort; on tansu that call only times out.
    assert "abort" not in producer.calls and "commit" not in producer.calls


def test_failure_while_producing_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer(FakeConsumer())
    _install(monkeypatch, producer)

    def broken() -> Iterator[Any]:
        yield from _rows(1)
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError):
        _write(producer, broken(), batch_id=0)
    assert "abort" in producer.calls and "commit" not in producer.calls


def _durable_plans_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, batch: int) -> tuple[Any, FakeProducer]:
    """The tasks' checkpoint with a durable-plan record at ``batch`` of query q (the runtime's gate on); its
    storage, and the producer every task gets."""
    from airflow_ckpt_provider.core.snapshots import durableplan
    from airflow_ckpt_provider.core.store.storage import LocalStorage

    live = LocalStorage(tmp_path)
    durableplan.write_durable(live, durableplan.DurablePlan("q", batch))
    producer = FakeProducer(FakeConsumer())
    _install(monkeypatch, producer)
    monkeypatch.setattr(sink, "checkpoint_storage", lambda location: live)
    return live, producer


def test_with_durable_plans_the_task_commits_only_once_the_job_store_holds_the_batchs_plan(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The transaction is written, then waits for the durable-plan record to reach the batch; never commits before."""
    from airflow_ckpt_provider.core.snapshots import durableplan

    live, producer = _durable_plans_at(monkeypatch, tmp_path, 2)
    seen: list[list[str]] = []

    def waiting(storage: Any, **kwargs: Any) -> float | None:
        seen.append(list(producer.calls))  # what the task had done when it started to wait
        durableplan.write_durable(live, durableplan.DurablePlan("q", 3))  # the driver stored batch 3's plan
        return durableplan.await_durable(storage, **kwargs)

    monkeypatch.setattr(sink, "await_durable", waiting)
    result = _write(producer, _rows(2), batch_id=3)
    assert result.records == 2
    assert seen == [["begin", f"offsets:{marker_offset(3, DIGEST)}", "flush"]]  # produced, not committed
    assert producer.calls[-3:] == ["commit", "release", "flush"]


def test_with_durable_plans_a_plan_that_never_reaches_the_store_aborts_the_transaction(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.snapshots import durableplan

    _live, producer = _durable_plans_at(monkeypatch, tmp_path, 2)
    clock = FakeClock()
    monkeypatch.setattr(sink, "await_durable",
                        lambda storage, **kw: durableplan.await_durable(storage, clock=clock, sleep=clock.sleep, **kw))
    with pytest.raises(durableplan.PlanNotDurable, match=r"expected the job store to hold its plan .* found batch 2"):
        _write(producer, _rows(2), batch_id=3)
    assert "abort" in producer.calls and "commit" not in producer.calls
    assert clock.now >= 30.0  # timeoutMs


def test_produce_batch_topic_column_partition_and_user_headers() -> None:
    producer = FakeProducer(FakeConsumer())
    rb = pa.RecordBatch.from_pydict({
        "value": [b"a", None], "topic": ["t1", "t2"], "partition": pa.array([2, None], pa.int32()),
        "headers": [[{"key": "h", "value": b"1"}], None],
    })
    assert sink.produce_batch(producer, rb, None, [("ckpt", b"tag")]) == 2
    (t1, v1, k1), (t2, v2, k2) = producer.records
    assert (t1, v1, k1["partition"], k1["headers"]) == ("t1", b"a", 2, [("h", b"1"), ("ckpt", b"tag")])
    assert (t2, v2, "partition" in k2, k2["headers"]) == ("t2", None, False, [("ckpt", b"tag")])


def test_attempt_tag_round_trip_and_order() -> None:
    tag = AttemptTag("9d875ce7-bba5-46ed", 12, 2, new_attempt(1_795_450_000_000_000_000, "ab12cd34"))
    assert AttemptTag.decode(tag.encode()) == tag
    assert new_attempt(999, "ff") < new_attempt(1000, "00") < new_attempt(2**60, "00")  # fixed width sorts


def test_last_attempt_filtering() -> None:
    def rec(offset: int, batch: int, part: int, attempt: str, partition: int = 0) -> SinkRecord:
        return SinkRecord("t", partition, offset, None, str(offset).encode(), "q", batch, part, attempt)

    records = [rec(0, 1, 0, "001-a"), rec(1, 1, 0, "001-a"), rec(2, 1, 1, "001-x"),
               rec(3, 1, 0, "002-b"),                       # retry of (1, 0): the earlier attempt was aborted
               rec(0, 1, 0, "002-b", partition=1),          # the retry also wrote to another Kafka partition
               rec(4, 2, 0, "003-c")]
    kept = last_attempts(records)
    assert [(r.partition, r.offset) for r in kept] == [(0, 2), (0, 3), (1, 0), (0, 4)]


def test_driver_commit_records_the_partitions_and_survives_a_broker_hiccup(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    recorded: list[int] = []
    monkeypatch.setattr(sink, "record_partitions", lambda options, n: recorded.append(n))
    writer = sink.CkptKafkaStreamWriter(parse_sink_options(BASE))
    messages: list[Any] = [sink.KafkaSinkCommit(p, 7, "q", f"t{p}", "a", records=2) for p in range(3)]
    writer.commit(messages, 7)
    assert recorded == [3]

    def down(options: Any, n: int) -> None:
        raise RuntimeError("broker down")

    monkeypatch.setattr(sink, "record_partitions", down)
    writer.commit(messages, 8)  # Kafka committed the batch: the count's failure does not fail it
    assert "could not record its 3 sink partitions (broker down)" in caplog.text


def test_the_commit_runner_builds_the_writer_without_asking_the_brokers_and_a_query_start_still_checks_topics(
        tmp_path: Path) -> None:
    """Spark builds the writer again for each batch's driver-side commit (its commit runner): a driver cut from the
    brokers, whose executors committed the batch, must not fail it on a topic check (docs/reliability.md, finding
    14). The query start still checks, and an unreachable broker fails it within ``timeoutMs``."""
    import importlib.util

    runner = importlib.util.find_spec(sink.COMMIT_RUNNER)  # the module name this relies on is pyspark's own
    assert runner is not None and runner.origin is not None
    assert "data_source.streamWriter(" in Path(runner.origin).read_text()
    options = {**BASE, "kafka.bootstrap.servers": "127.0.0.1:1", "timeoutMs": "1000",
               "checkpointLocation": str(tmp_path)}
    schema = _schema("value binary")
    as_runner = {"__name__": sink.COMMIT_RUNNER, "stream_writer": sink.stream_writer}
    writer = eval("stream_writer(options, schema, False)", as_runner, {"options": options, "schema": schema})
    assert isinstance(writer, sink.CkptKafkaStreamWriter) and writer.options.job == "orders"
    with pytest.raises(ConfigError, match=re.escape("could not list the topics of 127.0.0.1:1 within 1 s")):
        sink.stream_writer(options, schema, False)


def test_the_topics_are_checked_once_per_worker_and_a_failed_check_is_not_remembered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark plans every batch's write by calling the sink again: one metadata request per worker, not per batch."""
    from airflow_ckpt_provider.kafka.txnlock import TANSU_CLUSTER_ID

    asked: list[str] = []

    def check(options: Any) -> str:
        asked.append(options.bootstrap_servers)
        if len(asked) == 1:
            raise ConfigError("could not list the topics")
        return TANSU_CLUSTER_ID + "-1"

    monkeypatch.setattr(sink, "check_topics", check)
    monkeypatch.setattr(sink, "_CHECKED", {})
    options = {**BASE, "kafka.bootstrap.servers": "broker-a:9092", "checkpointLocation": str(tmp_path)}
    with pytest.raises(ConfigError):
        sink.stream_writer(options, _schema("value binary"), False)
    writers = [sink.stream_writer(options, _schema("value binary"), False) for _ in range(3)]
    assert asked == ["broker-a:9092", "broker-a:9092"]  # the failure, then one check for three batches
    assert all(w.options.serialize_txn_ends for w in writers)  # decided from the remembered cluster id
