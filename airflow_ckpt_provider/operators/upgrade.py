"""Upgrade a running job to new code, keeping its state; roll back if the new code does not make progress.

Observe, decide, act one step at a time (the Flink Kubernetes Operator's upgrade):

1. check: the new code restores the current state (Spark plans a batch on a scratch copy of the latest
   snapshot: state operators, partitions, schemas), in a process of its own whose verdict the task waits for
   deferred (core/restorechecks.py) - refused here, before anything stops;
2. stop the old driver: stop-with-savepoint (``savepoint``) or cancel (``last-state``, ``stateless``);
3. start the new code from that savepoint / the latest state / no state;
4. verify: ``verify_batches`` batches within ``verify_timeout`` seconds, no failure or restart;
5. on failure, roll back: the old code from the same snapshot (a newer launch supersedes the failing
   one's supervisor and its driver is fenced by the lease), then the task fails saying so.

With ``partitions`` the upgrade also rescales the state (RescaleStreamingJobOperator: the same code with
other partitions). The check of step 1 runs on a copy repartitioned with Spark's offline repartition, and
between steps 2 and 3 the savepoint is repartitioned on a copy and saved as a savepoint of its own (trigger
``rescale``; the same detached process as the check, its verdict awaited the same way); step 3 starts from
that one, and a rollback goes back to the savepoint of step 2 with the old partitions (docs/rescaling.md).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt_provider.core.control import RequestAction
from airflow_ckpt_provider.core.deployments import Deployment, Launch, mark_stable, read_launch
from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.health import HealthCriteria
from airflow_ckpt_provider.core.jobview import check_can_request, observe
from airflow_ckpt_provider.core.manifest import Kind
from airflow_ckpt_provider.core.modes import LATEST_STATE, RestoreMode, RestoreSpec, StopMode, UpgradeMode
from airflow_ckpt_provider.core.outcomes import CHECK_EVENTS, CheckOutcome
from airflow_ckpt_provider.core.rescaling import StoppedSource, parse_partitions, snapshot_problem, stopped_source
from airflow_ckpt_provider.core.restorechecks import OUTCOME_GRACE, CheckStarted
from airflow_ckpt_provider.core.snapshots import dispose_snapshot, latest_completed, list_snapshots
from airflow_ckpt_provider.core.status import JobState, read_status
from airflow_ckpt_provider.launcher.deploy import log_tail, submit_spec
from airflow_ckpt_provider.launcher.restorecheck import start_check
from airflow_ckpt_provider.launcher.submit import build_command
from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators.arguments import mode_arg, parse_mode
from airflow_ckpt_provider.operators.base import check_event
from airflow_ckpt_provider.operators.control import STOP_ACTION, STOP_TIMEOUT, ack_result, request_and_wait
from airflow_ckpt_provider.operators.job import _LaunchMixin
from airflow_ckpt_provider.runtime.config import default_checkpoint
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger
from airflow_ckpt_provider.triggers.restore_check import RestoreCheckTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ckpt_provider.core.jobstore import JobStore

class UpgradeStreamingJobOperator(_LaunchMixin):
    """Upgrade ``job`` to ``job_file`` (``code_version``) with ``upgrade_mode`` savepoint (default),
    last-state or stateless. The job's other settings come from its last deployment.

    Returns ``{"job", "from_version", "to_version", "upgrade_mode", "snapshot_id", "epoch", "batch_id"}``;
    fails (after rolling back) when the new code does not pass verification.
    """

    template_fields = (*_LaunchMixin.template_fields, "job_file", "code_version", "upgrade_mode",
                       "allow_non_restored_state", "verify_batches", "partitions")
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partitions = partitions
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

    # -- 1. check, 2. stop -------------------------------------------------------------------------

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
        partitions = self._partitions()
        if partitions is not None and mode is not UpgradeMode.SAVEPOINT:
            raise AirflowException(f"{self._what} of job {self.job}: partitions={partitions} with upgrade_mode "
                                   f"{mode}; a rescale goes through a savepoint: use upgrade_mode savepoint. Nothing "
                                   "was changed")
        ti = context.get("ti")
        if ti is not None and int(getattr(ti, "try_number", 1) or 1) > 1:
            # A retry would take spec/last.json (maybe the new code by now) for the old deployment.
            raise AirflowFailException(
                f"{self._what} of job {self.job}: not retried (try {ti.try_number}): an earlier try may have "
                "stopped the old job or started the new code. Check `ckpt job status` and spec/last.json, then "
                "trigger a new run; set retries=0 on this task")
        store = self.job_store()
        old = read_launch(store)
        if old is None:
            raise AirflowException(f"job {self.job} has no recorded deployment (spec/last.json): submit it first "
                                   "with SubmitStreamingJobOperator; nothing was changed")
        try:
            new = old.deployment.with_code(self.job_file, self.code_version)
            if mode is UpgradeMode.STATELESS:  # without state: on a fresh live checkpoint location
                base = old.deployment.checkpoint or default_checkpoint(self.job)
                new = replace(new, checkpoint=f"{base.rstrip('/')}-stateless-{int(time.time())}")
            running = self._running_epoch(store)
            hook = self.store_hook  # a deployment spark-submit would refuse fails here, before anything stops
            build_command(submit_spec(new, self.job, hook.store_url, LATEST_STATE, hook.s3_options, supervised=True))
            stopped = self._observe(store, mode, partitions, running)
            check = None if mode is UpgradeMode.STATELESS or stopped else self._start_check(context, store, new)
        except CkptError as err:
            raise self._refused(err) from err
        plan: dict[str, Any] = {"old": old.to_dict(), "new": new.to_dict(), "partitions": partitions}
        if stopped is not None:
            return self._from_stopped(context, store, plan, stopped)
        if check is None:  # stateless: nothing to restore, nothing to check
            return self._stop(context, store, plan, running)
        # The watch's own deadline (timeout + OUTCOME_GRACE) says "no verdict" before the trigger times out.
        trigger = RestoreCheckTrigger(**self._store_args, check_id=check.check_id,
                                      timeout=self.check_timeout + OUTCOME_GRACE + 30)
        return self.wait(context, trigger=trigger, method_name="after_check", kwargs={"plan": plan})

    def _observe(self, store: JobStore, mode: UpgradeMode, partitions: int | None,
                 running: int | None) -> StoppedSource | None:
        """Refuse what cannot work (CkptError); a rescale of a stopped job: where it starts from."""
        if partitions is not None and running is None:  # a stopped job: from the savepoint it stopped with
            return stopped_source(read_status(store), list_snapshots(store, Kind.SAVEPOINT), partitions)
        self._check_running(mode, running)
        latest = latest_completed(list_snapshots(store)) if partitions is not None else None
        problem = snapshot_problem(latest, partitions) if latest is not None and partitions is not None else None
        if latest is not None and problem:  # the same count, no state, HDFS-backed: no check needed to say so
            raise ConfigError(f"snapshot {latest.snapshot_id}: {problem}")
        return None

    def _from_stopped(self, context: Context, store: JobStore, plan: dict[str, Any], stopped: StoppedSource) -> Any:
        """Nothing to stop: repartition the savepoint the job stopped with (the step runs the code on its copy),
        or start from the one an unfinished rescale saved."""
        self._step(2, stopped.describe(int(plan["partitions"])))
        plan["snapshot_id"] = stopped.source.snapshot_id
        if stopped.rescaled is None:
            return self._rescale(context, store, plan)
        plan["rescaled_snapshot_id"] = rescaled = stopped.rescaled.snapshot_id
        return self._start_new(context, store, plan, RestoreSpec(RestoreMode.SNAPSHOT, rescaled))

    def _refused(self, why: object) -> AirflowException:
        return AirflowException(f"{self._what} of job {self.job} to {self._target(self.job_file)} refused before "
                                f"anything was stopped: {why}; the job runs as before")

    def _target(self, code: str) -> str:
        """What the run moves the job to: the new ``code``, and/or the partitions."""
        partitions = self._partitions()
        if partitions is None:
            return code
        return f"{partitions} state partitions" if self._what == "rescale" else f"{code} with {partitions} state " \
            "partitions"

    @staticmethod
    def _check_running(mode: UpgradeMode, running: int | None) -> None:
        if running is None and mode is UpgradeMode.SAVEPOINT:
            raise ConfigError("it is not running, so no savepoint can be taken; use upgrade_mode last-state to "
                              "upgrade from its latest checkpoint")

    def _stop(self, context: Context, store: JobStore, plan: dict[str, Any], running: int | None) -> Any:
        mode = self._mode()
        if running is None:
            self._step(2, "no driver runs: nothing to stop")
            return self.after_stop(context, None, plan)
        if mode.stop is StopMode.SAVEPOINT:
            self._step(2, "stop with savepoint (driver of epoch %d)", running)
        else:
            self._step(2, "cancel the driver of epoch %d (%s)", running, mode)
        return request_and_wait(self, context, store, STOP_ACTION[mode.stop], timeout=self.stop_timeout,
                                method_name="after_stop", kwargs={"plan": plan})

    def _running_epoch(self, store: JobStore) -> int | None:
        try:
            view = observe(store)
        except ConfigError:
            return None
        if not view.live:
            return None
        return check_can_request(view, RequestAction.STOP).epoch

    def _start_check(self, context: Context, store: JobStore, new: Deployment) -> CheckStarted:
        """Start the restore check detached (its record first); the task then waits for its verdict."""
        partitions = self._partitions()
        self._step(1, "checking that %s (code %s) restores the current state%s", new.job_file,
                   new.code_version or "-", f" repartitioned into {partitions} partitions" if partitions else "")
        who = self._who(context)
        hook = self.store_hook
        check = start_check(store, new, store_url=hook.store_url, timeout=self.check_timeout, s3=hook.s3_options,
                            allow_non_restored_state=_flag(self.allow_non_restored_state), started_by=who,
                            rescale_to=partitions)
        self._step(1, "restore check %s runs as pid %s on %s (log %s); waiting up to %.0f s for its verdict",
                   check.check_id, check.pid, check.host, check.log_file, self.check_timeout)
        return check

    def _who(self, context: Context) -> str:
        ti = context.get("ti")
        who = f"airflow:{self.dag_id}.{self.task_id}"
        if ti is not None and getattr(ti, "run_id", None):
            who += f" run {ti.run_id} try {getattr(ti, 'try_number', 1)}"
        return who

    def after_check(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        """The check's verdict: compatible goes on to the stop (the job observed again: it may have changed
        meanwhile); anything else refuses the upgrade, nothing stopped."""
        try:
            event = check_event(event, CHECK_EVENTS, "restore check")
        except AirflowException as err:  # timed out, the trigger failed: no verdict
            raise self._refused(err) from err
        status = event["status"]
        if status == CheckOutcome.BAD_INPUT:
            raise self._refused(event.get("reason"))
        if status != CheckOutcome.COMPATIBLE:
            raise self._refused(f"restore check of snapshot {event.get('snapshot_id') or '-'} with the new code: "
                                f"{status}: {event.get('reason')}")
        self._step(1, "compatible: Spark restored snapshot %s (batch %s) with the new code%s", event.get("snapshot_id"),
                   event.get("batch_id"), f", in {event['state_partitions']} state partitions"
                   if event.get("state_partitions") else "")
        store = self.job_store()
        try:
            running = self._running_epoch(store)
            self._check_running(self._mode(), running)
        except CkptError as err:
            raise self._refused(f"{err} (observed after the restore check)") from err
        return self._stop(context, store, plan, running)

    # -- 3. start the new code ---------------------------------------------------------------------

    def after_stop(self, context: Context, event: dict[str, Any] | None, plan: dict[str, Any]) -> Any:
        store = self.job_store()
        snapshot_id = None
        if event is not None:
            try:
                snapshot_id = ack_result(self, context, event)["snapshot_id"]
            except AirflowException as err:
                self._stop_failed(store, plan, err)
        if snapshot_id is None:  # cancelled or not running: the rollback goes back to the latest snapshot
            latest = latest_completed(list_snapshots(store))
            snapshot_id = latest.snapshot_id if latest else None
        saved = RestoreSpec(RestoreMode.SNAPSHOT, snapshot_id) if snapshot_id else LATEST_STATE
        restore = {UpgradeMode.SAVEPOINT: saved, UpgradeMode.LAST_STATE: LATEST_STATE,
                   UpgradeMode.STATELESS: RestoreSpec(RestoreMode.NONE)}[self._mode()]
        plan = plan | {"snapshot_id": snapshot_id}
        if plan.get("partitions") is not None:
            return self._rescale(context, store, plan)
        return self._start_new(context, store, plan, restore)

    def _start_new(self, context: Context, store: JobStore, plan: dict[str, Any], restore: RestoreSpec) -> Any:
        self._step(3, "starting %s (code %s), restore %s", self.job_file, self.code_version or "-", restore)
        try:
            record = self._launch(store, Deployment.from_dict(plan["new"]), restore)
        except AirflowException as err:  # e.g. the job file is missing on this worker: bring the old code back
            return self._roll_back(context, store, plan, f"the new code could not be launched: {err}")
        return self._verify(context, store, record, "after_verify", plan)

    # -- 2b. rescale: the savepoint repartitioned on a copy, saved as a savepoint of its own ---------------------

    def _rescale(self, context: Context, store: JobStore, plan: dict[str, Any]) -> Any:
        partitions, snapshot_id = plan["partitions"], plan["snapshot_id"]
        if snapshot_id is None:
            return self._roll_back(context, store, plan, "the stop left no savepoint to repartition")
        self._step(3, "repartitioning savepoint %s into %d state partitions on a copy", snapshot_id, partitions)
        hook = self.store_hook
        try:
            check = start_check(store, Deployment.from_dict(plan["new"]), store_url=hook.store_url,
                                timeout=self.check_timeout, s3=hook.s3_options, started_by=self._who(context),
                                allow_non_restored_state=_flag(self.allow_non_restored_state),
                                restore=RestoreSpec(RestoreMode.SNAPSHOT, snapshot_id), rescale_to=partitions,
                                save_rescaled=True)
        except CkptError as err:
            return self._roll_back(context, store, plan, f"the rescale could not start: {err}")
        self._step(3, "rescale %s runs as pid %s on %s (log %s); waiting up to %.0f s", check.check_id, check.pid,
                   check.host, check.log_file, self.check_timeout)
        trigger = RestoreCheckTrigger(**self._store_args, check_id=check.check_id,
                                      timeout=self.check_timeout + OUTCOME_GRACE + 30)
        return self.wait(context, trigger=trigger, method_name="after_rescale", kwargs={"plan": plan})

    def after_rescale(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        """The repartitioned savepoint: start the job on it; anything else rolls back to the old partitions."""
        store = self.job_store()
        try:
            event = check_event(event, CHECK_EVENTS, "rescale")
        except AirflowException as err:
            return self._roll_back(context, store, plan, str(err))
        rescaled = event.get("rescaled_snapshot_id")
        if event["status"] != CheckOutcome.COMPATIBLE or not rescaled:
            return self._roll_back(context, store, plan, f"the rescale of savepoint {plan['snapshot_id']} to "
                                   f"{plan['partitions']} partitions: {event['status']}: {event.get('reason')}")
        self._step(3, "savepoint %s holds the state in %s partitions (rescaled from %s)", rescaled,
                   event.get("state_partitions"), plan["snapshot_id"])
        plan = plan | {"rescaled_snapshot_id": rescaled}
        return self._start_new(context, store, plan, RestoreSpec(RestoreMode.SNAPSHOT, rescaled))

    def _stop_failed(self, store: JobStore, plan: dict[str, Any], err: AirflowException) -> None:
        """The old driver did not stop as asked: say what state the job is in; relaunch it if it is down."""
        try:
            view = observe(store)
        except ConfigError:
            view = None
        status = view.status if view else None
        if view is not None and status is not None and view.live:
            if status.state is JobState.STOPPING:
                raise AirflowException(
                    f"{self._what} of job {self.job}: {err}; the old driver (epoch {status.epoch}) is still STOPPING: "
                    "the stop stays in effect and nothing restarts the job afterwards; once `ckpt job status` "
                    "shows it STOPPED, run the upgrade again (or restart the job)") from err
            raise AirflowException(f"{self._what} of job {self.job}: {err}; the old job still runs (epoch "
                                   f"{status.epoch}), nothing was changed") from err
        old = Deployment.from_dict(plan["old"]["deployment"])
        self._launch(store, old, LATEST_STATE)
        raise AirflowException(f"{self._what} of job {self.job}: {err}; the old job had stopped: relaunched "
                               f"{old.job_file} (code {old.code_version or '-'}) from its latest state") from err

    def _verify(self, context: Context, store: JobStore, record: Launch, method_name: str,
                plan: dict[str, Any]) -> Any:
        criteria = HealthCriteria(started_after=record.launched_at, min_batches=int(self.verify_batches),
                                  start_timeout=self.verify_timeout, max_restarts=1, health_window=self.verify_timeout)
        self._step(4, "verifying: %d batches within %.0f s", int(self.verify_batches), self.verify_timeout)
        trigger = JobHealthTrigger(**self._store_args, criteria=criteria, timeout=self.verify_timeout)
        return self.wait(context, trigger=trigger, method_name=method_name,
                         kwargs={"plan": plan | {"launch": record.to_dict()}})

    # -- 4. verify, 5. roll back -------------------------------------------------------------------

    def after_verify(self, context: Context, event: dict[str, Any], plan: dict[str, Any]) -> Any:
        store = self.job_store()
        healthy, why = self._healthy(event)
        old = Deployment.from_dict(plan["old"]["deployment"])
        if healthy:
            launched = Launch.from_dict(plan["launch"])
            mark_stable(store, launched)
            SparkUILink.persist(context, event.get("ui_url"))
            SnapshotLink.persist_snapshot(context, plan["snapshot_id"] and store.snapshot_uri(plan["snapshot_id"]),
                                          self.store_hook.s3_options.endpoint_url)
            self._step(4, "verified: epoch %s at batch %s; %s is the stable deployment", event.get("epoch"),
                       event.get("batch_id"), self.code_version or self.job_file)
            return {"job": self.job, "from_version": old.code_version, "to_version": self.code_version,
                    "upgrade_mode": self._mode().value, "snapshot_id": plan["snapshot_id"],
                    "epoch": event.get("epoch"), "batch_id": event.get("batch_id"),
                    "partitions": plan.get("partitions"), "rescaled_snapshot_id": plan.get("rescaled_snapshot_id")}
        tail = log_tail(read_launch(store))
        self.log.error("%s of job %s: the new code failed verification: %s%s", self._what, self.job, why,
                       f"\nlast lines of its log:\n{tail}" if tail else "")
        return self._roll_back(context, store, plan, why)

    def _roll_back(self, context: Context, store: JobStore, plan: dict[str, Any], why: str) -> Any:
        old = Deployment.from_dict(plan["old"]["deployment"])
        rescaled = plan.get("rescaled_snapshot_id")
        if rescaled:  # a restore strategy must not pick the new partitions up again (it is the newest savepoint)
            try:
                dispose_snapshot(store, rescaled, force=True)
                self.log.info("%s of job %s: disposed savepoint %s (the state in %s partitions)", self._what,
                              self.job, rescaled, plan.get("partitions"))
            except CkptError as err:
                self.log.warning("%s of job %s: savepoint %s (the new partitions) was not disposed: %s; dispose it "
                                 "with `ckpt snapshot dispose`", self._what, self.job, rescaled, err)
        restore = RestoreSpec(RestoreMode.SNAPSHOT, plan["snapshot_id"]) if plan["snapshot_id"] else LATEST_STATE
        self._step(5, "rolling back to %s (code %s) from %s", old.job_file, old.code_version or "-", restore)
        record = self._launch(store, old, restore)
        criteria = HealthCriteria(started_after=record.launched_at, start_timeout=self.verify_timeout)
        trigger = JobHealthTrigger(**self._store_args, criteria=criteria, timeout=self.verify_timeout)
        return self.wait(context, trigger=trigger, method_name="after_rollback", kwargs={"plan": plan, "why": why})

    def after_rollback(self, context: Context, event: dict[str, Any], plan: dict[str, Any], why: str) -> Any:
        healthy, rollback_why = self._healthy(event)
        old = plan["old"]["deployment"]
        if not healthy:
            raise AirflowException(
                f"{self._what} of job {self.job} to {self._target(self.code_version or self.job_file)} failed "
                f"verification ({why}) "
                f"and the rollback to {old.get('code_version') or old['job_file']} ALSO failed ({rollback_why}); "
                f"the job's state is uncertain: check `ckpt job status --job {self.job}`, and if it is not "
                f"running restore it from snapshot {plan['snapshot_id'] or '(its latest state)'}")
        SparkUILink.persist(context, event.get("ui_url"))
        raise AirflowException(
            f"{self._what} of job {self.job} to {self._target(self.code_version or self.job_file)} failed "
            f"verification ({why}); "
            f"rolled back to {old.get('code_version') or old['job_file']} from "
            f"{plan['snapshot_id'] or 'its latest state'}"
            + (" on its old partitions: it runs again" if plan.get("partitions") else ": the old code runs again")
            + f" (epoch {event.get('epoch')})")

    def _healthy(self, event: dict[str, Any]) -> tuple[bool, str]:
        if event.get("status") == "timeout":
            return False, f"no verdict within {self.verify_timeout:.0f} s"
        event = check_event(event, ("healthy", "unhealthy"), f"job {self.job}")
        return event["status"] == "healthy", str(event.get("message") or event.get("reason"))


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
        old = read_launch(self.job_store())
        if old is not None and not self.job_file:
            self.job_file = old.deployment.job_file
            self.code_version = self.code_version or old.deployment.code_version
        return super().execute(context)
