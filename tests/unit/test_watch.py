"""The core watches on a real local job store with an injected clock: every health reason, epoch and start
filtering, healthy_for/min_batches, the start timeout; control request answers; new snapshots."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.control import Ack, Action, Outcome, submit_request, write_ack
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.jobstore import DEPLOYMENTS, LEASE, SPEC_LAST, JobStore
from airflow_ckpt_provider.core.lease import LeaseRecord
from airflow_ckpt_provider.core.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots import create_snapshot
from airflow_ckpt_provider.core.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.storage import LocalStorage
from airflow_ckpt_provider.core.watch import JobHealthWatch, RequestWatch, SnapshotWatch, Unhealthy
from tests.support.ckptfactory import make_checkpoint, write_batch

T0 = 1_800_000_000.0
PAYLOAD_KEYS = {"status", "reason", "message", "job", "epoch", "batch_id", "state", "ui_url", "restarts"}


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


def report(store: JobStore, now: float, *, state: JobState = JobState.RUNNING, epoch: int = 1,
           started_at: float = T0 - 100, **changes: Any) -> JobStatus:
    """The driver's heartbeat at ``now``."""
    base: dict[str, Any] = {"job": "orders", "state": state, "epoch": epoch, "updated_at": now,
                            "started_at": started_at, "heartbeat_interval": 5.0}
    status = JobStatus(**base | changes)
    assert write_status(store, status)
    return status


def deployed(store: JobStore, epoch: int, at: float, launch_id: str | None = None) -> None:
    """The record runtime/startup.prepare_checkpoint writes at each driver start (older versions wrote no
    launch_id)."""
    body: dict[str, Any] = {"epoch": epoch, "at": at, "restore": "latest-state", "action": "resume",
                            "snapshot": None, "reason": "test", "lineage_since": 0.0, "lineage_base": None}
    if launch_id is not None:
        body["launch_id"] = launch_id
    store.storage.write(f"{DEPLOYMENTS}{epoch:010d}.json", json.dumps(body).encode())


def leased(store: JobStore, epoch: int) -> None:
    store.storage.write(LEASE, LeaseRecord("orders", epoch, f"host:{epoch}", "host", 100 + epoch, T0).to_bytes())


def unhealthy(event: dict[str, Any] | None, reason: Unhealthy) -> dict[str, Any]:
    assert event is not None, f"expected unhealthy ({reason}), found no event"
    assert set(event) == PAYLOAD_KEYS
    assert (event["status"], event["reason"]) == ("unhealthy", reason.value), event["message"]
    return event


# -- not started, and which statuses count ------------------------------------------------------------


def test_a_job_that_never_reports_is_not_started_after_the_start_timeout(store: JobStore) -> None:
    watch = JobHealthWatch(store, start_timeout=60)
    assert watch.poll(T0) is None  # the job does not exist yet: not an error
    assert watch.poll(T0 + 59) is None
    event = unhealthy(watch.poll(T0 + 60), Unhealthy.NOT_STARTED)
    assert event["epoch"] is None and event["state"] is None
    assert "within 60 s" in event["message"] and "never ran" in event["message"]


def test_a_launch_whose_supervisor_ended_before_any_report_is_not_started_at_once(store: JobStore) -> None:
    from airflow_ckpt_provider.core.deployments import Deployment, Launch, record_end

    launch = Launch("orders", Deployment("job.py"), "latest-state", T0, "test", "L1", log_file="/logs/L1.log")
    store.storage.write("spec/last.json", launch.to_bytes())
    report(store, T0 - 50, state=JobState.STOPPED, epoch=2, started_at=T0 - 500)  # the previous driver
    watch = JobHealthWatch(store, started_after=T0, start_timeout=600)
    assert watch.poll(T0 + 1) is None
    assert not record_end(store, "L0", ending="config-error", exit_code=2, reason="someone else's launch")
    assert watch.poll(T0 + 2) is None
    assert record_end(store, "L1", ending="config-error", exit_code=2, reason="driver exited with code 2")
    event = unhealthy(watch.poll(T0 + 3), Unhealthy.NOT_STARTED)  # long before the 600 s start timeout
    assert "launch L1 ended before its driver reported: driver exited with code 2 (exit code 2)" in event["message"]
    assert "/logs/L1.log" in event["message"]


def test_statuses_below_min_epoch_are_the_previous_deployment(store: JobStore) -> None:
    report(store, T0, epoch=3, batch_id=40)  # the old driver, still RUNNING and fresh
    watch = JobHealthWatch(store, min_epoch=4, start_timeout=60)
    assert watch.poll(T0) is None
    report(store, T0 + 30, epoch=4, state=JobState.STARTING, batch_id=40)
    assert watch.poll(T0 + 30) is None
    report(store, T0 + 40, epoch=4, batch_id=40)
    event = watch.poll(T0 + 40)
    assert event is not None and set(event) == PAYLOAD_KEYS
    assert (event["status"], event["reason"], event["epoch"], event["state"]) == ("healthy", None, 4, "RUNNING")


def test_an_old_deployment_failing_is_not_the_new_one_failing(store: JobStore) -> None:
    report(store, T0, epoch=3, state=JobState.FAILED)
    watch = JobHealthWatch(store, expect="unhealthy", min_epoch=4, start_timeout=60)
    assert watch.poll(T0) is None
    event = unhealthy(watch.poll(T0 + 60), Unhealthy.NOT_STARTED)
    assert "epoch >= 4" in event["message"] and "older deployment (FAILED at epoch 3" in event["message"]


def test_started_after_filters_a_status_of_an_earlier_start(store: JobStore) -> None:
    report(store, T0, started_at=T0 - 500)
    watch = JobHealthWatch(store, started_after=T0 - 10, start_timeout=60)
    assert watch.poll(T0) is None
    report(store, T0 + 5, started_at=T0 - 1)
    event = watch.poll(T0 + 5)
    assert event is not None and event["status"] == "healthy"


def test_a_newer_lease_without_a_status_means_its_driver_has_not_reported(store: JobStore) -> None:
    report(store, T0, epoch=2)
    leased(store, 3)  # a newer driver took the job; the status is still the fenced driver's
    watch = JobHealthWatch(store, start_timeout=30)
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
    event = unhealthy(JobHealthWatch(store, expect=expect).poll(T0 + 1), reason)
    assert (event["epoch"], event["batch_id"], event["state"], event["ui_url"]) == (2, 7, state.value,
                                                                                    "http://ui:4040")
    assert "query failed: boom" in event["message"] and "Restart" in event["message"]


def test_no_heartbeat_by_default_after_three_intervals_plus_five_seconds(store: JobStore) -> None:
    report(store, T0, pid=4242, host="worker-1")
    watch = JobHealthWatch(store, expect="unhealthy")
    assert watch.poll(T0 + 20) is None
    event = unhealthy(watch.poll(T0 + 20.5), Unhealthy.NO_HEARTBEAT)
    assert "none for 20 s" in event["message"] and "pid 4242 on worker-1" in event["message"]


def test_heartbeat_timeout_overrides_the_default(store: JobStore) -> None:
    report(store, T0)
    watch = JobHealthWatch(store, expect="unhealthy", heartbeat_timeout=60)
    assert watch.poll(T0 + 59) is None
    unhealthy(watch.poll(T0 + 61), Unhealthy.NO_HEARTBEAT)


@pytest.mark.parametrize("state", [JobState.STARTING, JobState.STOPPING])
def test_a_restoring_or_final_savepointing_driver_gets_the_start_timeout(store: JobStore, state: JobState) -> None:
    report(store, T0, state=state)
    watch = JobHealthWatch(store, expect="unhealthy", start_timeout=300)
    assert watch.poll(T0 + 120) is None  # silent, but restoring a snapshot or taking the final savepoint
    unhealthy(watch.poll(T0 + 301), Unhealthy.NO_HEARTBEAT)


def test_too_many_restarts_counts_driver_starts_after_the_first_within_the_window(store: JobStore) -> None:
    deployed(store, 1, T0 - 5000)  # the first start, long ago
    deployed(store, 2, T0 - 700)  # a restart outside the window
    deployed(store, 3, T0 - 300)
    deployed(store, 4, T0 - 100)
    report(store, T0, epoch=4)
    assert JobHealthWatch(store, expect="unhealthy", max_restarts=3, restart_window=600).poll(T0) is None
    deployed(store, 5, T0 - 10)
    report(store, T0, epoch=5)
    event = unhealthy(JobHealthWatch(store, expect="unhealthy", max_restarts=3, restart_window=600).poll(T0),
                      Unhealthy.TOO_MANY_RESTARTS)
    assert event["restarts"] == 3 and "found 3" in event["message"]
    # min_epoch: the deployment being watched starts at epoch 4; only epoch 5 is a restart of it
    healthy = JobHealthWatch(store, min_epoch=4, max_restarts=2).poll(T0)
    assert healthy is not None and (healthy["status"], healthy["restarts"]) == ("healthy", 1)


def test_a_crash_loop_is_unhealthy_even_before_any_status(store: JobStore) -> None:
    for epoch in (1, 2, 3):
        deployed(store, epoch, T0 - 30 + epoch)
    unhealthy(JobHealthWatch(store, max_restarts=2).poll(T0), Unhealthy.TOO_MANY_RESTARTS)


def test_no_progress_while_data_waits_and_the_batch_id_stands(store: JobStore) -> None:
    watch = JobHealthWatch(store, expect="unhealthy", progress_timeout=60)
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
    watch = JobHealthWatch(store, expect="unhealthy", progress_timeout=60)
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
    watch = JobHealthWatch(store, healthy_for=30)
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
    watch = JobHealthWatch(store, min_batches=3)
    report(store, T0, batch_id=10)
    assert watch.poll(T0) is None
    report(store, T0 + 5, batch_id=12)
    assert watch.poll(T0 + 5) is None
    assert "2 of 3 batches" in watch.waiting_for()
    report(store, T0 + 10, batch_id=13)
    event = watch.poll(T0 + 10)
    assert event is not None and (event["status"], event["batch_id"]) == ("healthy", 13)


def test_min_batches_from_a_job_without_any_batch(store: JobStore) -> None:
    watch = JobHealthWatch(store, min_batches=1)
    report(store, T0, state=JobState.STARTING)
    assert watch.poll(T0) is None
    report(store, T0 + 5)
    assert watch.poll(T0 + 5) is None
    report(store, T0 + 10, batch_id=0)  # batch 0 committed: one batch
    event = watch.poll(T0 + 10)
    assert event is not None and event["status"] == "healthy"


def test_expect_unhealthy_never_reports_healthy(store: JobStore) -> None:
    watch = JobHealthWatch(store, expect="unhealthy")
    for t in range(0, 100, 10):
        report(store, T0 + t, batch_id=t)
        assert watch.poll(T0 + t) is None
    assert "RUNNING at epoch 1, batch 90" in watch.waiting_for()


def test_invalid_arguments_are_refused(store: JobStore) -> None:
    with pytest.raises(ConfigError, match="expect"):
        JobHealthWatch(store, expect="sick")
    with pytest.raises(ConfigError, match="max_restarts"):
        JobHealthWatch(store, max_restarts=0)
    with pytest.raises(ConfigError, match="healthy_for"):
        JobHealthWatch(store, healthy_for=-1)


# -- batches are counted from the watched driver's first ---------------------------------------------------


@pytest.mark.parametrize("first", [JobState.STARTING, JobState.RUNNING])
def test_a_restored_driver_without_a_batch_yet_counts_from_its_first_batch(store: JobStore,
                                                                           first: JobState) -> None:
    # restored at batch 500: the new driver reports no batch id until it completes batch 501
    watch = JobHealthWatch(store, min_batches=2)
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
    watch = JobHealthWatch(store, min_batches=2)
    report(store, T0, batch_id=40)
    assert watch.poll(T0) is None
    assert "0 of 2 batches" in watch.waiting_for()
    report(store, T0 + 5, batch_id=41)
    assert watch.poll(T0 + 5) is None
    report(store, T0 + 10, batch_id=42)
    event = watch.poll(T0 + 10)
    assert event is not None and (event["status"], event["batch_id"]) == ("healthy", 42)


# -- a launch on its way: a stopped or failed job is not unhealthy yet -------------------------------------


def relaunch(store: JobStore, at: float, launch_id: str = "L2") -> None:
    """spec/last.json: a launch at ``at`` (a restart, an upgrade, a restore) whose driver has not reported."""
    from airflow_ckpt_provider.core.deployments import Deployment, Launch

    record = Launch("orders", Deployment("job.py"), "latest-state", at, "airflow:dag.restart", launch_id)
    store.storage.write(SPEC_LAST, record.to_bytes())


ENDED = [(JobState.STOPPED, Unhealthy.STOPPED), (JobState.FAILED, Unhealthy.FAILED)]


@pytest.mark.parametrize("expect", ["healthy", "unhealthy"])
@pytest.mark.parametrize(("state", "reason"), ENDED)
def test_an_ended_job_with_a_newer_launch_on_its_way_is_pending(store: JobStore, expect: str, state: JobState,
                                                                reason: Unhealthy) -> None:
    report(store, T0 - 50, state=state, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, expect=expect, start_timeout=600)
    for t in (1, 300, 599.5):
        assert watch.poll(T0 + t) is None, t
    event = unhealthy(watch.poll(T0 + 600), reason)  # the launch is as old as the start timeout: it died
    assert event["state"] == state.value


@pytest.mark.parametrize(("state", "reason"), ENDED)
def test_a_pending_launch_that_records_its_end_makes_the_job_unhealthy(store: JobStore, state: JobState,
                                                                      reason: Unhealthy) -> None:
    from airflow_ckpt_provider.core.deployments import record_end

    report(store, T0 - 50, state=state, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, start_timeout=600)
    assert watch.poll(T0 + 1) is None
    assert record_end(store, "L2", ending="config-error", exit_code=2, reason="driver exited with code 2")
    unhealthy(watch.poll(T0 + 2), reason)  # at once, long before the start timeout


def test_a_pending_launch_whose_driver_reports_is_healthy(store: JobStore) -> None:
    report(store, T0 - 50, state=JobState.STOPPED, epoch=1, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, start_timeout=600)
    assert watch.poll(T0 + 1) is None
    report(store, T0 + 20, state=JobState.STARTING, epoch=2, started_at=T0 + 10)
    assert watch.poll(T0 + 20) is None
    report(store, T0 + 30, epoch=2, started_at=T0 + 10, batch_id=0)
    event = watch.poll(T0 + 30)
    assert event is not None and (event["status"], event["epoch"]) == ("healthy", 2)


@pytest.mark.parametrize(("state", "reason"), ENDED)
def test_the_launch_of_the_ended_driver_itself_is_not_on_its_way(store: JobStore, state: JobState,
                                                                reason: Unhealthy) -> None:
    relaunch(store, T0 - 600, "L1")  # the launch whose driver started, then ended
    report(store, T0 - 50, state=state, started_at=T0 - 590)
    unhealthy(JobHealthWatch(store, start_timeout=6000).poll(T0), reason)


# -- restarts are counted per launch ---------------------------------------------------------------------------


def test_restarts_are_the_further_starts_of_one_launch(store: JobStore) -> None:
    deployed(store, 1, T0 - 400, "L1")  # submitted
    deployed(store, 2, T0 - 300, "L1")  # its supervisor restarted the driver: a restart
    deployed(store, 3, T0 - 200, "L2")  # an upgrade: a new launch, no restart
    deployed(store, 4, T0 - 100, "L3")  # its rollback: a new launch, no restart
    deployed(store, 5, T0 - 50, "L3")  # a restart of the rollback
    report(store, T0, epoch=5)
    event = JobHealthWatch(store, max_restarts=3, restart_window=600).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 2)
    event = unhealthy(JobHealthWatch(store, max_restarts=2, restart_window=600).poll(T0),
                      Unhealthy.TOO_MANY_RESTARTS)
    assert event["restarts"] == 2 and "found 2" in event["message"]


def test_launches_alone_are_no_crash_loop(store: JobStore) -> None:
    for epoch in range(1, 6):  # five launches from Airflow (restarts, upgrades, rollbacks) in a few minutes
        deployed(store, epoch, T0 - 300 + 50 * epoch, f"L{epoch}")
    report(store, T0, epoch=5)
    event = JobHealthWatch(store, max_restarts=1, restart_window=600).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 0)


def test_records_without_a_launch_id_count_every_start_but_the_first(store: JobStore) -> None:
    for epoch in (1, 2, 3):
        deployed(store, epoch, T0 - 300 + epoch)  # written before launch ids were recorded
    report(store, T0, epoch=3)
    event = JobHealthWatch(store, max_restarts=3, restart_window=600).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 2)


def test_the_watched_launch_s_first_start_is_no_restart(store: JobStore) -> None:
    deployed(store, 1, T0 - 400, "L1")
    deployed(store, 2, T0 - 300, "L1")
    deployed(store, 3, T0 - 100, "L2")  # the upgrade being verified (started_after its launch)
    report(store, T0, epoch=3, started_at=T0 - 100)
    watch = JobHealthWatch(store, started_after=T0 - 110, max_restarts=1, restart_window=600)
    event = watch.poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 0)
    deployed(store, 4, T0 + 10, "L2")  # its supervisor restarted it: one restart is one too many here
    report(store, T0 + 20, epoch=4, started_at=T0 + 10)
    unhealthy(JobHealthWatch(store, started_after=T0 - 110, max_restarts=1, restart_window=600).poll(T0 + 20),
              Unhealthy.TOO_MANY_RESTARTS)


def test_driver_starts_record_their_launch_id(store: JobStore, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.deployments import LAUNCH_ENV
    from airflow_ckpt_provider.runtime.config import RestoreSpec
    from airflow_ckpt_provider.runtime.startup import prepare_checkpoint

    live = LocalStorage(tmp_path / "live")
    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    prepare_checkpoint(store, live, RestoreSpec.parse("latest-state"), epoch=1)  # `ckpt run` by hand
    for epoch, launch_id in ((2, "L1"), (3, "L1"), (4, "L2")):
        monkeypatch.setenv(LAUNCH_ENV, launch_id)
        prepare_checkpoint(store, live, RestoreSpec.parse("latest-state"), epoch=epoch)
    records = [json.loads(store.storage.read(f"{DEPLOYMENTS}{epoch:010d}.json")) for epoch in (1, 2, 3, 4)]
    assert [r["launch_id"] for r in records] == [None, "L1", "L1", "L2"]
    report(store, time.time(), epoch=4)
    event = JobHealthWatch(store, max_restarts=5).poll()
    assert event is not None and event["restarts"] == 1  # only the second start of L1


# -- control requests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", list(Outcome))
def test_request_watch_reports_the_ack(store: JobStore, outcome: Outcome) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, Action.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 1) is None
    ack = Ack(request.id, Action.SAVEPOINT, outcome, "done here", 2, T0 + 2, snapshot_id="s", batch_id=9)
    write_ack(store, ack)
    event = watch.poll(T0 + 2)
    assert event is not None and event["status"] == outcome.value
    assert event["ack"] == ack.to_dict() and event["request_id"] == request.id
    assert "done here" in event["message"] and "epoch 2" in event["message"]


def test_request_watch_fails_when_the_driver_died_without_answering(store: JobStore) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, Action.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 10) is None
    assert watch.poll(T0 + 30) is None  # noticed: one more poll, in case the ack lands
    event = watch.poll(T0 + 35)
    assert event is not None and (event["status"], event["ack"]) == ("failed", None)
    assert "no heartbeat" in event["message"] and "probably died" in event["message"]


def test_an_ack_written_just_after_the_final_status_is_not_missed(store: JobStore) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, Action.STOP, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    report(store, T0 + 5, epoch=2, state=JobState.STOPPED)  # the driver writes its status first ...
    assert watch.poll(T0 + 5) is None
    write_ack(store, Ack(request.id, Action.STOP, Outcome.COMPLETED, "stopped with savepoint", 2, T0 + 6))
    event = watch.poll(T0 + 7)  # ... then the ack
    assert event is not None and event["status"] == "completed"


def test_request_watch_fails_when_the_driver_ended_or_a_newer_one_took_over(store: JobStore) -> None:
    report(store, T0, epoch=2, state=JobState.STOPPED, reason="canceled")
    request = submit_request(store, Action.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0) is None
    event = watch.poll(T0 + 1)
    assert event is not None and event["status"] == "failed" and "STOPPED" in event["message"]

    leased(store, 3)
    report(store, T0 + 2, epoch=3)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 2) is None
    event = watch.poll(T0 + 3)
    assert event is not None and event["status"] == "failed" and "newer driver (epoch 3)" in event["message"]


def test_request_watch_waits_for_a_stopping_driver_taking_its_final_savepoint(store: JobStore) -> None:
    report(store, T0, epoch=2, state=JobState.STOPPING)
    request = submit_request(store, Action.STOP, 2, now=T0)
    watch = RequestWatch(store, request.id, 2, busy_timeout=600)
    for t in (100, 300, 599):
        assert watch.poll(T0 + t) is None
    assert watch.poll(T0 + 601) is None
    event = watch.poll(T0 + 602)
    assert event is not None and event["status"] == "failed"


def test_request_watch_waits_while_the_driver_has_not_reported(store: JobStore) -> None:
    request = submit_request(store, Action.SAVEPOINT, 2, now=T0)
    leased(store, 2)
    watch = RequestWatch(store, request.id, 2)
    for t in (0, 100, 1000):
        assert watch.poll(T0 + t) is None
    assert "no status.json" in watch.waiting_for()


# -- snapshots ------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> LocalStorage:
    return LocalStorage(make_checkpoint(tmp_path / "ckpt", 3))


def test_snapshot_watch_reports_the_newest_completed_snapshot_after_the_time(
    store: JobStore, checkpoint: LocalStorage
) -> None:
    old = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    after = time.time()
    assert old.manifest.created.timestamp() < after
    watch = SnapshotWatch(store, after=after)
    assert watch.poll() is None
    assert "no completed snapshot" in watch.waiting_for()
    write_batch(Path(checkpoint.root), 3)
    first = create_snapshot(store, checkpoint, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    second = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    newest = max((first, second), key=lambda r: (r.manifest.created_at, r.manifest.batch_id))
    event = watch.poll()
    assert event is not None and newest.uri in event.pop("message")
    assert event == {
        "status": "completed", "snapshot_id": newest.manifest.snapshot_id, "kind": newest.manifest.kind.value,
        "batch_id": 3, "uri": newest.uri, "created_at": newest.manifest.created_at, "job": "orders",
    }


def test_snapshot_watch_filters_by_kind(store: JobStore, checkpoint: LocalStorage) -> None:
    watch = SnapshotWatch(store, after=time.time() - 1, kind="savepoint")
    create_snapshot(store, checkpoint, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    assert watch.poll() is None
    savepoint = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    event = watch.poll()
    assert event is not None and (event["snapshot_id"], event["kind"]) == (savepoint.manifest.snapshot_id,
                                                                          "savepoint")
    with pytest.raises(ConfigError, match="kind"):
        SnapshotWatch(store, after=0, kind="backup")


def test_snapshot_watch_skips_a_corrupt_manifest(store: JobStore, checkpoint: LocalStorage) -> None:
    watch = SnapshotWatch(store, after=time.time() - 1)
    result = create_snapshot(store, checkpoint, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    key = store.manifest_key(result.manifest.snapshot_id)
    store.storage.write(key, store.storage.read(key).replace(b'"batch_id": 2', b'"batch_id": 1'))
    assert watch.poll() is None  # its checksum no longer matches: not a completed snapshot
