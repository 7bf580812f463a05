"""Offsets committed on completion and consumer lag, against a real tansu broker (and real Spark).

Test data is produced with ``batch.num.messages=1``: tansu's ListOffsets(LATEST) answers with the
base offset of the LAST record batch + 1 (ENVIRONMENT.md), so high watermarks are exact only when
every record batch holds one record. The product code uses the standard request, right for Kafka.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.ckptfiles import parse_log_entry
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.kafka.lag import LagError, checkpoint_lag, consumer_group_lag
from airflow_ckpt_provider.kafka.offsetcommitter import MAX_RETRY_INTERVAL, OffsetCommitter
from airflow_ckpt_provider.kafka.offsets import Offsets, kafka_offsets_or_none

pytestmark = pytest.mark.integration

TIMEOUT = 10.0


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """``counts[p]`` records into partition p, one record per record batch (see the module doc)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0,
                        "acks": "all", "enable.idempotence": True})
    errors: list[str] = []
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, key=f"k{i}".encode(), value=f"{partition}-{i}".encode(), partition=partition,
                             on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
    assert producer.flush(TIMEOUT) == 0, "not all records delivered in time"
    assert errors == []


def consume_and_commit(bootstrap: str, topic: str, group: str, counts: dict[int, int]) -> None:
    """A plain consumer reads exactly ``counts[p]`` records of partition p and commits (no group join)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for partition, count in counts.items():
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            seen: list[int] = []
            deadline = time.monotonic() + TIMEOUT
            while len(seen) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None and msg.offset() is not None:
                    seen.append(int(msg.offset() or 0))
            assert seen == list(range(count))
            consumer.commit(offsets=[TopicPartition(topic, partition, seen[-1] + 1)], asynchronous=False)
    finally:
        consumer.close()


def group_offsets(bootstrap: str, group: str) -> Offsets:
    """The group's committed offsets, read back with the admin API."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                               request_timeout=TIMEOUT)[group].result(TIMEOUT)
    out: Offsets = {}
    for tp in result.topic_partitions:
        assert tp.error is None
        if tp.offset >= 0:
            out.setdefault(tp.topic, {})[tp.partition] = tp.offset
    return out


def group_name() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def write_checkpoint(root: Path, batches: list[list[str]]) -> Path:
    """A stateless checkpoint whose batches are all completed; ``batches[n]`` are the source offsets of n."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    for n, sources in enumerate(batches):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + n, "conf": {}}
        (root / "offsets" / str(n)).write_text("\n".join(["v1", json.dumps(meta), *sources]))
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


# ------------------------------------------------------------------------------------------------
# The committer against the broker
# ------------------------------------------------------------------------------------------------


def test_committer_commits_and_the_group_reads_back(kafka_server: EmbeddedKafka, topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    bootstrap, group = kafka_server.bootstrap_servers, group_name()
    produce(bootstrap, topic, {0: 5, 1: 8, 2: 0})
    committer = OffsetCommitter(group, bootstrap, timeout=TIMEOUT)
    try:
        committer.submit({topic: {0: 3, 1: 8, 2: 0}}, batch_id=0, query_id="q")
        assert committer.flush(TIMEOUT)
        assert group_offsets(bootstrap, group) == {topic: {0: 3, 1: 8, 2: 0}}
        # committed() of a consumer in the group (next offset to read, as Kafka expects)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            got = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=TIMEOUT)
        finally:
            consumer.close()
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 3), (1, 8), (2, 0)]

        # Time travel (restored from an older snapshot): the batch's offsets are committed as they are.
        committer.submit({topic: {0: 1, 1: 2, 2: 0}}, batch_id=1, query_id="q")
        assert committer.flush(TIMEOUT)
        assert group_offsets(bootstrap, group) == {topic: {0: 1, 1: 2, 2: 0}}
        assert committer.stats().committed == 2
    finally:
        assert committer.close()


def test_per_partition_errors_are_failures_not_exceptions(kafka_server: EmbeddedKafka, topic: str) -> None:
    bootstrap, group = kafka_server.bootstrap_servers, group_name()
    committer = OffsetCommitter(group, bootstrap, timeout=TIMEOUT)
    try:
        committer.submit({topic: {0: 0}, f"missing-{uuid.uuid4().hex[:6]}": {0: 4}}, batch_id=3, query_id="q")
        assert not committer.flush(TIMEOUT)
        stats = committer.stats()
        assert stats.failed == 1 and stats.last_error is not None
        assert "1 of 2 partitions not committed" in stats.last_error and "nknown topic" in stats.last_error
        assert group_offsets(bootstrap, group) == {topic: {0: 0}}  # the good partition went through
    finally:
        committer.close(1.0)


def test_an_unreachable_broker_is_a_bounded_logged_failure() -> None:
    from airflow_ckpt_provider.embedded import free_port

    committer = OffsetCommitter(group_name(), f"127.0.0.1:{free_port()}", {"log_level": 0}, timeout=1.0)
    started = time.monotonic()
    committer.submit({"t": {0: 1}}, batch_id=0)
    assert not committer.flush(TIMEOUT)
    assert time.monotonic() - started < 5.0
    assert committer.stats().failed == 1
    assert not committer.close(5.0)


@pytest.fixture
def kafka_on_s3(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> Iterator[EmbeddedKafka]:
    """A broker of its own whose log and committed offsets live on S3: they survive its restart."""
    with EmbeddedKafka(s3=s3_server, bucket=bucket, workdir=tmp_path / "tansu") as kafka:
        yield kafka


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"expected {what} within {timeout:.0f} s"
        time.sleep(0.1)


OUTAGE_S = 15.0  # longer than COMMIT_TIMEOUT twice over: commits time out during it
COMMIT_TIMEOUT = 5.0


def test_after_a_broker_outage_the_group_reaches_the_newest_offsets_at_the_next_batch_or_idle_on_its_own(
    kafka_on_s3: EmbeddedKafka, caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 39: commits that timed out during an outage must not break later ones. Two committers
    ride out one outage: "flowing" (its query goes on with new batches; its own retries are set
    beyond the test) and "idle" (no batch after the outage: only its own retries can commit)."""
    caplog.set_level("INFO", logger="airflow_ckpt_provider.kafka.offsetcommitter")
    kafka = kafka_on_s3
    bootstrap, topic = kafka.bootstrap_servers, f"t-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(topic, partitions=3)

    def batch(n: int) -> Offsets:
        return {topic: {0: 10 * n, 1: 10 * n + 1, 2: 10 * n + 2}}

    flowing = OffsetCommitter(group_name(), bootstrap, timeout=COMMIT_TIMEOUT, retry_interval=600.0)
    idle = OffsetCommitter(group_name(), bootstrap, timeout=COMMIT_TIMEOUT, retry_interval=1.0)
    try:
        for committer in (flowing, idle):
            committer.submit(batch(0), batch_id=0)
            assert committer.flush(TIMEOUT)
            assert group_offsets(bootstrap, committer.group_id) == batch(0)

        with kafka.outage():
            down = time.monotonic()
            for committer in (flowing, idle):  # batch 1 completes as the broker goes
                committer.submit(batch(1), batch_id=1)
            wait_for(lambda: flowing.stats().failed == 1 and idle.stats().failed >= 2, OUTAGE_S + 2 * COMMIT_TIMEOUT,
                     "batch 1's commits and a retry of the idle one failing")
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))  # the outage's length is the test's input
        # start() returned: the broker answers on the same port, its data kept.

        # The flowing query's first batch after the outage is committed at its first attempt.
        flowing.submit(batch(2), batch_id=2)
        assert flowing.flush(COMMIT_TIMEOUT + 1.0), flowing.stats()
        assert group_offsets(bootstrap, flowing.group_id) == batch(2)
        # The idle query's batch 1 reaches its group with no new submission, by the committer's own retry.
        wait_for(lambda: group_offsets(bootstrap, idle.group_id) == batch(1), MAX_RETRY_INTERVAL + 2 * COMMIT_TIMEOUT,
                 f"the idle group at batch 1 ({idle.stats()})")
    finally:
        closed = [flowing.close(), idle.close()]
    assert closed == [True, True]
    assert flowing.stats().committed == 2 and flowing.stats().last_committed_batch == 2
    assert idle.stats().committed == 2 and idle.stats().last_committed_batch == 1 and idle.stats().submitted == 2
    replaced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Replacing the Kafka admin")]
    # One line per group for the whole outage however many clients were replaced.
    assert sorted(line.split()[7] for line in replaced) == sorted([flowing.group_id, idle.group_id]), replaced


# ------------------------------------------------------------------------------------------------
# Lag
# ------------------------------------------------------------------------------------------------


def test_group_lag_matches_produced_and_consumed(kafka_server: EmbeddedKafka, topic: str) -> None:
    bootstrap, group = kafka_server.bootstrap_servers, group_name()
    produce(bootstrap, topic, {0: 10, 1: 7, 2: 3})
    consume_and_commit(bootstrap, topic, group, {0: 4, 1: 7})  # partition 2 never consumed

    report = consumer_group_lag(bootstrap, group, timeout=TIMEOUT)
    rows = [(p.topic, p.partition, p.offset, p.low, p.high, p.lag) for p in report.partitions]
    assert rows == [(topic, 0, 4, 0, 10, 6), (topic, 1, 7, 0, 7, 0), (topic, 2, None, 0, 3, 3)]
    assert report.total_lag == 9 and (report.kind, report.name) == ("group", group)
    assert report.to_dict()["partitions"][2] == {"topic": topic, "partition": 2, "offset": None,
                                                 "low": 0, "high": 3, "lag": 3}

    produce(bootstrap, topic, {1: 2})
    assert consumer_group_lag(bootstrap, group, [topic], timeout=TIMEOUT).total_lag == 11

    unknown = group_name()
    assert consumer_group_lag(bootstrap, unknown, timeout=TIMEOUT).partitions == ()
    assert consumer_group_lag(bootstrap, unknown, [topic], timeout=TIMEOUT).total_lag == 10 + 9 + 3
    with pytest.raises(LagError, match="topic 'no-such-topic' not found"):
        consumer_group_lag(bootstrap, group, ["no-such-topic"], timeout=TIMEOUT)


def test_checkpoint_lag_reads_the_latest_completed_batch(
    kafka_server: EmbeddedKafka, topic: str, tmp_path: Path
) -> None:
    bootstrap = kafka_server.bootstrap_servers
    produce(bootstrap, topic, {0: 6, 1: 6, 2: 6})
    kafka = json.dumps({topic: {"0": 2, "1": 6, "2": 1}})
    ckpt = write_checkpoint(tmp_path / "ckpt", [
        ['{"logOffset":0}', json.dumps({topic: {"0": 1, "1": 1, "2": 1}})],
        ['{"logOffset":1}', kafka],  # a file source next to the Kafka source: ignored
    ])
    report = checkpoint_lag(bootstrap, str(ckpt), timeout=TIMEOUT)
    assert report.batch_id == 1 and report.kind == "checkpoint"
    assert [(p.partition, p.offset, p.lag) for p in report.partitions] == [(0, 2, 4), (1, 6, 0), (2, 1, 5)]
    assert report.total_lag == 9
    by_offsets = checkpoint_lag(bootstrap, {topic: {0: 2, 1: 6, 2: 1}}, timeout=TIMEOUT)
    assert by_offsets.partitions == report.partitions

    no_kafka = write_checkpoint(tmp_path / "files", [['{"logOffset":0}']])
    with pytest.raises(ConfigError, match="has no Kafka source"):
        checkpoint_lag(bootstrap, LocalStorage(no_kafka), timeout=TIMEOUT)


def ckpt_cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    proc = subprocess.run([sys.executable, "-m", "airflow_ckpt_provider.cli", "kafka", "lag", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == expect, proc.stderr
    return proc


def test_ckpt_kafka_lag_command(kafka_server: EmbeddedKafka, topic: str, tmp_path: Path) -> None:
    bootstrap, group = kafka_server.bootstrap_servers, group_name()
    produce(bootstrap, topic, {0: 5, 1: 3, 2: 0})
    consume_and_commit(bootstrap, topic, group, {0: 2})

    table = ckpt_cli("--bootstrap-servers", bootstrap, "--group", group).stdout.splitlines()
    assert table[0].split() == ["TOPIC", "PARTITION", "OFFSET", "HIGH", "LAG"]
    assert [line.split() for line in table[1:4]] == [[topic, "0", "2", "5", "3"], [topic, "1", "-", "3", "3"],
                                                     [topic, "2", "-", "0", "0"]]
    assert table[4] == f"total lag of group {group}: 6"

    data = json.loads(ckpt_cli("--bootstrap-servers", bootstrap, "--group", group, "--json").stdout)
    assert data == consumer_group_lag(bootstrap, group, timeout=TIMEOUT).to_dict()

    ckpt = write_checkpoint(tmp_path / "ckpt", [[json.dumps({topic: {"0": 5, "1": 1, "2": 0}})]])
    config = tmp_path / "client.properties"
    config.write_text("# librdkafka settings\nclient.id=ckpt-lag-test\n")
    data = json.loads(ckpt_cli("--bootstrap-servers", bootstrap, "--checkpoint", str(ckpt), "--topic", topic,
                               "--config", str(config), "--json").stdout)
    assert (data["kind"], data["batch_id"], data["total_lag"]) == ("checkpoint", 0, 2)

    missing = ckpt_cli("--group", group, expect=1)
    assert "pass --bootstrap-servers" in missing.stderr
    ckpt_cli("--bootstrap-servers", bootstrap, "--group", group, "--checkpoint", str(ckpt), expect=2)
    config.write_text("no equals sign\n")
    bad = ckpt_cli("--bootstrap-servers", bootstrap, "--group", group, "--config", str(config), expect=1)
    assert "expected key=value" in bad.stderr


# ------------------------------------------------------------------------------------------------
# End to end with Spark and the ckpt-kafka source
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark(kafka_spark: Any) -> Any:
    return kafka_spark


def batch_end(ckpt: Path, batch: int) -> Offsets | None:
    """The Kafka end offsets of ``batch`` in the offsets log (written before the batch runs)."""
    path = ckpt / "offsets" / str(batch)
    if batch < 0 or not path.exists():
        return None
    entry = parse_log_entry(path.read_bytes(), kind="offsets")
    return kafka_offsets_or_none(entry.offsets[0])


def progress_recorder(ckpt: Path, *, as_json: bool = False) -> Any:
    """A listener that records, when each batch's progress arrives, whether commits/N exists, and what the event
    says. ``as_json``: a ProgressListener (the event parsed from Spark's JSON), else pyspark's own listener class."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from airflow_ckpt_provider.kafka.listening import ProgressListener

    class Recorder(ProgressListener if as_json else StreamingQueryListener):  # type: ignore[misc]  # either base
        def __init__(self) -> None:
            self.seen: list[tuple[int, bool, str]] = []
            self.said: list[tuple[Any, ...]] = []  # what else each event says, offsets parsed

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            self.seen.append((p.batchId, (ckpt / "commits" / str(p.batchId)).exists(), p.sources[0].endOffset))
            self.said.append((p.id, p.runId, p.batchId, p.numInputRows, sorted(p.durationMs), p.sink.description,
                              [(s.description, s.numInputRows, kafka_offsets_or_none(s.startOffset),
                                kafka_offsets_or_none(s.latestOffset)) for s in p.sources]))

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Recorder()


def test_group_offsets_follow_completed_batches_only(
    spark: Any, kafka_server: EmbeddedKafka, topic: str, tmp_path: Path
) -> None:
    from airflow_ckpt_provider.kafka.committer import (
        disable_commit_on_completion,
        enable_commit_on_completion,
        ensure_listener,
    )

    bootstrap, group, ckpt = kafka_server.bootstrap_servers, group_name(), tmp_path / "ckpt"
    produce(bootstrap, topic, {0: 20, 1: 20, 2: 20})
    final = {topic: {0: 20, 1: 20, 2: 20}}

    listener = enable_commit_on_completion(spark, group, bootstrap, topics=[topic])
    assert ensure_listener(spark, group, bootstrap, topics=[topic]) is listener  # one per session and group
    with pytest.raises(ConfigError, match="other client settings"):
        ensure_listener(spark, group, "127.0.0.1:1")
    recorder, json_recorder = progress_recorder(ckpt), progress_recorder(ckpt, as_json=True)
    spark.streams.addListener(recorder)
    spark.streams.addListener(json_recorder)

    inside: dict[int, Offsets] = {}  # batch N -> the group's offsets seen while N ran
    problems: list[str] = []
    rows = [0]

    def sink(df: Any, batch_id: int) -> None:
        # Runs on the driver while batch N is not committed (no commits/N yet). The group may still
        # be catching up with batch N-1 (commits are asynchronous): wait for it, bounded, and check
        # that it never shows batch N's offsets.
        rows[0] += df.count()
        mine, before = batch_end(ckpt, batch_id), batch_end(ckpt, batch_id - 1) or {}
        deadline = time.monotonic() + 20
        seen = group_offsets(bootstrap, group)
        while seen != before and time.monotonic() < deadline:
            if seen == mine:
                problems.append(f"batch {batch_id}: group already at its end offsets {mine} before it committed")
            time.sleep(0.05)
            seen = group_offsets(bootstrap, group)
        if (ckpt / "commits" / str(batch_id)).exists():
            problems.append(f"commits/{batch_id} exists inside batch {batch_id}")
        inside[batch_id] = seen

    query = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 25)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        last = None
        while time.monotonic() < deadline and query.isActive:
            last = SparkCheckpoint(LocalStorage(ckpt)).latest_completed_batch() if (ckpt / "commits").exists() else None
            if last is not None and batch_end(ckpt, last) == final:
                break
            time.sleep(0.1)
        assert last is not None and batch_end(ckpt, last) == final, f"query did not finish: {query.exception()}"
        deadline = time.monotonic() + 20  # both listeners see the last batch's progress event
        while time.monotonic() < deadline and (
            group_offsets(bootstrap, group) != final or last not in [b for b, _, _ in recorder.seen]
            or last not in [b for b, _, _ in json_recorder.seen]
        ):
            time.sleep(0.05)
    finally:
        query.stop()
        spark.streams.removeListener(recorder)
        spark.streams.removeListener(json_recorder)

    assert problems == []
    assert rows[0] == 60
    # Batch 0 resolves startingOffsets and reads nothing; then 25, 25 and 10 records.
    ends = [batch_end(ckpt, n) for n in range(last + 1)]
    assert ends[0] == {topic: {0: 0, 1: 0, 2: 0}} and ends[-1] == final and last >= 3
    # Inside batch N the group was at batch N-1's end offsets: it reached them after N-1 completed,
    # and did not move to N's before N completed.
    assert inside == {n: ends[n - 1] if n else {} for n in range(last + 1)}
    assert group_offsets(bootstrap, group) == final  # ... and after the last batch completed
    # Spark delivered every progress event after writing commits/N, with the offsets log's end offsets.
    assert [(b, exists) for b, exists, _ in recorder.seen] == [(n, True) for n in range(last + 1)]
    assert [kafka_offsets_or_none(end) for _, _, end in recorder.seen] == ends
    # A ProgressListener (the event parsed from Spark's JSON, as the driver's and the commit listeners take it) got
    # the same events as pyspark's own conversion: the same batches, offsets, counts and names.
    assert [(b, exists, kafka_offsets_or_none(end)) for b, exists, end in json_recorder.seen] == [
        (b, exists, kafka_offsets_or_none(end)) for b, exists, end in recorder.seen]
    assert json_recorder.said == recorder.said and len(recorder.said) == last + 1
    stats = listener.committer.stats()
    assert stats.failed == 0 and stats.last_committed_batch == last

    assert consumer_group_lag(bootstrap, group, timeout=TIMEOUT).total_lag == 0
    assert checkpoint_lag(bootstrap, str(ckpt), timeout=TIMEOUT).total_lag == 0
    produce(bootstrap, topic, {1: 7})  # the query is stopped: exactly 7 records behind
    assert consumer_group_lag(bootstrap, group, timeout=TIMEOUT).total_lag == 7
    report = checkpoint_lag(bootstrap, str(ckpt), timeout=TIMEOUT)
    assert (report.batch_id, report.total_lag) == (last, 7)
    assert [p.lag for p in report.partitions] == [0, 7, 0]

    assert disable_commit_on_completion(spark, listener)
    assert ensure_listener(spark, group, bootstrap) is not listener  # registered afresh
    assert disable_commit_on_completion(spark, ensure_listener(spark, group, bootstrap))


def test_commit_group_id_option_commits_completed_batches(
    spark: Any, kafka_server: EmbeddedKafka, topic: str, tmp_path: Path
) -> None:
    """The source option alone (with register(spark) in the driver) commits each completed batch."""
    bootstrap, group, ckpt = kafka_server.bootstrap_servers, group_name(), tmp_path / "ckpt"
    produce(bootstrap, topic, {0: 9, 1: 5, 2: 4})
    final = {topic: {0: 9, 1: 5, 2: 4}}
    query = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("commitGroupId", group)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    last = SparkCheckpoint(LocalStorage(ckpt)).latest_completed_batch()
    assert last is not None and batch_end(ckpt, last) == final
    raw = json.loads(parse_log_entry((ckpt / "offsets" / str(last)).read_bytes(), kind="offsets").offsets[0] or "{}")
    assert raw["$commit"] == {"group": group, "servers": bootstrap}  # the group travels in the offset
    deadline = time.monotonic() + 20  # the last progress event is delivered asynchronously
    while group_offsets(bootstrap, group) != final and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_offsets(bootstrap, group) == final
    assert consumer_group_lag(bootstrap, group, timeout=TIMEOUT).total_lag == 0
    assert checkpoint_lag(bootstrap, str(ckpt), timeout=TIMEOUT).total_lag == 0
