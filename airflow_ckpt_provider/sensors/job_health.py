"""JobHealthSensor: waits until a streaming job is healthy (after a deploy), or until it is not (to restart it)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, ClassVar

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.hooks.job_store import JobStoreHook
from airflow_ckpt_provider.sensors.base import WatchSensor, optional_int, optional_time
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger


class JobHealthSensor(WatchSensor):
    """Waits on ``job``'s health (core/watches/job_health.JobHealthWatch has the rules).

    ``expect="healthy"``: returns the event once the job is healthy (RUNNING, ``min_batches`` new batches,
    for ``healthy_for`` s); fails with the event's message as soon as it is unhealthy. Pass ``min_epoch``
    (or ``started_after``) from the deploy task so the previous deployment's status does not count.
    ``expect="unhealthy"``: returns the event (reason: failed, stopped, no_heartbeat, too_many_restarts,
    no_progress, not_started) so that a downstream task can restart the job; with ``soft_fail`` the
    sensor's ``timeout`` (a job healthy all along) skips instead of failing.

    The health arguments are core/policy/health.HealthCriteria's (``restart_window``, the earlier name of
    ``health_window``, is accepted with a deprecation warning for one release). ``healthy_for``,
    ``min_batches`` and ``progress_timeout`` track the job over time: they need
    ``deferrable`` or mode="poke"; mode="reschedule" is refused with them.
    """

    template_fields = ("job", "store_url", "min_epoch", "started_after")
    trigger_class: ClassVar[type[JobHealthTrigger]] = JobHealthTrigger

    def __init__(
        self,
        *,
        job: str,
        expect: str = Health.HEALTHY,
        min_epoch: int | str | None = None,
        started_after: float | str | None = None,
        healthy_for: float = 0,
        min_batches: int = 0,
        heartbeat_timeout: float | None = None,
        max_restarts: int | None = None,
        count_query_restarts: bool = False,
        health_window: float = 600,
        progress_timeout: float | None = None,
        start_timeout: float = 300,
        ckpt_store_conn_id: str = JobStoreHook.default_conn_name,
        store_url: str | None = None,
        restart_window: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if expect not in (Health.HEALTHY, Health.UNHEALTHY):
            raise ValueError(f"{self.task_id}: expect must be 'healthy' or 'unhealthy', found {expect!r}")
        if restart_window is not None:
            warnings.warn(f"{self.task_id}: restart_window is deprecated, pass health_window (the same window)",
                          AirflowProviderDeprecationWarning, stacklevel=2)
            if health_window not in (HealthCriteria.health_window, restart_window):
                raise ValueError(f"{self.task_id}: restart_window is the earlier name of health_window: pass "
                                 f"health_window only (found {restart_window} and {health_window})")
            health_window = restart_window
        try:  # min_epoch and started_after are templated: the trigger gets them once rendered (make_trigger)
            self.criteria = HealthCriteria(
                expect=Health(expect), healthy_for=healthy_for, min_batches=min_batches,
                heartbeat_timeout=heartbeat_timeout, max_restarts=max_restarts,
                count_query_restarts=count_query_restarts, health_window=health_window,
                progress_timeout=progress_timeout, start_timeout=start_timeout)
        except ConfigError as err:
            raise ValueError(f"{self.task_id}: {err}") from err
        if self.mode == "reschedule" and not self.deferrable and (healthy_for or min_batches or progress_timeout):
            raise ValueError(
                f"{self.task_id}: healthy_for, min_batches and progress_timeout track the job between pokes, which "
                'mode="reschedule" forgets; use deferrable=True or mode="poke"'
            )
        self.job = job
        self.min_epoch = min_epoch
        self.started_after = started_after
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url

    def make_trigger(self) -> JobHealthTrigger:
        criteria = replace(self.criteria, min_epoch=optional_int(self.min_epoch),
                           started_after=optional_time(self.started_after))
        return JobHealthTrigger(
            job=self.job, criteria=criteria, ckpt_store_conn_id=self.ckpt_store_conn_id, store_url=self.store_url,
            poll_interval=self.poke_interval, timeout=self.timeout,
        )

    def on_event(self, event: dict[str, Any]) -> Any:
        status, message, expect = event["status"], str(event.get("message")), self.criteria.expect
        if status == Health.HEALTHY and expect is Health.HEALTHY:
            self.log.info("%s", message)
            return event
        if status == Health.UNHEALTHY and expect is Health.UNHEALTHY:
            self.log.warning("%s", message)
            return event
        if status == Health.UNHEALTHY:
            self.fail(message)
        raise AirflowException(f"{self.task_id}: expected an unhealthy event (expect='unhealthy'), found {event!r}")
