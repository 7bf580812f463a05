"""The steps of an upgrade, a rescale or a restart, decided once for every driver (the Airflow operators, ``ckpt job
rescale``, and any other orchestrator): observe, decide, act, as the Flink Kubernetes Operator's upgrade.

Design notes: docs/concepts.md#design-notes-launcherupgradestepspy."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, UpgradeMode
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.policy.stateedit import describe_edit, parse_edit
from airflow_ckpt_provider.core.policy.stepsettings import (
    EDIT,
    RESCALE,
    RESTART,
    UPGRADE,
    RestartStepSettings,
    UpgradeSettings,
)
from airflow_ckpt_provider.core.records.control import STOP_ACTION, RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, read_status
from airflow_ckpt_provider.core.snapshots.catalog import dispose_snapshot, latest_completed, list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest
from airflow_ckpt_provider.core.snapshots.rescaling import snapshot_problem, stopped_source
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.views.jobview import RestartDecision, check_can_request, observe, restart_decision
from airflow_ckpt_provider.launcher.deploy import submit_spec
from airflow_ckpt_provider.launcher.submit import build_command
from airflow_ckpt_provider.runtime.config import default_checkpoint

#: Why an upgrade with a savepoint of a job that does not run is refused.
NOT_RUNNING = ("it is not running, so no savepoint can be taken; use upgrade_mode last-state to upgrade from its "
               "latest checkpoint")


# -- the plan -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpgradePlan:
    """One run's target and what it has done so far. ``old``: the old launch record (spec/last.json) as JSON,
    the rollback's deployment; ``new``: the new deployment as JSON; ``snapshot_id``: the stop's savepoint (or the
    latest snapshot), the rollback's source; ``rescaled_snapshot_id``: R; ``launch``: the new deployment's launch
    under verification; ``stopped``: the job was stopped with a savepoint when the run began (nothing to stop).
    A restart: ``new`` is the old deployment, ``restore`` what it restarts from; ``owner`` (``supervisor`` or
    ``driver``) when the job's own restart was under way and the run waits for it (a driver of ``min_epoch``)."""

    job: str
    old: dict[str, Any]
    new: dict[str, Any]
    what: str = UPGRADE
    mode: UpgradeMode = UpgradeMode.SAVEPOINT
    partitions: int | None = None
    savepoint_first: bool = False  # a running job without a snapshot: take a savepoint to check against
    stopped: bool = False
    snapshot_id: str | None = None
    rescaled_snapshot_id: str | None = None
    launch: dict[str, Any] | None = None
    restore: str | None = None
    owner: str | None = None
    min_epoch: int | None = None
    edit: dict[str, str] | None = None  # the state edit (delete_keys or update_values), applied to the stop's savepoint

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "old": self.old, "new": self.new, "what": self.what, "mode": self.mode.value,
                "partitions": self.partitions, "savepoint_first": self.savepoint_first, "stopped": self.stopped,
                "snapshot_id": self.snapshot_id, "rescaled_snapshot_id": self.rescaled_snapshot_id,
                "launch": self.launch, "restore": self.restore, "owner": self.owner, "min_epoch": self.min_epoch,
                "edit": self.edit}

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> UpgradePlan:
        """The plan back from its JSON; optional keys it lacks take defaults (a plan of an earlier version: the
        job from the old launch). Both deployments are required (without them a step would relaunch nothing, or
        the wrong code): ConfigError."""
        missing = [k for k in ("old", "new") if not isinstance(body.get(k), dict) or not body[k]]
        job = body.get("job") or (body["old"].get("job") if isinstance(body.get("old"), dict) else None)
        if missing or not job:
            raise ConfigError(f"upgrade plan: expected the old and new deployments and the job, found keys "
                              f"{sorted(body)}; the plan is written by prepare(): trigger a new run")
        return cls(job=str(job), old=body["old"], new=body["new"],
                   what=body.get("what") or UPGRADE, mode=UpgradeMode(body.get("mode") or UpgradeMode.SAVEPOINT),
                   partitions=body.get("partitions"), savepoint_first=bool(body.get("savepoint_first")),
                   stopped=bool(body.get("stopped")), snapshot_id=body.get("snapshot_id"),
                   rescaled_snapshot_id=body.get("rescaled_snapshot_id"), launch=body.get("launch"),
                   restore=body.get("restore"), owner=body.get("owner"), min_epoch=body.get("min_epoch"),
                   edit=body.get("edit"))

    @property
    def old_deployment(self) -> Deployment:
        return Deployment.from_dict(self.old["deployment"])

    @property
    def new_deployment(self) -> Deployment:
        return Deployment.from_dict(self.new)

    @property
    def old_code(self) -> str:
        """The old code as the messages name it: its version, or its job file."""
        return str(self.old["deployment"].get("code_version") or self.old["deployment"]["job_file"])

    @property
    def edit_text(self) -> str:
        """The state edit as the messages say it ('' without one)."""
        edit = parse_edit(**self.edit) if self.edit else None
        return describe_edit(edit) if edit is not None else ""

    @property
    def transforms(self) -> bool:
        """The stop's savepoint is transformed (repartitioned or edited) into a savepoint R the job starts from."""
        return self.partitions is not None or self.edit is not None

    def target(self, code: str | None = None) -> str:
        """What the run moves the job to: ``code`` (default the new job file), and/or the partitions, or its state
        edited."""
        code = self.new.get("job_file", "") if code is None else code
        if self.edit is not None:
            return f"its state edited ({self.edit_text})" if self.what == EDIT else \
                f"{code} with its state edited ({self.edit_text})"
        if self.partitions is None:
            return str(code)
        return f"{self.partitions} state partitions" if self.what == RESCALE else \
            f"{code} with {self.partitions} state partitions"

    def refused(self, why: object) -> str:
        """A refusal's message: nothing was stopped."""
        if self.what == RESTART:
            return (f"restart of job {self.job} from {self.restore or LATEST_STATE} refused before anything was "
                    f"stopped: {why}; the job runs as before")
        return (f"{self.what} of job {self.job} to {self.target()} refused before anything was stopped: {why}; "
                + ("nothing was changed" if self.stopped else "the job runs as before"))

    @property
    def restore_spec(self) -> RestoreSpec:
        """What a restart restores."""
        return RestoreSpec.parse(self.restore) if self.restore else LATEST_STATE

    @property
    def source(self) -> RestoreSpec:
        """Where the old deployment restarts from in a rollback: the stop's savepoint, or its latest state."""
        return RestoreSpec(RestoreMode.SNAPSHOT, self.snapshot_id) if self.snapshot_id else LATEST_STATE


# -- the outcomes a driver feeds back -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """The running driver's epoch (None: no driver runs), or why no request can be made to it (``problem``)."""

    epoch: int | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Began:
    """What :func:`prepare` observed: the running driver; for a rescale, the latest snapshot (a running job) or
    the status and savepoints (a stopped one)."""

    running: Running
    latest: Manifest | None = None
    status: JobStatus | None = None
    savepoints: Sequence[Manifest] = ()
    note: str | None = None  # what the actor says first


@dataclass(frozen=True)
class Saved:
    """The savepoint to check against: taken, or ``problem``."""

    problem: str | None = None


@dataclass(frozen=True)
class Checked:
    """The restore check's verdict (``status``: a CheckOutcome value), or ``problem``: no verdict (it could not
    start, the wait timed out or failed). ``running``: the job observed again after the verdict."""

    status: str | None = None
    reason: str | None = None
    snapshot_id: str | None = None
    problem: str | None = None
    running: Running = field(default_factory=Running)


@dataclass(frozen=True)
class Stopped:
    """The old driver stopped (or there was none): with its final savepoint, else the latest completed snapshot."""

    snapshot_id: str | None = None
    latest: str | None = None


@dataclass(frozen=True)
class StopFailed:
    """The stop did not complete (``why``); ``seen``: the job observed after it, ``stopping``, ``running`` or
    ``down``, None when the driver did not look."""

    why: str
    seen: str | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class Rescaled:
    """The repartition's verdict and savepoint R, or ``problem``: no verdict."""

    status: str | None = None
    reason: str | None = None
    rescaled_snapshot_id: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Started:
    """The new deployment launched (``launch``: its record as JSON), or ``problem``: it could not be."""

    launch: dict[str, Any] | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Verified:
    """The health verdict on the new deployment. ``batches``: the batches its driver completed during the
    verification (None: not known); ``required``: the batches asked for (None: not known); ``idle``: it was
    caught up with no new input when it was found healthy."""

    healthy: bool
    why: str = ""
    epoch: int | None = None
    batch_id: int | None = None
    batches: int | None = None
    required: int | None = None
    idle: bool = False


@dataclass(frozen=True)
class RolledBack:
    """The health verdict on the old deployment started again; ``why``: the failure rolled back."""

    why: str
    healthy: bool
    rollback_why: str = ""
    epoch: int | None = None


Outcome = Began | Saved | Checked | Stopped | StopFailed | Rescaled | Started | Verified | RolledBack


# -- the steps ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TakeSavepoint:
    """Ask the driver of ``epoch`` for a savepoint (it keeps running): the check needs a snapshot."""

    epoch: int


@dataclass(frozen=True)
class Check:
    """Run the new deployment on a copy of the latest state (``rescale_to``: repartitioned first)."""

    rescale_to: int | None


@dataclass(frozen=True)
class Stop:
    """Stop the driver of ``epoch`` with ``action`` (stop with savepoint, or cancel); None: none runs."""

    action: RequestAction
    epoch: int | None


@dataclass(frozen=True)
class Rescale:
    """Repartition savepoint ``snapshot_id`` into ``partitions`` (or edit its state: the plan's ``edit``) on a copy,
    saved as a savepoint of its own. ``note``: where a stopped job's rescale starts, for the driver to say first."""

    snapshot_id: str
    partitions: int | None
    note: str | None = None


@dataclass(frozen=True)
class Start:
    """Launch the new deployment, restoring ``restore`` (``note``: as for Rescale)."""

    restore: RestoreSpec
    note: str | None = None


@dataclass(frozen=True)
class Verify:
    """Wait for the health verdict on the new deployment's launch (the plan's ``launch``): ``verify_criteria``."""


def verify_criteria(launched_at: float, *, batches: int, timeout: float) -> HealthCriteria:
    """What verifying a launch waits for: a driver of that launch RUNNING with ``batches`` new batches within
    ``timeout`` s, and no restart meanwhile: not of the driver (its supervisor's) nor of its query in the driver
    (``count_query_restarts``), so new code that fails its first batch fails the verification at that batch's
    failure, not once the driver's restart strategy is spent."""
    return HealthCriteria(started_after=launched_at, start_timeout=timeout, min_batches=batches, max_restarts=1,
                          count_query_restarts=True, health_window=timeout)


@dataclass(frozen=True)
class RollBack:
    """Dispose savepoint ``dispose`` (if any), start the old deployment from ``restore``, wait for its health."""

    why: str
    dispose: str | None
    restore: RestoreSpec


@dataclass(frozen=True)
class Relaunch:
    """The old job went down while it was asked to stop: start it again from its latest state, then fail."""

    message: str


@dataclass(frozen=True)
class Done:
    """Verified: record the new deployment as stable; ``result`` is the run's result, ``said`` what was verified
    (``verification_said``)."""

    result: dict[str, Any]
    said: str = ""


@dataclass(frozen=True)
class Refuse:
    """Refused before anything stopped."""

    message: str


@dataclass(frozen=True)
class Fail:
    """Failed after the stop; the message says where the job is now."""

    message: str


Step = TakeSavepoint | Check | Stop | Rescale | Start | Verify | RollBack | Relaunch | Done | Refuse | Fail


# -- decide -------------------------------------------------------------------------------------------------------


def next_step(plan: UpgradePlan, outcome: Outcome) -> tuple[UpgradePlan, Step]:
    """The step after ``outcome``, and the plan with what it recorded. Pure: no IO, no clock."""
    table = _RESTART_DECISIONS if plan.what == RESTART else _DECISIONS
    decide: Callable[[UpgradePlan, Any], tuple[UpgradePlan, Step]] = table[type(outcome)]
    return decide(plan, outcome)


def _saved(plan: UpgradePlan, saved: Saved) -> tuple[UpgradePlan, Step]:
    if saved.problem:
        return plan, Refuse(plan.refused(f"the savepoint to check against did not complete ({saved.problem})"))
    return plan, Check(plan.partitions)


def _started(plan: UpgradePlan, started: Started) -> tuple[UpgradePlan, Step]:
    if started.launch is None:
        what = {UPGRADE: "the new code", EDIT: "the job on its edited state"}.get(
            plan.what, f"the job on {plan.partitions} partitions")
        return plan, _roll_back(plan, f"{what} could not be launched: {started.problem}")
    return replace(plan, launch=started.launch), Verify()


def _verified(plan: UpgradePlan, verified: Verified) -> tuple[UpgradePlan, Step]:
    if not verified.healthy:
        return plan, _roll_back(plan, verified.why)
    return plan, Done(_result(plan, verified), verification_said(plan, verified))


def verification_said(plan: UpgradePlan, verified: Verified) -> str:
    """What the verification of the new deployment verified, and what it did not: a job caught up with no new
    input is healthy without a batch (unless batches were required: ``UpgradeSettings.require_batches``), and then
    no batch of the new deployment was verified; that is said, not a batch that never ran. Pure."""
    runs = f", {plan.partitions} partitions" if plan.what == RESCALE else ""
    required, batches = verified.required, verified.batches
    if verified.batch_id is not None and (required is None or batches is None or batches >= required):
        return f"epoch {verified.epoch} at batch {verified.batch_id}{runs}"  # the batches asked for ran
    driver = (f"the new driver (epoch {verified.epoch}) runs on {plan.partitions} partitions" if plan.what == RESCALE
              else f"the new driver (epoch {verified.epoch}) runs")
    if required == 0:
        return f"{driver}; no batch was asked for (--verify-batches 0), so no batch was verified"
    hint = "to wait for one, pass --verify-batches N (a batch then must run within --verify-timeout)"
    if verified.batch_id is None:
        return (f"{driver}; no batch has run since the {plan.what} (no new input), so no batch was verified; "
                f"{hint}")
    return (f"{driver}; {batches} of {required} batches ran since the {plan.what}, up to batch "
            f"{verified.batch_id}, then no new input: only those were verified; {hint}")


def _began(plan: UpgradePlan, seen: Began) -> tuple[UpgradePlan, Step]:
    """The first step: refused from what was observed, or the check (a stopped job's rescale: the repartition)."""
    running, n, latest = seen.running, plan.partitions, seen.latest
    if n is not None and running.epoch is None and running.problem is None:  # stopped: from its final savepoint
        return _stopped_job(replace(plan, stopped=True), seen, n)
    problem = snapshot_problem(latest, n) if latest is not None and n is not None else None
    why = running.problem or (NOT_RUNNING if running.epoch is None and plan.mode is UpgradeMode.SAVEPOINT else None) \
        or (f"snapshot {latest.snapshot_id}: {problem}" if latest is not None and problem else None)
    if why == NOT_RUNNING and plan.edit is not None:
        why = ("it is not running, so no savepoint can be taken; edit its latest savepoint with `ckpt state "
               "delete|update` and start it from the savepoint that prints")
    if why:  # the same count, no state, HDFS-backed: no check needed to say so
        return plan, Refuse(plan.refused(why))
    if plan.mode is UpgradeMode.STATELESS:  # nothing to restore, nothing to check
        return plan, _stop(plan, running)
    if plan.transforms and latest is None and plan.savepoint_first and running.epoch is not None:
        return plan, TakeSavepoint(running.epoch)
    return plan, Check(n)


def _stopped_job(plan: UpgradePlan, seen: Began, n: int) -> tuple[UpgradePlan, Step]:
    """Nothing to stop: repartition the savepoint the job stopped with (the step runs the code on its copy: no
    check of its own), or start from the one an unfinished rescale saved."""
    try:
        start = stopped_source(seen.status, seen.savepoints, n)
    except ConfigError as err:
        return plan, Refuse(plan.refused(err))
    plan, note = replace(plan, snapshot_id=start.source.snapshot_id), start.describe(n)
    if start.rescaled is None:
        return plan, Rescale(start.source.snapshot_id, n, note)
    plan = replace(plan, rescaled_snapshot_id=start.rescaled.snapshot_id)
    return plan, Start(RestoreSpec(RestoreMode.SNAPSHOT, start.rescaled.snapshot_id), note)


def _checked(plan: UpgradePlan, verdict: Checked) -> tuple[UpgradePlan, Step]:
    """Compatible goes on to the stop (of the job observed again: it may have changed meanwhile); anything else
    refuses the run, nothing stopped."""
    if verdict.problem is not None:
        return plan, Refuse(plan.refused(verdict.problem))
    if verdict.status == CheckOutcome.BAD_INPUT:
        return plan, Refuse(plan.refused(verdict.reason))
    if verdict.status != CheckOutcome.COMPATIBLE:
        how = {UPGRADE: "with the new code", EDIT: f"edited ({plan.edit_text})"}.get(
            plan.what, f"repartitioned into {plan.partitions} partitions")
        return plan, Refuse(plan.refused(f"restore check of snapshot {verdict.snapshot_id or '-'} {how}: "
                                         f"{verdict.status}: {verdict.reason}"))
    running = verdict.running
    problem = running.problem or (NOT_RUNNING if running.epoch is None and plan.mode is UpgradeMode.SAVEPOINT
                                  else None)
    if problem:
        return plan, Refuse(plan.refused(f"{problem} (observed after the restore check)"))
    return plan, _stop(plan, running)


def _stop(plan: UpgradePlan, running: Running) -> Stop:
    return Stop(STOP_ACTION[plan.mode.stop], running.epoch)


def _stopped(plan: UpgradePlan, stopped: Stopped) -> tuple[UpgradePlan, Step]:
    """Cancelled or not running: the rollback goes back to the latest snapshot."""
    snapshot_id = stopped.snapshot_id or stopped.latest
    plan = replace(plan, snapshot_id=snapshot_id)
    if plan.transforms:
        if snapshot_id is None:
            return plan, _roll_back(plan, "the stop left no savepoint to " + (
                "edit" if plan.partitions is None else "repartition"))
        return plan, Rescale(snapshot_id, plan.partitions)
    restore = {UpgradeMode.SAVEPOINT: plan.source, UpgradeMode.LAST_STATE: LATEST_STATE,
               UpgradeMode.STATELESS: RestoreSpec(RestoreMode.NONE)}[plan.mode]
    return plan, Start(restore)


def _stop_failed(plan: UpgradePlan, failed: StopFailed) -> tuple[UpgradePlan, Step]:
    return plan, _stop_failure(plan, failed)


def _stop_failure(plan: UpgradePlan, failed: StopFailed) -> Step:
    """The old driver did not stop as asked: say what state the job is in; relaunch it if it is down."""
    head = f"{plan.what} of job {plan.job}: {failed.why}"
    if failed.seen == "stopping":
        return Fail(f"{head}; the old driver (epoch {failed.epoch}) is still STOPPING: the stop stays in effect and "
                    "nothing restarts the job afterwards; once `ckpt job status` shows it STOPPED, run the "
                    f"{plan.what} again" + ("" if plan.what == RESTART else " (or restart the job)"))
    if failed.seen == "running":
        return Fail(f"{head}; the old job still runs (epoch {failed.epoch}), nothing was changed")
    if failed.seen == "down":
        old = plan.old_deployment
        return Relaunch(f"{head}; the old job had stopped: relaunched {old.job_file} (code "
                        f"{old.code_version or '-'}) from its latest state")
    return Fail(f"{head}; the stop may still be under way: check `ckpt job status --job {plan.job}`; nothing was "
                + ("repartitioned" if plan.partitions is not None else "changed"))


def _rescaled(plan: UpgradePlan, verdict: Rescaled) -> tuple[UpgradePlan, Step]:
    """The repartitioned savepoint: start the job on it; anything else rolls back to the old partitions."""
    if verdict.problem is not None:
        return plan, _roll_back(plan, verdict.problem)
    rescaled = verdict.rescaled_snapshot_id
    if verdict.status != CheckOutcome.COMPATIBLE or not rescaled:
        how = f"the edit of savepoint {plan.snapshot_id} ({plan.edit_text})" if plan.edit is not None else \
            f"the rescale of savepoint {plan.snapshot_id} to {plan.partitions} partitions"
        return plan, _roll_back(plan, f"{how}: {verdict.status}: {verdict.reason}")
    plan = replace(plan, rescaled_snapshot_id=rescaled)
    return plan, Start(RestoreSpec(RestoreMode.SNAPSHOT, rescaled))


def _roll_back(plan: UpgradePlan, why: str) -> RollBack:
    # A restore strategy must not pick the new partitions up again (R is the newest savepoint): R goes.
    return RollBack(why, plan.rescaled_snapshot_id, plan.source)


def _result(plan: UpgradePlan, verified: Verified) -> dict[str, Any]:
    return {"job": plan.job, "from_version": plan.old["deployment"].get("code_version"),
            "to_version": plan.new.get("code_version"), "upgrade_mode": plan.mode.value,
            "snapshot_id": plan.snapshot_id, "epoch": verified.epoch, "batch_id": verified.batch_id,
            "partitions": plan.partitions, "rescaled_snapshot_id": plan.rescaled_snapshot_id}


def _rolled_back(plan: UpgradePlan, rolled: RolledBack) -> tuple[UpgradePlan, Step]:
    return plan, Fail(_rollback_message(plan, rolled))


def _rollback_message(plan: UpgradePlan, rolled: RolledBack) -> str:
    new = plan.new.get("code_version") or plan.new.get("job_file") or ""
    head = f"{plan.what} of job {plan.job} to {plan.target(new)} failed verification ({rolled.why})"
    if not rolled.healthy:
        return (f"{head} and the rollback to {plan.old_code} ALSO failed ({rolled.rollback_why}); the job's state is "
                f"uncertain: check `ckpt job status --job {plan.job}`, and if it is not running restore it from "
                f"snapshot {plan.snapshot_id or '(its latest state)'}")
    return (f"{head}; rolled back to {plan.old_code} from {plan.snapshot_id or 'its latest state'}"
            + (" on its old partitions: it runs again" if plan.partitions else
               " on its state as it was before the edit: it runs again" if plan.edit else ": the old code runs again")
            + f" (epoch {rolled.epoch})")


_DECISIONS: dict[type, Callable[[UpgradePlan, Any], tuple[UpgradePlan, Step]]] = {
    Began: _began, Saved: _saved, Checked: _checked, Stopped: _stopped, StopFailed: _stop_failed,
    Rescaled: _rescaled, Started: _started, Verified: _verified, RolledBack: _rolled_back}


# -- a restart: the same deployment again, no check, nothing to roll back to -------------------------------------


def _restart_began(plan: UpgradePlan, seen: Began) -> tuple[UpgradePlan, Step]:
    """Wait for the job's own restart (``owner``), else stop the running driver, else start."""
    running = seen.running
    if plan.owner is not None:
        return plan, Verify()
    if running.problem is not None:
        return plan, Refuse(plan.refused(running.problem))
    return plan, (_stop(plan, running) if running.epoch is not None else Start(plan.restore_spec))


def _restart_stopped(plan: UpgradePlan, stopped: Stopped) -> tuple[UpgradePlan, Step]:
    """Start from what was asked (after a stop with savepoint, latest-state is that savepoint)."""
    return replace(plan, snapshot_id=stopped.snapshot_id or stopped.latest), Start(plan.restore_spec)


def _restart_stop_failed(plan: UpgradePlan, failed: StopFailed) -> tuple[UpgradePlan, Step]:
    if failed.seen == "down":  # it went down anyway: the restart goes on
        return plan, Start(plan.restore_spec)
    return plan, _stop_failure(plan, failed)


def _restart_started(plan: UpgradePlan, started: Started) -> tuple[UpgradePlan, Step]:
    if started.launch is None:
        stopped = "; its driver was stopped before: it does not run now" if plan.snapshot_id or plan.stopped else ""
        return plan, Fail(f"restart of job {plan.job}: its deployment ({plan.old_code}) could not be launched: "
                          f"{started.problem}{stopped}")
    return replace(plan, launch=started.launch), Verify()


def _restart_verified(plan: UpgradePlan, verified: Verified) -> tuple[UpgradePlan, Step]:
    if not verified.healthy:
        return plan, Fail(f"restart of job {plan.job}: {verified.why}")
    # restarted_by: who made the driver that runs (this operation, or the job's own owner)
    return plan, Done({"job": plan.job, "restore": plan.restore or str(LATEST_STATE),
                       "restarted_by": plan.owner or "operation", "snapshot_id": plan.snapshot_id,
                       "epoch": verified.epoch, "batch_id": verified.batch_id,
                       "launch_id": (plan.launch or {}).get("launch_id")}, f"epoch {verified.epoch} at batch "
                      f"{verified.batch_id}")


_RESTART_DECISIONS: dict[type, Callable[[UpgradePlan, Any], tuple[UpgradePlan, Step]]] = {
    Began: _restart_began, Stopped: _restart_stopped, StopFailed: _restart_stop_failed, Started: _restart_started,
    Verified: _restart_verified}


# -- observe ------------------------------------------------------------------------------------------------------


def dispose_rescaled(store: JobStore, step: RollBack) -> tuple[bool, str] | None:
    """The rollback's first act, for both drivers: dispose R (the state in the new partitions), so that no restore
    strategy picks it up again (it is the newest savepoint). None if there is no R; else whether it is gone and what
    to say. A failure is said, not raised: the rollback goes on."""
    if not step.dispose:
        return None
    if store.storage.stat(store.manifest_key(step.dispose)) is None:  # a retried rollback disposed it already
        return True, f"savepoint {step.dispose} (the new partitions) is already disposed"
    try:
        dispose_snapshot(store, step.dispose, force=True)
    except CkptError as err:
        return False, (f"savepoint {step.dispose} (the new partitions) was not disposed: {err}; dispose it with "
                       f"`ckpt snapshot dispose --store {store.root.url} --job {store.job} "
                       f"{step.dispose} --force` before restarting the job from its latest savepoint")
    return True, f"disposed savepoint {step.dispose} (the state in the new partitions)"


def observe_running(store: JobStore) -> Running:
    """The epoch of the driver a stop can be asked of; None when none runs; ``problem`` when one runs but cannot
    be asked (a restart under way, a newer driver starting)."""
    try:
        view = observe(store)
    except ConfigError:  # never ran
        return Running()
    except CkptError as err:  # the job store unreadable: nothing can be decided on it
        return Running(problem=f"the job store could not be read: {err}")
    if not view.live:
        return Running()
    try:
        return Running(check_can_request(view, RequestAction.STOP).epoch)
    except CkptError as err:
        return Running(problem=str(err))


def observe_stop_failure(store: JobStore) -> tuple[str, int | None]:
    """After a stop that did not complete: is the old driver ``stopping``, ``running``, or ``down``?"""
    try:
        view = observe(store)
    except ConfigError:
        return "down", None
    status = view.status
    if status is None or not view.live:
        return "down", None
    return ("stopping" if status.state is JobState.STOPPING else "running"), status.epoch


def prepare(store: JobStore, settings: UpgradeSettings, *, store_url: str, s3: S3Options | None, submit_hint: str,
            now: float | None = None) -> tuple[UpgradePlan, Began]:
    """Observe the job and build the plan; ConfigError (its message final) for what is refused before any step: no
    recorded deployment (``submit_hint`` says how to make one), a new deployment spark-submit would refuse. A
    ``settings.job_file`` None: the running code. ``py_files``/``files`` None: the recorded ones; a rollback goes back
    to the old deployment, its files included."""
    job, what, mode, partitions = store.job, settings.what, settings.upgrade_mode, settings.partitions
    old = read_launch(store)
    if old is None:
        raise ConfigError(f"job {job} has no recorded deployment (spec/last.json): {submit_hint}")
    job_file, code_version = settings.job_file, settings.code_version
    if not job_file:
        job_file, code_version = old.deployment.job_file, code_version or old.deployment.code_version
    new = old.deployment.with_code(job_file, code_version, py_files=settings.py_files, files=settings.files)
    if mode is UpgradeMode.STATELESS:  # without state: on a fresh live checkpoint location
        base = old.deployment.checkpoint or default_checkpoint(job)
        new = replace(new, checkpoint=f"{base.rstrip('/')}-stateless-{int(time.time() if now is None else now)}")
    # A running job without a snapshot gets a savepoint to check against, whoever asked (savepoint_first).
    plan = UpgradePlan(job, old.to_dict(), new.to_dict(), what, mode, partitions, savepoint_first=True,
                       edit=settings.edit)
    running = observe_running(store)
    if running.problem is None:
        try:  # a deployment spark-submit would refuse fails here, before anything stops
            build_command(submit_spec(new, job, store_url, LATEST_STATE, s3, supervised=True))
        except CkptError as err:
            raise ConfigError(plan.refused(err)) from err
    if not plan.transforms:
        return plan, Began(running)
    if partitions is None:  # an edit: the snapshot it is checked against
        return plan, Began(running, latest=latest_completed(list_snapshots(store)))
    if running.epoch is None and running.problem is None:
        return plan, Began(running, status=read_status(store), savepoints=list_snapshots(store, Kind.SAVEPOINT))
    return plan, Began(running, latest=latest_completed(list_snapshots(store)))


def prepare_restart(store: JobStore, settings: RestartStepSettings, *, submit_hint: str) -> tuple[UpgradePlan, Began]:
    """Observe the job and build a restart's plan (core/views/jobview.restart_decision: one owner per restart): a
    ``latest-state`` restart of a job its supervisor or driver restarts already waits for that restart (``owner``);
    otherwise a driver that runs is stopped first. ConfigError (final) for what is refused before any step: no
    recorded deployment, a restore its time-travel policy refuses."""
    from airflow_ckpt_provider.runtime.startup import check_named_restore  # reads snapshots and lineage

    job, spec = store.job, settings.restore
    old = read_launch(store)
    if old is None:
        raise ConfigError(f"job {job} has no recorded deployment (spec/last.json): {submit_hint}")
    plan = UpgradePlan(job, old.to_dict(), old.deployment.to_dict(), RESTART, settings.upgrade_mode,
                       restore=str(spec))
    try:  # the job's time-travel policy, before the running driver is stopped
        check_named_restore(store, spec, old.deployment.time_travel)
    except CkptError as err:
        raise ConfigError(plan.refused(err)) from err
    try:
        view = observe(store)
    except ConfigError:  # never ran
        view = None
    decision, restarter = restart_decision(view, spec)
    if decision is RestartDecision.LEAVE_TO_OWNER:
        assert restarter is not None
        launch = old.to_dict() if old.launch_id == restarter.launch_id else None
        plan = replace(plan, owner=restarter.by.value, min_epoch=restarter.min_epoch, launch=launch)
        return plan, Began(Running(), note=f"nothing to launch: the job is {restarter.describe()}; waiting for that")
    if decision is RestartDecision.STOP_THEN_LAUNCH:
        return plan, Began(observe_running(store))
    return plan, Began(Running())


# -- the record: steps and outcomes as JSON (core/records/operations.py keeps them) ----------------------------


def encode(item: Outcome | Step) -> dict[str, Any]:
    """A step or an outcome as JSON: its type's name and its fields (never Began: it is decided on at once)."""
    body: dict[str, Any] = {"type": type(item).__name__}
    for f in fields(item):
        value = getattr(item, f.name)
        if isinstance(value, Running):
            value = {"epoch": value.epoch, "problem": value.problem}
        elif isinstance(value, RestoreSpec):
            value = str(value)
        elif isinstance(value, Enum):
            value = value.value
        body[f.name] = value
    return body


def decode_step(body: dict[str, Any]) -> Step:
    """A step recorded by ``encode``; ConfigError naming what is wrong (a malformed record: nothing is acted on)."""
    return _decode(body, _STEPS)  # type: ignore[no-any-return]  # one of _STEPS' types


def decode_outcome(body: dict[str, Any]) -> Outcome:
    """An outcome recorded by ``encode``; ConfigError as ``decode_step``."""
    return _decode(body, _OUTCOMES)  # type: ignore[no-any-return]  # one of _OUTCOMES' types


def _decode(body: dict[str, Any], types: dict[str, type]) -> Any:
    kind = types.get(str(body.get("type")))
    if kind is None:
        raise ConfigError(f"operation record: expected one of {', '.join(sorted(types))}, found type "
                          f"{body.get('type')!r}; the record is damaged: remove operation.json and run the upgrade "
                          "again once `ckpt job status` shows what the job runs")
    values: dict[str, Any] = {}
    try:
        for f in fields(kind):
            if f.name not in body:
                continue
            value = body[f.name]
            if f.name == "running":
                value = Running(**value)
            elif f.name == "restore":
                value = RestoreSpec.parse(value)
            elif f.name == "action":
                value = RequestAction(value)
            values[f.name] = value
        return kind(**values)
    except (TypeError, ValueError, CkptError) as err:
        raise ConfigError(f"operation record: {body.get('type')} {body} is not valid ({err}); the record is damaged: "
                          "remove operation.json and run the upgrade again") from err


# Began is decided on at once and never recorded; the final steps (Refuse, Fail, Done, Relaunch) end the operation.
_OUTCOMES: dict[str, type] = {t.__name__: t for t in (
    Saved, Checked, Stopped, StopFailed, Rescaled, Started, Verified, RolledBack)}
_STEPS: dict[str, type] = {t.__name__: t for t in (TakeSavepoint, Check, Stop, Rescale, Start, Verify, RollBack)}
