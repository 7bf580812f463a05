"""Upgrade a running job to new code, keeping its state; roll back if the new code does not make progress. The task
asks for the operation in the job store and waits for it: the supervision service (a job handed to it) or a detached
``ckpt job operate`` acts on it (launcher/upgrade.py, the one actor of every front-end); a retry resumes it.

Design notes: docs/airflow.md#design-notes-operatorsupgradepy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.modes import UpgradeMode
from airflow_ckpt_provider.core.policy.settings import names
from airflow_ckpt_provider.core.policy.stepsettings import STOP_TIMEOUT, UpgradeSettings
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.operations import Operation, actor_alive, ask, read_operation
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.watches.operation import ORPHANED
from airflow_ckpt_provider.launcher.upgrade import handed, outcome_of, start_actor
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators import lineage
from airflow_ckpt_provider.operators.arguments import mode_arg
from airflow_ckpt_provider.operators.base import check_event
from airflow_ckpt_provider.operators.job import _LaunchMixin
from airflow_ckpt_provider.triggers.operation import OPERATION_EVENTS, OperationTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.store.jobstore import JobStore

#: Seconds the wait for an operation may take beyond its steps' own timeouts (starting drivers, the actor's start).
OPERATION_GRACE = 600.0


class UpgradeStreamingJobOperator(_LaunchMixin):  # its lineage facets, as the submit's
    """Upgrade ``job`` to ``job_file`` (``code_version``) with ``upgrade_mode`` savepoint (default),
    last-state or stateless. The job's other settings come from its last deployment.

    ``py_files`` and ``files`` (a list, or one comma-separated string; templated): the new code's own Python
    modules and data files, instead of the last deployment's; None (or a template rendering to '' or 'None')
    keeps those, ``[]`` ships none. A rollback ships the old deployment's. The options are UpgradeSettings'
    (core/policy/stepsettings.py), as ``ckpt job upgrade``'s flags and the Dagster op's config are:
    ``verify_batches`` None waits for 2 batches, or none on a job caught up with no new input; a number is required.

    The task asks for the operation and waits (deferred, or in the worker); a retry of the task finds it and
    resumes it (or returns how it ended). Returns ``{"job", "from_version", "to_version", "upgrade_mode",
    "snapshot_id", "epoch", "batch_id", ...}``; fails (after rolling back) when the new code does not pass
    verification.
    """

    template_fields = (*_LaunchMixin.template_fields, "job_file", "code_version", "upgrade_mode",
                       "allow_non_restored_state", "verify_batches", "partitions", "py_files", "files")
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partitions = partitions
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
        self.start_timeout = verify_timeout  # _LaunchMixin's (unused here: the actor launches and verifies)

    _what = "upgrade"

    def settings(self) -> UpgradeSettings:
        """The arguments as rendered, read as ``ckpt job upgrade`` reads its flags; a template that rendered to ''
        or 'None' leaves its option unset. ConfigError says what is wrong."""
        values = {name: getattr(self, name) for name in names(UpgradeSettings)}  # the arguments carry its names
        given = {k: v for k, v in values.items() if not _unset(v)}
        try:
            return UpgradeSettings(**given)
        except ConfigError as err:
            raise ConfigError(f"{self._what} of job {self.job}: {err}") from err

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail or defer (links.py)
        try:
            settings = self.settings()
        except ConfigError as err:  # bad input: a retry cannot fix it
            raise AirflowFailException(str(err)) from err
        store = self.job_store()
        try:
            found, new = ask(store, settings.what, settings.to_json(), requested_by=self.who(context),
                             key=self.run_key(context))
        except ConflictError as err:
            raise AirflowException(str(err)) from err
        operation = found.operation
        self.log.info("%s of job %s: %s %s", self._what, self.job, "asked for" if new else "resuming",
                      operation.describe())
        return self._follow(context, store, operation, settings)

    def _follow(self, context: Context, store: JobStore, operation: Operation, settings: UpgradeSettings, *,
                orphaned: bool = False) -> Any:
        """The operation's end, or a wait for it; an actor started first when none acts (a job not the service's;
        ``orphaned``: the wait found its actor gone)."""
        if operation.state.final:
            return self._finish(context, store, operation)
        if handed(store):
            self.log.info("job %s: the supervision service acts on %s; nothing of it runs on this worker", self.job,
                          operation.id)
        elif orphaned or not actor_alive(operation, silent_for=0.0):
            last = read_launch(store)
            env = lineage.launch_env(self, last.deployment.env if last else {})
            start_actor(store, self.store_hook.store_url, self.store_hook.s3_options, operation.id, env=env)
        timeout = (2 * settings.check_timeout + settings.stop_timeout + 2 * settings.verify_timeout
                   + OPERATION_GRACE)
        trigger = OperationTrigger(**self._store_args, operation_id=operation.id, timeout=timeout)
        return self.wait(context, trigger=trigger, method_name="after_operation",
                         kwargs={"operation_id": operation.id})

    def after_operation(self, context: Context, event: dict[str, Any], operation_id: str) -> Any:
        event = check_event(event, OPERATION_EVENTS, f"{self._what} of job {self.job}")
        store = self.job_store()
        found = read_operation(store)
        if found is None or found.operation.id != operation_id:
            raise AirflowException(str(event.get("message")))
        orphaned = event["status"] == ORPHANED  # its actor is gone: a new one resumes the recorded step
        if orphaned:
            self.log.warning("%s", event.get("message"))
        return self._follow(context, store, found.operation, self.settings(), orphaned=orphaned)

    def _finish(self, context: Context, store: JobStore, operation: Operation) -> dict[str, Any]:
        for line in operation.lines:
            self.log.info("%s of job %s: %s", self._what, self.job, line)
        try:
            result = outcome_of(operation)
        except CkptError as err:  # refused (nothing stopped) or failed (rolled back or not): a retry ends the same
            raise AirflowFailException(str(err)) from err
        snapshot_id = result.get("snapshot_id")
        SnapshotLink.persist_snapshot(context, snapshot_id and store.snapshot_uri(snapshot_id),
                                      self.store_hook.s3_options.endpoint_url)
        try:
            status = read_status(store)
        except CkptError:
            status = None
        SparkUILink.persist(context, status.ui_url if status is not None else None)
        return result


def _unset(value: object) -> bool:
    """An argument left unset: None, or a template that rendered to '' or 'None'."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


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
        if _unset(self.partitions):
            raise AirflowFailException(f"rescale of job {self.job}: expected partitions (a whole number >= 1), found "
                                       f"{self.partitions!r}; nothing was changed")
        return super().execute(context)  # job_file "": the running code (launcher/upgradesteps.py steps.prepare)
