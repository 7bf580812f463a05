"""Fixtures of the unit tests of the Airflow layer: job ``orders`` in a local store the default connection names, and
fakes of ``launch`` and ``start_check`` installed where the operators look them up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.launcher import deploy
from tests.support.operatorfakes import (
    FakeCheck,
    FakeLaunch,
    PopenCall,
)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """Job ``orders`` in a local store that the default store connection names; no Spark connection."""
    root = tmp_path / "store"
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT",
                       json.dumps({"conn_type": "ckpt_store", "extra": {"store_url": str(root)}}))
    monkeypatch.delenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", raising=False)
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    return JobStore(LocalStorage(root), "orders")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> FakeLaunch:
    fake = FakeLaunch()
    monkeypatch.setattr("airflow_ckpt_provider.launcher.handover.launch", fake)  # under start_job
    return fake


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Launch:
        pytest.fail("the operator launched the job")

    monkeypatch.setattr("airflow_ckpt_provider.launcher.handover.launch", refuse)  # under start_job


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> FakeCheck:
    fake = FakeCheck()
    monkeypatch.setattr("airflow_ckpt_provider.operators.upgrade.start_check", fake)
    return fake


@pytest.fixture
def popen_calls(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> list[PopenCall]:
    """subprocess.Popen for deploy.launch: records argv, env and what spec/last.json held when it was called."""
    calls: list[PopenCall] = []

    class FakePopen:
        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            calls.append((argv, env, read_launch(store)))
            self.pid = 4242

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(deploy.subprocess, "Popen", FakePopen)
    return calls
