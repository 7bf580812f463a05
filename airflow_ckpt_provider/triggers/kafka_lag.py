"""KafkaLagTrigger: waits in the triggerer until a consumer group's total lag is below (or above) a threshold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.lag import DEFAULT_TIMEOUT, LAG_EVENTS, LagCondition
from airflow_ckpt_provider.triggers.base import TRIGGER_EVENTS, WatchTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.kafka.lag import LagWatch


class KafkaLagTrigger(WatchTrigger):
    """Event statuses: ``met`` (payload: group, total_lag, partitions, condition, threshold, message),
    ``timeout`` (its message carries the last Kafka error, if the brokers could not be read), ``error``.

    Brokers and client settings come from ``kafka_conn_id`` (a ``kafka`` connection: its extra is the
    librdkafka config) and/or ``bootstrap_servers``; no setting travels in the trigger's arguments, so
    no secret is stored with it. ``request_timeout`` bounds each broker call.
    """

    STATUSES: ClassVar[frozenset[str]] = LAG_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        group: str,
        threshold: int,
        topics: list[str] | None = None,
        condition: str = LagCondition.BELOW,
        bootstrap_servers: str | None = None,
        kafka_conn_id: str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT,
        poll_interval: float = 10.0,
        timeout: float | None = None,
        waiting_since: float | None = None,
        min_wait: float = 0.0,
        resume_with: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout, waiting_since=waiting_since,
                         min_wait=min_wait, resume_with=resume_with)
        self.group = group
        self.threshold = threshold
        self.topics = list(topics) if topics is not None else None
        self.condition = str(condition)
        self.bootstrap_servers = bootstrap_servers
        self.kafka_conn_id = kafka_conn_id
        self.request_timeout = request_timeout

    def arguments(self) -> dict[str, Any]:
        return {
            "group": self.group, "threshold": self.threshold, "topics": self.topics, "condition": self.condition,
            "bootstrap_servers": self.bootstrap_servers, "kafka_conn_id": self.kafka_conn_id,
            "request_timeout": self.request_timeout,
        }

    def build_watch(self) -> LagWatch:
        from airflow_ckpt_provider.hooks.kafka import KafkaConfigHook
        from airflow_ckpt_provider.kafka.lag import LagWatch

        if self.kafka_conn_id is not None:
            servers, conf = KafkaConfigHook(self.kafka_conn_id).client_config(self.bootstrap_servers)
        elif self.bootstrap_servers:
            servers, conf = self.bootstrap_servers, {}
        else:
            raise ConfigError("no Kafka brokers: pass kafka_conn_id (a kafka connection) or bootstrap_servers")
        return LagWatch(servers, self.group, self.topics, threshold=self.threshold, condition=self.condition,
                        conf=conf, timeout=self.request_timeout)
