"""One owner per restart (issue 15) in the supervisor, on fake processes and a fake clock: RESTARTING with its
own pid before the next driver spawns, its own heartbeat record, codes 5/6/7 ending supervision with the
driver's code and reason, and no heartbeat verdict right after the store was unreadable."""

from __future__ import annotations

import os
import signal

import pytest

from airflow_ckpt_provider.core.errors import UnreachableError
from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, read_launch
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, Restart, RestartOwner, read_status
from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, read_supervisor
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, STATUS, JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, Supervisor, SupervisorOutcome
from tests.support.supervisorfakes import HOST, START, FakeClock, FakeProcess, Run, Spawner, supervise


def running(store: JobStore, clock: FakeClock, *, epoch: int = 4, batch: int = 7, pid: int = 5000,
            at: float | None = None) -> None:
    """status.json as the Python driver ``pid`` writes it: RUNNING at ``batch``, its heartbeat at ``at``."""
    now = clock.now if at is None else at
    store.storage.write(STATUS, JobStatus("orders", JobState.RUNNING, epoch, now, START, batch_id=batch, pid=pid,
                                          host=HOST).to_bytes())


def test_a_dead_driver_is_marked_restarting_by_the_supervisor_before_the_next_driver_spawns(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[JobStatus | None] = []

    def first(proc: FakeProcess) -> None:
        running(store, clock)

    def second(proc: FakeProcess) -> None:
        if clock.now == proc.started:  # what the next driver finds when it starts
            seen.append(read_status(store))

    outcome, spawner = supervise(spec, clock, [Run(-9, runs_for=20.0, tick=first), Run(0, tick=second)],
                                 FixedDelay(attempts=3, delay=4.0, clock=clock), store=store, poll=5.0)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)
    [status] = seen
    assert status is not None
    assert (status.state, status.epoch, status.batch_id, status.pid, status.host) == (
        JobState.RESTARTING, 4, 7, os.getpid(), HOST)  # the dead driver's epoch, the supervisor's own pid
    restart = status.current_restart()
    # died at START + 20; RUNNING seen at the first poll (5 s): allowance max(30, 2 x 5 + 5) = 30 s
    assert restart == Restart(by=RestartOwner.SUPERVISOR, attempt=1, cause="exit code -9: signal 9", delay=4.0,
                              at=START + 20, expected_by=START + 20 + 4 + 30, from_batch=7)
    assert spawner.procs[1].started == START + 24
    [line] = [m for m in caplog.messages if "restarting in" in m]
    assert line == ("job orders: driver pid 100 died (exit code -9: signal 9) after 20 s at batch 7: restarting in "
                    "4.0 s (attempt 1, strategy fixed-delay: 3 attempts, 4 s apart; expected running by 00:17:34Z: "
                    "2 x the last cold start of 5 s + a poll, at least 30 s)")


def test_a_newer_drivers_status_is_never_marked_restarting(spec: SubmitSpec, clock: FakeClock, store: JobStore) -> None:
    def first(proc: FakeProcess) -> None:
        if clock.now == proc.started:
            running(store, clock)
        elif clock.now >= START + 15:  # a driver elsewhere took over at epoch 5, then died too
            store.storage.write(STATUS, JobStatus("orders", JobState.RUNNING, 5, START, START, pid=77,
                                                  host="host-b").to_bytes())

    supervise(spec, clock, [Run(1, runs_for=20.0, tick=first), Run(0, runs_for=1.0)],
              FixedDelay(attempts=3, delay=1.0, clock=clock), store=store, poll=5.0)
    status = read_status(store)
    assert status is not None and (status.state, status.epoch, status.pid) == (JobState.RUNNING, 5, 77)


def test_the_supervisor_keeps_a_heartbeat_record_while_it_watches_and_waits_and_records_its_end(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    records: list[SupervisorRecord] = []
    holder: list[Supervisor] = []

    def look(_proc: FakeProcess | None = None) -> None:
        record = read_supervisor(store, holder[0].record_id)
        assert record is not None
        records.append(record)

    def sleep(seconds: float) -> None:
        look()
        clock.sleep(seconds)

    spawner = Spawner(clock, [Run(1, runs_for=12.0, tick=look), Run(0, runs_for=6.0, tick=look)])
    sup = Supervisor(spec, FixedDelay(attempts=3, delay=12.0, clock=clock), store=store, poll=5.0, clock=clock,
                     sleep=sleep, spawn=spawner, wall=clock)
    holder.append(sup)
    assert sup.run() == SupervisorOutcome(Ending.STOPPED, 2, 1, 0, "driver stopped")
    assert clock.sleeps == [5.0, 5.0, 2.0]  # the 12 s delay in polls, a heartbeat between them
    assert [(r.state.value, r.updated_at - START, r.driver_pid) for r in records] == [
        ("watching", 0, 100), ("watching", 5, 100), ("watching", 10, 100),  # every poll while the driver runs
        ("restarting", 12, None), ("restarting", 17, None), ("restarting", 22, None),  # and while it waits
        ("watching", 24, 101), ("watching", 29, 101)]
    ended = read_supervisor(store, sup.record_id)
    assert ended is not None
    assert (ended.state, ended.ending, ended.exit_code, ended.end_reason, ended.pid, ended.host, ended.attempt) == (
        SupervisorState.ENDED, "stopped", 0, "driver stopped", os.getpid(), HOST, 2)
    assert ended.standalone and ended.launch_id == sup.record_id  # plain `ckpt run --supervise`: an id of its own
    assert sup.record_id[:16] == "19700101T001640Z"  # its start (the fake clock's START), so ids sort by time


def test_once_its_driver_runs_the_supervisor_beats_and_reads_every_three_of_its_heartbeats(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    """A supervisor's heartbeat (a PUT) and its read of status.json every 5 s cost more than the driver's own
    heartbeat (docs/scale.md): once the driver runs they come every three of its heartbeats, and the record says so
    before the first longer wait (readers judge it by ``interval``). A dead driver is still noticed at once."""
    records: list[tuple[float, float]] = []
    holder: list[Supervisor] = []

    def beat(proc: FakeProcess) -> None:
        store.storage.write(STATUS, JobStatus("orders", JobState.RUNNING, 4, clock.now, START, batch_id=7, pid=proc.pid,
                                              host=HOST, heartbeat_interval=30.0).to_bytes())
        record = read_supervisor(store, holder[0].record_id)
        assert record is not None
        if not records or records[-1][0] != record.updated_at - START:
            records.append((record.updated_at - START, record.interval))

    spawner = Spawner(clock, [Run(0, runs_for=100.0, tick=beat)])
    sup = Supervisor(spec, FixedDelay(attempts=1, delay=1.0, clock=clock), store=store, poll=5.0, clock=clock,
                     spawn=spawner, wall=clock, group_of=lambda pid: pid)  # the Python driver is the process here
    holder.append(sup)
    assert sup.run().final is Ending.STOPPED
    assert records == [(0, 5.0), (5, 90.0), (95, 90.0)]
    assert spawner.procs[0].ended == START + 100  # its end noticed at once, not at the next beat


@pytest.mark.parametrize(("code", "final", "meaning"), [
    (2, Ending.CONFIG_ERROR, "bad input"),
    (5, Ending.INCOMPATIBLE, "cannot restore the state"),
    (6, Ending.DENIED, "credentials refused"),
    (7, Ending.REFUSED, "a sink refused the query"),
])
def test_a_driver_exit_no_restart_can_fix_ends_supervision_with_the_drivers_code_and_reason(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, code: int, final: Ending, meaning: str
) -> None:
    store.storage.write(SPEC_LAST, Launch("orders", Deployment("job.py"), "latest-state", START, "test",
                                          "L1").to_bytes())

    def fails(proc: FakeProcess) -> None:  # the driver's last report, then its exit code
        store.storage.write(STATUS, JobStatus("orders", JobState.FAILED, 4, clock.now, START, pid=5000, host=HOST,
                                              reason="the storage refused the credentials: InvalidAccessKeyId")
                            .to_bytes())

    outcome, spawner = supervise(spec, clock, [Run(code, runs_for=7.0, tick=fails)],
                                 FixedDelay(attempts=5, clock=clock), store=store, launch_id="L1")
    reason = (f"driver exited with code {code} ({meaning}): a restart would fail again: the storage refused the "
              "credentials: InvalidAccessKeyId; see its log")
    assert outcome == SupervisorOutcome(final, attempts=1, restarts=0, exit_code=code, reason=reason)
    assert final.exit_code == code  # what `ckpt run --supervise` exits with
    assert len(spawner.procs) == 1 and clock.sleeps == []
    last = read_launch(store)
    assert last is not None and (last.ending, last.exit_code, last.end_reason) == (final.value, code, reason)
    record = read_supervisor(store, "L1")
    assert record is not None and (record.state, record.ending, record.standalone) == (
        SupervisorState.ENDED, final.value, False)


def _outage_driver(store: JobStore, clock: FakeClock, *, outage: bool) -> Run:
    """A driver that reports every tick until START + 10, then cannot write until START + 50 (its last
    heartbeat stays at START + 9); with ``outage`` the supervisor cannot read status.json either until
    START + 40."""

    def tick(proc: FakeProcess) -> None:
        t = clock.now - START
        if t < 10 or t >= 50:
            running(store, clock)
        elif outage and t < 40:
            store.storage.write(STATUS, b"<Error>ServiceUnavailable</Error>")  # what reads get: not a status
        else:
            running(store, clock, at=START + 9)

    return Run(0, runs_for=80.0, term_code=1, tick=tick)


def test_a_driver_that_rode_out_a_store_outage_is_not_killed_for_its_stale_heartbeat(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    outcome, spawner = supervise(spec, clock, [_outage_driver(store, clock, outage=True)],
                                 FixedDelay(attempts=1, clock=clock), store=store, poll=5.0)
    # readable again at START + 40 with a heartbeat 31 s old (limit 20 s): not judged until readable for 20 s,
    # and by then (START + 55) the driver reports again
    assert spawner.procs[0].signals == []
    assert outcome == SupervisorOutcome(Ending.STOPPED, 1, 0, 0, "driver stopped")


def test_without_an_outage_the_same_stale_heartbeat_gets_the_driver_killed(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    outcome, spawner = supervise(spec, clock, [_outage_driver(store, clock, outage=False), Run(0, runs_for=1.0)],
                                 FixedDelay(attempts=1, delay=1.0, clock=clock), store=store, poll=5.0)
    assert spawner.procs[0].signals == [signal.SIGTERM]
    # RUNNING seen at 5 s, then a look every three heartbeats (15 s): seen at 35 s, 26 s without one (limit 20 s)
    assert spawner.procs[0].ended == START + 35
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)


def _slow_outage(store: JobStore, clock: FakeClock, *, ends: float, cost: float) -> None:
    """The store does not answer from START + 10 until ``ends``: a request begun meanwhile fails after ``cost``
    seconds of retries (as S3Storage's do), reads and writes alike."""
    storage = store.storage
    real_read, real_write = storage.read, storage.write

    def failing(what: str) -> None:
        if START + 10 <= clock.now < ends:
            clock.now += cost
            raise UnreachableError(f"{what}: cannot reach S3 endpoint")

    def read(key: str) -> bytes:
        failing(f"read {key}")
        return real_read(key)

    def write(key: str, data: bytes) -> None:
        failing(f"write {key}")
        real_write(key, data)

    storage.read = read  # type: ignore[method-assign]  # the fault, in a unit test
    storage.write = write  # type: ignore[method-assign]  # the fault, in a unit test


def test_the_grace_after_an_outage_counts_from_the_first_read_that_worked_not_the_last_that_failed(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    """Failed requests take 3 s each (retries), so the supervisor's last failed read of status.json can be
    seconds older than the store's return: the driver gets a whole heartbeat limit (8 s) from the first read
    that worked, and reports 6 s after it."""
    back: list[float] = []  # the supervisor's first poll after the outage

    def beat() -> None:
        store.storage.write(STATUS, JobStatus("orders", JobState.RUNNING, 4, clock.now, START, batch_id=7, pid=5000,
                                              host=HOST, heartbeat_interval=1.0).to_bytes())

    def tick(proc: FakeProcess) -> None:  # called at each of the supervisor's polls
        if clock.now < START + 10:
            beat()
        elif clock.now >= START + 40:
            if not back:
                back.append(clock.now)
            if clock.now >= back[0] + 6:
                beat()

    _slow_outage(store, clock, ends=START + 40, cost=3.0)
    outcome, spawner = supervise(spec, clock, [Run(0, runs_for=70.0, term_code=1, tick=tick)],
                                 FixedDelay(attempts=0, clock=clock), store=store, poll=1.0)
    assert spawner.procs[0].signals == [], f"terminated, ended at {spawner.procs[0].ended}"
    assert outcome == SupervisorOutcome(Ending.STOPPED, 1, 0, 0, "driver stopped")
