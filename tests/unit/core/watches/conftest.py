"""Fixtures of the watches' tests: job ``orders`` in a local store, and a Spark checkpoint to snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support.ckptfactory import make_checkpoint


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


@pytest.fixture
def checkpoint(tmp_path: Path) -> LocalStorage:
    """A local checkpoint with three completed batches."""
    return LocalStorage(make_checkpoint(tmp_path / "ckpt", 3))
