"""The upgrade/rescale steps as one pure function (launcher/upgradesteps.py next_step): each transition, with the
plan round-tripping through JSON before every decision, as a deferred operator carries it through its triggers."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, UpgradeMode
from airflow_ckpt_provider.core.policy.stepsettings import EDIT, UpgradeSettings
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.snapshots.manifest import RESCALED_FROM, Trigger
from airflow_ckpt_provider.launcher.upgradesteps import (
    NOT_RUNNING,
    RESCALE,
    Began,
    Check,
    Checked,
    Done,
    Fail,
    Outcome,
    Refuse,
    Relaunch,
    Rescale,
    Rescaled,
    RollBack,
    RolledBack,
    Running,
    Saved,
    Start,
    Started,
    Step,
    Stop,
    StopFailed,
    Stopped,
    TakeSavepoint,
    UpgradePlan,
    Verified,
    Verify,
    next_step,
    verification_said,
)
from tests.support.operatorfakes import old_deployment
from tests.unit.core.test_rescaling import manifest, op, stopped

S, R = "savepoint-7-x", "savepoint-8-r"
LAUNCH = {"job": "orders", "launch_id": "launch-1", "launched_at": 1.0}


def plan_of(what: str = "upgrade", mode: UpgradeMode = UpgradeMode.SAVEPOINT, partitions: int | None = None,
            **changes: Any) -> UpgradePlan:
    old = {"job": "orders", "deployment": old_deployment().to_dict(), "restore": "latest-state", "launched_at": 0.0,
           "launched_by": "test", "launch_id": "launch-0"}
    new = old_deployment().with_code("orders_v2.py" if what == "upgrade" else "orders_v1.py",
                                     "v2" if what == "upgrade" else "v1")
    return replace(UpgradePlan("orders", old, new.to_dict(), what, mode, partitions), **changes)


def decide(plan: UpgradePlan, outcome: Outcome) -> tuple[UpgradePlan, Step]:
    """next_step on the plan as it comes back from JSON; the plan it returns survives JSON too."""
    plan, step = next_step(UpgradePlan.from_dict(json.loads(json.dumps(plan.to_dict()))), outcome)
    assert UpgradePlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    return plan, step


def refusal(step: Step) -> str:
    assert isinstance(step, Refuse), step
    return step.message


# -- the first step, from what prepare observed -------------------------------------------------------------------


def test_a_running_job_is_checked_first() -> None:
    assert decide(plan_of(), Began(Running(3))) == (plan_of(), Check(None))
    assert decide(plan_of("rescale", partitions=5), Began(Running(3), latest=manifest(op())))[1] == Check(5)
    assert decide(plan_of(mode=UpgradeMode.LAST_STATE), Began(Running(None)))[1] == Check(None)


def test_stateless_has_nothing_to_check_and_cancels() -> None:
    assert decide(plan_of(mode=UpgradeMode.STATELESS), Began(Running(3)))[1] == Stop(RequestAction.CANCEL, 3)


@pytest.mark.parametrize(("plan", "began", "why", "tail"), [
    (plan_of(), Began(Running(None)), NOT_RUNNING, "the job runs as before"),
    (plan_of(), Began(Running(problem="job orders is RESTARTING")), "job orders is RESTARTING",
     "the job runs as before"),
    (plan_of(RESCALE, partitions=2), Began(Running(3), latest=manifest(op())),
     f"snapshot {S}: the state already has 2 partitions", "the job runs as before"),
    (plan_of(RESCALE, partitions=5), Began(Running(None), status=stopped(snapshot=None), savepoints=[manifest(op())]),
     "the job is not running (STOPPED) and did not stop with a savepoint", "nothing was changed"),
], ids=["not-running", "restarting", "same-count", "cancelled"])
def test_what_is_refused_before_anything_stops(plan: UpgradePlan, began: Began, why: str, tail: str) -> None:
    text = refusal(decide(plan, began)[1])
    target = "5 state partitions" if plan.partitions == 5 else "2 state partitions" if plan.partitions else \
        "orders_v2.py"
    assert text.startswith(f"{plan.what} of job orders to {target} refused before anything was stopped: {why}")
    assert text.endswith(f"; {tail}")


def test_a_stopped_jobs_rescale_repartitions_its_final_savepoint_or_starts_on_the_saved_one() -> None:
    source = manifest(op())
    plan, step = decide(plan_of(RESCALE, partitions=5), Began(Running(), status=stopped(), savepoints=[source]))
    assert (plan.stopped, plan.snapshot_id) == (True, S)
    assert isinstance(step, Rescale) and (step.snapshot_id, step.partitions) == (S, 5)
    assert step.note is not None and step.note.endswith("rescaling it from there")
    rescaled = manifest(op(), partitions=5, snapshot_id=R, batch_id=8, trigger=Trigger.RESCALE,
                        labels={RESCALED_FROM: S})
    plan, step = decide(plan_of(RESCALE, partitions=5), Began(Running(), status=stopped(),
                                                              savepoints=[source, rescaled]))
    assert (plan.snapshot_id, plan.rescaled_snapshot_id) == (S, R)
    assert isinstance(step, Start) and str(step.restore) == R and "already repartitioned" in (step.note or "")


def test_a_rescale_without_a_snapshot_takes_a_savepoint_to_check_against_when_asked() -> None:
    plan = plan_of(RESCALE, partitions=5, savepoint_first=True)
    assert decide(plan, Began(Running(3)))[1] == TakeSavepoint(3)
    assert decide(replace(plan, savepoint_first=False), Began(Running(3)))[1] == Check(5)
    assert decide(plan, Saved())[1] == Check(5)
    assert "the savepoint to check against did not complete (no answer)" in refusal(decide(plan, Saved("no answer"))[1])


# -- 1. the check's verdict ---------------------------------------------------------------------------------------


def test_a_compatible_verdict_stops_the_job_observed_again() -> None:
    assert decide(plan_of(), Checked("compatible", running=Running(4)))[1] == Stop(RequestAction.STOP, 4)
    last_state = plan_of(mode=UpgradeMode.LAST_STATE)
    assert decide(last_state, Checked("compatible", running=Running(4)))[1] == Stop(RequestAction.CANCEL, 4)
    assert decide(last_state, Checked("compatible"))[1] == Stop(RequestAction.CANCEL, None)  # nothing runs


@pytest.mark.parametrize(("plan", "verdict", "why"), [
    (plan_of(), Checked(problem="restore check: timed out: no outcome"), "restore check: timed out: no outcome"),
    (plan_of(), Checked("bad-input", "job file orders_v2.py does not define a @streaming_job"),
     "job file orders_v2.py does not define a @streaming_job"),
    (plan_of(), Checked("incompatible", "the key schema changed", S),
     f"restore check of snapshot {S} with the new code: incompatible: the key schema changed"),
    (plan_of(RESCALE, partitions=5), Checked("inconclusive", "timeout"),
     "restore check of snapshot - repartitioned into 5 partitions: inconclusive: timeout"),
    (plan_of(), Checked("compatible"), f"{NOT_RUNNING} (observed after the restore check)"),
    (plan_of(), Checked("compatible", running=Running(problem="a newer driver")),
     "a newer driver (observed after the restore check)"),
], ids=["no-verdict", "bad-input", "incompatible", "rescale-inconclusive", "stopped-meanwhile", "newer-driver"])
def test_anything_but_a_compatible_verdict_on_a_running_job_refuses(plan: UpgradePlan, verdict: Checked,
                                                                    why: str) -> None:
    text = refusal(decide(plan, verdict)[1])
    assert f"refused before anything was stopped: {why}; the job runs as before" in text


# -- 2. the stop --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "stopped_with", "restore"), [
    (UpgradeMode.SAVEPOINT, Stopped(S), S),
    (UpgradeMode.SAVEPOINT, Stopped(None, None), "latest-state"),
    (UpgradeMode.LAST_STATE, Stopped(None, "checkpoint-9-c"), "latest-state"),
    (UpgradeMode.STATELESS, Stopped(None, "checkpoint-9-c"), "none"),
])
def test_after_the_stop_the_new_code_starts(mode: UpgradeMode, stopped_with: Stopped, restore: str) -> None:
    plan, step = decide(plan_of(mode=mode), stopped_with)
    assert plan.snapshot_id == (stopped_with.snapshot_id or stopped_with.latest)  # the rollback's source
    assert isinstance(step, Start) and str(step.restore) == restore


def test_a_rescale_repartitions_the_stops_savepoint_or_rolls_back_without_one() -> None:
    plan, step = decide(plan_of(RESCALE, partitions=5), Stopped(S))
    assert step == Rescale(S, 5) and plan.snapshot_id == S
    _, step = decide(plan_of(RESCALE, partitions=5), Stopped(None, None))
    assert step == RollBack("the stop left no savepoint to repartition", None, LATEST_STATE)


@pytest.mark.parametrize(("failed", "kind", "text"), [
    (StopFailed("job orders: stop failed: x", "running", 3), Fail,
     "upgrade of job orders: job orders: stop failed: x; the old job still runs (epoch 3), nothing was changed"),
    (StopFailed("job orders: stop timed out", "stopping", 3), Fail, "the old driver (epoch 3) is still STOPPING"),
    (StopFailed("job orders: stop failed: x", "down"), Relaunch,
     "upgrade of job orders: job orders: stop failed: x; the old job had stopped: relaunched orders_v1.py (code v1) "
     "from its latest state"),
    (StopFailed("the stop with savepoint did not complete (no answer)"), Fail,
     "upgrade of job orders: the stop with savepoint did not complete (no answer); the stop may still be under way: "
     "check `ckpt job status --job orders`; nothing was changed"),
], ids=["still-running", "stopping", "down", "not-observed"])
def test_a_stop_that_did_not_complete(failed: StopFailed, kind: type[Fail | Relaunch], text: str) -> None:
    _, step = decide(plan_of(), failed)
    assert isinstance(step, kind) and text in step.message


# -- 3. the repartition, the start, the verification --------------------------------------------------------------


def test_the_repartitioned_savepoint_is_started_or_the_rescale_rolls_back() -> None:
    plan = plan_of(RESCALE, partitions=5, snapshot_id=S)
    plan, step = decide(plan, Rescaled("compatible", rescaled_snapshot_id=R))
    assert plan.rescaled_snapshot_id == R and step == Start(RestoreSpec(RestoreMode.SNAPSHOT, R))
    _, step = decide(plan_of(RESCALE, partitions=5, snapshot_id=S), Rescaled("incompatible", "no"))
    assert step == RollBack(f"the rescale of savepoint {S} to 5 partitions: incompatible: no", None,
                            RestoreSpec(RestoreMode.SNAPSHOT, S))
    _, step = decide(plan_of(RESCALE, partitions=5, snapshot_id=S), Rescaled(problem="rescale: timed out"))
    assert isinstance(step, RollBack) and step.why == "rescale: timed out"


def test_a_launched_deployment_is_verified_and_one_that_could_not_be_launched_rolls_back() -> None:
    plan, step = decide(plan_of(snapshot_id=S), Started(LAUNCH))
    assert plan.launch == LAUNCH and step == Verify()
    _, step = decide(plan_of(snapshot_id=S), Started(problem="cannot launch job orders: job file gone"))
    assert step == RollBack("the new code could not be launched: cannot launch job orders: job file gone", None,
                            RestoreSpec(RestoreMode.SNAPSHOT, S))
    _, step = decide(plan_of(RESCALE, partitions=5, snapshot_id=S, rescaled_snapshot_id=R), Started(problem="p"))
    assert step == RollBack("the job on 5 partitions could not be launched: p", R, RestoreSpec(RestoreMode.SNAPSHOT, S))


def test_a_verified_run_is_done_with_its_result() -> None:
    plan = plan_of(RESCALE, partitions=5, snapshot_id=S, rescaled_snapshot_id=R, launch=LAUNCH)
    _, step = decide(plan, Verified(True, "healthy", 4, 9))
    assert step == Done({"job": "orders", "from_version": "v1", "to_version": "v1", "upgrade_mode": "savepoint",
                         "snapshot_id": S, "epoch": 4, "batch_id": 9, "partitions": 5, "rescaled_snapshot_id": R},
                        "epoch 4 at batch 9, 5 partitions")


HINT = "to wait for one, pass --verify-batches N (a batch then must run within --verify-timeout)"


@pytest.mark.parametrize(("verified", "said"), [
    (Verified(True, "", 2, 9, batches=2, required=2), "epoch 2 at batch 9, 5 partitions"),
    (Verified(True, "", 2, 9), "epoch 2 at batch 9, 5 partitions"),  # the count not known: as before
    (Verified(True, "", 2, None, batches=0, required=2, idle=True),
     "the new driver (epoch 2) runs on 5 partitions; no batch has run since the rescale (no new input), so no batch "
     f"was verified; {HINT}"),
    (Verified(True, "", 2, 9, batches=1, required=2, idle=True),
     "the new driver (epoch 2) runs on 5 partitions; 1 of 2 batches ran since the rescale, up to batch 9, then no "
     f"new input: only those were verified; {HINT}"),
    (Verified(True, "", 2, None, batches=0, required=0),
     "the new driver (epoch 2) runs on 5 partitions; no batch was asked for (--verify-batches 0), so no batch was "
     "verified"),
])
def test_the_verification_says_what_it_verified_and_never_a_batch_that_did_not_run(verified: Verified,
                                                                                    said: str) -> None:
    plan = plan_of(RESCALE, partitions=5, snapshot_id=S, rescaled_snapshot_id=R, launch=LAUNCH)
    assert verification_said(plan, verified) == said
    _, step = decide(plan, verified)
    assert isinstance(step, Done) and step.said == said


def test_an_idle_upgrade_is_not_said_to_be_verified_at_a_batch() -> None:
    said = verification_said(plan_of(snapshot_id=S, launch=LAUNCH), Verified(True, "", 4, None, 0, 2, idle=True))
    assert said == (f"the new driver (epoch 4) runs; no batch has run since the upgrade (no new input), so no batch "
                    f"was verified; {HINT}")


def test_a_failed_verification_disposes_the_rescaled_savepoint_and_rolls_back_to_the_stops() -> None:
    plan = plan_of(RESCALE, partitions=5, snapshot_id=S, rescaled_snapshot_id=R, launch=LAUNCH)
    _, step = decide(plan, Verified(False, "job orders: expected it healthy, found FAILED"))
    assert step == RollBack("job orders: expected it healthy, found FAILED", R, RestoreSpec(RestoreMode.SNAPSHOT, S))


# -- 5. the rollback's outcome ------------------------------------------------------------------------------------


def test_the_rollback_fails_the_run_either_way_saying_where_the_job_is() -> None:
    _, step = decide(plan_of(snapshot_id=S), RolledBack("why", healthy=True, epoch=5))
    assert step == Fail(f"upgrade of job orders to v2 failed verification (why); rolled back to v1 from {S}: the "
                        "old code runs again (epoch 5)")
    _, step = decide(plan_of(RESCALE, partitions=5, snapshot_id=S), RolledBack("why", healthy=True, epoch=5))
    assert isinstance(step, Fail) and step.message.startswith("rescale of job orders to 5 state partitions failed")
    assert step.message.endswith(f"rolled back to v1 from {S} on its old partitions: it runs again (epoch 5)")
    _, step = decide(plan_of(mode=UpgradeMode.LAST_STATE), RolledBack("why", healthy=False, rollback_why="boom"))
    assert step == Fail("upgrade of job orders to v2 failed verification (why) and the rollback to v1 ALSO failed "
                        "(boom); the job's state is uncertain: check `ckpt job status --job orders`, and if it is "
                        "not running restore it from snapshot (its latest state)")


def test_a_plan_of_an_earlier_version_reads_with_defaults() -> None:
    old = {"job": "orders", "deployment": old_deployment().to_dict()}
    plan = UpgradePlan.from_dict({"old": old, "new": {"job_file": "orders_v2.py"}, "partitions": None,
                                  "snapshot_id": S, "launch": LAUNCH})
    assert (plan.what, plan.mode, plan.stopped, plan.rescaled_snapshot_id, plan.old_code) == (
        "upgrade", UpgradeMode.SAVEPOINT, False, None, "v1")
    assert plan.source == RestoreSpec(RestoreMode.SNAPSHOT, S)
    assert plan.job == "orders"  # from the old launch


@pytest.mark.parametrize(("key", "value"), [("old", None), ("new", None), ("old", "not a launch"), ("new", [])])
def test_a_plan_without_a_deployment_is_refused_not_defaulted(key: str, value: object) -> None:
    body: dict[str, object] = {"old": {"job": "orders", "deployment": old_deployment().to_dict()},
                               "new": {"job_file": "orders_v2.py"}}
    if value is None:
        del body[key]
    else:
        body[key] = value
    with pytest.raises(ConfigError, match="expected the old and new deployments and the job, found keys"):
        UpgradePlan.from_dict(body)


def test_a_rollback_disposes_the_rescaled_savepoint_and_says_so_or_says_why_not(tmp_path: Any) -> None:
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot, list_snapshots
    from airflow_ckpt_provider.core.snapshots.manifest import Kind
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.upgradesteps import RollBack, dispose_rescaled
    from tests.support.ckptfactory import make_checkpoint

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    ckpt = LocalStorage(make_checkpoint(tmp_path / "ckpt", 2))
    source = create_snapshot(store, ckpt, kind=Kind.SAVEPOINT).manifest.snapshot_id
    rescaled = create_snapshot(store, ckpt, kind=Kind.SAVEPOINT).manifest.snapshot_id
    restore = RestoreSpec(RestoreMode.SNAPSHOT, source)
    assert dispose_rescaled(store, RollBack("verify failed", None, restore)) is None  # an upgrade: no R
    assert dispose_rescaled(store, RollBack("verify failed", rescaled, restore)) == (
        True, f"disposed savepoint {rescaled} (the state in the new partitions)")
    assert [m.snapshot_id for m in list_snapshots(store)] == [source]
    assert dispose_rescaled(store, RollBack("verify failed", rescaled, restore)) == (  # a retried rollback
        True, f"savepoint {rescaled} (the new partitions) is already disposed")
    (tmp_path / "store" / "orders" / "snapshots" / source / "manifest.json").write_text("not json")
    ok, said = dispose_rescaled(store, RollBack("verify failed", source, restore))  # cannot: said, not raised
    assert not ok and said.startswith(f"savepoint {source} (the new partitions) was not disposed: ")
    assert said.endswith(f"dispose it with `ckpt snapshot dispose --store {store.root.url} --job orders {source} "
                         "--force` before restarting the job from its latest savepoint")


# -- a restart: the same deployment, no check, no rollback ------------------------------------------------------


def restart_plan(mode: UpgradeMode = UpgradeMode.LAST_STATE, restore: str = S, **changes: Any) -> UpgradePlan:
    plan = plan_of("restart", mode)
    return replace(plan, new=plan.old["deployment"], restore=restore, **changes)


@pytest.mark.parametrize(("mode", "action"), [(UpgradeMode.LAST_STATE, RequestAction.CANCEL),
                                              (UpgradeMode.SAVEPOINT, RequestAction.STOP)])
def test_a_restart_stops_a_running_driver_first_then_starts_from_what_was_asked(mode: UpgradeMode,
                                                                               action: RequestAction) -> None:
    plan, step = decide(restart_plan(mode), Began(Running(3)))
    assert step == Stop(action, 3)
    plan, step = decide(plan, Stopped(S if action is RequestAction.STOP else None, "checkpoint-6"))
    assert step == Start(RestoreSpec(RestoreMode.SNAPSHOT, S)) and plan.snapshot_id == (
        S if action is RequestAction.STOP else "checkpoint-6")
    plan, step = decide(plan, Started(LAUNCH))
    assert step == Verify() and plan.launch == LAUNCH
    plan, step = decide(plan, Verified(True, "", 4, 9, 1, 0))
    assert step == Done({"job": "orders", "restore": S, "restarted_by": "operation", "snapshot_id": plan.snapshot_id,
                         "epoch": 4, "batch_id": 9, "launch_id": "launch-1"}, "epoch 4 at batch 9")


def test_a_restart_of_a_job_that_does_not_run_starts_at_once() -> None:
    assert decide(restart_plan(restore="latest-state"), Began(Running(None)))[1] == Start(LATEST_STATE)


def test_a_restart_left_to_the_jobs_own_restart_only_waits_for_it() -> None:
    plan, step = decide(restart_plan(owner="supervisor", min_epoch=4, launch=LAUNCH), Began(Running(None)))
    assert step == Verify() and (plan.owner, plan.min_epoch) == ("supervisor", 4)
    assert decide(plan, Verified(True, "", 4, 9))[1].result["restarted_by"] == "supervisor"  # type: ignore[union-attr]  # a Done


def test_a_restart_refuses_a_driver_it_cannot_ask_to_stop_and_says_nothing_was_stopped() -> None:
    assert refusal(decide(restart_plan(), Began(Running(problem="job orders is STOPPING")))[1]) == (
        f"restart of job orders from {S} refused before anything was stopped: job orders is STOPPING; the job runs "
        "as before")


def test_a_restart_whose_driver_went_down_during_the_stop_goes_on_and_one_still_running_fails() -> None:
    plan = restart_plan()
    assert decide(plan, StopFailed("the cancel did not complete (no answer)", "down"))[1] == Start(
        RestoreSpec(RestoreMode.SNAPSHOT, S))
    step = decide(plan, StopFailed("the cancel did not complete (no answer)", "running", 3))[1]
    assert step == Fail("restart of job orders: the cancel did not complete (no answer); the old job still runs "
                        "(epoch 3), nothing was changed")


def test_a_restart_that_cannot_launch_or_does_not_run_fails_without_a_rollback() -> None:
    stopped_plan = replace(restart_plan(), snapshot_id=S)
    step = decide(stopped_plan, Started(None, "spark-submit not found"))[1]
    assert step == Fail("restart of job orders: its deployment (v1) could not be launched: spark-submit not found; its "
                        "driver was stopped before: it does not run now")
    step = decide(replace(stopped_plan, launch=LAUNCH), Verified(False, "job orders: FAILED"))[1]
    assert step == Fail("restart of job orders: job orders: FAILED")


# -- an edit of the state: the rescale's path with the plan's edit ------------------------------------------------

EDIT_KEYS = {"delete_keys": "0:key_k = 'a'"}


def test_an_edit_is_checked_applied_to_the_stops_savepoint_started_and_rolled_back_to_the_unedited_state() -> None:
    plan = plan_of(EDIT, edit=EDIT_KEYS, savepoint_first=True)
    assert plan.target() == "its state edited (deleting the keys of operator 0 where key_k = 'a')"
    assert decide(plan, Began(Running(3)))[1] == TakeSavepoint(3)  # nothing to check against: a savepoint first
    assert decide(plan, Began(Running(3), latest=manifest()))[1] == Check(None)
    assert decide(plan, Checked("compatible", running=Running(3)))[1] == Stop(RequestAction.STOP, 3)
    refused = refusal(decide(plan, Checked("bad-input", "the predicate selects no row"))[1])
    assert refused == ("edit of job orders to its state edited (deleting the keys of operator 0 where key_k = 'a') "
                       "refused before anything was stopped: the predicate selects no row; the job runs as before")
    plan, step = decide(plan, Stopped(S))
    assert step == Rescale(S, None) and plan.snapshot_id == S
    _, failed = decide(plan, Rescaled("incompatible", "no"))
    assert failed == RollBack(f"the edit of savepoint {S} (deleting the keys of operator 0 where key_k = 'a'): "
                              "incompatible: no", None, RestoreSpec(RestoreMode.SNAPSHOT, S))
    plan, step = decide(plan, Rescaled("compatible", rescaled_snapshot_id=R))
    assert step == Start(RestoreSpec(RestoreMode.SNAPSHOT, R))
    plan, step = decide(plan, Started(LAUNCH))
    _, step = decide(plan, Verified(False, "unhealthy"))
    assert step == RollBack("unhealthy", R, RestoreSpec(RestoreMode.SNAPSHOT, S))  # the edited savepoint goes
    _, step = decide(plan, RolledBack("unhealthy", healthy=True, epoch=5))
    assert isinstance(step, Fail) and step.message.endswith(
        f"rolled back to v1 from {S} on its state as it was before the edit: it runs again (epoch 5)")


def test_an_edit_of_a_job_that_does_not_run_is_refused_saying_how_to_edit_its_savepoint() -> None:
    why = refusal(decide(plan_of(EDIT, edit=EDIT_KEYS), Began(Running(None), latest=manifest()))[1])
    assert "it is not running, so no savepoint can be taken; edit its latest savepoint with `ckpt state " \
           "delete|update`" in why


def test_edit_settings_refuse_a_rescale_in_the_same_run_and_another_upgrade_mode() -> None:
    assert UpgradeSettings(delete_keys="0:key_k = 1").what == EDIT
    assert UpgradeSettings(delete_keys="0:key_k = 1").edit == {"delete_keys": "0:key_k = 1"}
    assert UpgradeSettings(job_file="v2.py", delete_keys="0:key_k = 1").what == "upgrade"
    with pytest.raises(ConfigError, match=r"an edit of the state .* and partitions are separate runs"):
        UpgradeSettings(delete_keys="0:key_k = 1", partitions=4).check()
    with pytest.raises(ConfigError, match="an edit goes through a savepoint; expected upgrade_mode savepoint"):
        UpgradeSettings(job_file="v2.py", delete_keys="0:key_k = 1", upgrade_mode=UpgradeMode.LAST_STATE).check()
    with pytest.raises(ConfigError, match="expected OPERATOR:PREDICATE"):
        UpgradeSettings(delete_keys="key_k = 1").check()
    with pytest.raises(ConfigError, match=r"expected the new code's job_file \(an upgrade\), partitions \(a rescale\) "
                                          r"or an edit of the state"):
        UpgradeSettings().check()
