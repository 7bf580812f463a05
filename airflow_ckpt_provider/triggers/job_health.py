"""JobHealthTrigger: waits in the triggerer until a job is healthy, or unhealthy (core/watches/job_health.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.outcomes import HEALTH_EVENTS
from airflow_ckpt_provider.core.restart import Health
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch


class JobHealthTrigger(JobStoreTrigger):
    """Event statuses: ``healthy``, ``unhealthy`` (with a ``reason``), ``timeout``, ``error``.

    The health arguments are JobHealthWatch's; the payload has status, reason, message, job, epoch,
    batch_id, state, ui_url and restarts. What the watch remembers (since when the job is healthy, when
    the batch id last changed) starts over if the triggerer restarts.
    """

    STATUSES: ClassVar[frozenset[str]] = HEALTH_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        expect: str = Health.HEALTHY,
        min_epoch: int | None = None,
        started_after: float | None = None,
        healthy_for: float = 0,
        min_batches: int = 0,
        heartbeat_timeout: float | None = None,
        max_restarts: int | None = None,
        restart_window: float = 600,
        progress_timeout: float | None = None,
        start_timeout: float = 300,
        ckpt_store_conn_id: str = DEFAULT_STORE_CONN,
        store_url: str | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        waiting_since: float | None = None,
        min_wait: float = 0.0,
        resume_with: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(job=job, ckpt_store_conn_id=ckpt_store_conn_id, store_url=store_url,
                         poll_interval=poll_interval, timeout=timeout, waiting_since=waiting_since,
                         min_wait=min_wait, resume_with=resume_with)
        self.expect = str(expect)
        self.min_epoch = min_epoch
        self.started_after = started_after
        self.healthy_for = healthy_for
        self.min_batches = min_batches
        self.heartbeat_timeout = heartbeat_timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.progress_timeout = progress_timeout
        self.start_timeout = start_timeout

    def arguments(self) -> dict[str, Any]:
        return {
            **super().arguments(), "expect": self.expect, "min_epoch": self.min_epoch,
            "started_after": self.started_after, "healthy_for": self.healthy_for, "min_batches": self.min_batches,
            "heartbeat_timeout": self.heartbeat_timeout, "max_restarts": self.max_restarts,
            "restart_window": self.restart_window, "progress_timeout": self.progress_timeout,
            "start_timeout": self.start_timeout,
        }

    def build_watch(self) -> JobHealthWatch:
        from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch

        return JobHealthWatch(
            self.job_store(), expect=self.expect, min_epoch=self.min_epoch, started_after=self.started_after,
            healthy_for=self.healthy_for, min_batches=self.min_batches, heartbeat_timeout=self.heartbeat_timeout,
            max_restarts=self.max_restarts, restart_window=self.restart_window,
            progress_timeout=self.progress_timeout, start_timeout=self.start_timeout,
        )
