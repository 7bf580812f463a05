"""Fixtures of the launcher's tests: a fake clock and a submit spec of job ``orders`` (its store is the shared
``store`` of tests/unit/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from tests.support.supervisorfakes import (
    FakeClock,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    """A job file that exists (its content does not matter to building a command)."""
    path = tmp_path / "count.py"
    path.write_text("# a job\n")
    return path


@pytest.fixture
def spec(tmp_path: Path, job_file: Path) -> SubmitSpec:
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "ckpt"),
                           restore="latest-savepoint")
    return SubmitSpec(job_file=str(job_file), config=config, spark_submit="/opt/spark/bin/spark-submit")
