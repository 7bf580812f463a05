"""Timelines of a sink: which committed batches are the output, after restores that went back in time.

Design notes: docs/sinks.md#design-notes-sinkstimelinespy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.snapshots.coverage import Coverage

#: Starts the message of a batch a sink refuses because of its timeline: the runtime finds it in the
#: query's failure and fails fast (a restart replans the same batch and is refused again).
REFUSED = "CKPT_TIMELINE_REFUSED:"


class TimelineRecord(Record, frozen=True):
    """Timeline ``timeline`` (>= 1) of a query: it starts at ``fork_batch``, after ``parent``'s earlier batches;
    ``coverage`` is the digest of what its first batch read, ``abandoned`` the batches of the other timelines it
    replaces, ``reason`` why it forked. Written once (create-if-absent) by the commit that forks
    (sinks/filecommit.py); read by every commit and reader of the sink (``query_timelines``)."""

    WHAT = "ckpt-files timeline record"
    KEY = "<sink>/_timelines/<query id>/<timeline>.json"

    query_id: str
    timeline: int
    parent: int
    fork_batch: int
    coverage: str
    created_at: str
    abandoned: tuple[int, ...] = ()
    reason: str = ""
    epoch: int | None = None  # the forking driver's lease epoch


class Committed(Protocol):
    """A committed batch of some timeline, as a sink records it."""

    @property
    def batch_id(self) -> int: ...
    @property
    def timeline(self) -> int: ...


C = TypeVar("C", bound=Committed)


@dataclass(frozen=True)
class Timelines:
    """The timelines of one query that took effect (their first batch is committed), oldest first."""

    records: tuple[TimelineRecord, ...] = ()

    @property
    def current(self) -> int:
        return self.records[-1].timeline if self.records else 0

    def holder(self, batch_id: int) -> int:
        """The timeline whose batch ``batch_id`` is the output (if that timeline committed it)."""
        for record in reversed(self.records):
            if batch_id >= record.fork_batch:
                return record.timeline
            # an older fork point above batch_id does not matter: a later timeline started lower
        return 0

    def shows(self, item: Committed) -> bool:
        """True if ``item`` is part of the output: its timeline holds its batch id."""
        return self.holder(item.batch_id) == item.timeline


def effective(records: Iterable[TimelineRecord], committed: Iterable[tuple[int, int]]) -> Timelines:
    """The records whose first batch was committed, given (timeline, batch id) pairs of committed batches.

    A record whose first batch never committed (the writer died in between, and a later restore
    changed course) never took effect: until its first batch exists, readers keep the parent's batches.
    A record is effective only if its parent was effective when it forked, so the chain is linear.
    """
    done = set(committed)
    chain: list[TimelineRecord] = []
    for record in sorted(records, key=lambda r: r.timeline):
        if (record.timeline, record.fork_batch) in done and record.parent == (chain[-1].timeline if chain else 0):
            chain.append(record)
    return Timelines(tuple(chain))


def split(items: Sequence[C], timelines: Timelines) -> tuple[list[C], list[C]]:
    """(shown, abandoned): the committed batches that are the output, and those of abandoned timelines."""
    shown = [m for m in items if timelines.shows(m)]
    abandoned = [m for m in items if not timelines.shows(m)]
    return shown, abandoned


class Action(StrEnum):
    COMMIT = "commit"  # a new batch of the shown timeline
    SKIP = "skip"  # a replay: the same batch is committed
    FORK = "fork"  # the batch differs from the committed one: start a new timeline here
    REFUSE = "refuse"  # the batch does not continue the shown timeline


@dataclass(frozen=True)
class Decision:
    action: Action
    timeline: int
    reason: str
    parent: int = 0  # FORK: the timeline the new one starts from


@dataclass(frozen=True)
class Shown:
    """A shown committed batch: the digest of its offsets log entry (None: committed before sinks recorded it)."""

    coverage: str | None


@dataclass(frozen=True)
class Observed:
    """What the sink holds around batch N: the shown batches N and N-1 (None: not committed), and the
    timelines. ``pending`` are records whose first batch is not committed (a fork under way)."""

    timelines: Timelines
    at_batch: Shown | None = None
    before: Shown | None = None
    pending: tuple[TimelineRecord, ...] = field(default_factory=tuple)
    next_timeline: int = 1
    abandoned_before: tuple[str, ...] = ()  # digests of batch N-1 in abandoned timelines (when none is shown)


def decide(coverage: Coverage, seen: Observed) -> Decision:
    """Skip a replay, commit a new batch, fork at a batch that came back with other content, or refuse."""
    n = coverage.batch_id
    holder = seen.timelines.holder(n)
    if seen.at_batch is not None:
        recorded = seen.at_batch.coverage
        if coverage.same_batch(recorded):
            why = "the same batch is committed" if recorded else "committed before coverage was recorded"
            return Decision(Action.SKIP, holder, why)
    problem = _continues(coverage, seen)
    if problem:
        return Decision(Action.REFUSE, holder, problem)
    for record in seen.pending:  # a fork of this very batch whose first commit did not happen: finish it
        if record.fork_batch == n and record.coverage == coverage.digest:
            return Decision(Action.COMMIT, record.timeline, "finishing the fork recorded before", record.parent)
    if seen.at_batch is None:
        return Decision(Action.COMMIT, holder, "a new batch")
    committed = (seen.at_batch.coverage or "")[:12]
    return Decision(Action.FORK, seen.next_timeline,
                    f"batch {n} is committed with other content (offsets log digest {committed}, "
                    f"this batch {coverage.short()}): it was planned again after a restore of an older snapshot",
                    seen.timelines.current)


def _continues(coverage: Coverage, seen: Observed) -> str | None:
    """Why the batch does not follow the shown batch N-1, or None if it does (or it cannot be told)."""
    if seen.before is None and coverage.previous is not None and coverage.previous in seen.abandoned_before:
        return (f"batch {coverage.batch_id} follows batch {coverage.batch_id - 1} of a timeline this sink abandoned "
                f"(offsets log digest {coverage.previous[:12]}), and the shown timeline has no batch "
                f"{coverage.batch_id - 1}: a zombie driver of the old timeline is still running, or a snapshot of "
                "it taken after the fork was restored. Expected a restore of a snapshot of the shown timeline; stop "
                "the old driver (check the job's lease), restore a snapshot of the shown timeline, or write to a new "
                "sink")
    before = seen.before.coverage if seen.before is not None else None
    if before is None or coverage.previous is None or coverage.previous == before:
        return None
    return (f"batch {coverage.batch_id} follows a batch {coverage.batch_id - 1} (offsets log digest "
            f"{coverage.previous[:12]}) that is not the one the sink shows ({before[:12]}): the query's state "
            "comes from a timeline this sink abandoned, or a zombie driver of one is still running. Expected a "
            "restore of a snapshot of the shown timeline; restore a newer snapshot, or write to a new sink")
