"""Operators that ask a running driver for something through a control request and wait for its answer:
StopStreamingJobOperator, and the request-and-wait steps the restart, upgrade and savepoint operators share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.policy.modes import StopMode
from airflow_ckpt_provider.core.policy.stepsettings import STOP_TIMEOUT
from airflow_ckpt_provider.core.records.control import STOP_ACTION, RequestAction
from airflow_ckpt_provider.core.views.jobview import request_running, stop_check
from airflow_ckpt_provider.core.watches.control import request_failure, request_result
from airflow_ckpt_provider.links import SnapshotLink, persist_empty_links
from airflow_ckpt_provider.operators.arguments import mode_arg, parse_mode
from airflow_ckpt_provider.operators.base import JobOperator, check_event
from airflow_ckpt_provider.triggers.control import RequestTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.store.jobstore import JobStore

__all__ = ["STOP_ACTION", "STOP_TIMEOUT", "StopStreamingJobOperator", "ack_result", "request_and_wait"]


class StopStreamingJobOperator(JobOperator):
    """Stop a job: ``mode="savepoint"`` (Flink's stop-with-savepoint: finish the batch in flight, take a final
    savepoint, exit) or ``mode="cancel"`` (stop now; the latest completed checkpoint stays valid).

    A job that is not running is left as it is (the task succeeds and says so): safe as a teardown.
    Returns ``{"job", "outcome", "snapshot_id", "snapshot_uri", "batch_id"}``.
    """

    template_fields = (*JobOperator.template_fields, "mode")
    operator_extra_links = (SnapshotLink(),)

    def __init__(self, *, mode: StopMode | str = StopMode.SAVEPOINT, timeout: float = STOP_TIMEOUT,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mode = mode_arg(StopMode, mode)
        self.timeout = timeout

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail or defer (links.py)
        try:
            mode = parse_mode(StopMode, self.mode)
        except CkptError as err:
            raise AirflowException(f"job {self.job}: {err}") from err
        store = self.job_store()
        action = STOP_ACTION[mode]
        try:  # a retry whose first try asked for the stop waits for that request
            status, nothing = stop_check(store, action=action, key=self.run_key(context))
        except CkptError as err:  # its supervisor restarts it: retry once it runs
            raise AirflowException(str(err)) from err
        if nothing:
            self.log.info("%s", nothing)
            return {"job": self.job, "outcome": "not_running", "snapshot_id": None, "snapshot_uri": None,
                    "batch_id": status.batch_id if status else None}
        return request_and_wait(self, context, store, action, timeout=self.timeout, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return ack_result(self, context, event)


def request_and_wait(op: JobOperator, context: Context, store: JobStore, action: RequestAction, *, timeout: float,
                     method_name: str, kwargs: dict[str, Any] | None = None, resume: bool = True) -> Any:
    """Submit ``action`` to the running driver (refused with nothing written if none could answer), then wait. With
    ``resume`` a retry of the task waits for the request its first try wrote, unless that failed
    (core/views/jobview.py ``request_running``): one savepoint or stop per task run."""
    key = op.run_key(context) if resume else ""
    try:
        request = request_running(store, action, requested_by=op.who(context), key=key or None)
    except CkptError as err:
        raise AirflowException(f"job {op.job}: {err}") from err
    op.log.info("job %s: requested %s of the driver of epoch %d (request %s by %s); waiting up to %.0f s", op.job,
                action, request.epoch, request.id, request.requested_by, timeout)
    trigger = RequestTrigger(**op._store_args, request_id=request.id, epoch=request.epoch, timeout=timeout)
    return op.wait(context, trigger=trigger, method_name=method_name, kwargs=kwargs)


def ack_result(op: JobOperator, context: Context, event: dict[str, Any]) -> dict[str, Any]:
    """The driver's answer as the task's result; AirflowException unless it completed."""
    event = check_event(event, ("completed", "failed", "rejected"), f"job {op.job}")
    failure = request_failure(op.job, event)
    if failure:
        raise AirflowException(failure)
    ack = event.get("ack") or {}
    SnapshotLink.persist_snapshot(context, ack.get("snapshot_uri"), op.store_hook.s3_options.endpoint_url)
    op.log.info("job %s: %s completed at batch %s%s", op.job, ack.get("action"), ack.get("batch_id"),
                f", snapshot {ack['snapshot_uri']}" if ack.get("snapshot_uri") else "")
    return request_result(op.job, event)
