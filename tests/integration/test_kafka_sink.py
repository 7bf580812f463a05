"""The transactional ckpt-kafka sink on real Spark (local[2]) and tansu.

tansu shows aborted records to read_committed consumers: outputs are read with
tests/kafkasink.read_sink_output (last attempt per (query, batch, sink partition)), and raw counts
with read_all show what was written, aborted attempts included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka
from airflow_ckpt_provider.kafka.writeroptions import read_marker
from tests.support.kafkasink import read_all, read_sink_output
from tests.support.runtimejob import produce

pytestmark = pytest.mark.integration


def _new_topic(kafka: EmbeddedKafka) -> str:
    name = f"out-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions=3)
    return name


def _query(spark: Any, kafka: EmbeddedKafka, source: str, sink: str, ckpt: Path, job: str, **options: str) -> Any:
    df = (spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("subscribe", source).option("startingOffsets", "earliest").load()
          .selectExpr("key", "value", "array(named_struct('key', 'src', 'value', CAST(topic AS BINARY))) AS headers"))
    writer = (df.writeStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("topic", sink).option("job", job).option("checkpointLocation", str(ckpt))
              .trigger(availableNow=True))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def _run(spark: Any, kafka: EmbeddedKafka, source: str, sink: str, ckpt: Path, job: str) -> None:
    query = _query(spark, kafka, source, sink, ckpt, job)
    assert query.awaitTermination(180), "query did not finish in 180 s"
    assert query.exception() is None, query.exception()


def _markers(kafka: EmbeddedKafka, sink: str, job: str, query_id: str, partitions: int = 3) -> dict[int, int]:
    """Committed marker offset per sink partition (absent: no marker)."""
    from confluent_kafka import Consumer, TopicPartition

    found = {}
    for p in range(partitions):
        c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"ckpt-{job}-{query_id}-{p}"})
        try:
            (tp,) = c.committed([TopicPartition(sink, 0)], timeout=10)
            if tp.offset >= 0:
                found[p] = tp.offset
        finally:
            c.close()
    return found


@pytest.mark.full(proven_by="integration/test_exactly_once.py (the sink's replays after kills at each of its commit "
                            "steps skip what was committed: every id once, each transaction committed once)")
def test_records_exactly_once_after_batches_and_replay_skipped(kafka_spark: Any, kafka_server: EmbeddedKafka,
                                                               topic: str, tmp_path: Path) -> None:
    sink, job, ckpt = _new_topic(kafka_server), f"j{uuid.uuid4().hex[:6]}", tmp_path / "ckpt"
    produce(kafka_server.bootstrap_servers, topic, 0, 30)
    _run(kafka_spark, kafka_server, topic, sink, ckpt, job)  # batch 0 (empty: resolves offsets), batch 1
    produce(kafka_server.bootstrap_servers, topic, 30, 30)
    _run(kafka_spark, kafka_server, topic, sink, ckpt, job)  # batch 2

    out = read_sink_output(kafka_server.bootstrap_servers, sink)
    assert sorted(int(r.value or b"") for r in out) == list(range(60))
    assert {r.batch_id for r in out} == {1, 2}
    assert all(r.headers == (("src", topic.encode()),) for r in out)  # user headers kept
    (query_id,) = {r.query_id for r in out}
    markers = _markers(kafka_server, sink, job, str(query_id))
    assert {p: read_marker(m).batch_id for p, m in markers.items()} == {0: 2, 1: 2, 2: 2}
    raw = len(read_all(kafka_server.bootstrap_servers, sink))
    assert raw == 60

    # Replay of committed batch 2: its commits/ entry is gone, offsets/2 stays; every partition skips.
    (ckpt / "commits" / "2").unlink()
    (ckpt / "commits" / ".2.crc").unlink(missing_ok=True)  # Hadoop's checksum file would block the rewrite
    _run(kafka_spark, kafka_server, topic, sink, ckpt, job)
    assert (ckpt / "commits" / "2").exists()
    assert len(read_all(kafka_server.bootstrap_servers, sink)) == raw  # no new records at all
    out = read_sink_output(kafka_server.bootstrap_servers, sink)
    assert sorted(int(r.value or b"") for r in out) == list(range(60))


def test_bad_input_fails_before_writing(kafka_spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                         tmp_path: Path) -> None:
    """Spark 4.3 creates a Python writer when the first batch is planned, not in start(): the query fails there."""
    produce(kafka_server.bootstrap_servers, topic, 0, 6)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    query = _query(kafka_spark, kafka_server, topic, missing, tmp_path / "ckpt", "jmissing")
    with pytest.raises(Exception, match=f"topic '{missing}'.*does not exist.*create it first"):
        query.awaitTermination(120)
    assert missing not in kafka_server_topics(kafka_server)
    assert not (tmp_path / "ckpt" / "commits").exists() or not any((tmp_path / "ckpt" / "commits").iterdir())

    sink = _new_topic(kafka_server)
    df = (kafka_spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka_server.bootstrap_servers)
          .option("subscribe", topic).option("startingOffsets", "earliest").load().selectExpr("key", "offset AS value"))
    query = (df.writeStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka_server.bootstrap_servers)
             .option("topic", sink).option("job", "jbad").option("checkpointLocation", str(tmp_path / "c2"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="column 'value' of the ckpt-kafka sink must be binary or string, found bigint"):
        query.awaitTermination(120)
    assert read_all(kafka_server.bootstrap_servers, sink) == []


def kafka_server_topics(kafka: EmbeddedKafka) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10).topics)


# --------------------------------------------------------------------------------------------
# The transaction protocol of one task, without Spark
# --------------------------------------------------------------------------------------------

def _batches(start: int, count: int) -> Any:
    import pyarrow as pa

    values = [str(i).encode() for i in range(start, start + count)]
    return iter([pa.RecordBatch.from_pydict({"key": [b"k"] * count, "value": values},
                                            schema=pa.schema([("key", pa.binary()), ("value", pa.binary())]))])


def _offsets_log(checkpoint: Path, batches: int) -> str:
    """A checkpoint whose offsets log has entries 0..batches-1, as Spark writes them before each batch."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    for b in range(batches):
        (checkpoint / "offsets" / str(b)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{1_790_000_000_000 + b}}}\n{{"t":{{"0":{b * 5}}}}}')
    return str(checkpoint)


def _options(kafka: EmbeddedKafka, sink: str, job: str, checkpoint: str, timeout_ms: int = 10_000) -> Any:
    from airflow_ckpt_provider.kafka.writeroptions import parse_sink_options

    return parse_sink_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": sink, "job": job,
                               "timeoutMs": str(timeout_ms), "checkpointLocation": checkpoint})


def test_zombie_producer_is_fenced(kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    from confluent_kafka import KafkaException, Producer

    from airflow_ckpt_provider.kafka.writer import write_partition

    sink, job = _new_topic(kafka_server), f"z{uuid.uuid4().hex[:6]}"
    options = _options(kafka_server, sink, job, _offsets_log(tmp_path / "ckpt", 8))
    zombie = Producer(options.producer_config(0))
    zombie.init_transactions(10)
    zombie.begin_transaction()
    zombie.produce(sink, b"zombie", partition=0)
    assert zombie.flush(10) == 0
    result = write_partition(options, _batches(0, 5), query_id="q1", batch_id=4, partition=0)
    assert (result.records, result.skipped) == (5, False)
    with pytest.raises(KafkaException):
        zombie.commit_transaction(5)  # fenced (tansu: the coordinator drops the connection; times out)
    out = read_sink_output(kafka_server.bootstrap_servers, sink)
    assert sorted(r.value for r in out if r.batch_id == 4) == [str(i).encode() for i in range(5)]
    # Replaying the committed (batch 4, partition 0) skips.
    assert write_partition(options, _batches(0, 5), query_id="q1", batch_id=4, partition=0).skipped
    # Another query id (fresh checkpoint: batch ids restart) has its own markers.
    assert write_partition(options, _batches(0, 5), query_id="q2", batch_id=0, partition=0).records == 5


def test_tasks_of_one_sink_partition_in_two_workers_never_fence_each_other_and_markers_advance_every_batch(
        kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    """Spark moves a sink partition's tasks between Python workers. A producer cached per worker was fenced by
    the other worker's task in normal running (~10 s lost per fence on tansu, markers stuck, a replay written
    twice: issue 39). Each task now makes its own producer: two workers (processes) alternate on partition 0
    of one batch after another, every batch commits once, and the marker reads each batch as it commits."""
    sink, job = _new_topic(kafka_server), f"w{uuid.uuid4().hex[:6]}"
    checkpoint = _offsets_log(tmp_path / "ckpt", 8)
    worker = textwrap.dedent("""
        import sys
        import pyarrow as pa
        from airflow_ckpt_provider.kafka.writer import write_partition
        from airflow_ckpt_provider.kafka.writeroptions import parse_sink_options
        bootstrap, sink, job, checkpoint = sys.argv[1:5]
        options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": sink, "job": job,
                                      "checkpointLocation": checkpoint, "timeoutMs": "10000"})
        for line in sys.stdin:  # one batch id per line, as Spark hands this worker a task of partition 0
            batch = int(line)
            rb = pa.RecordBatch.from_pydict({"value": [f"{batch}-{i}".encode() for i in range(4)]})
            r = write_partition(options, iter([rb]), query_id="q", batch_id=batch, partition=0)
            print(r.records, r.skipped, flush=True)
    """)
    workers = [subprocess.Popen([sys.executable, "-c", worker, kafka_server.bootstrap_servers, sink, job, checkpoint],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    markers = []
    try:
        for batch in range(8):
            w = workers[batch % 2]
            assert w.stdin is not None and w.stdout is not None
            w.stdin.write(f"{batch}\n")
            w.stdin.flush()
            assert w.stdout.readline().split() == ["4", "False"], w.stderr.read() if w.poll() is not None else ""
            markers.append(read_marker(_markers(kafka_server, sink, job, "q", partitions=1)[0]).batch_id)
    finally:
        for w in workers:
            w.kill()
            _, err = w.communicate(timeout=30)
    assert markers == list(range(8))  # the marker advanced with every batch
    assert "recreating" not in err and "FENCED" not in err, err[-2000:]
    out = read_sink_output(kafka_server.bootstrap_servers, sink)
    assert sorted(r.value or b"" for r in out) == sorted(f"{b}-{i}".encode() for b in range(8) for i in range(4))
    assert len(read_all(kafka_server.bootstrap_servers, sink)) == 32  # no aborted attempt either


_KILLED_TASK = textwrap.dedent("""
    import sys
    import pyarrow as pa
    from airflow_ckpt_provider.kafka.writer import write_partition
    from airflow_ckpt_provider.kafka.writeroptions import parse_sink_options
    bootstrap, sink, job, checkpoint = sys.argv[1:5]
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": sink, "job": job,
                                  "checkpointLocation": checkpoint})
    rb = pa.RecordBatch.from_pydict({"value": [str(i).encode() for i in range(20)]})
    write_partition(options, iter([rb]), query_id="q1", batch_id=7, partition=1)
    print("not killed")
""")


def test_task_killed_mid_transaction_then_retried_writes_once(kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.policy.faults import ENV
    from airflow_ckpt_provider.kafka.writer import write_partition

    sink, job = _new_topic(kafka_server), f"k{uuid.uuid4().hex[:6]}"
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "kafka.task.after-produce@7").touch()
    env = {**os.environ, ENV: str(faults)}
    checkpoint = _offsets_log(tmp_path / "ckpt", 8)
    done = subprocess.run([sys.executable, "-c", _KILLED_TASK, kafka_server.bootstrap_servers, sink, job, checkpoint],
                          env=env, start_new_session=True, timeout=60, capture_output=True, check=False)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    assert not (faults / "kafka.task.after-produce@7").exists()

    retry = write_partition(_options(kafka_server, sink, job, checkpoint), _batches(0, 20), query_id="q1", batch_id=7,
                            partition=1)
    assert (retry.records, retry.skipped) == (20, False)
    raw = read_all(kafka_server.bootstrap_servers, sink)
    assert len({r.attempt for r in raw}) == 2  # tansu keeps the killed attempt's aborted records visible
    out = read_sink_output(kafka_server.bootstrap_servers, sink)
    assert sorted(r.value or b"" for r in out) == sorted(str(i).encode() for i in range(20))
    assert {r.attempt for r in out} == {retry.attempt}
    shutil.rmtree(faults)


@pytest.fixture(autouse=True)
def _close_cached_clients() -> Any:
    """Close the sink's cached producers of in-process tasks while the broker still runs."""
    from airflow_ckpt_provider.kafka.writer import _close_all

    yield
    _close_all()


def test_kafka_sink_refuses_bad_input_before_the_query_starts(kafka_spark: Any, kafka_server: EmbeddedKafka,
                                                             topic: str) -> None:
    """kafka_sink() runs the option, column and topic checks in the job's build function: no query starts."""
    from airflow_ckpt_provider.core.errors import ConfigError
    from airflow_ckpt_provider.kafka.writer import kafka_sink

    df = (kafka_spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka_server.bootstrap_servers)
          .option("subscribe", topic).load())
    servers = {"kafka.bootstrap.servers": kafka_server.bootstrap_servers}
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError, match=f"topic '{missing}'.*does not exist.*create it first"):
        kafka_sink(df.selectExpr("key", "value"), job="j", topic=missing, **servers)
    with pytest.raises(ConfigError, match="column 'value' of the ckpt-kafka sink must be binary or string"):
        kafka_sink(df.selectExpr("key", "offset AS value"), job="j", topic=topic, **servers)
    with pytest.raises(ConfigError, match="needs option 'job'"):
        kafka_sink(df.selectExpr("key", "value"), job=" ", topic=topic, **servers)
    assert missing not in kafka_server_topics(kafka_server)
    assert kafka_spark.streams.active == []
    writer = kafka_sink(df.selectExpr("key", "value"), job="j", topic=topic, **servers)
    assert type(writer).__name__ == "DataStreamWriter"


def test_a_task_whose_marker_tansu_defers_waits_for_the_overlapping_transaction_then_a_replay_skips(
        kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    """A tansu 0.6 deviation (docs/embedded.md): it applies a transaction's offsets only once every OTHER
    transaction that wrote the same topic partition before it has ended (tansu-storage, dynostore txn_end:
    "overlapping transactions"), and its OffsetFetch ignores require_stable. Sink partitions of one batch
    write the same Kafka partitions concurrently, so a task's marker may show only when the other task
    commits. The task does not report success before its marker reads back: a replay then always finds it.
    Apache Kafka applies the offsets with the commit (the task reads its marker back at once)."""
    import threading

    from confluent_kafka import Producer

    from airflow_ckpt_provider.kafka.writer import write_partition

    sink, job = _new_topic(kafka_server), f"o{uuid.uuid4().hex[:6]}"
    options = _options(kafka_server, sink, job, _offsets_log(tmp_path / "ckpt", 5))
    other = Producer(options.producer_config(1))  # the task of sink partition 1, still producing
    other.init_transactions(10)
    other.begin_transaction()
    for partition in range(3):  # wherever the task's records land
        other.produce(sink, b"open", partition=partition)
    assert other.flush(10) == 0

    results: list[Any] = []
    task = threading.Thread(target=lambda: results.append(
        write_partition(options, _batches(0, 5), query_id="q", batch_id=4, partition=0)), daemon=True)
    task.start()
    task.join(3)
    assert task.is_alive() and not results, "the task returned while its marker was not applied"
    assert _markers(kafka_server, sink, job, "q", partitions=1) == {}, "tansu applied the marker at once: the " \
        "deviation is gone; drop the one-Kafka-partition-per-sink-partition layout of the exactly-once proof"
    other.commit_transaction(10)  # the overlapping transaction ends: tansu applies both
    task.join(30)
    assert [(r.records, r.skipped) for r in results] == [(5, False)]
    assert {p: read_marker(m).batch_id for p, m in _markers(kafka_server, sink, job, "q", partitions=1).items()} \
        == {0: 4}
    assert write_partition(options, _batches(0, 5), query_id="q", batch_id=4, partition=0).skipped


def test_a_killed_drivers_open_transaction_is_aborted_before_the_restart_and_the_replay_skips(
        kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    """A driver killed while sink partition 1's task had its transaction open and partition 0's task waited for
    its deferred marker (tansu). Without lingering aborts, the open transaction holds the last stable offset
    for ever (tansu has no transaction timeout) and partition 0's marker stays invisible, so the replay of
    partition 0 wrote the batch again (issue 39). abort_lingering (run by the runtime before each start of a
    query built with kafka_sink) fences every transactional id the sink used: partition 1's transaction is
    aborted, partition 0's commit applied, the replay skips and read_committed reaches the end of the topic."""
    import threading

    from confluent_kafka import Producer

    from airflow_ckpt_provider.kafka.writer import (
        MarkerNotApplied,
        abort_lingering,
        record_partitions,
        recorded_partitions,
        write_partition,
    )

    sink, job = _new_topic(kafka_server), f"l{uuid.uuid4().hex[:6]}"
    options = _options(kafka_server, sink, job, _offsets_log(tmp_path / "ckpt", 5), timeout_ms=3000)
    record_partitions(options, 2)  # the driver's commit of an earlier batch recorded two sink partitions
    record_partitions(options, 1)  # never lowered
    assert recorded_partitions(options) == 2
    zombie = Producer(options.producer_config(1))  # the killed driver's task of partition 1: open for good
    zombie.init_transactions(10)
    zombie.begin_transaction()
    for partition in range(3):
        zombie.produce(sink, b"zombie", partition=partition)
    assert zombie.flush(10) == 0

    failed: list[BaseException] = []

    def task() -> None:
        try:
            write_partition(options, _batches(0, 5), query_id="q", batch_id=4, partition=0)
        except BaseException as err:
            failed.append(err)

    t = threading.Thread(target=task, daemon=True)
    t.start()
    t.join(60)
    assert [type(e) for e in failed] == [MarkerNotApplied]  # no success reported for an unreadable marker
    assert _markers(kafka_server, sink, job, "q", partitions=1) == {}

    assert abort_lingering(options) == 2
    assert {p: read_marker(m).batch_id for p, m in _markers(kafka_server, sink, job, "q", partitions=1).items()} \
        == {0: 4}
    assert write_partition(options, _batches(0, 5), query_id="q", batch_id=4, partition=0).skipped
    # The zombie's aborted records (no ckpt header here) stay visible on tansu; the sink's records are there once.
    out = [r for r in read_sink_output(kafka_server.bootstrap_servers, sink) if r.attempt]
    assert sorted(r.value or b"" for r in out) == sorted(str(i).encode() for i in range(5))
    # The last stable offset moved: a read_committed consumer reaches every record (tansu shows the aborted ones).
    assert len(read_all(kafka_server.bootstrap_servers, sink, isolation="read_committed")) == \
        len(read_all(kafka_server.bootstrap_servers, sink)) == 8
    del zombie



def _end_together(kafka: EmbeddedKafka, rounds: int, **extra: str) -> tuple[bool | None, int | None]:
    """Rounds of four transactions (sink partitions 0-3 of one batch, as four Python workers), each writing a record
    to every Kafka partition of a new topic and its marker, released together to commit through the sink's
    txn_end_slot; serializeTxnEnds as decided, and the first round whose markers did not all read back (None)."""
    import threading

    from confluent_kafka import TopicPartition

    from airflow_ckpt_provider.kafka.txnlock import txn_end_slot
    from airflow_ckpt_provider.kafka.writer import _decided, _marker_consumer, _read_marker, new_producer, release
    from airflow_ckpt_provider.kafka.writeroptions import marker_offset, parse_sink_options

    sink, job = _new_topic(kafka), f"e{uuid.uuid4().hex[:6]}"
    options = _decided(parse_sink_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": sink,
                                           "job": job, "timeoutMs": "10000", **extra}))
    consumers = [_marker_consumer(options, options.marker_group("q", p)) for p in range(4)]
    for batch in range(rounds):
        release_all = threading.Barrier(4)

        def task(p: int, batch: int = batch, release_all: threading.Barrier = release_all) -> None:
            producer = new_producer(options, p)
            try:
                producer.begin_transaction()
                producer.send_offsets_to_transaction([TopicPartition(sink, 0, marker_offset(batch, "00000000"))],
                                                     consumers[p].consumer_group_metadata(), 10)
                for kafka_partition in range(3):
                    producer.produce(sink, f"{batch}-{p}".encode(), partition=kafka_partition)
                assert producer.flush(10) == 0
                release_all.wait(30)
                with txn_end_slot(options, f"the commit of batch {batch} partition {p}"):
                    producer.commit_transaction(10)
            finally:
                release(producer)

        threads = [threading.Thread(target=task, args=(p,), daemon=True) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        wanted, deadline = marker_offset(batch, "00000000"), time.monotonic() + 5  # all four ended: nothing defers them
        while any(_read_marker(c, options) != wanted for c in consumers):
            if time.monotonic() > deadline:
                return options.serialize_txn_ends, batch
            time.sleep(0.05)
    return options.serialize_txn_ends, None


def test_transactions_ending_together_on_tansu_lose_markers_unless_the_sink_ends_them_one_at_a_time(
        kafka_server: EmbeddedKafka) -> None:
    """tansu 0.6 can lose a marker for good when transactions over the same partitions end at the same moment:
    one is marked ended while its commit still writes, and it then holds back every later marker on those
    partitions (tansu-storage dynostore txn_end). A replay cannot see its batch and writes it again: the CI run
    of the exactly-once proof met it (one sink partition's marker stuck at batch 11 through three restarts).
    The sink ends transactions one at a time per host where the broker is tansu (serializeTxnEnds=auto):
    40 rounds of four commits released together all read back. Turned off, the same rounds lose a marker
    (measured: within 1 to 8 rounds in 8 of 8 runs)."""
    assert _end_together(kafka_server, 40) == (True, None)
    serialized, lost_at = _end_together(kafka_server, 80, serializeTxnEnds="false")
    assert serialized is False
    assert lost_at is not None, "80 rounds of concurrent ends on tansu lost no marker: tansu may have fixed " \
        "txn_end; measure again and consider serializeTxnEnds=auto off for it (docs/sink-kafka.md)"
