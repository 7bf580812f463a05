"""The Airflow front-end of every operation (an upgrade, a rescale, a restart): the task records what it asks for in
the job store and waits for it; the supervision service (a job handed to it) or a detached ``ckpt job operate`` acts on
it (launcher/upgrade.py, the one actor of every front-end); a retry of the task resumes it or returns how it ended.

Design notes: docs/airflow.md#design-notes-operatorsupgradepy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.settings import names
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.operations import Operation, actor_alive, ask, read_operation
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.watches.operation import ORPHANED
from airflow_ckpt_provider.launcher.upgrade import handed, outcome_of, start_actor
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators import lineage
from airflow_ckpt_provider.operators.base import check_event
from airflow_ckpt_provider.triggers.operation import OPERATION_EVENTS, OperationTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.policy.stepsettings import StepSettings  # (annotations only)
    from airflow_ckpt_provider.core.store.jobstore import JobStore


class OperationOperator(lineage.LaunchingOperator):
    """Ask for the operation ``settings()`` describes and wait for its end (deferred, or in the worker); its result
    is the task's. Refused (nothing stopped) or failed after the stop: the task fails without a retry (it would end
    the same)."""

    _what = "operation"
    #: The operation's settings (core/policy/stepsettings.py): the operator's arguments carry their names.
    settings_class: type[StepSettings]

    def settings(self) -> StepSettings:
        """The arguments as rendered, read as ``ckpt job upgrade|rescale|restart`` read their flags; a template that
        rendered to '' or 'None' leaves its option unset. ConfigError says what is wrong."""
        values = {name: getattr(self, name) for name in names(self.settings_class)}
        try:
            return self.settings_class(**{k: v for k, v in values.items() if not unset(v)})
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

    def _follow(self, context: Context, store: JobStore, operation: Operation, settings: StepSettings, *,
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
        trigger = OperationTrigger(**self._store_args, operation_id=operation.id, timeout=settings.wait_timeout)
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


def unset(value: object) -> bool:
    """An argument left unset: None, or a template that rendered to '' or 'None'."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))
