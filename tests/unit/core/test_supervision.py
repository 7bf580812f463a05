"""core/records/supervision.py: which supervisor owns the job, and whether it is live (ended, heartbeat, pid on this
host, superseded by a newer launch)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.supervision import (
    SupervisorState,
    latest_supervisor,
    live_supervisor,
    observe_supervision,
    process_alive,
    supervisor_key,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from tests.support.watchrecords import T0, relaunch, supervised


def test_the_newest_launch_id_is_the_owner_and_an_ended_one_owns_nothing(store: JobStore) -> None:
    supervised(store, T0, launch_id="20270115T070000Z-cccccc")
    newer = supervised(store, T0, launch_id="20270115T080000Z-aaaaaa")
    assert latest_supervisor(store) == newer
    assert live_supervisor(store, T0 + 20) == newer  # 3 polls + 5 s
    seen = observe_supervision(store, T0 + 21)
    assert (seen.live, seen.why_not) == (False, "is gone: no heartbeat for 21 s (every 5 s expected)")
    supervised(store, T0 + 1, launch_id=newer.launch_id, state=SupervisorState.ENDED, ending="stopped",
               end_reason="driver stopped")
    seen = observe_supervision(store, T0 + 2)
    assert not seen.live
    assert seen.gone() == ("its supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) ended (stopped, exit "
                           "code 1) at 08:00:01Z: driver stopped")


def test_on_this_host_the_supervisors_process_decides(store: JobStore) -> None:
    host = socket.gethostname()
    supervised(store, T0, host=host, pid=os.getpid())
    assert live_supervisor(store, T0 + 120) is not None  # silent for 120 s, but its process runs
    supervised(store, T0, host=host, pid=2**22 + 1)  # above pid_max: no such process
    seen = observe_supervision(store, T0 + 1)
    assert (seen.live, seen.why_not) == (False, "is gone: its process no longer exists")


def test_a_killed_supervisor_left_a_zombie_is_gone(store: JobStore) -> None:
    """A supervisor orphaned by the worker's death and killed is a zombie until pid 1 reaps it (a container init
    may never): kill(pid, 0) still finds it, the probe must not."""
    child = subprocess.Popen(["sleep", "60"])  # not waited for: a zombie of this process once killed
    try:
        host = socket.gethostname()
        supervised(store, T0, host=host, pid=child.pid)
        assert process_alive(child.pid) and live_supervisor(store, T0 + 1) is not None
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, 0)  # still there, unreaped: a zombie
        seen = observe_supervision(store, T0 + 1)
        assert (seen.live, seen.why_not) == (False, "is gone: its process no longer exists")
    finally:
        child.kill()
        child.wait()


def test_a_supervisor_superseded_by_a_newer_launch_owns_nothing(store: JobStore) -> None:
    supervised(store, T0, standalone=False)  # started at T0 - 300
    assert live_supervisor(store, T0) is not None
    relaunch(store, T0 - 50, launch_id="20270115T080500Z-bbbbbb")  # a restart or an upgrade, its supervisor starting
    seen = observe_supervision(store, T0)
    assert (seen.live, seen.why_not) == (False, "is superseded by launch 20270115T080500Z-bbbbbb (by "
                                                "airflow:dag.restart)")


def test_a_malformed_record_is_a_storage_error_naming_it(store: JobStore) -> None:
    store.storage.write(supervisor_key("20270115T080000Z-aaaaaa"), b"{}")
    with pytest.raises(StorageError, match=r"supervisor record .*20270115T080000Z-aaaaaa.json is not valid: Object "
                                           "missing required field `job`"):
        latest_supervisor(store)
