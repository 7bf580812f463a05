"""The restore strategy as a pure decision: what a starting driver resumes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import CheckpointError, ConfigError, SnapshotError
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest
from airflow_ckpt_provider.runtime.config import RestoreSpec, TimeTravel
from airflow_ckpt_provider.runtime.startup import (
    NO_COMPLETED_BATCH,
    Lineage,
    LiveCheckpoint,
    StartAction,
    check_time_travel,
    decide,
    travel_of,
)
from tests.support.manifests import T0, manifest

EMPTY = LiveCheckpoint("file:///live", empty=True)
LIVE_AT_5 = LiveCheckpoint("file:///live", empty=False, batch_id=5)
BROKEN = LiveCheckpoint("file:///live", empty=False, batch_id=5, problem="state/0/0/6.delta is truncated")
CP4 = manifest(Kind.CHECKPOINT, 4, 10)
SP3 = manifest(Kind.SAVEPOINT, 3, 5)
CP7 = manifest(Kind.CHECKPOINT, 7, 20)
T30 = (T0 + timedelta(minutes=30)).timestamp()


def ok(_m: Manifest) -> str | None:
    return None


def damaged(*ids: str) -> Callable[[Manifest], str | None]:
    return lambda m: "object objects/ab is missing" if m.snapshot_id in ids else None


def test_latest_state_keeps_an_intact_live_checkpoint_that_is_newest() -> None:
    plan = decide(RestoreSpec.parse("latest-state"), LIVE_AT_5, [SP3, CP4], ok)
    assert plan.action is StartAction.KEEP_LIVE
    assert plan.snapshot is None
    assert "intact at batch 5" in plan.reason


def test_latest_state_restores_a_newer_snapshot_than_the_live_checkpoint() -> None:
    plan = decide(RestoreSpec.parse("latest-state"), LIVE_AT_5, [SP3, CP4, CP7], ok)
    assert (plan.action, plan.snapshot) == (StartAction.RESTORE, CP7)
    assert "older than the newest snapshot" in plan.reason


def test_latest_state_falls_back_from_a_broken_live_checkpoint_loudly() -> None:
    plan = decide(RestoreSpec.parse("latest-state"), BROKEN, [SP3, CP4], ok)
    assert (plan.action, plan.snapshot) == (StartAction.RESTORE, CP4)
    assert plan.reason.startswith("FALLBACK: the live checkpoint file:///live is broken (state/0/0/6.delta")


def test_damaged_snapshots_are_skipped_for_the_next_newest() -> None:
    plan = decide(RestoreSpec.parse("latest-state"), EMPTY, [SP3, CP4, CP7], damaged(CP7.snapshot_id))
    assert (plan.action, plan.snapshot) == (StartAction.RESTORE, CP4)
    assert plan.skipped == ((CP7.snapshot_id, "object objects/ab is missing"),)
    assert f"skipped damaged {CP7.snapshot_id}" in plan.reason


def test_broken_live_checkpoint_without_any_valid_snapshot_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"is broken .* no valid snapshot to fall back to .*Nothing was changed"):
        decide(RestoreSpec.parse("latest-state"), BROKEN, [CP4], damaged(CP4.snapshot_id))


def test_first_start_and_a_started_but_never_completed_checkpoint_start_fresh() -> None:
    assert decide(RestoreSpec.parse("latest-state"), EMPTY, [], ok).action is StartAction.FRESH
    never = LiveCheckpoint("file:///live", empty=False, problem=NO_COMPLETED_BATCH)
    assert decide(RestoreSpec.parse("latest-state"), never, [], ok).action is StartAction.FRESH
    plan = decide(RestoreSpec.parse("latest-state"), never, [CP4], ok)
    assert (plan.action, plan.snapshot) == (StartAction.RESTORE, CP4)
    assert "holds no completed batch" in plan.reason


def test_latest_savepoint_ignores_checkpoints_and_the_live_checkpoint() -> None:
    plan = decide(RestoreSpec.parse("latest-savepoint"), LIVE_AT_5, [SP3, CP4, CP7], ok)
    assert (plan.action, plan.snapshot) == (StartAction.RESTORE, SP3)
    with pytest.raises(SnapshotError, match=r"no restorable savepoint .*none exists"):
        decide(RestoreSpec.parse("latest-savepoint"), LIVE_AT_5, [CP4], ok)


def test_none_starts_without_state_only_on_an_empty_location() -> None:
    assert decide(RestoreSpec.parse("none"), EMPTY, [], ok).action is StartAction.FRESH
    with pytest.raises(ConfigError, match="not empty: delete it, choose another --checkpoint"):
        decide(RestoreSpec.parse("none"), LIVE_AT_5, [], ok)


def test_a_named_snapshot_is_restored_or_refused_without_fallback() -> None:
    spec = RestoreSpec.parse(SP3.snapshot_id)
    assert decide(spec, LIVE_AT_5, [SP3], ok).snapshot == SP3
    with pytest.raises(SnapshotError, match=f"snapshot {SP3.snapshot_id} cannot be restored: object"):
        decide(spec, LIVE_AT_5, [SP3], damaged(SP3.snapshot_id))


def test_a_damaged_newest_snapshot_never_replaces_a_newer_live_checkpoint() -> None:
    live_at_6 = LiveCheckpoint("file:///live", empty=False, batch_id=6)
    plan = decide(RestoreSpec.parse("latest-state"), live_at_6, [CP4, CP7], damaged(CP7.snapshot_id))
    assert plan.action is StartAction.KEEP_LIVE
    assert plan.skipped == ((CP7.snapshot_id, "object objects/ab is missing"),)


def test_a_lineage_holds_its_base_and_what_was_taken_since() -> None:
    since = CP4.created.timestamp()
    lineage = Lineage(since, base=SP3.snapshot_id)
    assert [lineage.holds(m) for m in (SP3, CP4, CP7, manifest(Kind.CHECKPOINT, 9, 1))] == [True, True, True, False]


def test_restoring_a_snapshot_older_than_the_latest_batch_is_time_travel() -> None:
    plan = decide(RestoreSpec.parse(SP3.snapshot_id), EMPTY, [SP3], ok)
    travel = travel_of(plan, 7, Lineage(0.0))
    assert travel is not None and (travel.to_batch, travel.from_batch) == (3, 7)
    assert travel.why == "the job had reached batch 7"
    assert travel_of(plan, 3, Lineage(0.0)) is None  # the savepoint of a stop: nothing newer exists
    assert travel_of(decide(RestoreSpec.parse("latest-state"), LIVE_AT_5, [SP3], ok), 7, None) is None  # no restore


def test_restoring_a_snapshot_of_another_lineage_is_time_travel_even_at_a_higher_batch() -> None:
    # The job went back to SP3 at minute 30 (a new lineage); CP7 (minute 20) belongs to the abandoned one.
    lineage = Lineage(T30, base=SP3.snapshot_id)
    plan = decide(RestoreSpec.parse(CP7.snapshot_id), EMPTY, [CP7], ok)
    travel = travel_of(plan, 5, lineage)
    assert travel is not None and "another lineage" in travel.why


def test_refuse_policy_refuses_an_explicit_restore_of_older_state_only() -> None:
    plan = decide(RestoreSpec.parse(SP3.snapshot_id), EMPTY, [SP3], ok)
    plan = replace(plan, travel=travel_of(plan, 7, None))
    check_time_travel(RestoreSpec.parse(SP3.snapshot_id), plan, TimeTravel.FORK)  # allowed
    with pytest.raises(ConfigError, match=r"goes back in time: the job had reached batch 7.*nothing was changed"):
        check_time_travel(RestoreSpec.parse(SP3.snapshot_id), plan, TimeTravel.REFUSE)
    # A latest-state recovery that finds only a lagging snapshot is the newest state there is: not refused.
    fallback = replace(decide(RestoreSpec.parse("latest-state"), BROKEN, [CP4], ok), travel=plan.travel)
    check_time_travel(RestoreSpec.parse("latest-state"), fallback, TimeTravel.REFUSE)
    with pytest.raises(ConfigError, match=r"invalid time-travel policy: expected one of fork, refuse, found"):
        TimeTravel.parse("maybe")


def test_a_restore_reference_is_normalised_like_the_cli_and_must_name_this_job(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.runtime.startup import _snapshot_id

    store = JobStore.open(str(tmp_path / "jobs"), "orders")
    sid = SP3.snapshot_id
    for ref in (sid, f"{tmp_path}/jobs/orders/snapshots/{sid}/manifest.json",
                f"file://{tmp_path}/jobs/./orders/snapshots/{sid}/", f"s3://b/p/orders/snapshots/{sid}"):
        assert _snapshot_id(store, ref) == sid
    with pytest.raises(ConfigError, match="belongs to job 'billing', not to job 'orders'"):
        _snapshot_id(store, f"s3://b/p/billing/snapshots/{sid}")
