"""JobHealthWatch on a real local job store with an injected clock: every health reason, epoch and start
filtering, healthy_for/min_batches, the start timeout, and from which batch batches are counted."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch, Unhealthy
from tests.support.watchrecords import PAYLOAD_KEYS, T0, deployed, leased, report, unhealthy

# -- not started, and which statuses count ------------------------------------------------------------


def test_a_job_that_never_reports_is_not_started_after_the_start_timeout(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(start_timeout=60))
    assert watch.poll(T0) is None  # the job does not exist yet: not an error
    assert watch.poll(T0 + 59) is None
    event = unhealthy(watch.poll(T0 + 60), Unhealthy.NOT_STARTED)
    assert event["epoch"] is None and event["state"] is None
    assert "within 60 s" in event["message"] and "never ran" in event["message"]


def test_a_launch_whose_supervisor_ended_before_any_report_is_not_started_at_once(store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, record_end

    launch = Launch("orders", Deployment("job.py"), "latest-state", T0, "test", "L1", log_file="/logs/L1.log")
    store.storage.write("spec/last.json", launch.to_bytes())
    report(store, T0 - 50, state=JobState.STOPPED, epoch=2, started_at=T0 - 500)  # the previous driver
    watch = JobHealthWatch(store, HealthCriteria(started_after=T0, start_timeout=600))
    assert watch.poll(T0 + 1) is None
    assert not record_end(store, "L0", ending="config-error", exit_code=2, reason="someone else's launch")
    assert watch.poll(T0 + 2) is None
    assert record_end(store, "L1", ending="config-error", exit_code=2, reason="driver exited with code 2")
    event = unhealthy(watch.poll(T0 + 3), Unhealthy.NOT_STARTED)  # long before the 600 s start timeout
    assert "launch L1 ended before its driver reported: driver exited with code 2 (exit code 2)" in event["message"]
    assert "/logs/L1.log" in event["message"]


def test_statuses_below_min_epoch_are_the_previous_deployment(store: JobStore) -> None:
    report(store, T0, epoch=3, batch_id=40)  # the old driver, still RUNNING and fresh
    watch = JobHealthWatch(store, HealthCriteria(min_epoch=4, start_timeout=60))
    assert watch.poll(T0) is None
    report(store, T0 + 30, epoch=4, state=JobState.STARTING, batch_id=40)
    assert watch.poll(T0 + 30) is None
    report(store, T0 + 40, epoch=4, batch_id=40)
    event = watch.poll(T0 + 40)
    assert event is not None and set(event) == PAYLOAD_KEYS
    assert (event["status"], event["reason"], event["epoch"], event["state"]) == ("healthy", None, 4, "RUNNING")


def test_an_old_deployment_failing_is_not_the_new_one_failing(store: JobStore) -> None:
    report(store, T0, epoch=3, state=JobState.FAILED)
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy", min_epoch=4, start_timeout=60))
    assert watch.poll(T0) is None
    event = unhealthy(watch.poll(T0 + 60), Unhealthy.NOT_STARTED)
    assert "epoch >= 4" in event["message"] and "older deployment (FAILED at epoch 3" in event["message"]


def test_started_after_filters_a_status_of_an_earlier_start(store: JobStore) -> None:
    report(store, T0, started_at=T0 - 500)
    watch = JobHealthWatch(store, HealthCriteria(started_after=T0 - 10, start_timeout=60))
    assert watch.poll(T0) is None
    report(store, T0 + 5, started_at=T0 - 1)
    event = watch.poll(T0 + 5)
    assert event is not None and event["status"] == "healthy"


def test_a_newer_lease_without_a_status_means_its_driver_has_not_reported(store: JobStore) -> None:
    report(store, T0, epoch=2)
    leased(store, 3)  # a newer driver took the job; the status is still the fenced driver's
    watch = JobHealthWatch(store, HealthCriteria(start_timeout=30))
    assert watch.poll(T0) is None
    event = unhealthy(watch.poll(T0 + 30), Unhealthy.NOT_STARTED)
    assert "epoch 3" in event["message"] and "never reported" in event["message"]


# -- unhealthy reasons ----------------------------------------------------------------------------------


@pytest.mark.parametrize("expect", ["healthy", "unhealthy"])
@pytest.mark.parametrize(("state", "reason"), [(JobState.FAILED, Unhealthy.FAILED),
                                               (JobState.STOPPED, Unhealthy.STOPPED)])
def test_a_terminal_state_is_unhealthy_at_once(store: JobStore, expect: str, state: JobState,
                                               reason: Unhealthy) -> None:
    report(store, T0, state=state, epoch=2, batch_id=7, reason="query failed: boom", ui_url="http://ui:4040")
    event = unhealthy(JobHealthWatch(store, HealthCriteria(expect=expect)).poll(T0 + 1), reason)
    assert (event["epoch"], event["batch_id"], event["state"], event["ui_url"]) == (2, 7, state.value,
                                                                                    "http://ui:4040")
    assert "query failed: boom" in event["message"] and "Restart" in event["message"]


def test_no_heartbeat_by_default_after_three_intervals_plus_five_seconds(store: JobStore) -> None:
    report(store, T0, pid=4242, host="worker-1")
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy"))
    assert watch.poll(T0 + 20) is None
    event = unhealthy(watch.poll(T0 + 20.5), Unhealthy.NO_HEARTBEAT)
    assert "none for 20 s" in event["message"] and "pid 4242 on worker-1" in event["message"]


def test_heartbeat_timeout_overrides_the_default(store: JobStore) -> None:
    report(store, T0)
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy", heartbeat_timeout=60))
    assert watch.poll(T0 + 59) is None
    unhealthy(watch.poll(T0 + 61), Unhealthy.NO_HEARTBEAT)


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.STOPPING])
def test_a_restoring_or_final_savepointing_driver_gets_the_start_timeout(store: JobStore, state: JobState) -> None:
    report(store, T0, state=state)
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy", start_timeout=300))
    assert watch.poll(T0 + 120) is None  # silent, but restoring a snapshot or taking the final savepoint
    unhealthy(watch.poll(T0 + 301), Unhealthy.NO_HEARTBEAT)


def test_too_many_restarts_counts_driver_starts_after_the_first_within_the_window(store: JobStore) -> None:
    deployed(store, 1, T0 - 5000)  # the first start, long ago
    deployed(store, 2, T0 - 700)  # a restart outside the window
    deployed(store, 3, T0 - 300)
    deployed(store, 4, T0 - 100)
    report(store, T0, epoch=4)
    assert JobHealthWatch(store, HealthCriteria(expect="unhealthy", max_restarts=3, health_window=600)).poll(T0) is None
    deployed(store, 5, T0 - 10)
    report(store, T0, epoch=5)
    criteria = HealthCriteria(expect="unhealthy", max_restarts=3, health_window=600)
    event = unhealthy(JobHealthWatch(store, criteria).poll(T0), Unhealthy.TOO_MANY_RESTARTS)
    assert event["restarts"] == 3 and "found 3" in event["message"]
    # min_epoch: the deployment being watched starts at epoch 4; only epoch 5 is a restart of it
    healthy = JobHealthWatch(store, HealthCriteria(min_epoch=4, max_restarts=2)).poll(T0)
    assert healthy is not None and (healthy["status"], healthy["restarts"]) == ("healthy", 1)


def test_a_verification_fails_at_the_first_query_restart_in_the_driver_with_its_cause(store: JobStore) -> None:
    """The upgrade's verification (``count_query_restarts``): new code whose batch fails is unhealthy as soon as
    its driver restarts the query, not once the driver's restart strategy is spent and its supervisor restarts
    it; a health watch without the flag leaves the driver's own restarts to the driver."""
    from airflow_ckpt_provider.core.records.status import Restart, RestartOwner
    from airflow_ckpt_provider.launcher.upgradesteps import verify_criteria

    deployed(store, 1, T0 - 50)
    report(store, T0 - 5, started_at=T0 - 50, batch_id=None)
    criteria = verify_criteria(T0 - 60, batches=1, timeout=300)
    assert JobHealthWatch(store, criteria).poll(T0) is None  # running, no batch yet
    restart = Restart(RestartOwner.DRIVER, 1, "the query failed: RuntimeError: v2 bug", 2.0, at=T0 - 2,
                      expected_by=T0 + 30, from_batch=47)
    report(store, T0, state=JobState.RESTARTING, started_at=T0 - 50, batch_id=None, restart=restart.to_dict(),
           restarts=[restart.to_dict()], restart_count=1)
    event = unhealthy(JobHealthWatch(store, criteria).poll(T0), Unhealthy.TOO_MANY_RESTARTS)
    assert event["restarts"] == 1 and "found 1; after batch 47: the query failed: RuntimeError: v2 bug. Read" in \
        event["message"], event
    # Without the flag (a health watch: the driver owns its query restarts) the same job is waited on.
    assert JobHealthWatch(store, HealthCriteria(started_after=T0 - 60, max_restarts=1)).poll(T0) is None
    # A query restart outside the window does not count.
    old = Restart(RestartOwner.DRIVER, 1, "RuntimeError: old", 2.0, at=T0 - 400, expected_by=T0 - 370)
    report(store, T0, started_at=T0 - 500, batch_id=3, restarts=[old.to_dict(), {"by": "driver"}], restart_count=2)
    assert JobHealthWatch(store, verify_criteria(T0 - 600, batches=9, timeout=300)).poll(T0) is None


def test_a_crash_loop_is_unhealthy_even_before_any_status(store: JobStore) -> None:
    for epoch in (1, 2, 3):
        deployed(store, epoch, T0 - 30 + epoch)
    unhealthy(JobHealthWatch(store, HealthCriteria(max_restarts=2)).poll(T0), Unhealthy.TOO_MANY_RESTARTS)


def test_no_progress_while_data_waits_and_the_batch_id_stands(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy", progress_timeout=60))
    for t in (0, 30, 59):
        report(store, T0 + t, batch_id=5, data_waiting=True)
        assert watch.poll(T0 + t) is None
    report(store, T0 + 70, batch_id=6, data_waiting=True)  # a batch completed: the clock starts over
    assert watch.poll(T0 + 70) is None
    report(store, T0 + 129, batch_id=6, data_waiting=True)
    assert watch.poll(T0 + 129) is None
    report(store, T0 + 130, batch_id=6, data_waiting=True)
    event = unhealthy(watch.poll(T0 + 130), Unhealthy.NO_PROGRESS)
    assert event["batch_id"] == 6 and "for 60 s" in event["message"]


def test_an_idle_job_is_not_stuck_when_data_arrives(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy", progress_timeout=60))
    report(store, T0, batch_id=5, data_waiting=False)
    assert watch.poll(T0) is None
    report(store, T0 + 500, batch_id=5, data_waiting=False)  # idle for long: no data, no batch
    assert watch.poll(T0 + 500) is None
    report(store, T0 + 510, batch_id=5, data_waiting=True)  # data arrives: the wait starts now
    assert watch.poll(T0 + 510) is None
    report(store, T0 + 569, batch_id=5, data_waiting=True)
    assert watch.poll(T0 + 569) is None
    report(store, T0 + 570, batch_id=5, data_waiting=True)
    unhealthy(watch.poll(T0 + 570), Unhealthy.NO_PROGRESS)


# -- healthy --------------------------------------------------------------------------------------------


def test_healthy_for_needs_running_continuously(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(healthy_for=30))
    report(store, T0, epoch=1)
    assert watch.poll(T0) is None
    report(store, T0 + 20, epoch=1)
    assert watch.poll(T0 + 20) is None
    report(store, T0 + 25, epoch=2, state=JobState.STARTING)  # a restart breaks the streak
    assert watch.poll(T0 + 25) is None
    report(store, T0 + 30, epoch=2)
    assert watch.poll(T0 + 30) is None
    report(store, T0 + 59, epoch=2)
    assert watch.poll(T0 + 59) is None
    report(store, T0 + 60, epoch=2, ui_url="http://ui:4040")
    event = watch.poll(T0 + 60)
    assert event is not None and (event["status"], event["epoch"], event["ui_url"]) == ("healthy", 2,
                                                                                       "http://ui:4040")
    assert "healthy for 30 s" in event["message"]


def test_min_batches_counts_batches_since_the_watch_first_saw_the_job(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(min_batches=3))
    report(store, T0, batch_id=10)
    assert watch.poll(T0) is None
    report(store, T0 + 5, batch_id=12)
    assert watch.poll(T0 + 5) is None
    assert "2 of 3 batches" in watch.waiting_for()
    report(store, T0 + 10, batch_id=13)
    event = watch.poll(T0 + 10)
    assert event is not None and (event["status"], event["batch_id"]) == ("healthy", 13)


def test_min_batches_from_a_job_without_any_batch(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(min_batches=1))
    report(store, T0, state=JobState.STARTING)
    assert watch.poll(T0) is None
    report(store, T0 + 5)
    assert watch.poll(T0 + 5) is None
    report(store, T0 + 10, batch_id=0)  # batch 0 committed: one batch
    event = watch.poll(T0 + 10)
    assert event is not None and event["status"] == "healthy"


def test_expect_unhealthy_never_reports_healthy(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(expect="unhealthy"))
    for t in range(0, 100, 10):
        report(store, T0 + t, batch_id=t)
        assert watch.poll(T0 + t) is None
    assert "RUNNING at epoch 1, batch 90" in watch.waiting_for()


# -- batches are counted from the watched driver's first ---------------------------------------------------


@pytest.mark.parametrize("first", [JobState.STARTING, JobState.RUNNING])
def test_a_restored_driver_without_a_batch_yet_counts_from_its_first_batch(store: JobStore,
                                                                           first: JobState) -> None:
    # restored at batch 500: the new driver reports no batch id until it completes batch 501
    watch = JobHealthWatch(store, HealthCriteria(min_batches=2))
    report(store, T0, state=first)
    assert watch.poll(T0) is None
    report(store, T0 + 5)
    assert watch.poll(T0 + 5) is None
    assert "0 of 2 batches" in watch.waiting_for()
    report(store, T0 + 10, batch_id=501)
    assert watch.poll(T0 + 10) is None  # one batch (before the fix: 502 "batches" since -1)
    assert "1 of 2 batches" in watch.waiting_for()
    report(store, T0 + 15, batch_id=502)
    event = watch.poll(T0 + 15)
    assert event is not None and (event["status"], event["batch_id"]) == ("healthy", 502)
    assert "2 batches since the check began" in event["message"]


def test_a_watch_that_first_sees_a_running_job_counts_from_its_batch(store: JobStore) -> None:
    watch = JobHealthWatch(store, HealthCriteria(min_batches=2))
    report(store, T0, batch_id=40)
    assert watch.poll(T0) is None
    assert "0 of 2 batches" in watch.waiting_for()
    report(store, T0 + 5, batch_id=41)
    assert watch.poll(T0 + 5) is None
    report(store, T0 + 10, batch_id=42)
    event = watch.poll(T0 + 10)
    assert event is not None and (event["status"], event["batch_id"]) == ("healthy", 42)
