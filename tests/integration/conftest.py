"""Fixtures shared by the integration tests: a Spark session with ckpt-kafka, a job environment, its runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from tests.runtimejob import JobEnv, Run


@pytest.fixture(scope="module")
def kafka_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A test Spark session (one per module) with the ckpt-kafka source registered."""
    from airflow_ckpt_provider.kafka.source import register
    from tests import sparkjobs

    session = sparkjobs.spark_session(f"ckpt-{request.module.__name__.rsplit('.', 1)[-1]}")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path) -> JobEnv:
    return JobEnv(s3_server, kafka_server, tmp_path, bucket, topic)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Runs a test started; whatever is still alive at the end is killed."""
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()
