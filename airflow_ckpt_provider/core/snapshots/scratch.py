"""Scratch directories a process removes when it ends, and the sweep of those a killed process left behind.

A restore check or a repartition copies the state into ``<temp dir>/ckpt-restore-check-<job>-*``; a SIGKILL leaves
the copy there (it can be as large as the state). Each scratch directory holds an owner marker (``OWNER``: the pid
and host of its process); the next check on the host removes the directories whose owner is gone, one log line
each with its size. A directory without a marker, of another host, or whose owner still runs is never removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.store.progress import human_bytes

log = logging.getLogger(__name__)

#: The owner marker inside a scratch directory.
OWNER = ".ckpt-owner.json"


def make_scratch(prefix: str, job: str, *, parent: str | None = None) -> Path:
    """A new directory ``<parent or the temp dir>/<prefix>*`` marked as this process's."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (root / OWNER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "job": job}))
    return root


def sweep_scratch(prefix: str, job: str, *, parent: str | None = None,
                  alive: Callable[[int], bool] = pid_alive) -> list[tuple[Path, int]]:
    """Remove the ``prefix*`` directories of ``parent`` (the temp dir) whose owner process of this host is gone;
    returns them with their sizes in bytes. Errors are logged, never raised: a sweep must not fail a check."""
    removed = []
    here = socket.gethostname()
    for path in sorted(Path(parent or tempfile.gettempdir()).glob(f"{prefix}*")):
        try:
            owner = json.loads((path / OWNER).read_text())
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no marker (an older version's, or not ours): its owner is unknown, it stays
        if host != here or pid == os.getpid() or alive(pid):
            continue
        size = _size(path)
        try:
            shutil.rmtree(path)
        except OSError as err:
            log.warning("job %s: cannot remove %s, left by process %d that is gone: %s", job, path, pid, err)
            continue
        log.info("job %s: removed %s (%s), a scratch copy left by process %d, which is gone (killed during a restore "
                 "check or repartition)", owner.get("job") or job, path, human_bytes(size), pid)
        removed.append((path, size))
    return removed


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += (Path(dirpath) / name).lstat().st_size
    return total
