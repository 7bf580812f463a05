"""Where a starting driver resumes from: observe the live checkpoint and the snapshots, decide with
the restore strategy, then act (restore into the live location). Pure decision, thin IO around it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from airflow_ckpt_provider.core.errors import CheckpointError, CkptError, ConfigError, SnapshotError
from airflow_ckpt_provider.core.policy.modes import RestoreMode, RestoreSpec, TimeTravel
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
from airflow_ckpt_provider.core.records.start import StartRecord, last_start, write_start
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, load_manifest, object_problems
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.durableplan import FirstPlan, read_first_plan, seed_first_plan
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, NewerFormatError, snapshot_order
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.store.jobstore import JobStore, split_snapshot_ref
from airflow_ckpt_provider.core.store.storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveCheckpoint:
    """What the live checkpoint location holds: nothing, a usable checkpoint, or a broken one."""

    location: str
    empty: bool
    batch_id: int | None = None
    problem: str | None = None

    @property
    def usable(self) -> bool:
        return not self.empty and self.problem is None and self.batch_id is not None


NO_COMPLETED_BATCH = "no completed batch"


class StartAction(StrEnum):
    """Where a starting driver resumes from (the decision of ``decide``)."""

    KEEP_LIVE = "keep-live"
    RESTORE = "restore"
    FRESH = "fresh"


@dataclass(frozen=True)
class Travel:
    """A restore that goes back in time: ``snapshot`` (at ``to_batch``) is older than the ``from_batch``
    the job had reached, or lies outside the lineage it followed. A new timeline starts."""

    snapshot: str
    to_batch: int
    from_batch: int | None
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"snapshot": self.snapshot, "to_batch": self.to_batch, "from_batch": self.from_batch, "why": self.why}


@dataclass(frozen=True)
class StartPlan:
    """The decision and why; ``skipped`` lists rejected candidates (snapshot id, problem) for the log;
    ``travel`` says whether the restore goes back in time."""

    action: StartAction
    reason: str
    snapshot: Manifest | None = None
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    travel: Travel | None = None
    first_plan: FirstPlan | None = None  # a fresh start resumes the first batch a lost driver planned


def observe_live(storage: Storage) -> LiveCheckpoint:
    """Read the live checkpoint; every file the latest completed batch needs is read and checked."""
    if all(o.key.rsplit("/", 1)[-1].startswith(".") for o in storage.list()):  # nothing, or Spark's temp files
        return LiveCheckpoint(storage.url, empty=True)
    checkpoint = SparkCheckpoint(storage)
    try:
        batch = checkpoint.latest_completed_batch()
        if batch is None:  # started but never completed a batch (killed early): nothing to keep or lose
            return LiveCheckpoint(storage.url, empty=False, problem=NO_COMPLETED_BATCH)
        problems = checkpoint.validate()
    except CkptError as err:
        return LiveCheckpoint(storage.url, empty=False, problem=str(err))
    if problems:
        return LiveCheckpoint(storage.url, empty=False, batch_id=batch, problem="; ".join(problems))
    return LiveCheckpoint(storage.url, empty=False, batch_id=batch)


def decide(
    spec: RestoreSpec,
    live: LiveCheckpoint,
    snapshots: Sequence[Manifest],
    problems: Callable[[Manifest], str | None],
) -> StartPlan:
    """The restore strategy as a pure function of what was observed.

    ``snapshots`` are this job's completed snapshots (or the one named); ``problems`` checks that a
    candidate's objects are all present, so a damaged snapshot is skipped for the next newest.
    """
    if spec.mode is RestoreMode.NONE:
        if not live.empty:
            raise ConfigError(
                f"restore strategy 'none' starts without state, but the live checkpoint {live.location} is not "
                "empty: delete it, choose another --checkpoint, or use --restore latest-state to keep its state"
            )
        return StartPlan(StartAction.FRESH, "restore strategy none: starting without state")
    if spec.mode is RestoreMode.SNAPSHOT:
        (named,) = snapshots
        problem = problems(named)
        if problem:
            raise SnapshotError(f"snapshot {named.snapshot_id} cannot be restored: {problem}; choose another one")
        return StartPlan(StartAction.RESTORE, f"restore strategy: snapshot {named.snapshot_id} as requested", named)

    kinds = {Kind.SAVEPOINT} if spec.mode is RestoreMode.LATEST_SAVEPOINT else set(Kind)
    candidates = sorted((m for m in snapshots if m.kind in kinds), key=snapshot_order, reverse=True)
    keep_live = spec.mode is RestoreMode.LATEST_STATE and live.usable
    skipped: list[tuple[str, str]] = []
    for m in candidates:
        if keep_live and (live.batch_id or 0) >= m.batch_id:
            break
        problem = problems(m)
        if problem is None:
            return StartPlan(StartAction.RESTORE, _why(spec, live, m, skipped), m, tuple(skipped))
        skipped.append((m.snapshot_id, problem))
    if keep_live:
        why = f"the live checkpoint is intact at batch {live.batch_id} and newest"
        if skipped:
            why += "; skipped damaged " + ", ".join(f"{sid} ({p})" for sid, p in skipped)
        return StartPlan(StartAction.KEEP_LIVE, why, skipped=tuple(skipped))
    if spec.mode is RestoreMode.LATEST_SAVEPOINT:
        found = "; ".join(f"{sid}: {p}" for sid, p in skipped) or "none exists"
        raise SnapshotError(
            f"restore strategy latest-savepoint: no restorable savepoint ({found}); take one with "
            "`ckpt job savepoint`, or use --restore latest-state"
        )
    if not live.empty and live.problem and live.problem != NO_COMPLETED_BATCH:
        found = "; ".join(f"{sid}: {p}" for sid, p in skipped) or "no snapshot exists"
        raise CheckpointError(
            f"the live checkpoint {live.location} is broken ({live.problem}) and there is no valid snapshot "
            f"to fall back to ({found}). Nothing was changed; repair or move the checkpoint away, or "
            "start over with --restore none on an empty --checkpoint"
        )
    return StartPlan(StartAction.FRESH, "no live checkpoint and no snapshot: first start", skipped=tuple(skipped))


def _why(spec: RestoreSpec, live: LiveCheckpoint, m: Manifest, skipped: list[tuple[str, str]]) -> str:
    what = f"{m.kind.value} {m.snapshot_id} (batch {m.batch_id})"
    if spec.mode is RestoreMode.LATEST_SAVEPOINT:
        why = f"restore strategy latest-savepoint: {what}"
    elif live.empty or live.problem == NO_COMPLETED_BATCH:
        why = f"the live checkpoint {live.location} holds no completed batch: restoring the newest snapshot, {what}"
    elif live.problem:
        why = f"FALLBACK: the live checkpoint {live.location} is broken ({live.problem}); restoring {what}"
    else:
        why = f"the live checkpoint is at batch {live.batch_id}, older than the newest snapshot {what}"
    if skipped:
        why += "; skipped damaged " + ", ".join(f"{sid} ({p})" for sid, p in skipped)
    return why


@dataclass(frozen=True)
class Lineage:
    """Where the running deployment's state comes from: ``base`` (the snapshot it was restored from)
    and the snapshots taken since ``since``. A restart with latest-state never leaves it, so it
    cannot undo a time travel or a fresh start by restoring an older timeline's newer snapshot."""

    since: float
    base: str | None = None

    def holds(self, m: Manifest) -> bool:
        return m.snapshot_id == self.base or m.created.timestamp() >= self.since


def read_lineage(store: JobStore) -> Lineage | None:
    """The lineage the last driver start recorded, or None before the first."""
    start = last_start(store)
    if start is None:
        return None
    if start.lineage_since is None:
        log.warning("job %s: ignoring start record %d without its lineage", store.job, start.epoch)
        return None
    return Lineage(start.lineage_since, start.lineage_base)


def latest_batch(store: JobStore, lineage: Lineage | None, snapshots: Sequence[Manifest]) -> int | None:
    """The newest batch the job is known to have completed on its current lineage: its last status, or
    the newest snapshot taken since the lineage began."""
    try:
        status = read_status(store)
    except CkptError as err:
        log.warning("job %s: cannot read its status to tell time travel (%s)", store.job, err)
        status = None
    found = [m.batch_id for m in snapshots if lineage is None or lineage.holds(m)]
    if status is not None and status.batch_id is not None:
        found.append(status.batch_id)
    return max(found, default=None)


def travel_of(plan: StartPlan, latest: int | None, lineage: Lineage | None) -> Travel | None:
    """Whether restoring ``plan.snapshot`` goes back in time (pure)."""
    m = plan.snapshot
    if plan.action is not StartAction.RESTORE or m is None:
        return None
    if latest is not None and m.batch_id < latest:
        return Travel(m.snapshot_id, m.batch_id, latest, f"the job had reached batch {latest}")
    if lineage is not None and not lineage.holds(m):
        return Travel(m.snapshot_id, m.batch_id, latest,
                      "the snapshot was taken before the job's last restore or fresh start (another lineage)")
    return None


def check_time_travel(spec: RestoreSpec, plan: StartPlan, policy: TimeTravel) -> None:
    """Refuse an explicit restore of an older snapshot under policy ``refuse`` (ConfigError, nothing changed).

    A latest-state recovery that finds only a snapshot behind the live state is never refused: it is
    the newest state there is, and the sinks fork if the lost batches come back different.
    """
    if policy is not TimeTravel.REFUSE or plan.travel is None or spec.mode is RestoreMode.LATEST_STATE:
        return
    t = plan.travel
    raise ConfigError(
        f"restoring {t.snapshot} (batch {t.to_batch}) goes back in time: {t.why}, and the job's sinks may hold "
        f"later batches. Expected a restore of the newest state under --time-travel refuse; nothing was changed "
        "(the running job, its lease and its sinks are untouched). Restore a newer snapshot, or allow it with "
        "--time-travel fork: exactly-once sinks then follow the restored timeline (docs/sinks.md#timelines)"
    )


def check_named_restore(store: JobStore, spec: RestoreSpec, policy: TimeTravel) -> None:
    """Before anything stops: refuse (ConfigError) restoring a named snapshot that goes back in time under
    policy ``refuse``. Reads the job store only (operators call it before they stop the running job)."""
    if policy is not TimeTravel.REFUSE or spec.mode is not RestoreMode.SNAPSHOT:
        return
    assert spec.snapshot is not None
    named = load_manifest(store, _snapshot_id(store, spec.snapshot))
    lineage = read_lineage(store)
    plan = StartPlan(StartAction.RESTORE, "named", named)
    plan = replace(plan, travel=travel_of(plan, latest_batch(store, lineage, _every_for_travel(store, spec, policy)),
                                          lineage))
    check_time_travel(spec, plan, policy)


def _every_for_travel(store: JobStore, spec: RestoreSpec, policy: TimeTravel) -> list[Manifest]:
    """Every completed snapshot, to tell whether restoring a named one goes back in time. Under ``refuse`` one that
    a newer version of this package wrote refuses the restore (ConfigError): its batch cannot be read, so going back
    cannot be ruled out. Otherwise it is skipped: the user chose the snapshot."""
    if policy is not TimeTravel.REFUSE:
        return list_snapshots(store)
    try:
        return list_snapshots(store, refuse_newer=True)
    except NewerFormatError as err:
        raise ConfigError(
            f"restoring {spec.snapshot} under --time-travel refuse: expected every snapshot of job {store.job} "
            f"readable, to tell whether the restore goes back in time; found {err}. Nothing was changed (the "
            "running job, its lease and its sinks are untouched). Upgrade airflow-ckpt-provider to the version "
            "that wrote it, or allow going back in time with --time-travel fork"
        ) from err


def _every_snapshot(store: JobStore, spec: RestoreSpec) -> list[Manifest]:
    """Every completed snapshot, for a restore of "the latest": refused (SnapshotError) if a newer version of this
    package wrote one, since without it "the latest" this version can read may be an older one."""
    try:
        return list_snapshots(store, refuse_newer=True)
    except NewerFormatError as err:
        raise SnapshotError(
            f"job {store.job}: restore {spec} refused: {err}. Without it the newest snapshot this version "
            "can read may be an older one, and the job would silently go back in time: upgrade airflow-ckpt-provider "
            "to the version that wrote it, or restore a snapshot by name"
        ) from err


def plan_start(store: JobStore, live_storage: Storage, spec: RestoreSpec,
               policy: TimeTravel = TimeTravel.FORK) -> tuple[StartPlan, LiveCheckpoint]:
    """Observe and decide, changing nothing: raises when the restore must be refused."""
    live = observe_live(live_storage)
    if spec.mode is RestoreMode.SNAPSHOT:
        assert spec.snapshot is not None
        snapshots: list[Manifest] = [load_manifest(store, _snapshot_id(store, spec.snapshot))]
    elif spec.mode is RestoreMode.NONE:
        snapshots = []
    else:
        snapshots = _every_snapshot(store, spec)
        lineage = read_lineage(store) if spec.mode is RestoreMode.LATEST_STATE else None
        if lineage is not None:
            snapshots = [m for m in snapshots if lineage.holds(m)]

    def problems(m: Manifest) -> str | None:
        found = object_problems(store, m)
        return "; ".join(sorted(found.values())[:3]) if found else None

    plan = decide(spec, live, snapshots, problems)
    if plan.action is StartAction.FRESH and spec.mode is RestoreMode.LATEST_STATE and live.empty:
        first = read_first_plan(store.storage)
        if first is not None:
            plan = replace(plan, first_plan=first, reason=(
                f"no live checkpoint and no snapshot, but driver epoch {first.epoch} planned the first batch of query "
                f"{first.query_id} and its sink may have committed it: resuming that query at batch 0 as planned"))
    if plan.action is StartAction.RESTORE:
        lineage = read_lineage(store)
        # The lineage's snapshots (latest-state), every one (latest-savepoint), or for a named one every one this
        # version reads (the user chose it: a newer format's snapshot refuses it under ``refuse`` only).
        every = _every_for_travel(store, spec, policy) if spec.mode is RestoreMode.SNAPSHOT else snapshots
        plan = replace(plan, travel=travel_of(plan, latest_batch(store, lineage, every), lineage))
        check_time_travel(spec, plan, policy)
    return plan, live


def prepare_checkpoint(store: JobStore, live_storage: Storage, spec: RestoreSpec, *, epoch: int,
                       policy: TimeTravel = TimeTravel.FORK, record: bool = True,
                       code_version: str | None = None) -> StartPlan:
    """Observe, decide, act, record: after this the live location holds what Spark resumes from.

    ``record=False`` for a query restarted inside a running driver: its start at ``epoch`` is recorded already.
    """
    plan, live = plan_start(store, live_storage, spec, policy)
    loud = plan.skipped or (live.problem and live.problem != NO_COMPLETED_BATCH and plan.action is StartAction.RESTORE)
    (log.warning if loud else log.info)("job %s: start: %s", store.job, plan.reason)
    previous_start = last_start(store)
    timeline = (previous_start.timeline if previous_start else 0) + (1 if plan.travel else 0)
    if plan.travel is not None:
        t = plan.travel
        log.warning(
            "job %s epoch %d: TIME TRAVEL to %s (batch %d; %s): timeline %d starts. Sources replay from batch %d's "
            "offsets. ckpt-files and the ledger will show the restored timeline (later batches of the old one are "
            "hidden / undone when batch %d comes back different); the ckpt-kafka sink writes those batches again, "
            "so its consumers see the records of the abandoned batches too (as with Flink); other sinks see them "
            "again", store.job, epoch, t.snapshot, t.to_batch, t.why, timeline, t.to_batch, t.to_batch + 1)
    if plan.first_plan is not None:
        seed_first_plan(plan.first_plan, live_storage)
    if plan.action is StartAction.RESTORE:
        assert plan.snapshot is not None
        restore_snapshot(store, plan.snapshot.snapshot_id, live_storage, replace=not live.empty)
    if not record:
        return plan
    previous = read_lineage(store)
    if spec.mode is RestoreMode.LATEST_STATE and plan.action is not StartAction.FRESH:
        lineage = previous or Lineage(0.0)
    else:
        lineage = Lineage(time.time(), plan.snapshot.snapshot_id if plan.snapshot else None)
    write_start(store, StartRecord(
        epoch=epoch, at=time.time(), restore=str(spec), action=plan.action.value,
        snapshot=plan.snapshot.snapshot_id if plan.snapshot else None, reason=plan.reason,
        lineage_since=lineage.since, lineage_base=lineage.base, timeline=timeline,
        time_travel=plan.travel.to_dict() if plan.travel else None,
        launch_id=os.environ.get(LAUNCH_ENV),  # restarts of one launch are its supervisor's
        code_version=code_version))
    return plan


def _snapshot_id(store: JobStore, ref: str) -> str:
    """A snapshot id, or its URI ``<root>/<job>/snapshots/<id>`` (normalised) which must name this job."""
    _root, job, snapshot_id = split_snapshot_ref(ref)
    if job is not None and job != store.job:
        raise ConfigError(
            f"snapshot {ref} belongs to job {job!r}, not to job {store.job!r}: restoring another job's state "
            "is refused; run it as that job, or copy the snapshot on purpose"
        )
    return snapshot_id
