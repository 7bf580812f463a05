"""A supervisor that adopts the running driver of a lost one (the supervision service's takeover, launcher/adoption.py):
it watches that driver through status.json instead of starting one, ends with it when it stops, restarts from the
latest state when it dies, and starts one at once when there is nothing to adopt. Fake clock, fake spark-submit, a
local job store."""

from __future__ import annotations

import logging

import pytest

from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.records.supervision import (
    SupervisorRecord,
    SupervisorState,
    read_supervisor,
    write_supervisor,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending
from tests.support.supervisorfakes import START, FakeClock, Run, put_lease, put_status, supervise

LAUNCH = "20261129T110000Z-abc123"
EPOCH = 4


@pytest.fixture
def lost(store: JobStore) -> SupervisorRecord:
    """The lost supervisor: it had started two drivers of the launch; its driver of epoch 4 runs on host-b."""
    record = SupervisorRecord(job="orders", launch_id=LAUNCH, pid=4321, host="svc-a", state=SupervisorState.WATCHING,
                              started_at=START - 300, updated_at=START - 60, interval=5.0, attempt=2, epoch=EPOCH)
    write_supervisor(store, record)
    put_lease(store, EPOCH, START - 120)
    put_status(store, JobState.RUNNING, EPOCH, START, pid=77, host="host-b")
    return record


def heartbeats_until(store: JobStore, clock: FakeClock, end: float, state: JobState | None) -> None:
    """The adopted driver reports every time the clock moves until ``end``; then it writes ``state`` once (None:
    nothing more, it died without a word)."""
    real = clock.sleep
    said = [False]

    def sleep(seconds: float) -> None:
        real(seconds)
        if clock.now < end:
            put_status(store, JobState.RUNNING, EPOCH, clock.now, pid=77, host="host-b")
        elif state is not None and not said[0]:
            said[0] = True
            put_status(store, state, EPOCH, clock.now, pid=77, host="host-b")

    clock.sleep = sleep  # type: ignore[method-assign]  # the driver's heartbeats ride on the fake clock


def test_an_adopted_driver_that_stops_ends_supervision_without_any_driver_started(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, lost: SupervisorRecord, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.launcher.supervisor")
    heartbeats_until(store, clock, START + 30, JobState.STOPPED)
    outcome, spawner = supervise(spec, clock, [], FixedDelay(attempts=3, clock=clock), store=store, launch_id=LAUNCH,
                                 adopt_epoch=EPOCH)
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 2, 0)
    assert spawner.argvs == []  # nothing started: the running driver was watched until it stopped
    assert clock.now >= START + 30
    assert ("job orders: adopted the running driver of epoch 4 (pid 77 on host-b, attempt 2) whose supervisor was "
            "lost: watching it; restarts resume from latest-state") in caplog.messages
    record = read_supervisor(store, LAUNCH)
    assert record is not None and record.state is SupervisorState.ENDED and record.pid != lost.pid
    assert record.epoch == EPOCH  # what an owner losing this supervisor too would adopt


def test_an_adopted_driver_that_dies_is_restarted_from_the_latest_state_as_the_next_attempt(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, lost: SupervisorRecord
) -> None:
    heartbeats_until(store, clock, START + 30, None)  # then no heartbeat: it died (its host lost)
    outcome, spawner = supervise(spec, clock, [Run(0)], FixedDelay(attempts=3, delay=1.0, clock=clock), store=store,
                                 launch_id=LAUNCH, adopt_epoch=EPOCH)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 3)  # the adopted one was attempt 2
    assert spawner.restores == ["latest-state"]  # not the launch's first restore (latest-savepoint)
    assert 1.0 in clock.sleeps  # the restart strategy's delay, as after any driver's failure


def test_nothing_to_adopt_starts_a_driver_at_once_from_the_latest_state(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, lost: SupervisorRecord
) -> None:
    put_status(store, JobState.RUNNING, EPOCH, START - 600, pid=77, host="host-b")  # its last heartbeat, long ago
    outcome, spawner = supervise(spec, clock, [Run(0)], FixedDelay(attempts=3, delay=1.0, clock=clock), store=store,
                                 launch_id=LAUNCH, adopt_epoch=EPOCH)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    assert spawner.restores == ["latest-state"]
    assert 1.0 not in clock.sleeps  # no failure was watched: no restart delay
