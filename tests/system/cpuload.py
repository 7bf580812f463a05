"""A CPU burner for tests that must hold under load: one busy process per core, started and stopped by the test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

#: Spins until killed; its output is nobody's business.
_BURN = "while True:\n    pass\n"


@contextlib.contextmanager
def cpu_burner(processes: int | None = None) -> Iterator[list[int]]:
    """Keeps ``processes`` (default: one per core) busy-looping processes at normal priority while inside;
    yields their pids. They are killed on the way out, also when the body raises."""
    count = processes if processes is not None else (os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
