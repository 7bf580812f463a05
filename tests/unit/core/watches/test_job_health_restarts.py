"""JobHealthWatch and restarts in progress (issue 15): a RESTARTING status is waited on while its supervisor is
live and the restart is not overdue; a driver that died or failed under a live supervisor is the supervisor's
to restart; NO_HEARTBEAT once the supervisor is gone, gave up, or its restart is late, saying which."""

from __future__ import annotations

import time

import pytest

from airflow_ckpt_provider.core.errors import StorageError, UnreachableError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.status import JobState, RestartOwner
from airflow_ckpt_provider.core.records.supervision import SupervisorState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch, Unhealthy
from tests.support.watchrecords import T0, report, restarting, supervised, unhealthy

WATCH = HealthCriteria(expect=Health.UNHEALTHY, heartbeat_timeout=5.0)


def hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def test_a_restart_by_a_live_supervisor_is_waited_on_until_it_is_overdue(store: JobStore) -> None:
    restarting(store, T0, expected_by=T0 + 40)
    watch = JobHealthWatch(store, WATCH)
    for now in (T0, T0 + 20, T0 + 45):  # the dead driver's heartbeat is long past the 5 s timeout
        supervised(store, now)  # the supervisor's heartbeat every poll
        assert watch.poll(now) is None
    assert watch.waiting_for() == (
        "job orders: watching for a fault; last seen: RESTARTING by the supervisor, attempt 2, expected running "
        f"by {hms(T0 + 40)} (RESTARTING at epoch 1, batch 9)")
    supervised(store, T0 + 46)
    event = unhealthy(watch.poll(T0 + 46), Unhealthy.NO_HEARTBEAT)  # 6 s late, limit 5 s
    assert f"expected the job running again by {hms(T0 + 40)}" in event["message"]
    assert "the restart is 6 s overdue (limit 5 s), though its supervisor (pid 77 on host-b" in event["message"]


def test_a_restart_whose_supervisor_is_gone_is_no_heartbeat_at_once(store: JobStore) -> None:
    supervised(store, T0 - 30)  # its last heartbeat: 30 s ago, limit 3 x 5 s + 5 s
    restarting(store, T0 - 31, expected_by=T0 + 60)
    event = unhealthy(JobHealthWatch(store, WATCH).poll(T0), Unhealthy.NO_HEARTBEAT)
    assert "expected its supervisor to restart the driver, found it RESTARTING at epoch 1" in event["message"]
    assert ("and its supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) is gone: no heartbeat for 30 s "
            "(every 5 s expected): nobody restarts it") in event["message"]


def test_a_restart_whose_supervisor_gave_up_is_no_heartbeat_with_its_reason(store: JobStore) -> None:
    restarting(store, T0 - 5)
    supervised(store, T0 - 1, state=SupervisorState.ENDED, ending="gave-up", end_reason="restart strategy exhausted")
    event = unhealthy(JobHealthWatch(store, WATCH).poll(T0), Unhealthy.NO_HEARTBEAT)
    assert f"supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) gave up at {hms(T0 - 1)}: restart " \
           "strategy exhausted: nobody restarts it" in event["message"]


def test_a_dead_driver_under_a_live_supervisor_is_not_unhealthy_within_the_supervisors_reaction_time(
    store: JobStore,
) -> None:
    report(store, T0, batch_id=9)  # RUNNING, then silent: the driver died
    watch = JobHealthWatch(store, WATCH)
    supervised(store, T0 + 30)
    assert watch.poll(T0 + 30) is None  # 30 s silent: past the watch's 5 s, within 20 s + 45 s reaction
    assert "its driver died; the supervisor (pid 77 on host-b" in watch.waiting_for()
    supervised(store, T0 + 66)
    event = unhealthy(watch.poll(T0 + 66), Unhealthy.NO_HEARTBEAT)  # the supervisor did not act: not its job
    assert "found none for 66 s (RUNNING at epoch 1): its driver probably died, and its supervisor" in event["message"]


def test_a_dead_driver_without_a_live_supervisor_is_no_heartbeat_saying_so(store: JobStore) -> None:
    report(store, T0, batch_id=9)
    event = unhealthy(JobHealthWatch(store, WATCH).poll(T0 + 6), Unhealthy.NO_HEARTBEAT)
    assert "its driver probably died, and no supervisor restarts it (no record in supervisors/)" in event["message"]
    supervised(store, T0 - 60)  # a supervisor on host-b, silent for 66 s
    event = unhealthy(JobHealthWatch(store, WATCH).poll(T0 + 6), Unhealthy.NO_HEARTBEAT)
    assert "and its supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) is gone: no heartbeat for 66 s" \
        in event["message"]


def test_a_failed_driver_under_a_live_supervisor_waits_for_its_decision(store: JobStore) -> None:
    report(store, T0, state=JobState.FAILED, reason="query failed: boom")
    supervised(store, T0 + 1)
    watch = JobHealthWatch(store, WATCH)
    assert watch.poll(T0 + 1) is None  # the supervisor writes RESTARTING, or ends, within its reaction time
    supervised(store, T0 + 2, state=SupervisorState.ENDED, ending="gave-up", end_reason="unhealthy")
    event = unhealthy(watch.poll(T0 + 2), Unhealthy.FAILED)
    assert "found FAILED at epoch 1" in event["message"]


def test_a_query_restart_by_the_driver_is_waited_on_until_its_heartbeat_stops(store: JobStore) -> None:
    restarting(store, T0, expected_by=T0 + 10, by=RestartOwner.DRIVER)
    watch = JobHealthWatch(store, WATCH)
    assert watch.poll(T0 + 299) is None  # a driver restoring its query may be silent for start_timeout (300 s)
    assert "RESTARTING by its driver, attempt 2" in watch.waiting_for()
    event = unhealthy(watch.poll(T0 + 301), Unhealthy.NO_HEARTBEAT)
    assert "expected its driver's query restart (attempt 2" in event["message"]



class Outage:
    """The job store's reads fail while ``down``, as S3's do when it does not answer."""

    def __init__(self, store: JobStore) -> None:
        self.down = False
        storage = store.storage
        real_read, real_versioned = storage.read, storage.read_versioned

        def read(key: str) -> bytes:
            self._fail(key)
            return real_read(key)

        def read_versioned(key: str):  # type: ignore[no-untyped-def]  # mirrors Storage.read_versioned
            self._fail(key)
            return real_versioned(key)

        storage.read = read  # type: ignore[method-assign]  # the outage, in a unit test
        storage.read_versioned = read_versioned  # type: ignore[method-assign]  # the outage, in a unit test

    def _fail(self, key: str) -> None:
        if self.down:
            raise UnreachableError(f"read {key}: cannot reach S3 endpoint")


def test_after_a_store_outage_heartbeats_are_judged_again_only_a_whole_limit_after_the_store_answered(
    store: JobStore,
) -> None:
    """A job store outage silences the driver and its supervisor (on another host, so only their heartbeats
    tell) as much as it blinds the watch: when the watch can read again, both records are stale. It waits a whole
    heartbeat limit from then (the larger of the driver's, 20 s, and the supervisor's, 20 s) before it calls the
    driver dead, where it would otherwise say NO_HEARTBEAT at once, and the DAG restart a job that is running."""
    outage = Outage(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))  # default heartbeat limit: 3 x 5 s + 5
    report(store, T0, batch_id=9)
    supervised(store, T0)
    assert watch.poll(T0) is None
    outage.down = True
    for now in (T0 + 10, T0 + 30, T0 + 59):
        with pytest.raises(StorageError):
            watch.poll(now)
    outage.down = False  # back at T0 + 60: both heartbeats are 60 s old
    assert watch.poll(T0 + 60) is None
    assert watch.waiting_for() == (
        f"job orders: watching for a fault; last seen: the job store could not be read until {hms(T0 + 60)}, so "
        f"no heartbeat is judged before {hms(T0 + 80)} (RUNNING at epoch 1, batch 9)")
    assert watch.poll(T0 + 79) is None
    event = unhealthy(watch.poll(T0 + 80), Unhealthy.NO_HEARTBEAT)  # nobody wrote again within the limit
    assert "its supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) is gone" in event["message"]


def test_after_a_store_outage_a_driver_that_reports_again_within_the_limit_is_never_called_dead(
    store: JobStore,
) -> None:
    outage = Outage(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    report(store, T0, batch_id=9)
    supervised(store, T0)
    assert watch.poll(T0) is None
    outage.down = True
    with pytest.raises(StorageError):
        watch.poll(T0 + 30)
    outage.down = False
    for now in (T0 + 60, T0 + 70):
        assert watch.poll(now) is None
    for now in (T0 + 75, T0 + 76, T0 + 90):  # the driver's first heartbeat after the outage comes 15 s after it
        report(store, now, batch_id=10)
        supervised(store, now)
        assert watch.poll(now) is None


def test_a_driver_failed_before_a_store_outage_is_left_to_its_supervisor_for_a_whole_limit_after_it(
    store: JobStore,
) -> None:
    """The driver failed just before the store went away, so its supervisor could write neither its decision
    (RESTARTING, or ended) nor its heartbeat. When the watch reads again, the FAILED status and the supervisor's
    heartbeat are both stale: it gives the supervisor a whole limit from then before it says FAILED, where it would
    say FAILED at once, and the DAG restart a job whose supervisor is restarting it."""
    outage = Outage(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    report(store, T0, state=JobState.FAILED, reason="query failed: boom")
    supervised(store, T0)
    assert watch.poll(T0) is None  # within the supervisor's reaction time
    outage.down = True
    with pytest.raises(StorageError):
        watch.poll(T0 + 30)
    outage.down = False  # back at T0 + 60
    assert watch.poll(T0 + 60) is None
    assert watch.waiting_for() == (
        f"job orders: watching for a fault; last seen: its driver failed, and the job store could not be read until "
        f"{hms(T0 + 60)}, so its supervisor (pid 77 on host-b, launch 20270115T080000Z-aaaaaa) is given until "
        f"{hms(T0 + 80)} to restart it (FAILED at epoch 1, no batch yet)")
    assert watch.poll(T0 + 79) is None
    event = unhealthy(watch.poll(T0 + 80), Unhealthy.FAILED)  # it wrote nothing within the limit
    assert "found FAILED at epoch 1" in event["message"]


def test_a_failed_driver_whose_supervisor_restarts_it_after_a_store_outage_is_never_called_failed(
    store: JobStore,
) -> None:
    outage = Outage(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    report(store, T0, state=JobState.FAILED, reason="query failed: boom")
    supervised(store, T0)
    outage.down = True
    with pytest.raises(StorageError):
        watch.poll(T0 + 30)
    outage.down = False
    assert watch.poll(T0 + 60) is None
    supervised(store, T0 + 65)
    restarting(store, T0 + 65, expected_by=T0 + 120)  # the supervisor's decision, once it can write again
    for now in (T0 + 70, T0 + 90, T0 + 110):
        supervised(store, now)
        assert watch.poll(now) is None
    assert "RESTARTING by the supervisor, attempt 2" in watch.waiting_for()


def test_a_failed_driver_whose_supervisor_was_already_silent_is_failed_at_once_after_a_store_outage(
    store: JobStore,
) -> None:
    """The grace is for a supervisor the outage silenced: one whose heartbeat had stopped before the driver failed
    (killed with it, say) is not waited on."""
    outage = Outage(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    supervised(store, T0 - 60)  # its last heartbeat, a minute before the failure (limit 3 x 5 s + 5 s)
    report(store, T0, state=JobState.FAILED, reason="query failed: boom")
    outage.down = True
    with pytest.raises(StorageError):
        watch.poll(T0 + 30)
    outage.down = False
    event = unhealthy(watch.poll(T0 + 60), Unhealthy.FAILED)
    assert "found FAILED at epoch 1" in event["message"]
