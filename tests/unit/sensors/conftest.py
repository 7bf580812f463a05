"""Fixtures of the sensors' tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def deferrable_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[operators] default_deferrable = True``: these tests take the deferred path unless they pass
    ``deferrable=False`` (poke); the default itself is tested in test_sensors.py."""
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
