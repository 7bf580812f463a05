"""Crash points armed to hold: the process waits at the point until the test deletes the held file."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy.faults import ENV, HOLD, crash_point


def test_a_point_armed_to_hold_waits_there_until_the_held_file_is_deleted_then_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    (tmp_path / "ledger.before-last-look@4").write_bytes(HOLD)
    passed: list[int] = []
    step = threading.Thread(target=lambda: (crash_point("ledger.before-last-look", 4), passed.append(4)))
    crash_point("ledger.before-last-look", 3)  # another batch: not armed, goes on at once
    step.start()
    held = tmp_path / "ledger.before-last-look@4.held"
    deadline = time.monotonic() + 10
    while not held.exists():
        assert time.monotonic() < deadline, "the point never held"
        time.sleep(0.01)
    assert passed == [] and step.is_alive()  # held: the file says so, and the step has not gone on
    held.unlink()
    step.join(10)
    assert passed == [4] and not any(tmp_path.iterdir())
