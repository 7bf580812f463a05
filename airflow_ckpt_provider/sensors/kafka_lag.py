"""KafkaLagSensor: waits until a consumer group's total lag is below (or above) a threshold."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_ckpt_provider.hooks.kafka import KafkaConfigHook
from airflow_ckpt_provider.kafka.lag import DEFAULT_TIMEOUT, LagCondition
from airflow_ckpt_provider.sensors.base import WatchSensor
from airflow_ckpt_provider.triggers.kafka_lag import KafkaLagTrigger


class KafkaLagSensor(WatchSensor):
    """Returns the lag once the total lag of ``group`` on ``topics`` is below ``threshold`` (strictly:
    ``threshold=1`` waits until the group caught up) or, with ``condition="above"``, above it. Payload:
    group, total_lag, partitions (topic, partition, offset, low, high, lag), condition, threshold, message.

    Brokers: ``kafka_conn_id`` (a ``kafka`` connection whose extra is the librdkafka config, as for
    Airflow's Kafka provider; default ``kafka_default`` unless ``bootstrap_servers`` is given), and/or
    ``bootstrap_servers``. Without ``topics``, every topic the group committed offsets for counts.
    Kafka errors do not fail the sensor: it keeps polling and its timeout message names the last one.
    """

    template_fields = ("group", "topics", "threshold", "bootstrap_servers", "kafka_conn_id")
    trigger_class: ClassVar[type[KafkaLagTrigger]] = KafkaLagTrigger

    def __init__(
        self,
        *,
        group: str,
        threshold: int | str,
        topics: list[str] | str | None = None,
        condition: str = LagCondition.BELOW,
        bootstrap_servers: str | None = None,
        kafka_conn_id: str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if condition not in (LagCondition.BELOW, LagCondition.ABOVE):
            raise ValueError(f"{self.task_id}: condition must be 'below' or 'above', found {condition!r}")
        self.group = group
        self.threshold = threshold
        self.topics = topics
        self.condition = str(condition)
        self.bootstrap_servers = bootstrap_servers
        self.kafka_conn_id = kafka_conn_id
        self.request_timeout = request_timeout

    def make_trigger(self) -> KafkaLagTrigger:
        topics = self.topics
        if isinstance(topics, str):  # a rendered template, or "a,b"
            topics = [t.strip() for t in topics.split(",") if t.strip()]
        conn_id = self.kafka_conn_id or (None if self.bootstrap_servers else KafkaConfigHook.default_conn_name)
        return KafkaLagTrigger(
            group=self.group, threshold=int(self.threshold), topics=topics, condition=self.condition,
            bootstrap_servers=self.bootstrap_servers or None, kafka_conn_id=conn_id,
            request_timeout=self.request_timeout, poll_interval=self.poke_interval, timeout=self.timeout,
        )

    def on_event(self, event: dict[str, Any]) -> Any:
        self.log.info("%s", event.get("message"))
        return event
