"""Scratch copies left by killed restore checks (issue 39, item 6): removed at the next check when their owner
process is gone, never when it runs, is of another host or is unknown."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.snapshots.scratch import OWNER, make_scratch, sweep_scratch
from airflow_ckpt_provider.core.store.progress import human_bytes

DEAD = 4_000_000  # above any pid_max: no such process


def _left(parent: Path, name: str, *, pid: int, host: str | None = None, size: int = 3000) -> Path:
    path = parent / name
    (path / "checkpoint" / "state").mkdir(parents=True)
    (path / "checkpoint" / "state" / "1.delta").write_bytes(b"x" * size)
    (path / OWNER).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "job": "orders"}))
    return path


def test_a_scratch_dir_is_marked_with_its_owner(tmp_path: Path) -> None:
    root = make_scratch("ckpt-restore-check-orders-", "orders", parent=str(tmp_path))
    assert root.parent == tmp_path and root.name.startswith("ckpt-restore-check-orders-")
    assert json.loads((root / OWNER).read_text()) == {"pid": os.getpid(), "host": socket.gethostname(),
                                                        "job": "orders"}
    assert sweep_scratch("ckpt-restore-check-", "orders", parent=str(tmp_path)) == []  # ours, and alive
    assert root.exists()


def test_only_the_copies_of_dead_processes_of_this_host_are_removed(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    dead = _left(tmp_path, "ckpt-restore-check-orders-dead", pid=DEAD)
    live = _left(tmp_path, "ckpt-restore-check-orders-live", pid=os.getppid())
    other_host = _left(tmp_path, "ckpt-restore-check-orders-far", pid=DEAD, host="another-host")
    unknown = tmp_path / "ckpt-restore-check-nomarker"
    unknown.mkdir()
    unrelated = _left(tmp_path, "spark-123", pid=DEAD)
    removed = sweep_scratch("ckpt-restore-check-", "orders", parent=str(tmp_path))
    assert [path for path, _ in removed] == [dead] and removed[0][1] >= 3000
    assert not dead.exists() and live.exists() and other_host.exists() and unknown.exists() and unrelated.exists()
    [line] = [m for m in caplog.messages if "removed" in m]
    size = human_bytes(removed[0][1])
    assert line == (f"job orders: removed {dead} ({size}), a scratch copy left by process {DEAD}, which is gone "
                    "(killed during a restore check or repartition)")


def test_a_pid_said_alive_is_never_removed(tmp_path: Path) -> None:
    kept = _left(tmp_path, "ckpt-restore-check-orders-x", pid=DEAD)
    assert sweep_scratch("ckpt-restore-check-", "orders", parent=str(tmp_path), alive=lambda pid: True) == []
    assert kept.exists()
