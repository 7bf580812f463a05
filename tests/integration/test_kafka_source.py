"""The ckpt-kafka source against a real tansu broker and a real Spark (local[2]).

Test data is produced with ``batch.num.messages=1``: tansu's ListOffsets(LATEST) returns the base
offset of the last record batch + 1 (ENVIRONMENT.md), which is the true end only for one-record
batches. Batch 0 of every new query is empty: it records the resolved startingOffsets.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka
from tests.support import sparkjobs

pytestmark = pytest.mark.integration

#: (topic, partition, offset, key, value)
Record = tuple[str, int, int, bytes | None, bytes | None]
COLUMNS = ("topic", "partition", "offset", "key", "value")
JOB = Path(__file__).resolve().parents[1] / "support" / "kafkajob.py"


@pytest.fixture(scope="module")
def spark(kafka_spark: Any) -> Any:
    return kafka_spark


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    first: int = 0,
    partitions: int = 3,
    headers: bool = False,
) -> list[Record]:
    """Produce records ``first..first+count-1`` round-robin over partitions; return them with their offsets."""
    from confluent_kafka import Producer

    delivered: list[Record] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "batch.num.messages": 1}
    )
    for i in range(first, first + count):
        producer.produce(
            topic,
            key=f"k{i % 7}".encode(),
            value=f"v{i}".encode(),
            partition=i % partitions,
            headers=[("n", str(i).encode()), ("empty", None)] if headers and i % 2 else None,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors
    return sorted(delivered)


def stream(spark: Any, bootstrap: str, **options: Any) -> Any:
    reader = spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class Collect:
    """A foreachBatch sink keeping each batch's records in memory, by batch id (a replay replaces its entry)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Record]] = {}
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.select(*COLUMNS).collect())
        with self.lock:
            self.batches[batch_id] = rows

    def records(self) -> list[Record]:
        with self.lock:
            return sorted(r for rows in self.batches.values() for r in rows)


def run_available_now(df: Any, checkpoint: Path, sink: Callable[[Any, int], None], timeout: float = 120) -> Any:
    """Run until everything present at start is processed; raise the query's error if it failed."""
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).trigger(
        availableNow=True
    ).start()
    try:
        assert query.awaitTermination(timeout), f"query did not finish within {timeout} s"
    finally:
        if query.isActive:
            query.stop()
    return query


def batch_sizes(query: Any) -> dict[int, int]:
    return {p["batchId"]: p["numInputRows"] for p in query.recentProgress}


def wait_for(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"expected {what} within {timeout} s")
        time.sleep(poll)


def log_offsets(checkpoint: Path, batch: int) -> dict[str, dict[str, int]]:
    """The source's offsets in ``offsets/<batch>`` (the last line: one source)."""
    # ignore[no-any-return] below: json.loads is Any; the log line is the source's offsets
    return json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])  # type: ignore[no-any-return]


def forget_commit(checkpoint: Path, batch: int) -> None:
    """What a crash between offsets/N and commits/N leaves: batch N is replayed on restart."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def new_topic(kafka: EmbeddedKafka, partitions: int = 3, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions=partitions)
    return name


def idents(records: list[Record]) -> list[tuple[str, int, int]]:
    return [(t, p, o) for t, p, o, _k, _v in records]


# --------------------------------------------------------------------------------------------
# Reading, counting, replay
# --------------------------------------------------------------------------------------------


def test_reads_every_record_with_the_kafka_schema(spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                                  tmp_path: Path) -> None:
    before = time.time()
    produced = produce(kafka_server.bootstrap_servers, topic, 60, headers=True)
    rows: list[Any] = []
    df = stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingOffsets="earliest",
                includeHeaders="true")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    query = run_available_now(df, tmp_path / "ckpt", lambda b, _i: rows.extend(b.collect()))

    assert sorted((r.topic, r.partition, r.offset, r.key, r.value) for r in rows) == produced
    for r in rows:
        n = int(r.value.decode()[1:])
        assert r.headers == ([("n", str(n).encode()), ("empty", None)] if n % 2 else None)
        assert r.timestampType == 0  # CreateTime
        assert before - 1 <= r.timestamp.timestamp() <= time.time() + 1
    # Batch 0 only pins the starting offsets; batch 1 ends exactly at the end of each partition.
    assert batch_sizes(query) == {0: 0, 1: 60}
    assert log_offsets(tmp_path / "ckpt", 0) == {topic: {"0": 0, "1": 0, "2": 0}}
    assert log_offsets(tmp_path / "ckpt", 1) == {topic: {"0": 20, "1": 20, "2": 20}}


def test_stateful_count_is_exact_and_batches_respect_max_offsets(spark: Any, kafka_server: EmbeddedKafka,
                                                                 topic: str, tmp_path: Path) -> None:
    produced = produce(kafka_server.bootstrap_servers, topic, 900)
    counts = (
        stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingOffsets="earliest",
               maxOffsetsPerTrigger=250)
        .selectExpr("CAST(key AS STRING) AS key").groupBy("key").count()
    )
    final: dict[str, int] = {}
    query = counts.writeStream.outputMode("update").foreachBatch(
        lambda b, _i: final.update({r.key: r["count"] for r in b.collect()})
    ).option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    assert query.awaitTermination(120)

    assert final == dict(Counter(k.decode() for _t, _p, _o, k, _v in produced if k is not None))
    assert batch_sizes(query) == {0: 0, 1: 250, 2: 250, 3: 250, 4: 150}


def test_replayed_batch_reads_exactly_the_same_records(spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                                       tmp_path: Path) -> None:
    bootstrap, ckpt = kafka_server.bootstrap_servers, tmp_path / "ckpt"
    produced = produce(bootstrap, topic, 300)
    options = {"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 100}
    first = Collect()
    run_available_now(stream(spark, bootstrap, **options), ckpt, first)
    assert sorted(first.batches) == [0, 1, 2, 3]
    offsets3 = (ckpt / "offsets" / "3").read_bytes()

    forget_commit(ckpt, 3)  # as if the driver died after batch 3 wrote its output, before its commit
    produced += produce(bootstrap, topic, 300, first=300)  # more data than batch 3 held is now there
    second = Collect()
    run_available_now(stream(spark, bootstrap, **options), ckpt, second)

    assert second.batches[3] == first.batches[3] and len(first.batches[3]) == 100
    assert (ckpt / "offsets" / "3").read_bytes() == offsets3
    assert sorted(second.batches) == [3, 4, 5, 6]
    everything = [r for b in (1, 2, 3) for r in first.batches[b]] + [r for b in (4, 5, 6) for r in second.batches[b]]
    assert sorted(everything) == sorted(produced)  # nothing lost, nothing twice


@pytest.mark.full(proven_by="integration/test_exactly_once.py (kill -9s of drivers reading ckpt-kafka at every "
                            "commit step and at random moments, every id exactly once)")
def test_kill_9_mid_stream_then_restart_counts_exactly(kafka_server: EmbeddedKafka, topic: str,
                                                       tmp_path: Path) -> None:
    """The driver (Python and JVM) is SIGKILLed at an arbitrary moment while data keeps arriving."""
    bootstrap, ckpt, out = kafka_server.bootstrap_servers, tmp_path / "ckpt", tmp_path / "out"
    produced = produce(bootstrap, topic, 2400)
    stop_feeding = threading.Event()

    def feed() -> None:  # more data while the first run is processing
        for chunk in range(12):
            if stop_feeding.wait(0.3):
                break
            produced.extend(produce(bootstrap, topic, 100, first=2400 + chunk * 100))

    job = start_job(bootstrap, topic, ckpt, out, tmp_path / "run1.log", "processing", max_offsets=300)
    feeder = threading.Thread(target=feed, name="feeder")
    feeder.start()
    seed = random.randrange(1_000_000)
    try:
        # Some moment after batch 1 (the first with data) committed: a random delay after a random
        # batch N in 2..4 was planned (offsets/N written, commits/N not yet), usually inside batch N.
        chance = random.Random(seed)
        target = chance.randint(2, 4)
        wait_for(lambda: in_flight(ckpt) >= target or job.poll() is not None, 180, f"batch {target} running")
        assert job.poll() is None, f"job exited early:\n{tail(tmp_path / 'run1.log')}"
        time.sleep(chance.uniform(0.0, 0.6))
        os.killpg(job.pid, signal.SIGKILL)  # the whole driver: Python, JVM and its Python workers
        job.wait(30)
    finally:
        stop_feeding.set()
        feeder.join()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    committed = last_batch(ckpt, "commits")
    replayed = last_batch(ckpt, "offsets") if last_batch(ckpt, "offsets") > committed else None
    read = sum(log_offsets(ckpt, committed)[topic].values())
    assert read < len(produced), f"seed {seed}: the job finished before the kill; nothing was tested"

    restart = start_job(bootstrap, topic, ckpt, out, tmp_path / "run2.log", "availableNow", max_offsets=10_000)
    assert restart.wait(180) == 0, tail(tmp_path / "run2.log")

    final: dict[str, int] = {}
    for _batch, rows in sparkjobs.read_batches(out):
        final.update({r["key"]: r["count"] for r in rows})
    expected = Counter(k.decode() for _t, _p, _o, k, _v in produced if k is not None)
    assert final == dict(expected), f"seed {seed}, killed after batch {committed}, replayed batch {replayed}"


def last_batch(checkpoint: Path, log: str) -> int:
    """The highest batch id in ``offsets/`` or ``commits/``; -1 if none (yet)."""
    folder = checkpoint / log
    return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=-1) if folder.is_dir() else -1


def in_flight(checkpoint: Path) -> int:
    """The batch planned (offsets/N) but not committed yet, or -1."""
    planned = last_batch(checkpoint, "offsets")
    return planned if planned > last_batch(checkpoint, "commits") else -1


def start_job(bootstrap: str, topic: str, ckpt: Path, out: Path, logfile: Path, trigger: str,
              max_offsets: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    with logfile.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, str(JOB), "--bootstrap", bootstrap, "--topic", topic, "--checkpoint", str(ckpt),
             "--out", str(out), "--trigger", trigger, "--max-offsets", str(max_offsets)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


# --------------------------------------------------------------------------------------------
# startingOffsets, startingTimestamp, subscribePattern, transactions
# --------------------------------------------------------------------------------------------


def test_starting_offsets_latest_is_pinned_by_batch_0(spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                                      tmp_path: Path) -> None:
    bootstrap, ckpt = kafka_server.bootstrap_servers, tmp_path / "ckpt"
    produce(bootstrap, topic, 30)  # before the query: never read
    first = Collect()
    run_available_now(stream(spark, bootstrap, subscribe=topic), ckpt, first)  # latest is the default
    assert first.records() == []
    assert log_offsets(ckpt, 0) == {topic: {"0": 10, "1": 10, "2": 10}}

    forget_commit(ckpt, 0)  # a crash during batch 0: Spark calls initialOffset() again on restart
    later = produce(bootstrap, topic, 30, first=30)
    second = Collect()
    run_available_now(stream(spark, bootstrap, subscribe=topic), ckpt, second)
    assert second.batches[0] == []
    assert second.records() == later  # exactly the records after the pinned start


def test_starting_offsets_json(spark: Any, kafka_server: EmbeddedKafka, topic: str, tmp_path: Path) -> None:
    produced = produce(kafka_server.bootstrap_servers, topic, 30)
    sink = Collect()
    start = json.dumps({topic: {"0": 5, "1": -2, "2": -1}})
    run_available_now(stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingOffsets=start),
                      tmp_path / "ckpt", sink)
    assert sink.records() == [r for r in produced if (r[1] == 0 and r[2] >= 5) or r[1] == 1]


def test_starting_timestamp_goes_through_list_offsets(spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                                      tmp_path: Path) -> None:
    produce(kafka_server.bootstrap_servers, topic, 30)
    future = int(time.time() * 1000) + 3_600_000
    sink = Collect()
    ckpt = tmp_path / "ckpt"
    run_available_now(stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingTimestamp=future),
                      ckpt, sink)
    # No record is at or after a future timestamp: Apache Kafka answers -1 and the source starts at
    # latest (10). tansu answers 0 to every timestamp query, so there it starts at 0. The mapping
    # itself (including -1 -> latest) is unit-tested with a fake broker.
    assert set(log_offsets(ckpt, 0)[topic].values()) <= {0, 10}
    assert len(sink.records()) in (0, 30)


def test_subscribe_pattern_picks_up_a_topic_created_later(spark: Any, kafka_server: EmbeddedKafka,
                                                          tmp_path: Path) -> None:
    bootstrap, prefix = kafka_server.bootstrap_servers, f"pat-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(f"{prefix}-a", partitions=1)
    produced = produce(bootstrap, f"{prefix}-a", 5, partitions=1)
    sink = Collect()
    df = stream(spark, bootstrap, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt")).trigger(
        processingTime="200 milliseconds"
    ).start()
    try:
        wait_for(lambda: len(sink.records()) == 5, 90, "the first topic's records")
        kafka_server.create_topic(f"{prefix}-b", partitions=2)
        produced += produce(bootstrap, f"{prefix}-b", 6, partitions=2)
        wait_for(lambda: len(sink.records()) >= 11, 90, "the new topic's records")
    finally:
        query.stop()
    assert sink.records() == sorted(produced)


def test_transaction_markers_do_not_stall_ranges(spark: Any, kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    """Each committed transaction leaves a marker offset without a record; ranges ending on one still finish."""
    from confluent_kafka import Producer

    bootstrap = kafka_server.bootstrap_servers
    topic = new_topic(kafka_server, partitions=1, prefix="tx")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "batch.num.messages": 1})
    producer.init_transactions(30)
    for txn in range(3):  # offsets 5n..5n+3 are records, 5n+4 is the commit marker
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, key=b"k", value=f"v{txn}-{i}".encode(), partition=0)
        producer.commit_transaction(30)
    sink = Collect()
    query = run_available_now(
        stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=5,
               **{"kafkaConsumer.pollTimeoutMs": 15_000}),  # a stalled range fails in 15 s instead of hanging
        tmp_path / "ckpt", sink, timeout=90,
    )
    values = sorted(r[4] or b"" for r in sink.records())
    assert values == sorted(f"v{t}-{i}".encode() for t in range(3) for i in range(4))
    ends = [log_offsets(tmp_path / "ckpt", b)[topic]["0"] for b in sorted(batch_sizes(query))]
    assert ends[-1] == 15  # 12 records + 3 markers: the last range ended on a marker, via partition EOF
    assert all(n <= 5 for n in batch_sizes(query).values())


# --------------------------------------------------------------------------------------------
# Data loss and bad options
# --------------------------------------------------------------------------------------------


def test_start_offset_beyond_the_end_is_data_loss(spark: Any, kafka_server: EmbeddedKafka, topic: str,
                                                  tmp_path: Path) -> None:
    produced = produce(kafka_server.bootstrap_servers, topic, 30)
    start = json.dumps({topic: {"0": 50, "1": -2, "2": -2}})
    df = stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingOffsets=start)
    with pytest.raises(Exception, match=rf"Data loss: startingOffsets asks for offset 50 of {topic}/0"):
        run_available_now(df, tmp_path / "fail", Collect())

    sink = Collect()
    run_available_now(stream(spark, kafka_server.bootstrap_servers, subscribe=topic, startingOffsets=start,
                             failOnDataLoss="false"), tmp_path / "skip", sink)
    assert sink.records() == produced  # partition 0 restarted from its earliest offset


def test_deleted_and_recreated_topics_are_data_loss(spark: Any, kafka_server: EmbeddedKafka, tmp_path: Path) -> None:
    bootstrap, ckpt = kafka_server.bootstrap_servers, tmp_path / "ckpt"
    kept, gone = new_topic(kafka_server), new_topic(kafka_server)
    produce(bootstrap, kept, 30)
    produce(bootstrap, gone, 30)
    options = {"subscribe": f"{kept},{gone}", "startingOffsets": "earliest"}
    run_available_now(stream(spark, bootstrap, **options), ckpt, Collect())
    assert log_offsets(ckpt, 1) == {kept: {"0": 10, "1": 10, "2": 10}, gone: {"0": 10, "1": 10, "2": 10}}

    delete_topics(bootstrap, kept, gone)
    kafka_server.create_topic(kept, partitions=3)
    recreated = produce(bootstrap, kept, 3)  # offsets restart at 0, below what the query has read
    with pytest.raises(Exception, match=r"Data loss: .*(no longer exists|truncated or the topic recreated)"):
        run_available_now(stream(spark, bootstrap, **options), ckpt, Collect())

    sink = Collect()
    run_available_now(stream(spark, bootstrap, **options, failOnDataLoss="false"), ckpt, sink)
    assert sink.records() == recreated  # the recreated topic from its start; the deleted one dropped
    assert log_offsets(ckpt, last_batch(ckpt, "commits")) == {kept: {"0": 1, "1": 1, "2": 1}}


def delete_topics(bootstrap: str, *topics: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the futures resolve
    for future in admin.delete_topics(list(topics), operation_timeout=30).values():
        future.result(30)


def test_bad_options_fail_when_the_query_is_defined_or_started(spark: Any, kafka_server: EmbeddedKafka,
                                                              topic: str, tmp_path: Path) -> None:
    bootstrap = kafka_server.bootstrap_servers
    with pytest.raises(Exception, match=r"unknown option.*startingoffset.*expected"):
        stream(spark, bootstrap, subscribe=topic, startingOffset="earliest")
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers is missing"):
        spark.readStream.format("ckpt-kafka").option("subscribe", topic).load()
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        stream(spark, bootstrap, subscribe=topic, subscribePattern="x.*")
    df = stream(spark, bootstrap, subscribe=topic, **{"kafka.no.such.property": "1"})
    with pytest.raises(Exception, match=r"librdkafka rejected the kafka\.\* options: No such configuration property"):
        run_available_now(df, tmp_path / "ckpt", Collect())
