"""Restart a job's last deployment from the latest completed checkpoint or a chosen snapshot: an operation like an
upgrade (operators/operation.py), acted on by the one actor (launcher/upgrade.py) from a plan in the job store.

Design notes: docs/airflow.md#design-notes-operatorsupgradepy."""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.core.policy.modes import StopMode, SupervisionMode
from airflow_ckpt_provider.core.policy.stepsettings import START_TIMEOUT, STOP_TIMEOUT, RestartStepSettings
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink
from airflow_ckpt_provider.operators.arguments import mode_arg, restore_arg
from airflow_ckpt_provider.operators.operation import OperationOperator


class RestartStreamingJobOperator(OperationOperator):
    """Restart a job's last deployment (spec/last.json) from ``restore`` (the latest completed checkpoint by default,
    or a chosen snapshot). A driver that still runs is stopped first (``stop_mode``: cancel, the default, or
    savepoint). The options are RestartStepSettings' (core/policy/stepsettings.py), as ``ckpt job restart``'s flags
    and the Dagster restart ops' config are.

    One owner per restart (core/views/jobview.restart_decision): when the job's supervisor restarts it already
    (RESTARTING by a live supervisor, or a driver that just died or failed under a live supervisor), a
    ``latest-state`` restart launches nothing and waits for that restart to run; a restart from a chosen
    snapshot replaces it.

    The task asks for the restart in the job store and waits (deferred, or in the worker); the supervision service (a
    job handed to it) or a detached ``ckpt job operate`` acts on it, and a retry of the task resumes it (never a
    second stop or launch). Returns ``{"job", "epoch", "batch_id", "launch_id", "restore", "snapshot_id",
    "restarted_by"}``: ``snapshot_id`` the stop's savepoint (or the latest snapshot), ``restarted_by`` ``operation``,
    or ``supervisor``/``driver`` when it left the restart to them. ``supervision``: who keeps the restarted job
    running (``auto``: the job stays with the service once handed to it).
    """

    template_fields = (*OperationOperator.template_fields, "restore", "stop_mode", "supervision")
    operator_extra_links = (SparkUILink(), SnapshotLink())
    settings_class = RestartStepSettings
    _what = "restart"

    def __init__(self, *, restore: str = "latest-state", stop_mode: StopMode | str = StopMode.CANCEL,
                 start_timeout: float = START_TIMEOUT, stop_timeout: float = STOP_TIMEOUT,
                 supervision: SupervisionMode | str = SupervisionMode.AUTO, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.restore = restore_arg(restore)  # literal values are checked when the DAG is parsed
        self.stop_mode = mode_arg(StopMode, stop_mode)
        self.supervision = mode_arg(SupervisionMode, supervision)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
