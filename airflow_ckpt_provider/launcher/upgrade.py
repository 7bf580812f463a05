"""``ckpt job rescale`` and ``ckpt job upgrade``: a recorded deployment rescaled or upgraded from a terminal, one
step after another.

Design notes: docs/cli.md#design-notes-launcherupgradepy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, UpgradeMode
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, mark_stable
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.watches.base import wait_for
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.launcher import upgradesteps as steps
from airflow_ckpt_provider.launcher.deploy import credentials_env, submit_spec
from airflow_ckpt_provider.launcher.restore_check import check_restore, check_spec
from airflow_ckpt_provider.launcher.service import start_job
from airflow_ckpt_provider.runtime.restore_check_verdict import RestoreCheck

log = logging.getLogger(__name__)

#: How to record a deployment, for a job without one.
SUBMIT_HINT = ("`ckpt job {verb}` restarts the job as it was launched, so it must have been launched by an operator "
               "or `ckpt job rescale|upgrade` before. For a job you run yourself: stop it with a savepoint, then `ckpt "
               "run ... --check-restore --restore SAVEPOINT --rescale-to N --save-rescaled`, and start it from the "
               "savepoint that prints")


class UpgradeFailed(CkptError):
    """The run failed after the job stopped; the message says where the job is now (rolled back or not)."""


@dataclass(frozen=True)
class UpgradeOptions:
    """``partitions`` alone: a rescale of the running code; ``job_file``: an upgrade (with ``partitions``: both)."""

    partitions: int | None = None
    check_timeout: float = 600.0
    stop_timeout: float = 300.0
    verify_batches: int = 2
    verify_timeout: float = 300.0
    #: Wait for ``verify_batches`` batches even on a job caught up with no new input (False: such a job is
    #: verified without a batch, and the run says so).
    require_batches: bool = False
    poll: float = 1.0
    job_file: str | None = None
    code_version: str | None = None
    #: The new code's py files and files (spark-submit --py-files, --files); None keeps the recorded deployment's.
    #: A rollback ships the old deployment's.
    py_files: tuple[str, ...] | None = None
    files: tuple[str, ...] | None = None
    mode: UpgradeMode = UpgradeMode.SAVEPOINT
    allow_non_restored_state: bool = False
    attempt: int = 1  # the orchestrator's try: a second one is refused (upgradesteps.NotRetried)
    submit_hint: str | None = None  # how to record a deployment in this orchestrator (default: SUBMIT_HINT)

    @property
    def what(self) -> str:
        return steps.UPGRADE if self.job_file else steps.RESCALE


class JobUpgrade:
    """One rescale or upgrade of ``store``'s job; ``run()`` returns the result or raises ConfigError (refused,
    nothing changed) or UpgradeFailed (after the stop; rolled back when possible)."""

    def __init__(self, store: JobStore, store_url: str, s3: S3Options | None, options: UpgradeOptions, *,
                 say: Callable[[str], None], launched_by: str) -> None:
        self.store, self.store_url, self.s3, self.options = store, store_url, s3, options
        self.say, self.launched_by = say, launched_by
        self.job = store.job

    def run(self) -> dict[str, Any]:
        outcome: steps.Outcome
        o = self.options
        plan, outcome = steps.prepare(self.store, store_url=self.store_url, s3=self.s3, what=o.what,
                                      job_file=o.job_file, code_version=o.code_version, mode=o.mode,
                                      partitions=o.partitions, attempt=o.attempt, py_files=o.py_files,
                                      files=o.files,
                                      submit_hint=o.submit_hint or SUBMIT_HINT.format(verb=o.what),
                                      savepoint_first=True)
        while True:
            plan, step = steps.next_step(plan, outcome)
            match step:
                case steps.Refuse(message=message):
                    raise ConfigError(message)
                case steps.Fail(message=message):
                    raise UpgradeFailed(message)
                case steps.Relaunch(message=message):  # the old driver went down during a stop that failed
                    self._start(plan.old_deployment, LATEST_STATE)
                    raise UpgradeFailed(message)
                case steps.Done(result=result, said=said):
                    return self._done(plan, result, said)
                case steps.TakeSavepoint(epoch=epoch):
                    self.say(f"1/5 job {self.job} has no snapshot to check against: taking a savepoint (it keeps "
                             "running)")
                    _, why = self._request(RequestAction.SAVEPOINT, epoch)
                    outcome = steps.Saved(why)
                case steps.Check():
                    outcome = self._check_latest(plan)
                case steps.Stop():
                    outcome = self._stop(step)
                case steps.Rescale():
                    outcome = self._rescale(plan, step)
                case steps.Start():
                    outcome = self._start_new(plan, step)
                case steps.Verify():
                    outcome = self._verify_new(plan)
                case steps.RollBack():
                    outcome = self._roll_back(plan, step)

    def _request(self, action: RequestAction, epoch: int) -> tuple[Ack | None, str | None]:
        """A savepoint, a stop with savepoint (completed with its snapshot) or a cancel of the driver of ``epoch``:
        its ack, or why it did not complete."""
        request = submit_request(self.store, action, epoch, requested_by=self.launched_by)
        ack = wait_ack(self.store, request.id, self.options.stop_timeout, poll=self.options.poll)
        snapshot = ack is not None and (ack.snapshot_id or action is RequestAction.CANCEL)
        if ack is None or ack.outcome is not Outcome.COMPLETED or not snapshot:
            return ack, "no answer" if ack is None else f"{ack.outcome.value}: {ack.message}"
        return ack, None

    def _check(self, plan: steps.UpgradePlan, restore: RestoreSpec, *, save: bool) -> RestoreCheck:
        deployment = plan.new_deployment
        spec = check_spec(submit_spec(deployment, self.job, self.store_url, restore, self.s3,
                                      check_restore=True, rescale_to=self.options.partitions,
                                      save_rescaled=save,
                                      allow_non_restored_state=self.options.allow_non_restored_state),
                          self.options.check_timeout)
        # The job store's credentials as the job gets them (launch): given to this process (a resource, --access-key),
        # they need not be in its environment.
        return check_restore(spec, self.options.check_timeout, env={**deployment.env, **credentials_env(self.s3)})

    def _check_latest(self, plan: steps.UpgradePlan) -> steps.Checked:
        n, new = self.options.partitions, plan.new_deployment
        if plan.what == steps.RESCALE:
            self.say(f"1/5 checking that {new.job_file} runs on its latest state repartitioned into {n} partitions "
                     "(on a copy)")
        else:
            self.say(f"1/5 checking that {new.job_file} (code {new.code_version or '-'}) restores the latest state"
                     + (f" repartitioned into {n} partitions" if n else "") + " (on a copy)")
        try:
            checked = self._check(plan, LATEST_STATE, save=False)
        except ConfigError as err:  # bad input: Spark or the check refused
            return steps.Checked(problem=str(err))
        running = steps.Running()
        if checked.compatible:
            self.say(f"1/5 compatible: snapshot {checked.snapshot_id} (batch {checked.batch_id})"
                     + (f" in {n} partitions" if n else "") + f", {checked.seconds} s")
            running = steps.observe_running(self.store)  # it may have changed meanwhile
        return steps.Checked(checked.outcome.value, checked.reason, checked.snapshot_id, running=running)

    def _stop(self, step: steps.Stop) -> steps.Outcome:
        what = "stop with savepoint" if step.action is RequestAction.STOP else "cancel"
        if step.epoch is None:
            self.say("2/5 no driver runs: nothing to stop")
            ack, why = None, None
        else:
            self.say(f"2/5 stopping the driver of epoch {step.epoch} " + (
                "with a savepoint" if step.action is RequestAction.STOP else f"({self.options.mode}: cancel)"))
            ack, why = self._request(step.action, step.epoch)
            if why is not None or ack is None:
                seen, epoch = steps.observe_stop_failure(self.store)
                return steps.StopFailed(f"the {what} did not complete ({why})", seen, epoch)
            self.say(f"2/5 stopped with savepoint {ack.snapshot_id} at batch {ack.batch_id}" if ack.snapshot_id else
                     f"2/5 cancelled at batch {ack.batch_id}")
        crash_point(f"{self.options.what}.after-stop")
        if ack is not None and ack.snapshot_id:
            return steps.Stopped(ack.snapshot_id)
        latest = latest_completed(list_snapshots(self.store))  # the rollback's source
        return steps.Stopped(None, latest.snapshot_id if latest else None)

    def _rescale(self, plan: steps.UpgradePlan, step: steps.Rescale) -> steps.Rescaled:
        if step.note:
            self.say(step.note)
        self.say(f"3/5 repartitioning savepoint {step.snapshot_id} into {step.partitions} partitions on a copy")
        try:
            report = self._check(plan, RestoreSpec(RestoreMode.SNAPSHOT, step.snapshot_id), save=True)
        except ConfigError as err:
            return steps.Rescaled(problem=str(err))
        if report.compatible and report.rescaled_snapshot_id:
            self.say(f"3/5 saved savepoint {report.rescaled_snapshot_id} ({step.partitions} partitions) in "
                     f"{report.seconds} s")
            crash_point("rescale.after-save")
        return steps.Rescaled(report.outcome.value, report.reason, report.rescaled_snapshot_id)

    def _start_new(self, plan: steps.UpgradePlan, step: steps.Start) -> steps.Started:
        if step.note:
            self.say(step.note)
        self.say(f"4/5 starting {plan.new['job_file']} from {step.restore}")
        try:
            record = self._start(plan.new_deployment, step.restore)
        except CkptError as err:
            return steps.Started(problem=f"cannot launch job {self.job}: {err}")
        crash_point(f"{self.options.what}.after-start")
        return steps.Started(record.to_dict())

    def _verify_new(self, plan: steps.UpgradePlan) -> steps.Verified:
        assert plan.launch is not None  # recorded with the launch
        try:
            event = self._verify(Launch.from_dict(plan.launch))
        except CkptError as err:  # the job store unreachable meanwhile: no verdict, roll back
            return steps.Verified(False, str(err))
        return steps.Verified(event.get("status") == "healthy", _said(event), event.get("epoch"),
                              event.get("batch_id"), event.get("batches"), self.options.verify_batches,
                              bool(event.get("idle")))

    def _start(self, deployment: Deployment, restore: RestoreSpec) -> Launch:
        # As the job had: handed to the supervision service again once it was (launcher/service.start_job).
        return start_job(self.store, deployment, restore=restore, store_url=self.store_url, s3=self.s3,
                         launched_by=self.launched_by)

    def _verify(self, record: Launch, *, batches: int | None = None) -> dict[str, Any]:
        """The health verdict on ``record``'s deployment: ``batches`` new batches (default ``verify_batches``),
        or caught up with no new input; with ``require_batches`` (the new deployment only) the batches are awaited
        within the same timeout even then, and their absence is a verdict of its own."""
        timeout = self.options.verify_timeout
        need = self.options.verify_batches if batches is None else batches
        criteria = steps.verify_criteria(record.launched_at, timeout=timeout, batches=need)
        watch = JobHealthWatch(self.store, criteria)
        deadline = time.monotonic() + timeout
        strict = batches is None and self.options.require_batches and need > 0
        while True:
            event = wait_for(watch, timeout=max(0.0, deadline - time.monotonic()), poll_interval=self.options.poll,
                             what=f"job {self.job}")
            if event.get("status") == "healthy" and hasattr(watch, "progress"):  # (a test's fake watch has not)
                ran, idle = watch.progress()
                event = {**event, "batches": ran, "idle": idle}  # what was verified (upgradesteps.verification_said)
            if not strict or event.get("status") != "healthy" or int(event.get("batches") or 0) >= need:
                return event
            if time.monotonic() >= deadline:
                ran = int(event.get("batches") or 0)
                return {**event, "status": "unhealthy", "reason": "no-batch", "message": (
                    f"job {self.job}: expected {need} batches of the new deployment within {timeout:.0f} s "
                    f"(--verify-batches {need}), found {ran}: it runs (epoch {event.get('epoch')}) but had no new "
                    "input; send input or raise --verify-timeout, or verify without waiting for a batch")}
            time.sleep(self.options.poll)

    def _done(self, plan: steps.UpgradePlan, result: dict[str, Any], said: str) -> dict[str, Any]:
        assert plan.launch is not None
        mark_stable(self.store, Launch.from_dict(plan.launch))
        said = said or f"epoch {result['epoch']} at batch {result['batch_id']}"
        if plan.what == steps.UPGRADE:
            self.say(f"4/5 verified: {said}; {plan.new.get('code_version') or plan.new['job_file']} is the stable "
                     "deployment")
            return result
        self.say(f"4/5 verified: {said}")
        return {key: result[key] for key in ("job", "partitions", "snapshot_id", "rescaled_snapshot_id", "epoch",
                                             "batch_id")}

    def _roll_back(self, plan: steps.UpgradePlan, step: steps.RollBack) -> steps.RolledBack:
        if (disposed := steps.dispose_rescaled(self.store, step)) is not None:
            self.say(f"5/5 {disposed[1]}")
        old = plan.old_deployment
        self.say(f"5/5 rolling back: starting {old.job_file} from {step.restore} (the old "
                 f"{'code' if plan.what == steps.UPGRADE else 'partitions'}): {step.why}")
        try:
            event = self._verify(self._start(old, step.restore), batches=0)
        except CkptError as err:  # the launch refused, or the store unreadable: the rollback did not happen
            return steps.RolledBack(step.why, False, f"the old deployment could not be started: {err}", None)
        healthy = event.get("status") == "healthy"
        return steps.RolledBack(step.why, healthy, _said(event), event.get("epoch"))


def _said(event: dict[str, Any]) -> str:
    """What a health event says (its message, else its reason)."""
    return str(event.get("message") or event.get("reason") or event.get("status"))
