"""What a job's records say about it: a driver seen dead at once on its own host, the busy allowance of a
restoring or final-savepointing driver, a launch on its way (spec/last.json newer than the status), and a
driver whose launch a newer one superseded (runtime/driver.py refuses to take the lease then)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV, Deployment, Launch, record_end
from airflow_ckpt_provider.core.records.status import BUSY_ALLOWANCE, JobState, JobStatus, driver_live
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.core.views.jobview import JobView, starting_launch
from airflow_ckpt_provider.runtime.driver import _superseded

T0 = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped): nothing answers it."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    try:
        os.kill(proc.pid, 0)
    except ProcessLookupError:
        return proc.pid
    pytest.skip(f"pid {proc.pid} was reused at once")


def status(**changes: Any) -> JobStatus:
    """A fresh heartbeat at T0 of the driver of epoch 3, RUNNING since T0 - 100."""
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": T0,
                            "started_at": T0 - 100, "heartbeat_interval": 5.0}
    return JobStatus(**body | changes)


def view(store: JobStore, s: JobStatus | None, now: float = T0 + 1) -> JobView:
    return JobView(store, s, None, now)


def launched(store: JobStore, at: float, launch_id: str = "L1", **changes: Any) -> Launch:
    """spec/last.json: a launch at ``at`` (not ended unless ``changes`` say so)."""
    record = Launch("orders", Deployment("orders.py"), "latest-state", at, "airflow:dag.restart", launch_id,
                    **changes)
    store.storage.write(SPEC_LAST, record.to_bytes())
    return record


# -- JobView.stale ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.RUNNING, JobState.STOPPING])
def test_a_fresh_status_of_a_dead_process_on_this_host_is_stale_at_once(store: JobStore, dead_pid: int,
                                                                        state: JobState) -> None:
    s = status(state=state, host=socket.gethostname(), pid=dead_pid)
    assert driver_live(s, T0 + 1)  # the heartbeat alone says alive ...
    assert view(store, s).stale  # ... but its process is gone: a kill -9 is seen without waiting
    assert not view(store, s).live


def test_a_live_process_on_this_host_is_not_stale(store: JobStore) -> None:
    assert not view(store, status(host=socket.gethostname(), pid=os.getpid())).stale


def test_a_pid_on_another_host_is_not_checked(store: JobStore, dead_pid: int) -> None:
    s = status(host=f"not-{socket.gethostname()}", pid=dead_pid)
    assert not view(store, s).stale  # that pid means nothing here: the heartbeat decides
    assert view(store, s, now=T0 + 20.5).stale  # 3 * 5 + 5 s without one


def test_a_status_without_a_pid_goes_by_its_heartbeat(store: JobStore) -> None:
    s = status(host=socket.gethostname(), pid=None)
    assert not view(store, s).stale and view(store, s, now=T0 + 20.5).stale


@pytest.mark.parametrize("state", [JobState.STOPPED, JobState.FAILED])
def test_an_ended_driver_is_never_stale(store: JobStore, dead_pid: int, state: JobState) -> None:
    assert not view(store, status(state=state, host=socket.gethostname(), pid=dead_pid), now=T0 + 1e6).stale
    assert not view(store, None).stale


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.STOPPING])
def test_a_restoring_or_final_savepointing_driver_is_not_stale_within_the_busy_allowance(store: JobStore,
                                                                                       state: JobState) -> None:
    s = status(state=state)  # another host: only the heartbeat counts
    assert not view(store, s, now=T0 + 60).stale  # a RUNNING driver would be stale after 20 s
    assert not view(store, s, now=T0 + BUSY_ALLOWANCE).stale
    assert view(store, s, now=T0 + BUSY_ALLOWANCE + 1).stale
    assert view(store, status(), now=T0 + 60).stale


# -- starting_launch ---------------------------------------------------------------------------------------


def test_no_launch_record_is_no_launch_on_its_way(store: JobStore) -> None:
    assert starting_launch(store, None, T0, 600) is None
    assert starting_launch(store, status(state=JobState.STOPPED), T0, 600) is None


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b'"a string"'])
def test_an_unreadable_launch_record_is_no_launch_on_its_way(store: JobStore, data: bytes) -> None:
    store.storage.write(SPEC_LAST, data)
    assert starting_launch(store, None, T0, 600) is None


def test_a_young_launch_without_a_status_is_on_its_way(store: JobStore) -> None:
    record = launched(store, T0 - 10)
    found = starting_launch(store, None, T0, 600)
    assert found is not None and (found.launch_id, found.launched_at) == ("L1", T0 - 10)
    assert found == record


@pytest.mark.parametrize("state", list(JobState))
def test_a_launch_after_the_status_s_driver_started_is_on_its_way(store: JobStore, state: JobState) -> None:
    launched(store, T0 - 10)
    found = starting_launch(store, status(state=state, started_at=T0 - 100), T0, 600)
    assert found is not None and found.launch_id == "L1"


def test_the_launch_of_the_driver_that_reported_is_not_on_its_way(store: JobStore) -> None:
    launched(store, T0 - 10)
    assert starting_launch(store, status(started_at=T0 - 5), T0, 600) is None  # its driver started after it
    assert starting_launch(store, status(started_at=T0 - 10), T0, 600) is None  # the same instant: not newer


def test_a_launch_older_than_the_start_timeout_is_not_on_its_way(store: JobStore) -> None:
    launched(store, T0 - 600)
    assert starting_launch(store, None, T0 - 0.5, 600) is not None
    assert starting_launch(store, None, T0, 600) is None  # it died unrecorded
    assert starting_launch(store, None, T0, 601) is not None


def test_a_launch_whose_end_was_recorded_is_not_on_its_way(store: JobStore) -> None:
    launched(store, T0 - 10)
    assert record_end(store, "L1", ending="config-error", exit_code=2, reason="bad input")
    assert starting_launch(store, None, T0, 600) is None
    assert starting_launch(store, status(state=JobState.STOPPED), T0, 600) is None


# -- runtime/driver.py: a superseded launch does not take the lease ------------------------------------------


def test_a_driver_of_a_superseded_launch_says_so(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    launched(store, T0, "L2")
    monkeypatch.setenv(LAUNCH_ENV, "L1")
    assert _superseded(store) == "launch L1 was superseded by launch L2 (airflow:dag.restart)"


def test_the_driver_of_the_latest_launch_goes_on(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    launched(store, T0, "L1")
    monkeypatch.setenv(LAUNCH_ENV, "L1")
    assert _superseded(store) == ""
    launched(store, T0, "L1", ended_at=T0 + 5, exit_code=1)  # ended: still its own record, not a newer launch
    assert _superseded(store) == ""


def test_a_driver_not_launched_by_deploy_goes_on(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    launched(store, T0, "L2")
    monkeypatch.delenv(LAUNCH_ENV, raising=False)  # `ckpt run` by hand, or spark-submit
    assert _superseded(store) == ""
    monkeypatch.setenv(LAUNCH_ENV, "")
    assert _superseded(store) == ""


@pytest.mark.parametrize("data", [None, b"{not json", b"[]", b'{"launch_id": null}'])
def test_without_a_readable_launch_record_the_driver_goes_on(store: JobStore, monkeypatch: pytest.MonkeyPatch,
                                                             data: bytes | None) -> None:
    if data is not None:
        store.storage.write(SPEC_LAST, data)
    monkeypatch.setenv(LAUNCH_ENV, "L1")
    assert _superseded(store) == ""
