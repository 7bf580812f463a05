"""The admission gate's file: an absolute path for a driver launched on this host, a bare name (in the temporary
directory of the driver's own host) for a driver in the cluster."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy import gate


def test_no_gate_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gate.GATE_ENV, raising=False)
    assert gate.gate_path() is None and gate.close_gate() is False and not gate.gate_closed()


def test_an_absolute_path_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "gates" / "ckpt-gate-orders-0123456789ab"
    monkeypatch.setenv(gate.GATE_ENV, str(path))
    assert gate.gate_path() == path
    assert gate.close_gate() and path.exists() and gate.gate_closed()
    gate.open_gate()
    assert not path.exists() and not gate.gate_closed()


def test_a_bare_name_is_in_this_host_s_temporary_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what TMPDIR says on the driver's host
    monkeypatch.setenv(gate.GATE_ENV, "ckpt-gate-orders-0123456789ab")
    assert gate.gate_path() == tmp_path / "ckpt-gate-orders-0123456789ab"
    assert gate.close_gate() and gate.gate_closed()
    gate.open_gate()
    assert not (tmp_path / "ckpt-gate-orders-0123456789ab").exists()
