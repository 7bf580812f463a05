"""A running driver whose supervisor was lost, adopted by a new supervisor: watched through the job store instead of a
process handle, so that a takeover by the supervision service does not restart a driver that still runs.

Design notes: docs/service.md#design-notes-launcheradoptionpy."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable

from airflow_ckpt_provider.core.errors import CkptError, StorageError
from airflow_ckpt_provider.core.records.control import RequestAction, submit_request
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, driver_live, read_status
from airflow_ckpt_provider.core.records.supervision import take_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.driverprocess import GroupOf
from airflow_ckpt_provider.runtime.exitcodes import EXIT_FAILED, EXIT_STOPPED

log = logging.getLogger("airflow_ckpt_provider.launcher.supervisor")


class AdoptedDriver:
    """The driver of ``epoch`` as a supervisor's process (launcher/driverprocess.ProcessLike), judged by its status in
    the job store: ``wait`` returns once it ended (STOPPED: 0; FAILED, or gone without a word: 1; or its own exit code
    from its end record ``run`` in cluster mode) or a newer driver took the job (1: the supervisor's ``_taken_over``
    then ends as fenced). A driver of this host is signalled as its own supervisor would (SIGTERM to the Python driver,
    SIGKILL to spark-submit's group); one elsewhere gets a cancel request for SIGTERM and, after SIGKILL, counts as
    gone (the next driver fences it)."""

    def __init__(self, store: JobStore, status: JobStatus, *, host: str, group_of: GroupOf, poll: float,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep, run: str | None = None) -> None:
        self.store, self.epoch, self.run = store, status.epoch, run
        self.host, self.group_of, self.interval = host, group_of, poll
        self.wall, self.clock, self.sleep = wall, clock, sleep
        self._pid = status.pid or 0
        self.here = status.host == host and status.pid is not None and group_of(status.pid) is not None
        self.returncode: int | None = None
        self._killed = False

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else self.clock() + timeout
        while self.returncode is None:
            self.returncode = EXIT_FAILED if self._killed else self._look()
            if self.returncode is not None:
                break
            left = None if deadline is None else deadline - self.clock()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"adopted driver of epoch {self.epoch}", timeout or 0.0)
            self.sleep(self.interval if left is None else min(self.interval, left))
        return self.returncode

    def _look(self) -> int | None:
        """The driver's exit code once it ended, else None (a store that does not answer: still running)."""
        try:
            status = read_status(self.store)
        except StorageError as err:
            log.warning("job %s: cannot read status.json while watching the adopted driver of epoch %d: %s",
                        self.store.job, self.epoch, err)
            return None
        if status is None or status.epoch != self.epoch:
            return EXIT_FAILED  # another driver reports now: the supervisor judges whether it took the job over
        if status.state is JobState.STOPPED:
            return self._word(EXIT_STOPPED)
        live = driver_live(status, self.wall(), host=self.host, pid_alive=lambda p: self.group_of(p) is not None)
        if status.state is JobState.FAILED or not live:
            return self._word(EXIT_FAILED)
        return None

    def _word(self, otherwise: int) -> int:
        """The exit code in the driver's end record (cluster mode), else ``otherwise``."""
        if self.run is None:
            return otherwise
        try:
            end = take_driver_end(self.store, self.run)
        except StorageError:
            return otherwise
        return otherwise if end is None else end.code

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        if self.here:
            group = self.group_of(self._pid)
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGTERM:
                    os.kill(self._pid, sig)  # the Python driver cancels its query, as under its own supervisor
                elif group is not None:
                    os.killpg(group, sig)
            return
        if sig == signal.SIGTERM:
            try:
                request = submit_request(self.store, RequestAction.CANCEL, self.epoch,
                                         requested_by="supervisor (adopted driver)")
                log.info("job %s: asked the adopted driver of epoch %d on another host to cancel (request %s)",
                         self.store.job, self.epoch, request.id)
            except CkptError as err:
                log.warning("job %s: could not ask the adopted driver of epoch %d to cancel: %s", self.store.job,
                            self.epoch, err)
        else:
            self._killed = True  # nothing reaches another host's process: the next driver fences it
