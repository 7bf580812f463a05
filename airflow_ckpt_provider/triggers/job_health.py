"""JobHealthTrigger: waits in the triggerer until a job is healthy, or unhealthy (core/watches/job_health.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.outcomes import HEALTH_EVENTS
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch


class JobHealthTrigger(JobStoreTrigger):
    """Event statuses: ``healthy``, ``unhealthy`` (with a ``reason``), ``timeout``, ``error``.

    ``criteria`` (core/policy/health.HealthCriteria), or its fields by name: ``serialize`` writes them flat, and a
    trigger the previous version serialized (``restart_window`` for ``health_window``) still loads. The
    payload has status, reason, message, job, epoch, batch_id, state, ui_url and restarts. What the watch
    remembers (since when the job is healthy, when the batch id last changed) starts over if the triggerer
    restarts.
    """

    STATUSES: ClassVar[frozenset[str]] = HEALTH_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        criteria: HealthCriteria | None = None,
        ckpt_store_conn_id: str = DEFAULT_STORE_CONN,
        store_url: str | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        waiting_since: float | None = None,
        min_wait: float = 0.0,
        resume_with: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(job=job, ckpt_store_conn_id=ckpt_store_conn_id, store_url=store_url,
                         poll_interval=poll_interval, timeout=timeout, waiting_since=waiting_since,
                         min_wait=min_wait, resume_with=resume_with)
        if criteria is not None and fields:
            raise TypeError(f"JobHealthTrigger: pass criteria or its fields, not both (found {sorted(fields)})")
        try:
            self.criteria = criteria if criteria is not None else HealthCriteria.from_kwargs(fields)
        except ConfigError as err:  # the triggerer fails a trigger whose kwargs do not fit on TypeError only
            raise TypeError(f"JobHealthTrigger: {err}") from err

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), **self.criteria.to_kwargs()}

    def build_watch(self) -> JobHealthWatch:
        from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch

        return JobHealthWatch(self.job_store(), self.criteria)
