"""A real broker outage (tansu stopped ~10 s, started again on the same port with its data on S3) seen
through kafka/clientlog.py: one "unreachable" line, one "reachable again" line, no raw librdkafka line."""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.kafka.clientlog import configured, serve

#: librdkafka's own stderr format: "%3|1690000000.123|FAIL|rdkafka#producer-1| ..."
RAW_LIBRDKAFKA_LINE = re.compile(r"^%\d\|\d+\.\d+\|", re.M)
STATE_LOGGER = "airflow_ckpt_provider.kafka.clientlog"
OUTAGE_S = 10.0
RECORDS = 40


@pytest.fixture
def kafka_on_s3(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> Iterator[EmbeddedKafka]:
    """A broker of its own whose log lives on S3, so that a restart keeps the topic and its records."""
    with EmbeddedKafka(s3=s3_server, bucket=bucket, workdir=tmp_path / "tansu") as kafka:
        yield kafka


@pytest.mark.full(proven_by="integration/test_recovery.py::test_a_broker_outage_is_ridden_out_in_the_same_driver_... "
                            "(one unreachable and one reachable line per process, no raw librdkafka line, in a job)")
def test_a_ten_second_broker_outage_logs_one_unreachable_and_one_reachable_line_and_no_raw_librdkafka_line(
        kafka_on_s3: EmbeddedKafka, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    caplog.set_level(logging.DEBUG, logger="airflow_ckpt_provider.kafka")
    kafka = kafka_on_s3
    address = kafka.bootstrap_servers
    topic = f"t-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(topic, partitions=1)
    # batch.num.messages=1: tansu's ListOffsets deviation (docs: ENVIRONMENT.md) stays out of the way.
    producer = Producer(configured({"bootstrap.servers": address, "acks": "all", "enable.idempotence": True,
                                    "batch.num.messages": 1, "linger.ms": 0}, job="outage"))
    consumer = Consumer(configured({"bootstrap.servers": address, "group.id": f"g-{topic}",
                                    "enable.auto.commit": False}, job="outage"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    admin = AdminClient(configured({"bootstrap.servers": address}, job="outage"))
    received: list[bytes] = []

    def pump() -> None:
        """What a job's clients do all the time: deliver, consume, ask for metadata."""
        producer.poll(0)
        received.extend(m.value() or b"" for m in consumer.consume(100, timeout=0.1) if m.error() is None)
        with contextlib.suppress(KafkaException):  # expected while the broker is down
            admin.list_topics(timeout=0.3)
        serve(admin)

    def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"Expected {what} within {timeout:.0f} s, found it not. Lines: {lines()}")
            pump()

    def lines(kind: str = "") -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == STATE_LOGGER and r.levelno >= logging.INFO
                and r.getMessage().startswith(f"kafka {address} {kind}")]

    def produce(first: int) -> None:
        for i in range(first, first + RECORDS // 2):
            producer.produce(topic, value=str(i).encode())

    produce(0)
    wait_for(lambda: len(received) == RECORDS // 2, 30, f"{RECORDS // 2} records consumed before the outage")
    with kafka.outage():
        stopped = time.monotonic()
        produce(RECORDS // 2)  # queued in the producer until the broker is back
        wait_for(lambda: bool(lines("unreachable")), 20, "an 'unreachable' line")
        wait_for(lambda: time.monotonic() - stopped >= OUTAGE_S, OUTAGE_S + 1, "the outage's duration")
    wait_for(lambda: bool(lines("reachable again")), 40, "a 'reachable again' line")
    assert producer.flush(30) == 0
    wait_for(lambda: len(received) >= RECORDS, 30, f"all {RECORDS} records consumed")
    for _ in range(10):
        pump()  # more polls after recovery must not add state lines

    assert sorted(int(v) for v in received) == list(range(RECORDS))
    unreachable, back = lines("unreachable"), lines("reachable again")
    assert len(unreachable) == 1, unreachable
    assert re.fullmatch(rf"kafka {re.escape(address)} unreachable: .+ \(job outage; further errors suppressed "
                        r"until it is back\)", unreachable[0]), unreachable[0]
    assert len(back) == 1, back
    match = re.fullmatch(rf"kafka {re.escape(address)} reachable again after ([\d.]+) s \((\d+) errors suppressed; "
                         r"job outage\)", back[0])
    assert match is not None, back[0]
    assert OUTAGE_S - 1 <= float(match[1]) <= OUTAGE_S + 30, back[0]
    assert len(lines()) == 2
    others = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and r.name != STATE_LOGGER
              and "Connect" in r.getMessage()]
    assert others == [], others  # every connection line went through the tracker
    captured = capfd.readouterr()
    assert RAW_LIBRDKAFKA_LINE.findall(captured.err + captured.out) == [], captured.err[-3000:]
    consumer.close()
