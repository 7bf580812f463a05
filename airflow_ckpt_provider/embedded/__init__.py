"""Embedded local services for tests, the demo and your own trials: SeaweedFS (S3) and tansu (Kafka) on
127.0.0.1, and a local Spark session (docs/embedded.md).

``process.py`` runs a server as a child process; ``seaweedfs.py`` and ``tansu.py`` are the two servers;
this module starts them together and closes, at interpreter exit, whatever its owner left running.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from airflow_ckpt_provider.embedded.process import HOST, REGION, EmbeddedServiceError, free_port, unclosed
from airflow_ckpt_provider.embedded.seaweedfs import EmbeddedS3
from airflow_ckpt_provider.embedded.tansu import EmbeddedKafka

log = logging.getLogger(__name__)

__all__ = ["HOST", "REGION", "EmbeddedKafka", "EmbeddedS3", "EmbeddedServiceError", "EmbeddedServices", "free_port",
           "local_spark"]


def local_spark(app_name: str, **conf: str) -> Any:
    """A local[2] SparkSession that listens on 127.0.0.1 only: driver, block manager, no UI.

    The one place for the embedded default's Spark settings (demo, tests, benchmarks); ``conf``
    adds or overrides settings. The caller stops the session.
    """
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (pandas, pyarrow, protobuf live here); without
    # SPARK_LOCAL_IP Spark picks the first non-loopback interface for its block manager.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    from airflow_ckpt_provider.runtime.sparkchecks import IDLE_POLL

    settings = {
        IDLE_POLL[0]: IDLE_POLL[1],  # as every job's session (runtime/sparkchecks.job_session)
        "spark.driver.bindAddress": HOST,
        "spark.driver.host": HOST,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        **conf,
    }
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark



class EmbeddedServices:
    """S3 and Kafka together; Kafka stores its log on S3 when `kafka_on_s3` (topics survive kills)."""

    def __init__(
        self,
        *,
        s3_data_dir: Path | None = None,
        kafka_on_s3: bool = False,
        kafka_bucket: str = "tansu",
    ) -> None:
        self.s3 = EmbeddedS3(s3_data_dir)
        self.kafka = EmbeddedKafka(s3=self.s3 if kafka_on_s3 else None, bucket=kafka_bucket)

    def start(self) -> Self:
        """Start S3, then Kafka; if Kafka fails, S3 is stopped again."""
        self.s3.start()
        try:
            self.kafka.start()
        except BaseException:
            self.s3.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop Kafka first (it may write to S3), then S3; idempotent."""
        try:
            self.kafka.stop()
        finally:
            self.s3.stop()

    def close(self) -> None:
        """Stop both and remove their temporary work dirs."""
        try:
            self.kafka.close()
        finally:
            self.s3.close()

    def env(self) -> dict[str, str]:
        """Variables for child processes: the AWS_* of S3 plus KAFKA_BOOTSTRAP_SERVERS."""
        return {**self.s3.env(), "KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers}

    def __enter__(self) -> Self:
        """Start both; a start that failed closes both (work dirs included), as EmbeddedProcess does."""
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()



def _close_all() -> None:
    """Safety net at interpreter exit: close servers whose owner forgot (Kafka before S3)."""
    for server in sorted(unclosed, key=lambda p: isinstance(p, EmbeddedS3)):
        try:
            server.close()
        except Exception:  # best effort at exit: keep closing the others
            log.exception("Cannot stop %s at exit", server.name)


atexit.register(_close_all)
