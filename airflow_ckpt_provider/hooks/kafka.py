"""KafkaConfigHook: librdkafka settings from an Airflow connection of type ``kafka``.

The connection is read the way Airflow's Kafka provider reads its own (its extra is the librdkafka
config dict, e.g. ``{"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...}``), so
existing Kafka connections work without that provider installed. The host (``host:port``) is a
fallback for ``bootstrap.servers``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_ckpt_provider.core.errors import ConfigError

#: Consumer-only settings an Airflow Kafka connection often carries: the admin client that reads lag
#: has no use for them and librdkafka warns about each on every client it creates.
_CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "auto.offset.reset", "enable.auto.commit", "auto.commit.interval.ms",
    "enable.auto.offset.store", "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
    "isolation.level", "enable.partition.eof", "partition.assignment.strategy",
})
_SECRET_WORDS = ("password", "secret", "token", "key", "jaas")


def redacted(conf: dict[str, Any]) -> dict[str, Any]:
    """The config with the values of credential-like keys (sasl.password, ssl.key.pem, ...) hidden, for logs."""
    return {k: "***" if any(w in k.lower() for w in _SECRET_WORDS) else v for k, v in conf.items()}


class KafkaConfigHook(BaseHook):
    """Bootstrap servers and client settings for the lag checks, from a ``kafka`` connection."""

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka"

    def __init__(self, kafka_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id

    def client_config(self, bootstrap_servers: str | None = None) -> tuple[str, dict[str, Any]]:
        """(bootstrap servers, the other settings): ``bootstrap_servers`` overrides the connection's."""
        conn = self.get_connection(self.kafka_conn_id)
        extra = dict(conn.extra_dejson)
        conf = {k: v for k, v in extra.items() if k != "bootstrap.servers" and k not in _CONSUMER_ONLY}
        host = f"{conn.host}:{conn.port}" if conn.host and conn.port else (conn.host or "")
        servers = bootstrap_servers or str(extra.get("bootstrap.servers") or "") or host
        if not servers:
            raise ConfigError(
                f"connection {self.kafka_conn_id!r} names no Kafka brokers: expected \"bootstrap.servers\" in its "
                "extra (the librdkafka config) or a host; set one, or pass bootstrap_servers"
            )
        self.log.info("Kafka connection %r: brokers %s, settings %s", self.kafka_conn_id, servers, redacted(conf))
        return servers, conf
