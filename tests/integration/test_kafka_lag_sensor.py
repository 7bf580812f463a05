"""LagWatch, KafkaLagTrigger and KafkaLagSensor against a real tansu broker: exact lags of a committed group.

Test data is produced with ``batch.num.messages=1``: tansu's ListOffsets(LATEST) answers with the base
offset of the LAST record batch + 1 (ENVIRONMENT.md), so high watermarks are exact only when every record
batch holds one record. The product code uses the standard request, right for Apache Kafka.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from airflow.sdk.bases.sensor import PokeReturnValue

from airflow_ckpt_provider.embedded import EmbeddedKafka
from airflow_ckpt_provider.kafka.lag import LagWatch
from airflow_ckpt_provider.sensors.kafka_lag import KafkaLagSensor
from airflow_ckpt_provider.triggers.kafka_lag import KafkaLagTrigger

pytestmark = pytest.mark.integration

TIMEOUT = 10.0
PRODUCED = {0: 10, 1: 7, 2: 5}


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0, "acks": "all"})
    errors: list[str] = []
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition,
                             on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
    assert producer.flush(TIMEOUT) == 0 and errors == []


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit the group's next offsets as a consumer that processed up to them would (no group join needed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


@pytest.fixture
def group(kafka_server: EmbeddedKafka, topic: str) -> str:
    """A group that committed {0: 4, 1: 7, 2: 0} on a topic holding {0: 10, 1: 7, 2: 5}: lag 6 + 0 + 5 = 11."""
    name = f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka_server.bootstrap_servers, topic, PRODUCED)
    commit(kafka_server.bootstrap_servers, name, topic, {0: 4, 1: 7, 2: 0})
    return name


def lags(event: dict[str, Any]) -> dict[int, tuple[int | None, int, int]]:
    return {p["partition"]: (p["offset"], p["high"], p["lag"]) for p in event["partitions"]}


def test_lag_watch_fires_with_the_exact_lag(kafka_server: EmbeddedKafka, topic: str, group: str) -> None:
    bootstrap = kafka_server.bootstrap_servers
    below = LagWatch(bootstrap, group, [topic], threshold=12)
    event = below.poll()
    assert event is not None and (event["status"], event["total_lag"]) == ("met", 11)
    assert lags(event) == {0: (4, 10, 6), 1: (7, 7, 0), 2: (0, 5, 5)}
    assert LagWatch(bootstrap, group, [topic], threshold=11).poll() is None  # strictly below
    above = LagWatch(bootstrap, group, threshold=10, condition="above").poll()  # topics: the group's own
    assert above is not None and above["total_lag"] == 11

    caught_up = LagWatch(bootstrap, group, [topic], threshold=1)
    assert caught_up.poll() is None
    assert "last seen 11 over 3 partitions" in caught_up.waiting_for()
    commit(bootstrap, group, topic, {0: 10, 2: 5})
    event = caught_up.poll()
    assert event is not None and event["total_lag"] == 0


def test_kafka_lag_trigger_reads_brokers_from_a_kafka_connection(
    kafka_server: EmbeddedKafka, topic: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {"bootstrap.servers": kafka_server.bootstrap_servers, "group.id": "ignored", "client.id": "lag-test"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": extra}))
    trigger = KafkaLagTrigger(group=group, threshold=12, topics=[topic], kafka_conn_id="kafka_default",
                              poll_interval=0.1, timeout=30)

    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    events = asyncio.run(collect())
    assert len(events) == 1 and events[0]["status"] == "met" and events[0]["total_lag"] == 11
    assert lags(events[0]) == {0: (4, 10, 6), 1: (7, 7, 0), 2: (0, 5, 5)}


def test_kafka_lag_sensor_pokes_until_the_group_is_below_the_threshold(
    kafka_server: EmbeddedKafka, topic: str, group: str
) -> None:
    sensor = KafkaLagSensor(task_id="lag", group=group, topics=[topic], threshold=6,
                            bootstrap_servers=kafka_server.bootstrap_servers, deferrable=False)
    assert sensor.poke({}) is False  # lag 11
    commit(kafka_server.bootstrap_servers, group, topic, {0: 10})  # lag 0 + 0 + 5
    result = sensor.poke({})
    assert isinstance(result, PokeReturnValue) and result.is_done and result.xcom_value is not None
    assert (result.xcom_value["status"], result.xcom_value["total_lag"]) == ("met", 5)
