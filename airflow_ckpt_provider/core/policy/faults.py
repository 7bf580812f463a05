"""Crash points for fault-injection tests: kill -9 the whole driver at a named step, once (or hold it there while the
test makes a fault); and the benchmark's switch that pauses a driver's checkpoint snapshots (``checkpoints_paused``).

Design notes: docs/development.md#design-notes-corepolicyfaultspy."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "CKPT_FAULT_DIR"
#: A file whose existence pauses the driver's checkpoint snapshots after batches (bench/runtime_bench.py measures
#: the same job with and without them, in turns); savepoints are taken as always. Unset: never paused.
PAUSE_ENV = "CKPT_BENCH_PAUSE_CHECKPOINTS"


#: What an armed file says to hold at its point instead of killing: the process renames it to ``<name>.held`` and waits
#: there until the test deletes that file (a test then makes a fault while the step is in progress), at most
#: ``HOLD_MAX`` seconds.
HOLD = b"hold"
HOLD_MAX = 300.0


def crash_point(point: str, batch_id: int | None = None) -> None:
    """Kill this process group if the test armed ``point`` (optionally only for ``batch_id``); hold here instead if
    the armed file says ``hold``."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    names = [point] if batch_id is None else [f"{point}@{batch_id}", point]
    for name in names:
        armed = Path(directory) / name
        try:
            if armed.read_bytes().strip() == HOLD:
                _hold(armed, point, batch_id)
                return
            armed.unlink()  # the one process that deletes it fires
        except FileNotFoundError:
            continue
        pgid = _jvm_pgid()
        log.warning("crash point %s fired (batch %s): killing process group %d", point, batch_id, pgid)
        os.killpg(pgid, signal.SIGKILL)


def _hold(armed: Path, point: str, batch_id: int | None) -> None:
    held = armed.with_name(armed.name + ".held")
    armed.rename(held)  # the one process that renames it holds; FileNotFoundError: another one took it
    log.warning("hold point %s reached (batch %s): waiting until %s is deleted", point, batch_id, held)
    deadline = time.monotonic() + HOLD_MAX
    while held.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    log.warning("hold point %s released (batch %s)", point, batch_id)


def _jvm_pgid() -> int:
    """The process group of the nearest ancestor ``java`` process; this process's own group if none."""
    pid = os.getpid()
    for _ in range(16):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        if comm == "java":
            return os.getpgid(pid)
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4 of /proc/PID/stat: the parent's pid
        if pid <= 1:
            break
    return os.getpgid(0)


def checkpoints_paused() -> bool:
    """Whether the benchmark paused checkpoint snapshots (``PAUSE_ENV`` names a file that exists): one stat."""
    path = os.environ.get(PAUSE_ENV)
    return bool(path and os.path.exists(path))
