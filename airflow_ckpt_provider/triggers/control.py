"""RequestTrigger: waits in the triggerer for the driver's answer to a control request (savepoint, stop, cancel)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.policy.outcomes import REQUEST_EVENTS
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.control import RequestWatch


class RequestTrigger(JobStoreTrigger):
    """Event statuses: ``completed``, ``failed``, ``rejected`` (payload: status, ack, message, job,
    request_id; ``ack`` is None when the driver went away without answering), ``timeout``, ``error``.

    ``busy_timeout``: how long a STARTING or STOPPING driver (restoring, taking its final savepoint) may go
    without a heartbeat before it counts as gone.
    """

    STATUSES: ClassVar[frozenset[str]] = REQUEST_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        request_id: str,
        epoch: int,
        busy_timeout: float = 900.0,
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
        self.request_id = request_id
        self.epoch = epoch
        self.busy_timeout = busy_timeout

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "request_id": self.request_id, "epoch": self.epoch,
                "busy_timeout": self.busy_timeout}

    def build_watch(self) -> RequestWatch:
        from airflow_ckpt_provider.core.watches.control import RequestWatch

        return RequestWatch(self.job_store(), self.request_id, self.epoch, busy_timeout=self.busy_timeout)
