"""The admission gate's file: an absolute path for a driver launched on this host, a bare name (in the temporary
directory of the driver's own host) for a driver in the cluster."""

from __future__ import annotations

import tempfile
import time
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


def test_a_stop_parks_the_source_until_the_gate_opens_and_a_plain_close_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import threading

    monkeypatch.setenv(gate.GATE_ENV, str(tmp_path / "ckpt-gate-orders"))
    assert gate.hold_at_gate() is True and not gate.parked()  # an open gate: plan as usual

    assert gate.close_gate()  # a restore check's gate: no new data, no holding
    assert gate.hold_at_gate() is False and not gate.parked()

    assert gate.close_gate(park=True)
    held: list[bool] = []
    source = threading.Thread(target=lambda: held.append(gate.hold_at_gate(bound_s=60)))
    source.start()
    deadline = time.monotonic() + 10
    while not gate.parked():
        assert time.monotonic() < deadline, "the source never parked"
        time.sleep(0.01)
    assert source.is_alive() and held == []
    gate.open_gate()
    source.join(10)
    assert held == [True] and not gate.parked()


def test_a_source_held_past_its_bound_offers_no_data_and_leaves_no_marker(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(gate.GATE_ENV, str(tmp_path / "ckpt-gate-orders"))
    assert gate.close_gate(park=True)
    (tmp_path / "ckpt-gate-orders.parked").touch()  # a stale marker of a killed worker: cleared by the next close
    assert gate.close_gate(park=True) and not gate.parked()
    assert gate.hold_at_gate(bound_s=0.2) is False
    assert not gate.parked() and gate.gate_closed()
