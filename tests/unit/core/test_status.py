"""The job state tables and ``driver_live``, the one rule of whether a status's driver still runs: the heartbeat
limit and its edges, the busy allowance of a restoring or final-savepointing driver, an explicit heartbeat
timeout, ended states, and the probe of a process on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.status import (
    ACTIVE_STATES,
    BUSY_ALLOWANCE,
    FAILURE_STATES,
    TERMINAL_STATES,
    JobState,
    JobStatus,
    driver_live,
    heartbeat_limit,
    read_status,
    write_status,
)
from airflow_ckpt_provider.core.store.jobstore import STATUS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage

HOST = "worker-1"


def _status(**changes: Any) -> JobStatus:
    base: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": 1000.0,
                            "started_at": 900.0}
    return JobStatus(**base | changes)


def test_state_tables_partition_the_states() -> None:
    assert set(JobState) == ACTIVE_STATES | TERMINAL_STATES
    assert not ACTIVE_STATES & TERMINAL_STATES
    assert FAILURE_STATES <= TERMINAL_STATES


def test_age_is_seconds_since_the_heartbeat() -> None:
    assert _status(updated_at=1000.0).age(now=1042.5) == 42.5


# -- the heartbeat limit ------------------------------------------------------------------------------------


def test_a_running_driver_is_live_until_three_missed_heartbeats_plus_five_seconds() -> None:
    status = _status(state=JobState.RUNNING, updated_at=1000.0, heartbeat_interval=5.0)  # 3 * 5 + 5 = 20 s
    assert heartbeat_limit(status) == 20.0
    assert driver_live(status, 1000.0)
    assert driver_live(status, 1020.0)  # the limit itself is still live
    assert not driver_live(status, 1020.001)
    slow = _status(state=JobState.RUNNING, updated_at=1000.0, heartbeat_interval=60.0)  # limit: 185 s
    assert driver_live(slow, 1185.0)
    assert not driver_live(slow, 1185.5)


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.STOPPING])
def test_a_restoring_or_final_savepointing_driver_gets_the_busy_allowance(state: JobState) -> None:
    status = _status(state=state, updated_at=1000.0, heartbeat_interval=5.0)
    assert heartbeat_limit(status) == BUSY_ALLOWANCE
    assert driver_live(status, 1000.0 + BUSY_ALLOWANCE)
    assert not driver_live(status, 1000.0 + BUSY_ALLOWANCE + 0.001)
    slow = _status(state=state, updated_at=1000.0, heartbeat_interval=200.0)  # 3 * 200 + 5 > the allowance
    assert driver_live(slow, 1605.0)
    assert not driver_live(slow, 1605.5)


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.STOPPING])
def test_busy_timeout_replaces_the_allowance(state: JobState) -> None:
    status = _status(state=state, updated_at=1000.0)
    assert driver_live(status, 1900.0, busy_timeout=900.0)
    assert not driver_live(status, 1900.5, busy_timeout=900.0)
    assert not driver_live(status, 1025.0, busy_timeout=1.0)  # never below the heartbeat limit: 20 s here
    assert driver_live(status, 1020.0, busy_timeout=1.0)


def test_busy_timeout_does_not_extend_a_running_driver() -> None:
    assert not driver_live(_status(updated_at=1000.0), 1021.0, busy_timeout=900.0)


def test_heartbeat_timeout_overrides_three_intervals() -> None:
    status = _status(updated_at=1000.0, heartbeat_interval=5.0)
    assert heartbeat_limit(status, heartbeat_timeout=60.0) == 60.0
    assert driver_live(status, 1060.0, heartbeat_timeout=60.0)
    assert not driver_live(status, 1060.5, heartbeat_timeout=60.0)
    assert not driver_live(status, 1002.0, heartbeat_timeout=1.0)  # shorter than the default, too
    starting = _status(state=JobState.STARTING, updated_at=1000.0)
    assert driver_live(starting, 1000.0 + BUSY_ALLOWANCE, heartbeat_timeout=1.0)  # the busy allowance still holds


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_an_ended_driver_is_never_live(state: JobState) -> None:
    assert not driver_live(_status(state=state, updated_at=1000.0), 1000.0)  # however fresh its last status
    assert not driver_live(_status(state=state, updated_at=0.0), 1e9)


def test_a_clock_behind_the_driver_s_is_live() -> None:
    assert driver_live(_status(updated_at=1000.0), 900.0)


# -- a process on this host ----------------------------------------------------------------------------------


def test_a_dead_process_on_this_host_is_not_live_however_fresh_its_heartbeat() -> None:
    status = _status(host=HOST, pid=4242)
    probed: list[int] = []

    def dead(pid: int) -> bool:
        probed.append(pid)
        return False

    assert not driver_live(status, 1000.0, host=HOST, pid_alive=dead)
    assert probed == [4242]
    assert driver_live(status, 1000.0, host=HOST, pid_alive=lambda pid: True)


def test_the_probe_is_asked_only_for_a_pid_of_this_host() -> None:
    def refuse(pid: int) -> bool:
        raise AssertionError(f"probed pid {pid}")

    assert driver_live(_status(host="worker-2", pid=4242), 1000.0, host=HOST, pid_alive=refuse)
    assert driver_live(_status(host=HOST, pid=None), 1000.0, host=HOST, pid_alive=refuse)
    assert not driver_live(_status(host=HOST, pid=4242, state=JobState.FAILED), 1000.0, host=HOST, pid_alive=refuse)


def test_a_live_process_on_this_host_still_needs_its_heartbeat() -> None:
    status = _status(host=HOST, pid=4242, updated_at=1000.0)
    assert not driver_live(status, 1020.5, host=HOST, pid_alive=lambda pid: True)


def test_a_restarting_job_is_live_until_its_restart_is_late_by_the_heartbeat_limit() -> None:
    from airflow_ckpt_provider.core.records.status import Restart, RestartOwner

    restart = Restart(RestartOwner.SUPERVISOR, 2, "driver exited with code 137", 1.5, at=1000.0,
                      expected_by=1000.0 + BUSY_ALLOWANCE + 100.0)
    status = _status(state=JobState.RESTARTING, updated_at=1000.0, heartbeat_interval=5.0, restart=restart.to_dict())
    assert status.current_restart() == restart
    assert heartbeat_limit(status) == BUSY_ALLOWANCE + 100.0 + 20.0  # expected_by, then three beats + 5 s
    assert driver_live(status, 1000.0 + BUSY_ALLOWANCE + 120.0)
    assert not driver_live(status, 1000.0 + BUSY_ALLOWANCE + 120.5)
    soon = _status(state=JobState.RESTARTING, updated_at=1000.0, restart={**restart.to_dict(), "expected_by": 1010.0})
    assert heartbeat_limit(soon) == BUSY_ALLOWANCE  # never less than a restoring driver gets
    assert _status(restart=restart.to_dict()).current_restart() is None  # RUNNING: no restart in progress


class _NewerWritesFirst(LocalStorage):
    """A store where a newer driver's status lands between an older writer's read and its write, once."""

    def __init__(self, root: Path, newer: bytes) -> None:
        super().__init__(root)
        self.newer: bytes | None = newer

    def write_if(self, key: str, data: bytes, tag: str | None) -> bool:
        if self.newer is not None:
            newer, self.newer = self.newer, None
            self.write(key, newer)
        return super().write_if(key, data, tag)


def test_a_stalled_older_driver_never_replaces_a_newer_drivers_status(tmp_path: Path) -> None:
    """Issue 41: the older driver read status.json (its own epoch 3), stalled, and writes after the driver of epoch 4
    reported: its write loses the compare-and-swap, it reads again, sees epoch 4 and writes nothing."""
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage = _NewerWritesFirst(tmp_path / "orders", _status(epoch=4, state=JobState.STARTING).to_bytes())
    store.storage.write(STATUS, _status().to_bytes())
    assert not write_status(store, _status(reason="the stalled driver's heartbeat"))
    assert read_status(store) == _status(epoch=4, state=JobState.STARTING)


def test_a_status_write_lost_to_the_same_epoch_is_tried_again(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage = _NewerWritesFirst(tmp_path / "orders", _status(reason="the heartbeat thread").to_bytes())
    assert write_status(store, _status(reason="a batch's report"))
    assert read_status(store) == _status(reason="a batch's report")


class _Counting(LocalStorage):
    """Counts the reads and conditional writes of status.json its callers make (S3 compares on its side; a local
    file's compare-and-swap reads under a lock, which is not counted)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads = self.swaps = 0
        self._swapping = False

    def read_versioned(self, key: str):  # type: ignore[no-untyped-def]  # as LocalStorage's
        self.reads += key == STATUS and not self._swapping
        return super().read_versioned(key)

    def swap(self, key: str, data: bytes, tag: str | None) -> str | None:
        self.swaps += key == STATUS
        self._swapping = True
        try:
            return super().swap(key, data, tag)
        finally:
            self._swapping = False


def test_the_drivers_reports_are_one_write_each_and_read_again_only_after_another_writer(tmp_path: Path) -> None:
    """The reporter's StatusWriter keeps the tag of its last write: one conditional PUT per report. Another writer
    in between (the supervisor) fails its swap once: it reads, then writes; a newer driver's status stops it."""
    from airflow_ckpt_provider.core.records.status import StatusWriter

    storage = _Counting(tmp_path / "orders")
    store = JobStore(LocalStorage(tmp_path), "orders")
    store.storage = storage
    writer = StatusWriter(store)
    for batch in range(5):
        assert writer.write(_status(batch_id=batch))
    assert (storage.reads, storage.swaps) == (1, 5)  # the first report read what was there
    storage.write(STATUS, _status(reason="the supervisor").to_bytes())
    assert writer.write(_status(batch_id=5))
    assert (storage.reads, storage.swaps) == (2, 7) and read_status(store) == _status(batch_id=5)
    storage.write(STATUS, _status(epoch=4, state=JobState.STARTING).to_bytes())
    assert not writer.write(_status(batch_id=6))  # a newer driver reports there now: nothing written
    assert read_status(store) == _status(epoch=4, state=JobState.STARTING)
