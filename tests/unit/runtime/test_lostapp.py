"""The decision of runtime/lostapp.py: which application of a dead predecessor a starting driver kills."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.runtime.lostapp import lost_application, master_ui_urls

NOW = 1_000_000.0
OLD_APP = "app-20261128185655-0000"
NEW_APP = "app-20261128185757-0001"


def status(*, age: float, state: JobState = JobState.RUNNING, app_id: str | None = OLD_APP) -> JobStatus:
    """The last driver's status, its heartbeat ``age`` s old (every 5 s expected: dead after 20 s)."""
    return JobStatus(job="orders", state=state, epoch=1, updated_at=NOW - age, started_at=NOW - 600, app_id=app_id,
                     pid=12026, host="worker-a", heartbeat_interval=5.0)


def apps(*entries: tuple[str, str]) -> list[dict[str, Any]]:
    """The master JSON's ``activeapps``: (id, state) each, 2 cores."""
    return [{"id": app, "state": state, "cores": 2} for app, state in entries]


def test_a_dead_drivers_application_the_master_still_runs_is_the_one_to_kill() -> None:
    lost = lost_application(status(age=27), apps((OLD_APP, "RUNNING"), (NEW_APP, "WAITING")), NEW_APP, NOW)
    assert lost is not None and (lost.app_id, lost.cores) == (OLD_APP, 2)
    assert lost.describe(NOW) == (f"application {OLD_APP} of epoch 1 (its driver pid 12026 on worker-a, silent for "
                                  "27 s) still holds 2 cores")


@pytest.mark.parametrize(("last", "active", "why"), [
    (status(age=3), apps((OLD_APP, "RUNNING")), "its driver is live: a heartbeat 3 s ago"),
    (status(age=27), apps((NEW_APP, "WAITING")), "the master no longer lists it"),
    (status(age=27), apps((OLD_APP, "FINISHED")), "the master ended it"),
    (status(age=27, app_id=None), apps((OLD_APP, "RUNNING")), "no application recorded"),
    (status(age=27, app_id=NEW_APP), apps((NEW_APP, "RUNNING")), "the status is already this driver's"),
    (None, apps((OLD_APP, "RUNNING")), "no status at all"),
])
def test_nothing_is_killed_unless_a_dead_drivers_application_is_still_active(
        last: JobStatus | None, active: list[dict[str, Any]], why: str) -> None:
    assert lost_application(last, active, NEW_APP, NOW) is None, why


def test_a_stopped_drivers_application_still_listed_is_killed_but_a_restoring_one_is_given_its_allowance() -> None:
    # A STOPPED status is not live at any age; a STARTING driver is live for 300 s (it restores without reporting).
    assert lost_application(status(age=1, state=JobState.STOPPED), apps((OLD_APP, "RUNNING")), NEW_APP, NOW)
    assert lost_application(status(age=60, state=JobState.STARTING), apps((OLD_APP, "RUNNING")), NEW_APP, NOW) is None


def test_the_masters_ui_is_on_each_master_host_at_the_given_port_or_sparks_default() -> None:
    assert master_ui_urls("spark://10.0.0.5:7077", None) == ["http://10.0.0.5:8080"]
    assert master_ui_urls("spark://m1:7077,m2:7077", "18080") == ["http://m1:18080", "http://m2:18080"]
