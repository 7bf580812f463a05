"""OperationTrigger: waits in the triggerer for a job's operation (upgrade, rescale, restart) to end, acted on by the
supervision service or a detached ``ckpt job operate``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.records.operations import OperationState
from airflow_ckpt_provider.core.watches.operation import GONE, ORPHANED
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.operation import OperationWatch

#: The final states of an operation and the watch's own events.
OPERATION_EVENTS = frozenset({*(s.value for s in OperationState if s.final), ORPHANED, GONE})


class OperationTrigger(JobStoreTrigger):
    """Event statuses: the operation's final state ``succeeded`` (with ``result``), ``refused`` or ``failed`` (with
    ``message``); ``orphaned`` (its actor is gone and the job is not the supervision service's: the task starts a new
    actor, which resumes the recorded step); ``gone`` (the record was replaced); and ``timeout``, ``error``."""

    STATUSES: ClassVar[frozenset[str]] = OPERATION_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        operation_id: str,
        ckpt_store_conn_id: str = DEFAULT_STORE_CONN,
        store_url: str | None = None,
        poll_interval: float = 2.0,
        timeout: float | None = None,
        waiting_since: float | None = None,
        min_wait: float = 0.0,
        resume_with: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(job=job, ckpt_store_conn_id=ckpt_store_conn_id, store_url=store_url,
                         poll_interval=poll_interval, timeout=timeout, waiting_since=waiting_since,
                         min_wait=min_wait, resume_with=resume_with)
        self.operation_id = operation_id

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "operation_id": self.operation_id}

    def build_watch(self) -> OperationWatch:
        from airflow_ckpt_provider.core.watches.operation import OperationWatch

        return OperationWatch(self.job_store(), self.operation_id)
