"""SnapshotTrigger: waits in the triggerer for a completed snapshot created after a point in time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ckpt_provider.core.policy.outcomes import SNAPSHOT_EVENTS
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN, TRIGGER_EVENTS, JobStoreTrigger

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.snapshot import SnapshotWatch


class SnapshotTrigger(JobStoreTrigger):
    """Event statuses: ``completed`` (payload: snapshot_id, kind, batch_id, uri, created_at, job, message),
    ``timeout``, ``error``. ``after`` is in epoch seconds; ``kind`` is checkpoint, savepoint or None (any)."""

    STATUSES: ClassVar[frozenset[str]] = SNAPSHOT_EVENTS | TRIGGER_EVENTS

    def __init__(
        self,
        *,
        job: str,
        after: float,
        kind: str | None = None,
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
        self.after = float(after)
        self.kind = kind

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "after": self.after, "kind": self.kind}

    def build_watch(self) -> SnapshotWatch:
        from airflow_ckpt_provider.core.watches.snapshot import SnapshotWatch

        return SnapshotWatch(self.job_store(), after=self.after, kind=self.kind)
