"""Timelines as pure decisions: which committed batch is shown, and skip / commit / fork / refuse."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_ckpt_provider.core.snapshots.checkpoint import id_ranges as ranges
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.sinks.timelines import (
    Action,
    Observed,
    Shown,
    TimelineRecord,
    Timelines,
    decide,
    effective,
    split,
)


@dataclass(frozen=True)
class Batch:
    batch_id: int
    timeline: int


def record(timeline: int, fork_batch: int, parent: int) -> TimelineRecord:
    return TimelineRecord("q", timeline, parent, fork_batch, f"d{timeline}", "2026-11-25T08:00:00+00:00")


def test_only_forks_whose_first_batch_committed_and_whose_parent_took_effect_count() -> None:
    t1, t2, t3 = record(1, 2, 0), record(2, 1, 1), record(3, 5, 0)  # t3 forked from 0 after t1: stale parent
    timelines = effective([t1, t2, t3], {(1, 2), (2, 1), (3, 5)})
    assert [r.timeline for r in timelines.records] == [1, 2]
    assert [r.timeline for r in effective([t1, t2], {(2, 1)}).records] == []  # t1 never started: t2 neither


def test_the_newest_fork_at_or_below_a_batch_holds_it() -> None:
    timelines = Timelines((record(1, 5, 0), record(2, 3, 1)))
    assert [timelines.holder(b) for b in range(8)] == [0, 0, 0, 2, 2, 2, 2, 2]
    items = [Batch(b, 0) for b in range(6)] + [Batch(5, 1), Batch(6, 1), Batch(3, 2), Batch(4, 2)]
    shown, abandoned = split(items, timelines)
    assert shown == [Batch(0, 0), Batch(1, 0), Batch(2, 0), Batch(3, 2), Batch(4, 2)]
    assert abandoned == [Batch(3, 0), Batch(4, 0), Batch(5, 0), Batch(5, 1), Batch(6, 1)]


def test_replay_new_batch_fork_and_refusal() -> None:
    cov = Coverage(5, "new5", "d4")
    assert decide(cov, Observed(Timelines(), Shown("new5"), Shown("d4"))).action is Action.SKIP
    assert decide(cov, Observed(Timelines(), Shown(None), Shown("d4"))).action is Action.SKIP  # version 1
    assert decide(cov, Observed(Timelines(), None, Shown("d4"))).action is Action.COMMIT
    fork = decide(cov, Observed(Timelines((record(1, 2, 0),)), Shown("old5"), Shown("d4"), next_timeline=4))
    assert (fork.action, fork.timeline, fork.parent) == (Action.FORK, 4, 1)
    assert "planned again after a restore of an older snapshot" in fork.reason
    refused = decide(cov, Observed(Timelines(), None, Shown("other4")))
    assert refused.action is Action.REFUSE and "not the one the sink shows" in refused.reason
    zombie = decide(cov, Observed(Timelines(), None, None, abandoned_before=("d4",)))
    assert zombie.action is Action.REFUSE and "of a timeline this sink abandoned" in zombie.reason


def test_a_fork_whose_first_batch_did_not_commit_is_finished_not_forked_again() -> None:
    pending = record(2, 5, 0)
    seen = Observed(Timelines(), Shown("old5"), Shown("d4"), pending=(pending,), next_timeline=3)
    decision = decide(Coverage(5, "d2", "d4"), seen)
    assert (decision.action, decision.timeline) == (Action.COMMIT, 2)


def test_ranges() -> None:
    assert ranges([17, 18, 19, 22, 21, 25]) == "17-19, 21-22, 25"
    assert ranges([]) == "none"
