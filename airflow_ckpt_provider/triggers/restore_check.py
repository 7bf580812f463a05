"""RestoreCheckTrigger: waits in the triggerer for the verdict of a detached restore check (an upgrade's step 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.policy.outcomes import CHECK_EVENTS
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.restore_check import RestoreCheckWatch


class RestoreCheckTrigger(JobStoreTrigger):
    """Event statuses: the verdict ``compatible``, ``incompatible``, ``inconclusive``, ``bad-input``, or ``failed``
    (the check ended without one: its process is gone, or its deadline passed), each with message, job, check_id,
    reason, snapshot_id, batch_id, seconds; and ``timeout``, ``error``."""

    STATUSES: ClassVar[frozenset[str]] = CHECK_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        check_id: str,
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
        self.check_id = check_id

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "check_id": self.check_id}

    def build_watch(self) -> RestoreCheckWatch:
        from airflow_ckpt_provider.core.watches.restore_check import RestoreCheckWatch

        return RestoreCheckWatch(self.job_store(), self.check_id)
