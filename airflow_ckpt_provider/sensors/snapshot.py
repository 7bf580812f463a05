"""SnapshotSensor: waits for a completed snapshot (checkpoint or savepoint) of a job, newer than a point in time."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from airflow_ckpt_provider.hooks.job_store import JobStoreHook
from airflow_ckpt_provider.sensors.base import WatchSensor, optional_time
from airflow_ckpt_provider.triggers.snapshot import SnapshotTrigger


class SnapshotSensor(WatchSensor):
    """Returns the latest completed snapshot of ``job`` created at or after ``after``: snapshot_id, kind,
    batch_id, uri, created_at, job, message.

    ``after``: epoch seconds, a datetime or an ISO 8601 string (templated); default: when the sensor
    starts waiting (mode="reschedule" needs an explicit ``after``: every poke starts anew).
    ``kind``: "checkpoint", "savepoint", or None for either.
    """

    template_fields = ("job", "store_url", "after", "kind")
    trigger_class: ClassVar[type[SnapshotTrigger]] = SnapshotTrigger

    def __init__(
        self,
        *,
        job: str,
        after: float | str | None = None,
        kind: str | None = None,
        ckpt_store_conn_id: str = JobStoreHook.default_conn_name,
        store_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if after is None and self.mode == "reschedule" and not self.deferrable:
            raise ValueError(f'{self.task_id}: mode="reschedule" needs an explicit after= (every poke starts anew)')
        self.job = job
        self.after = after
        self.kind = kind
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url

    def make_trigger(self) -> SnapshotTrigger:
        after = optional_time(self.after)
        return SnapshotTrigger(
            job=self.job, after=time.time() if after is None else after, kind=self.kind or None,
            ckpt_store_conn_id=self.ckpt_store_conn_id, store_url=self.store_url,
            poll_interval=self.poke_interval, timeout=self.timeout,
        )

    def on_event(self, event: dict[str, Any]) -> Any:
        self.log.info("%s", event.get("message"))
        return event
