"""Whose status is it: the supervisor keeps the user's restore until a driver of its own ran, ends as fenced
when a newer driver owns the job, records failed only over a status nobody else owns, and kills a driver whose
heartbeat stops or that ignores a stop request."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import replace

import pytest

from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.store.jobstore import LEASE, JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, Supervisor, SupervisorOutcome
from tests.support.supervisorfakes import (
    HOST,
    OTHER_PID,
    START,
    FakeClock,
    FakeProcess,
    Run,
    Spawner,
    put_lease,
    put_status,
    reports,
    supervise,
)

# -- whose status is it: restore on restart, newer drivers, giving up, heartbeats ---------------------


def test_restarts_keep_the_users_restore_until_a_driver_of_ours_reported_running(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.launcher.supervisor")
    runs = [
        Run(1),  # a transient error before restoring: no status at all
        Run(1, tick=reports(store, epoch=3, pid=OTHER_PID)),  # RUNNING, but written by a process not ours
        Run(1, tick=reports(store, JobState.STARTING, epoch=5, pid=5002)),  # ours, but never RUNNING
        Run(1, tick=reports(store, epoch=6, pid=5003)),  # ours, RUNNING
        Run(0),
    ]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=4, delay=1.0, clock=clock), store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 5)
    assert spawner.restores == ["latest-savepoint"] * 4 + ["latest-state"]
    assert [m for m in caplog.messages if "runs the job" in m] == [
        "job orders: driver pid 103 runs the job at epoch 6: restarts resume from latest-state"]
    assert "job orders: driver pid 104 started (attempt 5, restore latest-state)" in caplog.messages


def test_a_newer_driver_with_a_live_status_ends_supervision_as_fenced(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    def fenced(proc: FakeProcess) -> None:  # ours runs at epoch 4; at 5 s a driver elsewhere takes over
        if clock.now == START:
            put_status(store, JobState.RUNNING, 4, clock.now, pid=5000)
        elif clock.now == START + 5:
            put_lease(store, 5, clock.now)
            put_status(store, JobState.RUNNING, 5, clock.now, pid=77, host="host-b")

    runs = [Run(1, tick=fenced)]  # a fenced driver may exit 1 (cluster mode: spark-submit's own code)
    outcome, _ = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert outcome == SupervisorOutcome(Ending.FENCED, attempts=1, restarts=0, exit_code=1,
                                        reason="another driver (owner host-b:77:abcd, epoch 5) runs the job: "
                                               "not restarting")
    assert outcome.final.exit_code == 3
    assert clock.sleeps == []
    status = read_status(store)
    assert status is not None and (status.state, status.epoch) == (JobState.RUNNING, 5)


def test_a_lease_taken_after_ours_started_fences_a_driver_that_never_reported(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    def taken(proc: FakeProcess) -> None:
        put_lease(store, 5, START + 1)
        put_status(store, JobState.STARTING, 5, clock.now, pid=OTHER_PID)  # alive here, not in our group

    outcome, _ = supervise(spec, clock, [Run(1, runs_for=3.0, tick=taken)], FixedDelay(attempts=5, clock=clock),
                           store=store)
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.FENCED, 1, 1)
    assert outcome.reason == "another driver (owner host-b:77:abcd, epoch 5) runs the job: not restarting"


def _lease_then(store: JobStore, *, epoch: int = 5, acquired: float = START + 1, released: bool = False,
                state: JobState = JobState.RUNNING, at: float = START, pid: int = 77, host: str = "host-b",
                lease_bytes: bytes | None = None) -> Callable[[FakeProcess], None]:
    def tick(proc: FakeProcess) -> None:
        if lease_bytes is not None:
            store.storage.write(LEASE, lease_bytes)
        else:
            put_lease(store, epoch, acquired, released=released)
        put_status(store, state, epoch, at, pid=pid, host=host)

    return tick


@pytest.mark.parametrize(
    "world",
    [
        pytest.param({"at": START - 100}, id="its-status-is-stale"),
        pytest.param({"host": HOST, "pid": 4242}, id="it-ran-here-and-is-gone"),
        pytest.param({"released": True}, id="lease-released"),
        pytest.param({"state": JobState.FAILED}, id="it-failed"),
        pytest.param({"acquired": START - 1}, id="lease-taken-before-ours-started"),
        pytest.param({"lease_bytes": b"{not json"}, id="lease-unreadable"),
    ],
)
def test_no_fencing_without_a_newer_live_driver(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture, world: dict[str, object]
) -> None:
    # ignore[arg-type] below: world holds _lease_then's keywords
    runs = [Run(1, runs_for=3.0, tick=_lease_then(store, **world)), Run(0)]  # type: ignore[arg-type]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 2, 1)
    assert len(spawner.procs) == 2
    if "lease_bytes" in world:
        assert "cannot read the lease or status.json, restarting as usual" in caplog.text


def test_a_driver_of_ours_killed_hard_is_not_mistaken_for_a_newer_one(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    # kill -9: our driver's lease stays taken and its RUNNING status is fresh; it is ours by its epoch
    def ours(proc: FakeProcess) -> None:
        put_lease(store, 4, START + 1)
        put_status(store, JobState.RUNNING, 4, clock.now, pid=5000)

    runs = [Run(-9, runs_for=10.0, tick=ours), Run(0)]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=5, clock=clock), store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


def test_in_cluster_mode_our_driver_is_known_by_its_epoch(spec: SubmitSpec, clock: FakeClock, store: JobStore) -> None:
    # The driver runs on a cluster host: its pid says nothing here. Ours took the epoch after the lease's
    # before it started (3); it crashed holding the lease with a fresh RUNNING status: not a newer driver.
    put_lease(store, 3, START - 60, released=True)

    def remote(proc: FakeProcess) -> None:
        put_lease(store, 4, START + 1)
        put_status(store, JobState.RUNNING, 4, clock.now, pid=77, host="host-b")

    # a cluster-mode driver needs a checkpoint and a job store the cluster shares (the test's store stands for it)
    shared = replace(spec.config, store="s3://bucket/jobs", checkpoint="s3a://bucket/ckpt/orders")
    cluster = replace(spec, master="yarn", deploy_mode="cluster", config=shared)
    def stopped(proc: FakeProcess) -> None:  # the next one stops (its status says so: it wrote no end record)
        put_lease(store, 5, START + 20)
        put_status(store, JobState.STOPPED, 5, clock.now, pid=78, host="host-c")

    outcome, spawner = supervise(cluster, clock, [Run(1, tick=remote), Run(0, tick=stopped)],
                                 FixedDelay(attempts=5, clock=clock), store=store)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        # ours reported epoch 4 and died holding the lease: FAILED recorded at its epoch
        (lambda store: _lease_then(store, epoch=4, acquired=START, at=START, pid=5000, host=HOST), (4, True)),
        # a driver not ours holds the lease at epoch 9 and reports: left alone
        (lambda store: _lease_then(store, epoch=9, acquired=START - 60, at=START - 60), (9, False)),
        # that driver released the lease (stopped): nobody owns the job, FAILED recorded
        (lambda store: _lease_then(store, epoch=9, acquired=START - 60, released=True, state=JobState.STOPPED),
         (9, True)),
    ],
    ids=["ours", "another-drivers", "released"],
)
def test_giving_up_records_failed_only_over_a_status_no_other_driver_owns(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture,
    tick: Callable[[JobStore], Callable[[FakeProcess], None]], expected: tuple[int, bool],
) -> None:
    outcome, _ = supervise(spec, clock, [Run(1, tick=tick(store))], FixedDelay(attempts=0, clock=clock),
                           store=store)
    reason = "restart strategy exhausted (fixed-delay: 0 attempts, 1 s apart) after 0 restarts; " \
             "last failure: driver exited with code 1 (failed)"
    assert outcome == SupervisorOutcome(Ending.GAVE_UP, attempts=1, restarts=0, exit_code=1, reason=reason)
    status = read_status(store)
    assert status is not None
    epoch, recorded = expected
    assert status.epoch == epoch
    assert (status.state is JobState.FAILED, status.reason == reason) == (recorded, recorded)
    left_alone = "job orders: another driver (owner host-b:77:abcd, epoch 9) owns the job: not recording FAILED"
    assert (left_alone in caplog.messages) == (not recorded)


def test_a_driver_whose_heartbeat_stops_is_killed_and_restarted(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    # RUNNING once at the start, every 5 s expected: stale when older than 3 * 5 + 5 s; looks at 5 s (RUNNING), then
    # every three heartbeats (15 s): seen at 35 s
    runs = [Run(runs_for=None, term_code=1, tick=reports(store, once=True)), Run(0)]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(attempts=1, delay=2.0, clock=clock),
                                 store=store, poll=5.0)
    stuck, _ = spawner.procs
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=2, restarts=1, exit_code=0, reason="driver stopped")
    assert (stuck.signals, stuck.ended) == ([signal.SIGTERM], START + 35)
    assert ("job orders: no heartbeat in status.json for 35 s (every 5 s expected): terminating driver pid 100"
            in caplog.messages)
    assert spawner.restores == ["latest-savepoint", "latest-state"]


def _stops_with_savepoint(store: JobStore) -> Callable[[FakeProcess], None]:
    """RUNNING at the start, STOPPING at 5 s, then silent: the final savepoint sends no heartbeat."""

    def tick(proc: FakeProcess) -> None:
        if proc.clock.now in (START, START + 5):
            put_status(store, JobState.RUNNING if proc.clock.now == START else JobState.STOPPING, 4,
                       proc.clock.now, pid=5000)

    return tick


@pytest.mark.parametrize(
    "tick",
    [
        lambda store: reports(store, JobState.STARTING, once=True),
        lambda store: reports(store, pid=OTHER_PID, once=True),
        _stops_with_savepoint,
    ],
    ids=["never-running", "not-ours", "stopping-with-savepoint"],
)
def test_a_stale_status_kills_only_a_running_driver_of_ours(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, tick: Callable[[JobStore], Callable[[FakeProcess], None]]
) -> None:
    runs = [Run(0, runs_for=100.0, tick=tick(store))]
    outcome, spawner = supervise(spec, clock, runs, FixedDelay(clock=clock), store=store, poll=5.0)
    assert (outcome.final, outcome.attempts, spawner.procs[0].signals) == (Ending.STOPPED, 1, [])
    assert spawner.procs[0].ended == START + 100


def test_a_driver_ignoring_the_stop_request_is_killed_after_grace(spec: SubmitSpec, clock: FakeClock) -> None:
    holder: list[Supervisor] = []

    def stop_once(proc: FakeProcess) -> None:
        if clock.now == START + 10:
            holder[0].request_stop()

    spawner = Spawner(clock, [Run(runs_for=None, tick=stop_once)])  # ignores SIGTERM
    sup = Supervisor(spec, FixedDelay(attempts=5, clock=clock), clock=clock, sleep=clock.sleep, spawn=spawner,
                     poll=5.0, grace=30.0)
    holder.append(sup)
    outcome = sup.run()
    assert spawner.procs[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert spawner.procs[0].ended == START + 40
    assert outcome == SupervisorOutcome(Ending.STOPPED, attempts=1, restarts=0, exit_code=-9,
                                        reason="stop requested; driver exited with code -9")
