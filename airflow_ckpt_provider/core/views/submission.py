"""Submit or reconnect: what a crash-safe submit finds in the job store before it launches anything.

A job whose driver runs (or whose restart or launch is on its way) is reconnected to, never launched a second
time: a second driver would fence the first. The Airflow submit operator (operators/job.py) and the Dagster
submit op (dagster/ops.py) both decide here, and launch with launcher/deploy.launch when this says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, read_launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.views.jobview import JobView, observe, starting_launch


@dataclass(frozen=True)
class Reconnect:
    """What to wait for instead of launching: a driver that runs (``epoch``), a restart on its way (``epoch``: the
    first epoch that ends it) or a launch on its way (``launched_at``); ``message`` says which, for the log."""

    launch_id: str | None
    launched_at: float | None
    epoch: int | None
    message: str

    def identity(self) -> dict[str, Any]:
        """``{"launch_id", "launched_at", "epoch"}``: what the wait is given (and Airflow stores as the job id)."""
        return {"launch_id": self.launch_id, "launched_at": self.launched_at, "epoch": self.epoch}


def _observe(store: JobStore) -> JobView | None:
    try:
        return observe(store)
    except ConfigError:  # never ran, or a launch whose driver has not taken the lease yet
        return None


def find_running(store: JobStore, start_timeout: float, now: float | None = None) -> Reconnect | None:
    """A live driver of this job, its restart, or a launch on its way (younger than ``start_timeout``); None when
    a launch is due. ConflictError for a STOPPING job: a new driver would fence it before its final savepoint."""
    job, at = store.job, time.time() if now is None else now
    view = _observe(store)
    status = view.status if view else None
    restarter = view.restarter if view else None
    if restarter is not None:
        last = read_launch(store)
        launched_at = last.launched_at if last is not None and last.launch_id == restarter.launch_id else None
        return Reconnect(restarter.launch_id, launched_at, restarter.min_epoch,
                         f"job {job} is {restarter.describe()}: waiting for that restart instead of submitting the "
                         "job again")
    starting = starting_launch(store, status, at, start_timeout)
    runs = view is not None and view.live and status is not None and status.state is JobState.RUNNING
    if starting is not None and not runs:
        return Reconnect(starting.launch_id, starting.launched_at, None,
                         f"job {job}: launch {starting.launch_id} (by {starting.launched_by}) is starting its driver: "
                         "waiting for it instead of submitting the job again")
    if view is None or status is None or not view.live:
        return None
    if status.state is JobState.STOPPING:
        raise ConflictError(
            f"job {job} is STOPPING (epoch {status.epoch}: {status.reason}); nothing was submitted. Retry "
            "once it is STOPPED (a retry of the task or op does that), then it restarts from its final savepoint")
    last = read_launch(store)
    return Reconnect(last.launch_id if last else None, None, status.epoch,
                     f"job {job} already runs (epoch {status.epoch}, {status.state}, pid {status.pid} on "
                     f"{status.host}, code {status.code_version or '-'}): reconnecting instead of submitting it "
                     "again; upgrade it to change its code")


def what_to_launch(last: Launch | None, mine: Deployment, *, keep_recorded_code: bool) -> tuple[Deployment, str]:
    """The deployment a submit launches, and a warning ('' for none): ``mine``, unless the job last ran other
    code (``last``, e.g. an upgrade from elsewhere) and ``keep_recorded_code``: then that, so that a keep-alive
    restart never silently downgrades a job whose state newer code wrote. Without a checkpoint of its own,
    ``mine`` keeps the recorded location (e.g. a stateless upgrade's fresh one)."""
    if last is None:
        return mine, ""
    if mine.checkpoint is None and last.deployment.checkpoint:
        mine = replace(mine, checkpoint=last.deployment.checkpoint)
    theirs = last.deployment
    if not keep_recorded_code or (theirs.job_file, theirs.code_version) == (mine.job_file, mine.code_version):
        return mine, ""
    return theirs, (f"job {last.job} last ran {theirs.job_file} (code {theirs.code_version or '-'}, launched by "
                    f"{last.launched_by}); starting that again, not the {mine.job_file} asked for (code "
                    f"{mine.code_version or '-'}): change code with an upgrade, or set keep_recorded_code=False")
