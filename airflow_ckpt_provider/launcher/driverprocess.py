"""A driver as a process on the launching host: spark-submit started in a session of its own, and the
signals that stop it (the Python driver alone for a graceful stop, the whole group for a kill).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from airflow_ckpt_provider.launcher.submit import ENTRYPOINT_PY


class ProcessLike(Protocol):
    """A started driver; ``wait`` raises ``subprocess.TimeoutExpired`` while it still runs."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None:
        """SIGTERM asks the driver to stop (cancel); SIGKILL ends its whole process group."""


class Spawn(Protocol):
    """Starts spark-submit: ``argv`` with ``env`` added to the inherited environment, in ``cwd`` if given."""

    def __call__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> ProcessLike: ...



#: The process group of a pid on this host, or None if no such process runs here.
GroupOf = Callable[[int], int | None]


class DriverProcess:
    """spark-submit in a session of its own: its JVM, the Python driver and the Python workers form one group.

    SIGTERM goes to the Python driver alone when it runs here (client mode): sent to the JVM too, the JVM's
    shutdown hook would stop the SparkContext under the driver while it cancels the query; a paused driver
    (SIGSTOP) gets SIGCONT after it, with its group, or it could not stop before the grace ends. Other signals,
    and SIGTERM in cluster mode (no local Python driver), go to the whole group.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is not None:
            return  # reaped: its pid, and so the group id, may belong to another process by now
        target = _python_driver(self._popen.pid) if sig == signal.SIGTERM else None
        with contextlib.suppress(ProcessLookupError):
            if target is not None:
                os.kill(target, sig)
                if _stopped(target):  # paused (SIGSTOP): it must run to stop; the group goes on with it
                    os.killpg(self._popen.pid, signal.SIGCONT)
            else:
                os.killpg(self._popen.pid, sig)


def _python_driver(pgid: int) -> int | None:
    """The pid of the process in group ``pgid`` that runs entrypoint.py, or None (not found, or no /proc)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    launch = str(ENTRYPOINT_PY).encode()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            if group == pgid and launch in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return None


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc/<pid>/stat: SIGSTOP, or a terminal's ^Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] in ("T", "t")


def process_group(pid: int) -> int | None:
    """The process group of ``pid`` on this host, or None if it does not run (any more)."""
    try:
        return os.getpgid(pid)
    except OSError:  # ProcessLookupError: gone
        return None


def spawn_driver(argv: list[str], env: dict[str, str], cwd: str | None = None) -> DriverProcess:
    """Start ``argv`` with ``env`` added to the inherited environment, as a process group leader."""
    return DriverProcess(subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, start_new_session=True))
