"""Fixtures of the operators' tests (the job store and the fakes of launch and start_check are in
tests/unit/conftest.py)."""

from __future__ import annotations

import time

import pytest

from airflow_ckpt_provider.core.records.deployments import Launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.store.jobstore import LEASE, JobStore
from tests.support.operatorfakes import record_deployment, report
from tests.support.upgradefakes import Actors, World


@pytest.fixture(autouse=True)
def deferrable_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[operators] default_deferrable = True``: these tests take the deferred path unless they pass
    ``deferrable=False`` (the in-worker wait); the default itself is tested in test_base.py."""
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")


@pytest.fixture
def running_v1(store: JobStore) -> Launch:
    """v1 deployed and running at epoch 3, holding the lease."""
    record = record_deployment(store)
    report(store, epoch=3, code_version="v1")
    lease = LeaseRecord(job="orders", epoch=3, owner="driver-3", host="h", pid=42, acquired_at=time.time() - 5)
    store.storage.write(LEASE, lease.to_bytes())
    return record


@pytest.fixture
def actors(world: World, monkeypatch: pytest.MonkeyPatch) -> Actors:
    """start_actor played (each test file's ``world`` fixture sets up the job): the operation's actor runs in this
    process when ``act`` is set."""
    from airflow_ckpt_provider.operators import operation

    found = Actors(world)
    monkeypatch.setattr(operation, "start_actor", found)
    return found
