"""Fixtures shared by the integration tests that need Spark with the ckpt-kafka source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def kafka_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A test Spark session (one per module) with the ckpt-kafka source registered."""
    from airflow_ckpt_provider.kafka.source import register
    from tests import sparkjobs

    session = sparkjobs.spark_session(f"ckpt-{request.module.__name__.rsplit('.', 1)[-1]}")
    register(session)
    yield session
    session.stop()
