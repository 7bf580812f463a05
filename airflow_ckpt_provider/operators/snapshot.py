"""Operators for snapshots: trigger a savepoint of a running job, dispose of snapshots by retention."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.snapshots.catalog import dispose_snapshots
from airflow_ckpt_provider.links import SnapshotLink, persist_empty_links
from airflow_ckpt_provider.operators.base import JobOperator
from airflow_ckpt_provider.operators.control import STOP_TIMEOUT, ack_result, request_and_wait

if TYPE_CHECKING:
    from airflow.sdk import Context


class TriggerSavepointOperator(JobOperator):
    """Ask the running driver for a savepoint and wait (or defer) until it completes; the job keeps running.

    Returns ``{"job", "snapshot_id", "snapshot_uri", "batch_id", ...}``: the savepoint a later restore or
    upgrade can name. Refused, with nothing written, when no live driver could answer.
    """

    operator_extra_links = (SnapshotLink(),)

    def __init__(self, *, timeout: float = STOP_TIMEOUT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail or defer (links.py)
        return request_and_wait(self, context, self.job_store(), RequestAction.SAVEPOINT, timeout=self.timeout,
                                method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return ack_result(self, context, event)


class DisposeSnapshotsOperator(JobOperator):
    """Dispose of snapshots: the named ones (``snapshot_ids``), or those the retention policy selects
    (keep the last ``keep_checkpoints`` checkpoints; savepoints bounded by ``keep_savepoints`` and
    ``max_savepoint_age`` seconds). The newest completed savepoint is never disposed of by retention.

    With ``preview`` nothing is disposed of: the result lists what would be.
    Returns ``{"job", "disposed": [{"snapshot_id", "kind", "reason"}], "preview"}``. Disposal removes the
    manifest; unreferenced objects are reclaimed by ``ckpt snapshot gc``.
    """

    template_fields = (*JobOperator.template_fields, "snapshot_ids")

    def __init__(
        self,
        *,
        snapshot_ids: list[str] | None = None,
        keep_checkpoints: int = 3,
        keep_savepoints: int | None = None,
        max_savepoint_age: float | None = None,
        preview: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.snapshot_ids = snapshot_ids
        self.keep_checkpoints = keep_checkpoints
        self.keep_savepoints = keep_savepoints
        self.max_savepoint_age = max_savepoint_age
        self.preview = preview

    def execute(self, context: Context) -> dict[str, Any]:
        store = self.job_store()
        if isinstance(self.snapshot_ids, str):  # a template rendered "a,b" (or one id)
            self.snapshot_ids = [i.strip() for i in self.snapshot_ids.split(",") if i.strip()]
        try:
            disposed, line = dispose_snapshots(store, self.snapshot_ids, keep_checkpoints=self.keep_checkpoints,
                                               keep_savepoints=self.keep_savepoints,
                                               max_savepoint_age_s=self.max_savepoint_age, preview=self.preview)
        except CkptError as err:
            raise AirflowException(f"job {self.job}: {err}") from err
        self.log.info("%s", line)
        return {"job": self.job, "disposed": disposed, "preview": self.preview}
