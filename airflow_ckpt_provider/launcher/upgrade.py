"""The one actor of an upgrade, a rescale or a restart, whoever asked for it (``ckpt job upgrade|rescale|restart``,
the Airflow operators, the Dagster ops) and wherever it runs (that command, a detached ``ckpt job operate``, the
supervision service). It acts
on the steps launcher/upgradesteps.py decides, each written to the operation record (core/records/operations.py) with
the ids of what it starts before it acts, so a new actor resumes the step in progress instead of redoing it.
Design notes: docs/operations.md#design-notes-launcherupgradepy."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, StorageError
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, SupervisionMode
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.policy.stepsettings import (
    RESCALE,
    RESTART,
    UPGRADE,
    RestartStepSettings,
    StepSettings,
    UpgradeSettings,
    step_settings,
)
from airflow_ckpt_provider.core.records.control import (
    Ack,
    Outcome,
    RequestAction,
    new_request_id,
    read_ack,
    request_key,
    submit_request,
)
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, mark_stable, read_launch
from airflow_ckpt_provider.core.records.operations import (
    Acting,
    Found,
    NotActor,
    Operation,
    OperationState,
    actor_alive,
    ask,
    read_operation,
)
from airflow_ckpt_provider.core.records.ownership import handed_key
from airflow_ckpt_provider.core.records.restore_check import running_checks
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.core.watches.operation import ORPHANED, OperationWatch
from airflow_ckpt_provider.core.watches.restore_check import RestoreCheckWatch
from airflow_ckpt_provider.launcher import upgradesteps as steps
from airflow_ckpt_provider.launcher.deploy import credentials_env, inherited_env, log_dir, spawn_detached
from airflow_ckpt_provider.launcher.handover import start_job
from airflow_ckpt_provider.launcher.restore_check import start_check

log = logging.getLogger(__name__)

#: How to record a deployment, for a job without one.
SUBMIT_HINT = ("`ckpt job {verb}` restarts the job as it was launched, so it must have been launched by an operator "
               "or `ckpt job rescale|upgrade` before. For a job you run yourself: stop it with a savepoint, then `ckpt "
               "run ... --check-restore --restore SAVEPOINT --rescale-to N --save-rescaled`, and start it from the "
               "savepoint that prints")
#: Environment variable naming the variables of the actor's environment passed on to the drivers it launches without
#: being recorded (an Airflow task's OpenLineage settings: a transport may hold an API key).
UNRECORDED_ENV = "CKPT_UNRECORDED_ENV"
#: Seconds a wait of a step resumed after its own deadline still gets (the driver's answer, the verification).
RESUMED_WAIT = 60.0
#: The statuses of a restore check's event that are verdicts (else: no verdict, e.g. its process died).
VERDICTS = frozenset(o.value for o in CheckOutcome)


class UpgradeFailed(CkptError):
    """The run failed after the job stopped; the message says where the job is now (rolled back or not)."""


def outcome_of(operation: Operation) -> dict[str, Any]:
    """A final operation's result; ConfigError (refused: nothing stopped) or UpgradeFailed (after the stop)."""
    if operation.state is OperationState.SUCCEEDED and operation.result is not None:
        return operation.result
    if operation.state is OperationState.REFUSED:
        raise ConfigError(operation.message)
    raise UpgradeFailed(operation.message or f"{operation.describe()}: ended without a result")


class JobUpgrade:
    """Acts on one operation of ``store``'s job until it is final: ``run(found)`` takes the record (names this actor
    in it), resumes the step it names or decides the next, and returns the final record. ``say`` gets each progress
    line (also kept in the record); ``may_act``: checked before each act (the supervision service's lease)."""

    def __init__(self, store: JobStore, store_url: str, s3: S3Options | None, *, say: Callable[[str], None],
                 actor: str, submit_hint: str | None = None, poll: float = 1.0,
                 may_act: Callable[[], bool] = lambda: True) -> None:
        self.store, self.store_url, self.s3, self.say_out = store, store_url, s3, say
        self.actor, self.poll, self.may_act = actor, poll, may_act
        self.submit_hint = submit_hint
        self.job = store.job
        self.acting: Acting | None = None

    settings: StepSettings  # the operation's, read by run()

    # -- the loop -----------------------------------------------------------------------------------------------

    def run(self, found: Found) -> Operation:
        op = found.operation
        resumed = op.plan is not None
        self.acting = acting = Acting.take(self.store, found, self.actor, line=(
            f"{self.actor} resumes {op.kind} {op.id} at step {op.steps} ({(op.step or {}).get('type', 'decided')})"
            if resumed else f"{self.actor} acts on {op.kind} {op.id}"))
        self.settings = step_settings(op.kind, op.settings)
        if resumed:
            self.say(acting.operation.lines[-1])
        stop = threading.Event()  # a heartbeat beside every act, however long (ACTOR_SILENCE on other hosts)
        beating = threading.Thread(target=acting.beat_while, args=(stop,), name=f"ckpt-operation-beat-{op.id}",
                                   daemon=True)
        beating.start()
        try:
            return self._run(acting)
        except NotActor:
            raise
        except Exception as err:  # this actor stops acting: it says so, so a retry in this process acts at once
            log.warning("job %s: %s stopped acting on %s at step %s: %s: %s", self.job, self.actor, op.id,
                        acting.operation.steps, type(err).__name__, err)
            try:
                acting.save(actor="", actor_pid=None, line=f"{self.actor} stopped acting: {type(err).__name__}: "
                                                           f"{err}")
            except Exception as also:  # the store, most likely: the others see this actor silent instead
                log.warning("job %s: could not record that: %s", self.job, also)
            raise
        finally:
            stop.set()
            beating.join(5)

    def _run(self, acting: Acting) -> Operation:
        try:
            plan, outcome = self._first(acting.operation)
        except ConfigError as err:
            return acting.save(state=OperationState.REFUSED, message=str(err), step=None)
        while True:
            if acting.operation.step is not None:  # a step in progress: resume it
                step = steps.decode_step(acting.operation.step)
            else:
                assert outcome is not None  # set by the step just acted on, or recorded
                plan, step = steps.next_step(plan, outcome)
                ended = self._end(plan, step)
                if ended is not None:
                    return ended
                self._begin(plan, step)
            outcome = self._act(plan, step)
            acting.save(step=None, outcome=steps.encode(outcome))

    def _first(self, op: Operation) -> tuple[steps.UpgradePlan, steps.Outcome | None]:
        """The plan and the outcome to decide on: observed now (nothing done yet), as recorded, or None when a step
        is in progress (the loop resumes it first)."""
        if op.plan is None:
            hint = self.submit_hint or SUBMIT_HINT.format(verb=op.kind)
            if isinstance(self.settings, RestartStepSettings):
                plan, began = steps.prepare_restart(self.store, self.settings, submit_hint=self.submit_hint or
                                                    "submit it first")
            else:
                plan, began = steps.prepare(self.store, self.settings, store_url=self.store_url, s3=self.s3,
                                            submit_hint=hint)
            assert self.acting is not None
            self.acting.save(state=OperationState.RUNNING)
            if began.note:
                self.say(began.note)
            return plan, began
        plan = steps.UpgradePlan.from_dict(op.plan)
        if op.step is not None:
            return plan, None
        if op.outcome is None:
            raise ConfigError(f"{op.describe()}: its record has a plan but neither a step nor an outcome: it is "
                              "damaged; check `ckpt job status`, then ask for the operation again")
        return plan, steps.decode_outcome(op.outcome)

    def _begin(self, plan: steps.UpgradePlan, step: steps.Step) -> None:
        """Record the step (and the plan that decided it) before acting: a new actor resumes it from here."""
        assert self.acting is not None
        n = self.acting.operation.steps + 1
        body = {**steps.encode(step), "n": n, "since": time.time()}
        if isinstance(step, steps.TakeSavepoint | steps.Stop) and getattr(step, "epoch", None) is not None:
            action = step.action if isinstance(step, steps.Stop) else RequestAction.SAVEPOINT
            body["request_id"] = new_request_id(action)
        self.acting.save(plan=plan.to_dict(), step=body, steps=n, outcome=None)

    def _end(self, plan: steps.UpgradePlan, step: steps.Step) -> Operation | None:
        assert self.acting is not None
        match step:
            case steps.Refuse(message=message):
                return self.acting.save(plan=plan.to_dict(), state=OperationState.REFUSED, message=message)
            case steps.Fail(message=message):
                return self.acting.save(plan=plan.to_dict(), state=OperationState.FAILED, message=message)
            case steps.Done(result=result, said=said):
                result = self._done(plan, result, said)
                return self.acting.save(plan=plan.to_dict(), state=OperationState.SUCCEEDED, result=result)
            case steps.Relaunch(message=message):  # the old driver went down during a stop that failed
                self._launch_once(plan.old_deployment, LATEST_STATE, "relaunch")
                return self.acting.save(plan=plan.to_dict(), state=OperationState.FAILED, message=message)
        return None

    def _act(self, plan: steps.UpgradePlan, step: steps.Step) -> steps.Outcome:  # noqa: PLR0911  # one return per step
        if not self.may_act():
            raise NotActor(f"job {self.job}: {self.actor} may not act now (its lease is not renewed); another actor "
                           "resumes the operation")
        match step:
            case steps.TakeSavepoint():
                self.say(f"{self._at(1)} job {self.job} has no snapshot to check against: taking a savepoint (it keeps "
                         "running)")
                _, why = self._request(RequestAction.SAVEPOINT, step.epoch, self.settings.stop_timeout)
                return steps.Saved(why)
            case steps.Check():
                return self._check_latest(plan)
            case steps.Stop():
                return self._stop(step)
            case steps.Rescale():
                return self._rescale(plan, step)
            case steps.Start():
                return self._start_new(plan, step)
            case steps.Verify():
                return self._verify_new(plan)
            case steps.RollBack():
                return self._roll_back(plan, step)
        raise AssertionError(f"unexpected step {step}")

    # -- what each step does; each finds what an earlier actor started for it first -----------------------------

    def _at(self, stage: int) -> str:
        """Where a line's step stands among its operation's: an upgrade's five (check, stop, rescale, start and
        verify, roll back), a restart's three (stop, start, verify)."""
        if self.settings.what == RESTART:
            return {2: "1/3", 4: "2/3"}.get(stage, "3/3")
        return f"{stage}/5"

    def say(self, line: str) -> None:
        self.say_out(line)
        log.info("job %s: %s", self.job, line)
        if self.acting is not None:
            self.acting.save(line=line)

    def _handle(self, name: str) -> Any:
        return (self._op().step or {}).get(name)

    def _record_handle(self, **handles: Any) -> None:
        assert self.acting is not None
        self.acting.save(step={**(self._op().step or {}), **handles})

    def _marker(self, what: str) -> str:
        """Who started something for this step (a launch's ``launched_by``, a check's ``started_by``): the step,
        then this actor in parentheses."""
        return f"{self._step_marker(what)} ({self.actor})"

    def _step_marker(self, what: str) -> str:
        """What an actor resuming the step finds it by: the marker without the actor (another one started it)."""
        op = self._op()
        return f"{op.kind} {op.id} step {op.steps} {what}"

    def _started_here(self, by: str | None, what: str) -> bool:
        return by is not None and by.startswith(f"{self._step_marker(what)} (")

    def _deadline(self, timeout: float) -> float:
        """When this step's wait ends: ``timeout`` s after the step began; a step resumed later than that still gets
        RESUMED_WAIT s (at most ``timeout``), so a takeover after a long outage does not judge the job unseen."""
        since = float(self._handle("since") or time.time())
        return max(since + timeout, time.time() + min(timeout, RESUMED_WAIT))

    def _op(self) -> Operation:
        assert self.acting is not None
        return self.acting.operation

    def _request(self, action: RequestAction, epoch: int, timeout: float) -> tuple[Ack | None, str | None]:
        """A savepoint, a stop with savepoint (completed with its snapshot) or a cancel of the driver of ``epoch``,
        by the request id the step recorded (written now unless an earlier actor wrote it): its ack, or why it did
        not complete."""
        request_id = self._handle("request_id") or new_request_id(action)
        if self.store.storage.stat(request_key(request_id)) is None:
            submit_request(self.store, action, epoch, requested_by=self._marker(action.value), request_id=request_id)
        deadline = self._deadline(timeout)
        ack = read_ack(self.store, request_id)
        while ack is None and time.time() < deadline:
            time.sleep(self.poll)
            ack = read_ack(self.store, request_id)
        snapshot = ack is not None and (ack.snapshot_id or action is RequestAction.CANCEL)
        if ack is None or ack.outcome is not Outcome.COMPLETED or not snapshot:
            return ack, "no answer" if ack is None else f"{ack.outcome.value}: {ack.message}"
        return ack, None

    def _start_check(self, plan: steps.UpgradePlan, restore: RestoreSpec, *, save: bool) -> str:
        """The check (or repartition) of this step: the one an earlier actor started, else a new one, detached,
        its id recorded in the step."""
        check_id = self._handle("check_id")
        if check_id:
            return str(check_id)
        settings = self.settings
        assert isinstance(settings, UpgradeSettings)  # only an upgrade or a rescale decides a check
        marker = self._marker("check")
        mine = [c for c in running_checks(self.store, time.time()) if self._started_here(c.started_by, "check")]
        if mine:
            check_id = mine[-1].check_id
        else:
            check_id = start_check(self.store, plan.new_deployment, store_url=self.store_url,
                                   timeout=settings.check_timeout, s3=self.s3,
                                   allow_non_restored_state=settings.allow_non_restored_state,
                                   started_by=marker, restore=restore, rescale_to=settings.partitions,
                                   save_rescaled=save and settings.partitions is not None,
                                   delete_keys=settings.delete_keys, update_values=settings.update_values,
                                   save_edited=save and settings.edit is not None).check_id
        self._record_handle(check_id=check_id)
        return str(check_id)

    def _wait_check(self, check_id: str) -> dict[str, Any]:
        watch = RestoreCheckWatch(self.store, check_id)
        while True:
            try:
                event = watch.poll()
            except StorageError as err:
                log.warning("job %s: cannot read restore check %s, will retry: %s", self.job, check_id, err)
                event = None
            if event is not None:
                return event
            time.sleep(self.poll)

    def _check_latest(self, plan: steps.UpgradePlan) -> steps.Checked:
        n, new = self.settings.partitions, plan.new_deployment
        if plan.what == RESCALE:
            self.say(f"{self._at(1)} checking that {new.job_file} runs on its latest state repartitioned into {n} "
                     "partitions (on a copy)")
        elif plan.edit is not None:
            self.say(f"{self._at(1)} checking that {new.job_file} runs on its latest state after {plan.edit_text} "
                     "(on a copy)")
        else:
            self.say(f"{self._at(1)} checking that {new.job_file} (code {new.code_version or '-'}) restores the latest "
                     "state" + (f" repartitioned into {n} partitions" if n else "") + " (on a copy)")
        try:
            event = self._wait_check(self._start_check(plan, LATEST_STATE, save=False))
        except ConfigError as err:  # bad input: spark-submit or the check refused
            return steps.Checked(problem=str(err))
        if event["status"] not in VERDICTS:
            return steps.Checked(problem=str(event.get("message")))
        running = steps.Running()
        if event["status"] == CheckOutcome.COMPATIBLE:
            self.say(f"{self._at(1)} compatible: snapshot {event.get('snapshot_id')} (batch {event.get('batch_id')})"
                     + (f" in {n} partitions" if n else "") + f", {event.get('seconds')} s")
            running = steps.observe_running(self.store)  # it may have changed meanwhile
        return steps.Checked(event["status"], event.get("reason"), event.get("snapshot_id"), running=running)

    def _stop(self, step: steps.Stop) -> steps.Outcome:
        what = "stop with savepoint" if step.action is RequestAction.STOP else "cancel"
        if step.epoch is None:
            self.say(f"{self._at(2)} no driver runs: nothing to stop")
            ack = None
        else:
            self.say(f"{self._at(2)} stopping the driver of epoch {step.epoch} " + (
                "with a savepoint" if step.action is RequestAction.STOP else
                ("(cancel)" if self.settings.what == RESTART else f"({self.settings.upgrade_mode}: cancel)")))
            ack, why = self._request(step.action, step.epoch, self.settings.stop_timeout)
            if why is not None or ack is None:
                seen, epoch = steps.observe_stop_failure(self.store)
                return steps.StopFailed(f"the {what} did not complete ({why})", seen, epoch)
            done = (f"stopped with savepoint {ack.snapshot_id}" if ack.snapshot_id else "cancelled")
            self.say(f"{self._at(2)} {done} at batch {ack.batch_id}")
        crash_point(f"{self.settings.what}.after-stop")
        if ack is not None and ack.snapshot_id:
            return steps.Stopped(ack.snapshot_id)
        latest = latest_completed(list_snapshots(self.store))  # the rollback's source
        return steps.Stopped(None, latest.snapshot_id if latest else None)

    def _rescale(self, plan: steps.UpgradePlan, step: steps.Rescale) -> steps.Rescaled:
        if step.note:
            self.say(step.note)
        self.say(f"{self._at(3)} " + (f"{plan.edit_text} in savepoint {step.snapshot_id} on a copy" if plan.edit
                                      else f"repartitioning savepoint {step.snapshot_id} into {step.partitions} "
                                      "partitions on a copy"))
        try:
            event = self._wait_check(self._start_check(plan, RestoreSpec(RestoreMode.SNAPSHOT, step.snapshot_id),
                                                       save=True))
        except ConfigError as err:
            return steps.Rescaled(problem=str(err))
        if event["status"] not in VERDICTS:
            return steps.Rescaled(problem=str(event.get("message")))
        rescaled = event.get("rescaled_snapshot_id") or event.get("rewritten_snapshot_id")
        if event["status"] == CheckOutcome.COMPATIBLE and rescaled:
            self.say(f"{self._at(3)} saved savepoint {rescaled} (" + ("edited" if plan.edit else
                                                                      f"{step.partitions} partitions")
                     + f") in {event.get('seconds')} s")
            crash_point("rescale.after-save")
        return steps.Rescaled(event["status"], event.get("reason"), rescaled)

    def _launch_once(self, deployment: Deployment, restore: RestoreSpec, what: str) -> Launch:
        """Start ``deployment`` for this step, unless an earlier actor did (spec/last.json names this step): the
        launch. As the job had: handed to the supervision service again once it was (launcher/handover.start_job)."""
        key = self._step_marker(what)  # the launch's key: exactly this step of this operation, whichever actor
        last = read_launch(self.store)
        if last is not None and (last.key == key or (not last.key and self._started_here(last.launched_by, what))):
            return last  # (a launch recorded before launches had keys is known by its launched_by)
        names = [n for n in os.environ.get(UNRECORDED_ENV, "").split(",") if n in os.environ]
        settings = self.settings
        supervision = settings.supervision if isinstance(settings, RestartStepSettings) else SupervisionMode.AUTO
        return start_job(self.store, deployment, restore=restore, store_url=self.store_url, s3=self.s3,
                         launched_by=self._marker(what), unrecorded_env={n: os.environ[n] for n in names}, key=key,
                         supervision=supervision)

    def _start_new(self, plan: steps.UpgradePlan, step: steps.Start) -> steps.Started:
        if step.note:
            self.say(step.note)
        self.say(f"{self._at(4)} starting {plan.new['job_file']} from {step.restore}")
        try:
            record = self._launch_once(plan.new_deployment, step.restore, "start")
        except CkptError as err:
            return steps.Started(problem=f"cannot launch job {self.job}: {err}")
        crash_point(f"{self.settings.what}.after-start")
        return steps.Started(record.to_dict())

    def _verify_new(self, plan: steps.UpgradePlan) -> steps.Verified:
        if plan.what == RESTART:  # running is enough, as for a submit; the job's own restart: a driver of min_epoch
            started_after = Launch.from_dict(plan.launch).launched_at if plan.launch else None
            criteria = HealthCriteria(min_epoch=plan.min_epoch, started_after=started_after,
                                      start_timeout=self.settings.verify_timeout)
            try:
                event = self._await(criteria, batches=0)
            except CkptError as err:
                return steps.Verified(False, str(err))
            return steps.Verified(event.get("status") == "healthy", _said(event), event.get("epoch"),
                                  event.get("batch_id"))
        assert plan.launch is not None  # recorded with the launch
        try:
            event = self._verify(Launch.from_dict(plan.launch))
        except CkptError as err:  # the job store unreachable meanwhile: no verdict, roll back
            return steps.Verified(False, str(err))
        return steps.Verified(event.get("status") == "healthy", _said(event), event.get("epoch"),
                              event.get("batch_id"), event.get("batches"), self.settings.batches,
                              bool(event.get("idle")))

    def _verify(self, record: Launch, *, batches: int | None = None) -> dict[str, Any]:
        """The health verdict on ``record``'s deployment: ``batches`` new batches (default the settings'), or caught
        up with no new input; with ``require_batches`` (the new deployment only) the batches are awaited within the
        same timeout even then, and their absence is a verdict of its own. The timeout counts from the step's start
        (a resumed step has what is left of it)."""
        need = self.settings.batches if batches is None else batches
        criteria = steps.verify_criteria(record.launched_at, timeout=self.settings.verify_timeout, batches=need)
        return self._await(criteria, batches=need, strict=batches is None and self.settings.require_batches)

    def _await(self, criteria: HealthCriteria, *, batches: int, strict: bool = False) -> dict[str, Any]:
        """The health watch's verdict on ``criteria`` (``_verify``), within the settings' verify timeout."""
        timeout, need = self.settings.verify_timeout, batches
        watch = JobHealthWatch(self.store, criteria)
        deadline = self._deadline(timeout)
        while True:
            try:
                event = watch.poll()
            except StorageError as err:
                log.warning("job %s: cannot read the job store, will retry: %s", self.job, err)
                event = None
            if event is not None and event.get("status") == "healthy" and hasattr(watch, "progress"):
                ran, idle = watch.progress()  # (a test's fake watch has no progress)
                event = {**event, "batches": ran, "idle": idle}  # what was verified (upgradesteps.verification_said)
            if event is not None and (not strict or event.get("status") != "healthy"
                                      or int(event.get("batches") or 0) >= need):
                return event
            if time.time() >= deadline:
                if event is None:
                    return {"status": "unhealthy", "reason": "timeout", "message": (
                        f"no verdict within {timeout:.0f} s: {watch.waiting_for()}")}
                ran = int(event.get("batches") or 0)
                return {**event, "status": "unhealthy", "reason": "no-batch", "message": (
                    f"job {self.job}: expected {need} batches of the new deployment within {timeout:.0f} s "
                    f"(--verify-batches {need}), found {ran}: it runs (epoch {event.get('epoch')}) but had no new "
                    "input; send input or raise --verify-timeout, or verify without waiting for a batch")}
            time.sleep(self.poll)

    def _done(self, plan: steps.UpgradePlan, result: dict[str, Any], said: str) -> dict[str, Any]:
        if plan.what == RESTART:  # the same deployment: nothing new to mark stable
            by = f" (restarted by the job's {plan.owner})" if plan.owner else ""
            self.say(f"{self._at(5)} running: epoch {result['epoch']}" + (
                f" at batch {result['batch_id']}" if result["batch_id"] is not None else "") + by)
            return result
        assert plan.launch is not None
        mark_stable(self.store, Launch.from_dict(plan.launch))
        said = said or f"epoch {result['epoch']} at batch {result['batch_id']}"
        if plan.what == UPGRADE:
            code = plan.new.get("code_version") or plan.new["job_file"]
            self.say(f"{self._at(4)} verified: {said}; {code} is the stable deployment")
            return result
        self.say(f"{self._at(4)} verified: {said}")
        return {key: result[key] for key in ("job", "partitions", "snapshot_id", "rescaled_snapshot_id", "epoch",
                                             "batch_id")}

    def _roll_back(self, plan: steps.UpgradePlan, step: steps.RollBack) -> steps.RolledBack:
        if (disposed := steps.dispose_rescaled(self.store, step)) is not None:
            self.say(f"{self._at(5)} {disposed[1]}")
        old = plan.old_deployment
        self.say(f"{self._at(5)} rolling back: starting {old.job_file} from {step.restore} (the old "
                 f"{'code' if plan.what == UPGRADE else 'partitions'}): {step.why}")
        try:
            event = self._verify(self._launch_once(old, step.restore, "rollback"), batches=0)
        except CkptError as err:  # the launch refused, or the store unreadable: the rollback did not happen
            return steps.RolledBack(step.why, False, f"the old deployment could not be started: {err}", None)
        healthy = event.get("status") == "healthy"
        return steps.RolledBack(step.why, healthy, _said(event), event.get("epoch"))


def _said(event: dict[str, Any]) -> str:
    """What a health event says (its message, else its reason)."""
    return str(event.get("message") or event.get("reason") or event.get("status"))


# -- the front-ends' part: ask, then act here or wait for the actor -------------------------------------------------


def handed(store: JobStore) -> bool:
    """Is the job the supervision service's? Then its owning instance acts on the job's operations."""
    return store.root.exists(handed_key(store.job))


def run_operation(store: JobStore, store_url: str, s3: S3Options | None, settings: StepSettings, *,
                requested_by: str, say: Callable[[str], None], key: str = "", submit_hint: str | None = None,
                poll: float = 1.0) -> dict[str, Any]:
    """``ckpt job`` and the Dagster ops: ask for the operation (or find the one asked before: a re-run
    resumes it), then act on it in this process, unless the supervision service owns the job or a live actor acts
    on it already: then wait for it, saying its progress. The result, or ConfigError (refused, nothing stopped) or
    UpgradeFailed (after the stop: rolled back or not)."""
    found, new = ask(store, settings.what, settings.to_json(), requested_by=requested_by, key=key)
    if not new:
        say(f"found {found.operation.describe()}: resuming it, not starting another")
    actor = f"{requested_by} (pid {os.getpid()})"
    seen, orphaned = (0 if new else len(found.operation.lines)), False
    while True:
        op = found.operation
        if op.state.final:
            return outcome_of(op)
        if not orphaned and (handed(store) or actor_alive(op, silent_for=0.0)):
            event = _wait(store, op.id, say, poll, seen)
            again = read_operation(store)
            if again is None or again.operation.id != op.id:
                raise UpgradeFailed(str(event.get("message")))
            found, seen, orphaned = again, len(again.operation.lines), event.get("status") == ORPHANED
            continue
        driver = JobUpgrade(store, store_url, s3, say=say, actor=actor, submit_hint=submit_hint, poll=poll)
        try:
            return outcome_of(driver.run(found))
        except NotActor as err:  # another actor took it at the same moment: wait for that one
            say(str(err))
            again = read_operation(store)
            if again is None:
                raise
            found, seen = again, len(again.operation.lines)


def _wait(store: JobStore, operation_id: str, say: Callable[[str], None], poll: float, seen: int) -> dict[str, Any]:
    """Wait for another actor's operation to end or be orphaned (its actor dead, the job not the service's)."""
    watch = OperationWatch(store, operation_id, seen_lines=seen)
    while True:
        try:
            event = watch.poll()
        except StorageError as err:
            log.warning("job %s: cannot read its operation, will retry: %s", store.job, err)
            event = None
        for line in watch.take_lines():
            say(line)
        if event is not None:
            return event
        time.sleep(poll)


def start_actor(store: JobStore, store_url: str, s3: S3Options | None, operation_id: str, *,
                env: dict[str, str] | None = None) -> int:
    """A detached ``ckpt job operate`` acting on the operation (the Airflow operators' actor, on the worker, for a
    job not handed to the supervision service): its pid. ``env``: passed on to the drivers it launches unrecorded."""
    logs = log_dir(store.job)
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "job", "operate", "--store", store_url, "--job",
            store.job, "--operation", operation_id]
    if s3 is not None and s3.endpoint_url:
        argv += ["--endpoint-url", s3.endpoint_url]
    if s3 is not None and s3.region:
        argv += ["--region", s3.region]
    extra = dict(env or {})
    full = {**inherited_env(), **credentials_env(s3), **extra, UNRECORDED_ENV: ",".join(sorted(extra))}
    log_file = logs / f"operation-{operation_id}.log"
    pid = spawn_detached(argv, full, log_file)
    log.info("job %s: operation %s acted on by a detached `ckpt job operate`, pid %d on %s (log %s)", store.job,
             operation_id, pid, socket.gethostname(), log_file)
    return pid
