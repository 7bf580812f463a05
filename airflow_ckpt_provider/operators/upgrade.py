"""Upgrade a running job to new code, keeping its state; roll back if the new code does not make progress; rescale
it. Operations (operators/operation.py): the task asks for it in the job store and waits; the supervision service or a
detached ``ckpt job operate`` acts on it (launcher/upgrade.py, the one actor of every front-end); a retry resumes it.

Design notes: docs/airflow.md#design-notes-operatorsupgradepy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_ckpt_provider.core.policy.modes import UpgradeMode
from airflow_ckpt_provider.core.policy.stepsettings import STOP_TIMEOUT, UpgradeSettings
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators.arguments import mode_arg
from airflow_ckpt_provider.operators.operation import OperationOperator, unset

if TYPE_CHECKING:
    from airflow.sdk import Context


class UpgradeStreamingJobOperator(OperationOperator):  # its lineage facets, as the submit's
    """Upgrade ``job`` to ``job_file`` (``code_version``) with ``upgrade_mode`` savepoint (default),
    last-state or stateless. The job's other settings come from its last deployment.

    ``py_files`` and ``files`` (a list, or one comma-separated string; templated): the new code's own Python
    modules and data files, instead of the last deployment's; None (or a template rendering to '' or 'None')
    keeps those, ``[]`` ships none. A rollback ships the old deployment's. ``delete_keys``/``update_values``: edit
    the state in the same run (the State Processor: keys deleted or values set in the stop's savepoint, checked on a
    copy first; docs/state-processor.md). The options are UpgradeSettings'
    (core/policy/stepsettings.py), as ``ckpt job upgrade``'s flags and the Dagster op's config are:
    ``verify_batches`` None waits for 2 batches, or none on a job caught up with no new input; a number is required.

    The task asks for the operation and waits (deferred, or in the worker); a retry of the task finds it and
    resumes it (or returns how it ended). Returns ``{"job", "from_version", "to_version", "upgrade_mode",
    "snapshot_id", "epoch", "batch_id", ...}``; fails (after rolling back) when the new code does not pass
    verification.
    """

    template_fields = (*OperationOperator.template_fields, "job_file", "code_version", "upgrade_mode",
                       "allow_non_restored_state", "verify_batches", "partitions", "py_files", "files",
                       "delete_keys", "update_values")
    operator_extra_links = (SparkUILink(), SnapshotLink())

    def __init__(
        self,
        *,
        job_file: str,
        code_version: str | None = None,
        upgrade_mode: UpgradeMode | str = UpgradeMode.SAVEPOINT,
        allow_non_restored_state: bool | str = False,
        verify_batches: int | str | None = None,
        verify_timeout: float = 300.0,
        check_timeout: float = 600.0,
        stop_timeout: float = STOP_TIMEOUT,
        partitions: int | str | None = None,
        py_files: Sequence[str] | str | None = None,
        files: Sequence[str] | str | None = None,
        delete_keys: str | None = None,
        update_values: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partitions = partitions
        self.delete_keys = delete_keys
        self.update_values = update_values
        self.py_files = py_files
        self.files = files
        self.job_file = job_file
        self.code_version = code_version
        self.upgrade_mode = mode_arg(UpgradeMode, upgrade_mode)
        self.allow_non_restored_state = allow_non_restored_state
        self.verify_batches = verify_batches
        self.verify_timeout = verify_timeout
        self.check_timeout = check_timeout
        self.stop_timeout = stop_timeout

    _what = "upgrade"

    settings_class = UpgradeSettings


class RescaleStreamingJobOperator(UpgradeStreamingJobOperator):
    """Rescale ``job``'s state to ``partitions`` state partitions through a savepoint, keeping its code: the
    restore check on a repartitioned copy, stop with savepoint, the savepoint repartitioned on a copy and saved
    as a savepoint of its own (trigger ``rescale``), the job started on it and verified, and a rollback to the
    old partitions from the stop's savepoint if anything fails (Flink: a savepoint, then another parallelism).

    A mode of the upgrade (Flink's operator rescales the same way: a changed parallelism is an upgrade through a
    savepoint); ``UpgradeStreamingJobOperator(partitions=N)`` changes the code in the same run. Spark 4.3
    repartitions RocksDB state only (docs/rescaling.md). Returns the upgrade's result, with ``partitions`` and
    ``rescaled_snapshot_id``.
    """

    _what = "rescale"

    def __init__(self, *, partitions: int | str, **kwargs: Any) -> None:
        kwargs.setdefault("job_file", "")  # the running code's, read from spec/last.json when the task runs
        super().__init__(partitions=partitions, upgrade_mode=UpgradeMode.SAVEPOINT, **kwargs)

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail (links.py); the upgrade's execute repeats it
        if unset(self.partitions):
            raise AirflowFailException(f"rescale of job {self.job}: expected partitions (a whole number >= 1), found "
                                       f"{self.partitions!r}; nothing was changed")
        return super().execute(context)  # job_file "": the running code (launcher/upgradesteps.py steps.prepare)
