"""The supervisor's warm standby: a spare driver process, started once the running driver runs, that builds its
SparkSession and the job and waits (runtime/standby.py); a restart gives it the go instead of starting a new
process, and a new spare is started behind it. One that dies is replaced; one that dies before it was ready three
times in a row is not (its log says why).

Design notes: docs/runtime.md#design-notes-runtimestandbypy."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from airflow_ckpt_provider.launcher.driverprocess import ProcessLike, Spawn
from airflow_ckpt_provider.runtime.standby import StandbySlot

log = logging.getLogger(__name__)

#: Spares in a row that may die before they are ready; then none is started again.
FAILED_STARTS = 3


class Spare:
    """At most one standby driver of job ``job``: ``start`` one, ``check`` it, ``promote`` it at a restart, ``stop``
    it when supervision ends."""

    def __init__(self, job: str, spawn: Spawn, *, slots: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.spawn = spawn
        self.slots = slots or Path(tempfile.gettempdir())
        self.clock = clock
        self.proc: ProcessLike | None = None
        self.slot: StandbySlot | None = None
        self.started = 0.0
        self.failed_starts = 0  # spares in a row that died before they were ready
        self._promoted: StandbySlot | None = None  # the last promoted spare's files, removed at the next start

    def needed(self) -> bool:
        """Whether ``start`` would start one: none runs, and fewer than FAILED_STARTS in a row died unready."""
        self.check()
        return self.proc is None and self.failed_starts < FAILED_STARTS

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        """Start a spare unless one runs, or too many died before they were ready."""
        if not self.needed():
            return
        self._clear_promoted()
        self.slot = StandbySlot(self.slots / f"ckpt-standby-{self.job}-{uuid.uuid4().hex[:8]}.go", os.getpid())
        self.slot.clear()
        self.proc, self.started = self.spawn(argv, {**env, **self.slot.env()}, cwd), self.clock()
        log.info("job %s: standby driver pid %d started: it builds its session and the job, then waits",
                 self.job, self.proc.pid)

    def seen(self) -> tuple[int, bool] | None:
        """(pid, ready) of the spare that runs, or None: what the supervisor's record says of it."""
        if self.proc is None or self.slot is None or self.proc.poll() is not None:
            return None
        return self.proc.pid, self.slot.ready.exists()

    def check(self) -> None:
        """Forget a spare that exited (counted when it was not ready yet); ``start`` replaces it."""
        if self.proc is None or self.proc.poll() is None:
            return
        assert self.slot is not None
        was_ready = self.slot.ready.exists()
        self.failed_starts = 0 if was_ready else self.failed_starts + 1
        more = ("" if self.failed_starts < FAILED_STARTS else
                f"; {FAILED_STARTS} in a row died before they were ready: no standby is started again (see their "
                "log)")
        log.warning("job %s: standby driver pid %d exited with code %s %s%s", self.job, self.proc.pid,
                    self.proc.poll(), "while waiting" if was_ready else "before it was ready", more)
        self._forget()

    def promote(self) -> ProcessLike | None:
        """The ready spare, given the go: it takes the lease as a fresh start would; None when none is ready (then
        a spare still starting is stopped, and the caller starts a driver as without a standby)."""
        self.check()
        proc, slot = self.proc, self.slot
        if proc is None or slot is None or not slot.ready.exists():
            self.stop()
            return None
        waited = self.clock() - self.started
        slot.go.touch()
        log.info("job %s: standby driver pid %d takes over (ready, waited %.0f s)", self.job, proc.pid, waited)
        self._promoted, self.proc, self.slot = self.slot, None, None  # the running driver now
        return proc

    def stop(self) -> None:
        """Kill the spare, if any (it took no lease and wrote nothing): supervision ends, or it is not wanted."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)  # its process group: spark-submit, its JVM, the Python driver
            proc.wait()
            log.info("job %s: standby driver pid %d stopped", self.job, proc.pid)
        self._forget()
        self._clear_promoted()

    def _forget(self) -> None:
        if self.slot is not None:
            self.slot.clear()
        self.proc, self.slot = None, None

    def _clear_promoted(self) -> None:
        if self._promoted is not None:
            self._promoted.clear()
            self._promoted = None
