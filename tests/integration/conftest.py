"""Fixtures shared by the integration tests: a Spark session with ckpt-kafka, a job environment, its runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from tests.support.runtimejob import JobEnv, Run


@pytest.fixture(scope="module")
def kafka_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A test Spark session (one per module) with the ckpt-kafka source registered."""
    from airflow_ckpt_provider.kafka.source import register
    from tests.support import sparkjobs

    session = sparkjobs.spark_session(f"ckpt-{request.module.__name__.rsplit('.', 1)[-1]}")
    register(session)
    yield session
    session.stop()


@contextmanager
def sink_session(s3: EmbeddedS3, app: str, **conf: str) -> Iterator[Any]:
    """A test Spark session with the ckpt sinks registered whose Python workers reach SeaweedFS: the S3
    settings go to this process's environment (the driver's commit workers) and to the executors'."""
    from airflow_ckpt_provider.runtime.datasources import register_data_sources
    from tests.support import sparkjobs

    saved = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())
    session = sparkjobs.spark_session(app, **conf, **{f"spark.executorEnv.{k}": v for k, v in s3.env().items()})
    register_data_sources(session)
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path) -> JobEnv:
    return JobEnv(s3_server, kafka_server, tmp_path, bucket, topic)


@pytest.fixture
def launcher_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For tests whose processes the launcher starts from this one (restore checks, rescale steps, deployments):
    a CKPT_HOME of the test's own (the detached processes' records and logs) and this Python for Spark's workers.
    Returns that CKPT_HOME."""
    home = tmp_path / "home"
    monkeypatch.setenv("CKPT_HOME", str(home))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    return home


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Runs a test started; whatever is still alive at the end is killed."""
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None],
                             ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that started runs shows the tail of each run's log under its failure: what the job's
    processes said is often the only evidence of why (CI keeps no files)."""
    report = yield
    started = getattr(item, "funcargs", {}).get("runs")
    if report.failed and call.when == "call" and started:
        report.sections.append(("job logs", "\n".join(run.tail(80) for run in started)))
    return report
