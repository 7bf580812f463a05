"""Pure logic of the transactional ckpt-kafka sink: options, schema checks, markers, skips, the task
protocol over fake clients, and the test reader's attempt filtering. No broker, no Spark session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from airflow_ckpt_provider.core.coverage import Coverage
from airflow_ckpt_provider.core.errors import ConfigError
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
])
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sink_options(options)


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

class FakeProducer:
    def __init__(self, fail_offsets: bool = False) -> None:
        self.calls: list[str] = []
        self.records: list[tuple[str, Any, dict[str, Any]]] = []
        self.fail_offsets = fail_offsets
        self.full_once = True

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets: list[Any], meta: Any, timeout: float) -> None:
        self.calls.append(f"offsets:{offsets[0].offset}")
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

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def close(self) -> None:
        self.calls.append("close")


class FakeConsumer:
    def __init__(self, offset: int = NO_OFFSET) -> None:
        self.offset = offset

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(partitions[0].topic, 0, self.offset)]

    def consumer_group_metadata(self) -> object:
        return object()

    def close(self) -> None:
        pass


def _install(monkeypatch: pytest.MonkeyPatch, *clients: sink._Clients) -> list[sink._Clients]:
    queue = list(clients)
    handed: list[sink._Clients] = []

    def fake(options: Any, partition: int, group: str) -> sink._Clients:
        handed.append(queue.pop(0))
        return handed[-1]

    monkeypatch.setattr(sink, "_clients", fake)
    monkeypatch.setattr(sink, "_drop", lambda txid: None)
    monkeypatch.setattr(sink, "checkpoint_storage", lambda location: location)
    monkeypatch.setattr(sink, "read_coverage", lambda storage, batch_id, **_: Coverage(batch_id, DIGEST, None))
    return handed


def _rows(n: int) -> Iterator[Any]:
    return iter([pa.RecordBatch.from_pydict({"key": [b"k"] * n, "value": [str(i) for i in range(n)]})])


def test_task_writes_marker_first_then_records_then_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer()
    _install(monkeypatch, sink._Clients(producer, FakeConsumer(marker_offset(2, OTHER)), "g"))
    result = sink.write_partition(parse_sink_options(BASE), _rows(3), query_id="q", batch_id=3, partition=1)
    assert (result.records, result.skipped, result.empty, result.rewritten) == (3, False, False, False)
    assert producer.calls == ["begin", f"offsets:{marker_offset(3, DIGEST)}", "flush", "commit"]
    topic, value, kwargs = producer.records[0]
    assert (topic, value, kwargs["key"]) == ("out", "0", b"k")
    assert kwargs["headers"] == [("ckpt", f"q/3/1/{result.attempt}".encode())]


def test_task_skips_committed_batch_and_empty_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer()
    _install(monkeypatch, sink._Clients(producer, FakeConsumer(marker_offset(3, DIGEST)), "g"))
    options = parse_sink_options(BASE)
    assert sink.write_partition(options, _rows(3), query_id="q", batch_id=3, partition=0).skipped
    assert producer.calls == []  # no transaction at all
    assert sink.write_partition(options, iter([]), query_id="q", batch_id=4, partition=0).empty


def test_task_rewrites_a_batch_planned_again_after_a_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer()
    _install(monkeypatch, sink._Clients(producer, FakeConsumer(marker_offset(7, OTHER)), "g"))
    result = sink.write_partition(parse_sink_options(BASE), _rows(2), query_id="q", batch_id=3, partition=0)
    assert (result.records, result.skipped, result.rewritten) == (2, False, True)
    assert producer.calls == ["begin", f"offsets:{marker_offset(3, DIGEST)}", "flush", "commit"]


def test_fenced_cached_producer_is_recreated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stale, new = FakeProducer(fail_offsets=True), FakeProducer()
    _install(monkeypatch, sink._Clients(stale, FakeConsumer(), "g", fresh=False),
             sink._Clients(new, FakeConsumer(), "g"))
    result = sink.write_partition(parse_sink_options(BASE), _rows(2), query_id="q", batch_id=0, partition=0)
    # A fenced producer is not asked to abort (nothing it may abort; on tansu that call only times out).
    assert result.records == 2 and "abort" not in stale.calls and new.calls[-1] == "commit"


def test_fenced_fresh_producer_is_a_real_zombie(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import KafkaException

    _install(monkeypatch, sink._Clients(FakeProducer(fail_offsets=True), FakeConsumer(), "g"))
    with pytest.raises(KafkaException):
        sink.write_partition(parse_sink_options(BASE), _rows(2), query_id="q", batch_id=0, partition=0)


def test_failure_while_producing_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = FakeProducer()
    _install(monkeypatch, sink._Clients(producer, FakeConsumer(), "g"))

    def broken() -> Iterator[Any]:
        yield from _rows(1)
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError):
        sink.write_partition(parse_sink_options(BASE), broken(), query_id="q", batch_id=0, partition=0)
    assert producer.calls[-1] == "abort" and "commit" not in producer.calls


def test_produce_batch_topic_column_partition_and_user_headers() -> None:
    producer = FakeProducer()
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
