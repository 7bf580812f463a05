"""JobHealthWatch and launches: a stopped or failed job with a newer launch on its way is not unhealthy yet, and
restarts are the further driver starts of one launch (deployments/ records), not launches from Airflow."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch, Unhealthy
from tests.support.watchrecords import T0, deployed, relaunch, report, unhealthy

# -- a launch on its way: a stopped or failed job is not unhealthy yet -------------------------------------


ENDED = [(JobState.STOPPED, Unhealthy.STOPPED), (JobState.FAILED, Unhealthy.FAILED)]


@pytest.mark.parametrize("expect", ["healthy", "unhealthy"])
@pytest.mark.parametrize(("state", "reason"), ENDED)
def test_an_ended_job_with_a_newer_launch_on_its_way_is_pending(store: JobStore, expect: str, state: JobState,
                                                                reason: Unhealthy) -> None:
    report(store, T0 - 50, state=state, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, HealthCriteria(expect=expect, start_timeout=600))
    for t in (1, 300, 599.5):
        assert watch.poll(T0 + t) is None, t
    event = unhealthy(watch.poll(T0 + 600), reason)  # the launch is as old as the start timeout: it died
    assert event["state"] == state.value


@pytest.mark.parametrize(("state", "reason"), ENDED)
def test_a_pending_launch_that_records_its_end_makes_the_job_unhealthy(store: JobStore, state: JobState,
                                                                      reason: Unhealthy) -> None:
    from airflow_ckpt_provider.core.records.deployments import record_end

    report(store, T0 - 50, state=state, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, HealthCriteria(start_timeout=600))
    assert watch.poll(T0 + 1) is None
    assert record_end(store, "L2", ending="config-error", exit_code=2, reason="driver exited with code 2")
    unhealthy(watch.poll(T0 + 2), reason)  # at once, long before the start timeout


def test_a_pending_launch_whose_driver_reports_is_healthy(store: JobStore) -> None:
    report(store, T0 - 50, state=JobState.STOPPED, epoch=1, started_at=T0 - 500)
    relaunch(store, T0)
    watch = JobHealthWatch(store, HealthCriteria(start_timeout=600))
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
    unhealthy(JobHealthWatch(store, HealthCriteria(start_timeout=6000)).poll(T0), reason)


# -- restarts are counted per launch ---------------------------------------------------------------------------


def test_restarts_are_the_further_starts_of_one_launch(store: JobStore) -> None:
    deployed(store, 1, T0 - 400, "L1")  # submitted
    deployed(store, 2, T0 - 300, "L1")  # its supervisor restarted the driver: a restart
    deployed(store, 3, T0 - 200, "L2")  # an upgrade: a new launch, no restart
    deployed(store, 4, T0 - 100, "L3")  # its rollback: a new launch, no restart
    deployed(store, 5, T0 - 50, "L3")  # a restart of the rollback
    report(store, T0, epoch=5)
    event = JobHealthWatch(store, HealthCriteria(max_restarts=3, health_window=600)).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 2)
    event = unhealthy(JobHealthWatch(store, HealthCriteria(max_restarts=2, health_window=600)).poll(T0),
                      Unhealthy.TOO_MANY_RESTARTS)
    assert event["restarts"] == 2 and "found 2" in event["message"]


def test_launches_alone_are_no_crash_loop(store: JobStore) -> None:
    for epoch in range(1, 6):  # five launches from Airflow (restarts, upgrades, rollbacks) in a few minutes
        deployed(store, epoch, T0 - 300 + 50 * epoch, f"L{epoch}")
    report(store, T0, epoch=5)
    event = JobHealthWatch(store, HealthCriteria(max_restarts=1, health_window=600)).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 0)


def test_records_without_a_launch_id_count_every_start_but_the_first(store: JobStore) -> None:
    for epoch in (1, 2, 3):
        deployed(store, epoch, T0 - 300 + epoch)  # written before launch ids were recorded
    report(store, T0, epoch=3)
    event = JobHealthWatch(store, HealthCriteria(max_restarts=3, health_window=600)).poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 2)


def test_the_watched_launch_s_first_start_is_no_restart(store: JobStore) -> None:
    deployed(store, 1, T0 - 400, "L1")
    deployed(store, 2, T0 - 300, "L1")
    deployed(store, 3, T0 - 100, "L2")  # the upgrade being verified (started_after its launch)
    report(store, T0, epoch=3, started_at=T0 - 100)
    watch = JobHealthWatch(store, HealthCriteria(started_after=T0 - 110, max_restarts=1, health_window=600))
    event = watch.poll(T0)
    assert event is not None and (event["status"], event["restarts"]) == ("healthy", 0)
    deployed(store, 4, T0 + 10, "L2")  # its supervisor restarted it: one restart is one too many here
    report(store, T0 + 20, epoch=4, started_at=T0 + 10)
    criteria = HealthCriteria(started_after=T0 - 110, max_restarts=1, health_window=600)
    unhealthy(JobHealthWatch(store, criteria).poll(T0 + 20), Unhealthy.TOO_MANY_RESTARTS)


def test_driver_starts_record_their_launch_id(store: JobStore, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
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
    event = JobHealthWatch(store, HealthCriteria(max_restarts=5)).poll()
    assert event is not None and event["restarts"] == 1  # only the second start of L1
