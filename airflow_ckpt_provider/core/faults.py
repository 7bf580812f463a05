"""Crash points for fault-injection tests: kill -9 the whole driver at a named step, once.

Sinks call ``crash_point("files.commit.after-manifest", batch_id)`` at each step of their commit
protocol. Nothing happens unless ``CKPT_FAULT_DIR`` names a directory holding a file called
``<point>`` (any batch) or ``<point>@<batch id>``: the first process that reaches the point deletes
the file (so the point fires once, also across restarts) and SIGKILLs its own process group, which is
the driver's spark-submit JVM, its Python driver and its Python workers, as ``kill -9`` of the driver
does. Tests arm a point by creating the file and see it fired when the file is gone.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "CKPT_FAULT_DIR"


def crash_point(point: str, batch_id: int | None = None) -> None:
    """Kill this process group if the test armed ``point`` (optionally only for ``batch_id``)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    names = [point] if batch_id is None else [f"{point}@{batch_id}", point]
    for name in names:
        try:
            (Path(directory) / name).unlink()  # the one process that deletes it fires
        except FileNotFoundError:
            continue
        log.warning("crash point %s fired (batch %s): killing process group %d", point, batch_id, os.getpgid(0))
        os.killpg(os.getpgid(0), signal.SIGKILL)
