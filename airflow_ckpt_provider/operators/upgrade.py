"""Upgrade a running job to new code, keeping its state; roll back if the new code does not make progress.

Design notes: docs/airflow.md#design-notes-operatorsupgradepy."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, UpgradeMode
from airflow_ckpt_provider.core.policy.outcomes import CHECK_EVENTS, CheckOutcome
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch, mark_stable, read_launch
from airflow_ckpt_provider.core.records.restore_check import OUTCOME_GRACE
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots
from airflow_ckpt_provider.core.snapshots.rescaling import parse_partitions
from airflow_ckpt_provider.launcher import upgradesteps as steps
from airflow_ckpt_provider.launcher.deploy import log_tail
from airflow_ckpt_provider.launcher.restore_check import start_check
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators.arguments import mode_arg, parse_mode, path_list
from airflow_ckpt_provider.operators.base import check_event
from airflow_ckpt_provider.operators.control import STOP_TIMEOUT, ack_result, request_and_wait
from airflow_ckpt_provider.operators.job import _LaunchMixin
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.store.jobstore import JobStore


class UpgradeStreamingJobOperator(_LaunchMixin):
    """Upgrade ``job`` to ``job_file`` (``code_version``) with ``upgrade_mode`` savepoint (default),
    last-state or stateless. The job's other settings come from its last deployment.

    ``py_files`` and ``files`` (a list, or one comma-separated string; templated): the new code's own Python
    modules and data files, instead of the last deployment's; None (or a template rendering to '' or 'None')
    keeps those, ``[]`` ships none. A rollback ships the old deployment's.

    Returns ``{"job", "from_version", "to_version", "upgrade_mode", "snapshot_id", "epoch", "batch_id"}``;
    fails (after rolling back) when the new code does not pass verification.
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
        allow_non_restored_state: bool = False,
        verify_batches: int = 2,
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
        self.start_timeout = verify_timeout

    def _step(self, n: int, text: str, *args: Any) -> None:
        self.log.info("%s of job %s, step %d/5: %s", self._what, self.job, n, text % args if args else text)

    _what = "upgrade"

    def _partitions(self) -> int | None:
        """The state partitions asked for; None (or an empty form field) keeps them."""
        if self.partitions is None or str(self.partitions).strip() in ("", "None"):
            return None
        try:
            return parse_partitions(self.partitions)
        except ValueError as err:
            raise AirflowException(f"{self._what} of job {self.job}: {err}; nothing was changed") from err

    def _paths(self, name: str) -> tuple[str, ...] | None:
        """``py_files`` or ``files`` as given; None (or a rendered '' or 'None') keeps the recorded ones."""
        value = getattr(self, name)
        if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
            return None
        try:
            return path_list(value, name)
        except ConfigError as err:
            raise AirflowException(f"{self._what} of job {self.job}: {err}; nothing was changed") from err

    def _mode(self) -> UpgradeMode:
        try:
            return parse_mode(UpgradeMode, self.upgrade_mode)
        except CkptError as err:
            raise AirflowException(f"{self._what} of job {self.job}: {err}; nothing was changed") from err

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail or defer (links.py)
        mode = self._mode()
        try:
            verify_batches = int(self.verify_batches)
        except (TypeError, ValueError):
            verify_batches = -1
        if verify_batches < 0:
            raise AirflowException(f"verify_batches: expected a whole number >= 0, found {self.verify_batches!r}")
        ti = context.get("ti")
        hook = self.store_hook
        try:
            plan, began = steps.prepare(
                self.job_store(), store_url=hook.store_url, s3=hook.s3_options, what=self._what,
                job_file=self.job_file, code_version=self.code_version, mode=mode, partitions=self._partitions(),
                attempt=int(getattr(ti, "try_number", 1) or 1) if ti is not None else 1,
                py_files=self._paths("py_files"), files=self._paths("files"),
                submit_hint="submit it first with SubmitStreamingJobOperator; nothing was changed")
        except steps.NotRetried as err:
            raise AirflowFailException(str(err)) from err
        except ConfigError as err:
            raise AirflowException(str(err)) from err
        return self._drive(context, plan, began)

    def _plan(self, plan: dict[str, Any]) -> steps.UpgradePlan:
        """The plan a trigger carried back; what it lacks (a plan of an earlier version) from this task."""
        own = {"job": self.job, "what": self._what, "mode": self._mode().value, "partitions": self._partitions(),
               "new": {"job_file": self.job_file, "code_version": self.code_version}}
        return steps.UpgradePlan.from_dict(own | plan)

    # -- act: each step as launcher/upgradesteps.py decides it; a wait defers, and resumes in an after_* method --

    def _drive(self, context: Context, plan: steps.UpgradePlan, outcome: steps.Outcome) -> Any:
        """Act on each step until one waits (it defers; not deferrable: it returns the run's end) or ends the run."""
        acts: dict[type, Callable[[Context, steps.UpgradePlan, Any], Any]] = {
            steps.Refuse: self._fail, steps.Fail: self._fail, steps.TakeSavepoint: self._fail,
            steps.Relaunch: self._relaunch, steps.Done: self._done, steps.Check: self._check, steps.Stop: self._stop,
            steps.Rescale: self._rescale, steps.Start: self._start_new, steps.Verify: self._verify,
            steps.RollBack: self._roll_back}
        while True:
            plan, step = steps.next_step(plan, outcome)
            acted = acts[type(step)](context, plan, step)
            if not isinstance(acted, steps.Outcome):
                return acted
            outcome = acted

    def _fail(self, context: Context, plan: steps.UpgradePlan,
              step: steps.Refuse | steps.Fail | steps.TakeSavepoint) -> NoReturn:
        """Refused, failed; or a savepoint to check against, which only ``ckpt job rescale`` asks for."""
        raise AirflowException(getattr(step, "message", f"{self._what} of job {self.job}: unexpected step {step}"))

    def _relaunch(self, context: Context, plan: steps.UpgradePlan, step: steps.Relaunch) -> NoReturn:
        self._launch(self.job_store(), plan.old_deployment, LATEST_STATE)
        raise AirflowException(step.message)

    def _check(self, context: Context, plan: steps.UpgradePlan, step: steps.Check) -> Any:
        try:
            check_id = self._start_check(context, self.job_store(), plan)
        except CkptError as err:
            return steps.Checked(problem=str(err))
        return self._wait_check(context, check_id, "after_check", plan)

    def _stop(self, context: Context, plan: steps.UpgradePlan, step: steps.Stop) -> Any:
        if step.epoch is None:
            self._step(2, "no driver runs: nothing to stop")
            return steps.Stopped(None, _latest(self.job_store()))
        if step.action is RequestAction.STOP:
            self._step(2, "stop with savepoint (driver of epoch %d)", step.epoch)
        else:
            self._step(2, "cancel the driver of epoch %d (%s)", step.epoch, plan.mode)
        return request_and_wait(self, context, self.job_store(), step.action, timeout=self.stop_timeout,
                                method_name="after_stop", kwargs={"plan": plan.to_dict()})

    def _rescale(self, context: Context, plan: steps.UpgradePlan, step: steps.Rescale) -> Any:
        try:
            check_id = self._start_rescale(context, self.job_store(), plan, step)
        except CkptError as err:
            return steps.Rescaled(problem=f"the rescale could not start: {err}")
        return self._wait_check(context, check_id, "after_rescale", plan)

    def _start_check(self, context: Context, store: JobStore, plan: steps.UpgradePlan) -> str:
        """Start the restore check detached (its record first); the task then waits for its verdict."""
        partitions, new = plan.partitions, plan.new_deployment
        self._step(1, "checking that %s (code %s) restores the current state%s", new.job_file,
                   new.code_version or "-", f" repartitioned into {partitions} partitions" if partitions else "")
        return self._start_detached(context, store, plan, 1, "restore check", rescale_to=partitions)

    def _start_rescale(self, context: Context, store: JobStore, plan: steps.UpgradePlan, step: steps.Rescale) -> str:
        """The savepoint repartitioned on a copy and saved as a savepoint of its own, in a detached process."""
        if step.note:
            self._step(2, step.note)
        self._step(3, "repartitioning savepoint %s into %d state partitions on a copy", step.snapshot_id,
                   step.partitions)
        return self._start_detached(context, store, plan, 3, "rescale", rescale_to=step.partitions, save_rescaled=True,
                                    restore=RestoreSpec(RestoreMode.SNAPSHOT, step.snapshot_id))

    def _start_detached(self, context: Context, store: JobStore, plan: steps.UpgradePlan, step: int, what: str,
                        **options: Any) -> str:
        """A restore check of the new deployment (``options``: what start_check takes beyond the common ones) in a
        detached process, its record written first; its id."""
        hook = self.store_hook
        check = start_check(store, plan.new_deployment, store_url=hook.store_url, timeout=self.check_timeout,
                            s3=hook.s3_options, started_by=self._who(context),
                            allow_non_restored_state=_flag(self.allow_non_restored_state), **options)
        self._step(step, "%s %s runs as pid %s on %s (log %s); waiting up to %.0f s for its verdict", what,
                   check.check_id, check.pid, check.host, check.log_file, self.check_timeout)
        return check.check_id

    def _wait_check(self, context: Context, check_id: str, method_name: str, plan: steps.UpgradePlan) -> Any:
        # The watch's own deadline (timeout + OUTCOME_GRACE) says "no verdict" before the trigger times out.
        trigger = RestoreCheckTrigger(**self._store_args, check_id=check_id,
                                      timeout=self.check_timeout + OUTCOME_GRACE + 30)
        return self.wait(context, trigger=trigger, method_name=method_name, kwargs={"plan": plan.to_dict()})

    def _who(self, context: Context) -> str:
        ti = context.get("ti")
        who = f"airflow:{self.dag_id}.{self.task_id}"
        if ti is not None and getattr(ti, "run_id", None):
            who += f" run {ti.run_id} try {getattr(ti, 'try_number', 1)}"
        return who

    def _start_new(self, context: Context, plan: steps.UpgradePlan, step: steps.Start) -> steps.Started:
        if step.note:
            self._step(2, step.note)
        new = plan.new_deployment
        self._step(3, "starting %s (code %s), restore %s", new.job_file, new.code_version or "-", step.restore)
        try:
            return steps.Started(self._launch(self.job_store(), new, step.restore).to_dict())
        except AirflowException as err:  # e.g. the job file is missing on this worker: bring the old code back
            return steps.Started(problem=str(err))

    def _verify(self, context: Context, plan: steps.UpgradePlan, step: steps.Verify) -> Any:
        assert plan.launch is not None  # the plan records the launch before it asks to verify it
        criteria = steps.verify_criteria(Launch.from_dict(plan.launch).launched_at, batches=int(self.verify_batches),
                                         timeout=self.verify_timeout)
        self._step(4, "verifying: %d batches within %.0f s", int(self.verify_batches), self.verify_timeout)
        trigger = JobHealthTrigger(**self._store_args, criteria=criteria, timeout=self.verify_timeout)
        return self.wait(context, trigger=trigger, method_name="after_verify", kwargs={"plan": plan.to_dict()})

    def _done(self, context: Context, plan: steps.UpgradePlan, step: steps.Done) -> dict[str, Any]:
        assert plan.launch is not None
        store, result = self.job_store(), step.result
        mark_stable(store, Launch.from_dict(plan.launch))
        SnapshotLink.persist_snapshot(context, plan.snapshot_id and store.snapshot_uri(plan.snapshot_id),
                                      self.store_hook.s3_options.endpoint_url)
        self._step(4, "verified: epoch %s at batch %s; %s is the stable deployment", result["epoch"],
                   result["batch_id"], plan.new.get("code_version") or plan.new.get("job_file"))
        return result

    def _roll_back(self, context: Context, plan: steps.UpgradePlan, step: steps.RollBack) -> Any:
        store = self.job_store()
        if (disposed := steps.dispose_rescaled(store, step)) is not None:
            self.log.log(logging.INFO if disposed[0] else logging.WARNING, "%s of job %s: %s", self._what, self.job,
                         disposed[1])
        old = plan.old_deployment
        self._step(5, "rolling back to %s (code %s) from %s", old.job_file, old.code_version or "-", step.restore)
        record = self._launch(store, old, step.restore)
        criteria = HealthCriteria(started_after=record.launched_at, start_timeout=self.verify_timeout)
        trigger = JobHealthTrigger(**self._store_args, criteria=criteria, timeout=self.verify_timeout)
        return self.wait(context, trigger=trigger, method_name="after_rollback",
                         kwargs={"plan": plan.to_dict(), "why": step.why})

    # -- the outcomes of the waits, fed back to the decision -----------------------------------------------------

    def after_check(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        """The check's verdict; compatible: the job observed again (it may have changed meanwhile)."""
        try:
            event = check_event(event, CHECK_EVENTS, "restore check")
        except AirflowException as err:  # timed out, the trigger failed: no verdict
            return self._drive(context, self._plan(plan), steps.Checked(problem=str(err)))
        running = steps.Running()
        if event["status"] == CheckOutcome.COMPATIBLE:
            self._step(1, "compatible: Spark restored snapshot %s (batch %s) with the new code%s",
                       event.get("snapshot_id"), event.get("batch_id"), f", in {event['state_partitions']} state "
                       "partitions" if event.get("state_partitions") else "")
            running = steps.observe_running(self.job_store())
        verdict = steps.Checked(event["status"], event.get("reason"), event.get("snapshot_id"), running=running)
        return self._drive(context, self._plan(plan), verdict)

    def after_stop(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        store = self.job_store()
        try:
            snapshot_id = ack_result(self, context, event)["snapshot_id"]
        except AirflowException as err:
            seen, epoch = steps.observe_stop_failure(store)
            return self._drive(context, self._plan(plan), steps.StopFailed(str(err), seen, epoch))
        stopped = steps.Stopped(snapshot_id, None if snapshot_id else _latest(store))
        return self._drive(context, self._plan(plan), stopped)

    def after_rescale(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        """The repartitioned savepoint, or why there is none."""
        try:
            event = check_event(event, CHECK_EVENTS, "rescale")
        except AirflowException as err:
            return self._drive(context, self._plan(plan), steps.Rescaled(problem=str(err)))
        rescaled = event.get("rescaled_snapshot_id")
        if event["status"] == CheckOutcome.COMPATIBLE and rescaled:
            self._step(3, "savepoint %s holds the state in %s partitions (rescaled from %s)", rescaled,
                       event.get("state_partitions"), plan.get("snapshot_id"))
        return self._drive(context, self._plan(plan), steps.Rescaled(event["status"], event.get("reason"), rescaled))

    def after_verify(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        healthy, why = self._healthy(event)
        if healthy:
            SparkUILink.persist(context, event.get("ui_url"))
        else:
            tail = log_tail(read_launch(self.job_store()))
            self.log.error("%s of job %s: the new code failed verification: %s%s", self._what, self.job, why,
                           f"\nlast lines of its log:\n{tail}" if tail else "")
        return self._drive(context, self._plan(plan),
                           steps.Verified(healthy, why, event.get("epoch"), event.get("batch_id")))

    def after_rollback(self, context: Context, event: dict[str, Any], plan: dict[str, Any], why: str) -> Any:
        healthy, rollback_why = self._healthy(event)
        if healthy:
            SparkUILink.persist(context, event.get("ui_url"))
        return self._drive(context, self._plan(plan), steps.RolledBack(why, healthy, rollback_why, event.get("epoch")))

    def _healthy(self, event: dict[str, Any]) -> tuple[bool, str]:
        if event.get("status") == "timeout":
            return False, f"no verdict within {self.verify_timeout:.0f} s"
        event = check_event(event, ("healthy", "unhealthy"), f"job {self.job}")
        return event["status"] == "healthy", str(event.get("message") or event.get("reason"))


def _latest(store: JobStore) -> str | None:
    """The latest completed snapshot: where a cancelled job's rollback restarts from."""
    latest = latest_completed(list_snapshots(store))
    return latest.snapshot_id if latest else None


def _flag(value: object) -> bool:
    """A boolean argument that may arrive rendered as text ("False" is false)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


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
        if self._partitions() is None:
            raise AirflowException(f"rescale of job {self.job}: expected partitions (a whole number >= 1), found "
                                   f"{self.partitions!r}; nothing was changed")
        return super().execute(context)  # job_file "": the running code (launcher/upgradesteps.py steps.prepare)
