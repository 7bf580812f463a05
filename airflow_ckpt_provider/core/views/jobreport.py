"""A job as an operator sees it on one page: summary, driver starts, snapshot history, restore lineage.

Read from the job store only (status.json, lease.json, supervisors/, deployments/, snapshots/, spec/), as
the CLI and the watches read it: the Streaming jobs page of the Airflow UI (ui/) renders these values and
serves them as JSON. Pure data and job store reads: no Spark, no Airflow, no Kafka.

Manifests never change once written (create-if-absent), so they are read once per process and kept
(``ManifestCache``): a page showing fifty jobs reads each snapshot's manifest once, not on every refresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.health import HealthCriteria, restart_times
from airflow_ckpt_provider.core.policy.prices import describe_rates
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.operations import read_operation
from airflow_ckpt_provider.core.records.ownership import handed_key, read_owner
from airflow_ckpt_provider.core.records.start import StartRecord, read_starts
from airflow_ckpt_provider.core.records.statesample import latest_sample
from airflow_ckpt_provider.core.records.status import ACTIVE_STATES, JobStatus
from airflow_ckpt_provider.core.records.supervision import observe_supervision
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import RESCALED_FROM, TOOK_SECONDS, Kind, Manifest, snapshot_order
from airflow_ckpt_provider.core.store.jobstore import SNAPSHOTS, SPEC_STABLE, JobStore
from airflow_ckpt_provider.core.views.jobview import JobView, observe, state_text

log = logging.getLogger(__name__)

#: Seconds of the window "restarts" counts over: the health watch's default window.
HEALTH_WINDOW = HealthCriteria.health_window


@dataclass(frozen=True)
class SnapshotRow:
    """One snapshot: its size, the bytes it added (objects no earlier snapshot of the job had), and the
    driver starts that restored from it. ``retained`` is False for one a start restored from that is gone
    (disposed by retention or by hand)."""

    snapshot_id: str
    kind: str
    trigger: str
    batch_id: int
    created_at: str
    files: int
    size: int
    new_bytes: int
    code_version: str | None
    uri: str
    retained: bool = True
    restored_by: tuple[int, ...] = ()
    state_partitions: int | None = None  # None: stateless, or unknown (disposed)
    rescaled_from: str | None = None  # a rescale's savepoint: the savepoint it was repartitioned from
    seconds: float | None = None  # how long it took (its manifest's TOOK_SECONDS; None: written before they said)


@dataclass(frozen=True)
class StartRow:
    """One driver start (deployments/<epoch>.json): how it started, from which snapshot, with which code,
    and whether it was a restart (a supervisor's start after its launch's first)."""

    epoch: int
    at: float
    action: str
    restore: str
    snapshot: str | None
    snapshot_retained: bool | None
    code_version: str | None
    launch_id: str | None
    timeline: int
    time_travel: bool
    restart: bool
    reason: str


@dataclass(frozen=True)
class JobSummary:
    """One row of the job list. Ages in seconds at ``now``; None when unknown."""

    job: str
    store: str
    state: str
    state_text: str
    live: bool
    epoch: int | None
    code_version: str | None
    batch_id: int | None
    batch_age: float | None
    heartbeat_age: float | None
    lag: int | None
    process_restarts: int
    driver_restarts: int
    latest_checkpoint: dict[str, Any] | None
    latest_savepoint: dict[str, Any] | None
    problem: str | None = None  # the job store could not be read: why
    store_cost: str | None = None  # the driver's store requests per second and their cost (core/policy/prices.py)

    @property
    def restarts(self) -> int:
        return self.process_restarts + self.driver_restarts


@dataclass(frozen=True)
class JobReport:
    """A job's page: its summary, its status record, its driver starts (newest first), its snapshots
    (newest first), in-driver restarts, the launches (last, stable) and the Spark UI of its driver."""

    summary: JobSummary
    status: dict[str, Any] | None
    starts: tuple[StartRow, ...]
    snapshots: tuple[SnapshotRow, ...]
    in_driver_restarts: tuple[dict[str, Any], ...]
    last_launch: dict[str, Any] | None
    stable_launch: dict[str, Any] | None
    spark_ui: str | None
    supervisor: str | None
    history: tuple[dict[str, Any], ...] = field(default=())
    #: The job's operation (upgrade, rescale, restart; core/records/operations.py): ``text`` (what it is, its step and
    #: actor, its last line or how it ended) and its record; None if the job never had one.
    operation: dict[str, Any] | None = None
    #: Who supervises the job when it was handed to the supervision service (the owning instance and the ownership's
    #: epoch), None when it never was (its supervisor runs where it was launched).
    service: str | None = None
    #: The newest state sample of one of its snapshots (core/records/statesample.py, ``ckpt state sample``), None
    #: without one.
    state_sample: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": summary_dict(self.summary)}


def summary_dict(summary: JobSummary) -> dict[str, Any]:
    return {**asdict(summary), "restarts": summary.restarts}


class ManifestCache:
    """Manifests by (job store URL, snapshot id), at most ``size`` (least recently used dropped)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], Manifest] = OrderedDict()
        self._lock = threading.Lock()

    def manifests(self, store: JobStore) -> list[Manifest]:
        """The job's completed snapshots, oldest first (one listing; a manifest is read the first time only).
        One that cannot be read is skipped with a warning, as ``list_snapshots`` does."""
        ids = sorted({o.key[len(SNAPSHOTS):].split("/", 1)[0] for o in store.storage.list(SNAPSHOTS)
                      if o.key.endswith("/manifest.json")})
        found = []
        for snapshot_id in ids:
            key = (store.url, snapshot_id)
            with self._lock:
                manifest = self._items.get(key)
                if manifest is not None:
                    self._items.move_to_end(key)
            if manifest is None:
                try:
                    manifest = load_manifest(store, snapshot_id)
                except (StorageError, FileNotFoundError) as err:  # disposed meanwhile, or unreadable
                    log.warning("job %s: skipping snapshot %s: %s", store.job, snapshot_id, err)
                    continue
                with self._lock:
                    self._items[key] = manifest
                    while len(self._items) > self.size:
                        self._items.popitem(last=False)
            found.append(manifest)
        return sorted(found, key=snapshot_order)


MANIFESTS = ManifestCache()


def start_rows(records: Sequence[StartRecord], retained: set[str]) -> list[StartRow]:
    """The driver starts, oldest first, each marked as a restart or not (core/policy/health.restart_times)."""
    restarted = set(restart_times([(r.epoch, r.at, r.launch_id) for r in records]))
    return [StartRow(
        epoch=r.epoch, at=r.at, action=r.action or "?", restore=r.restore or "?", snapshot=r.snapshot,
        snapshot_retained=None if r.snapshot is None else r.snapshot in retained, code_version=r.code_version,
        launch_id=r.launch_id, timeline=r.timeline, time_travel=bool(r.time_travel), restart=r.at in restarted,
        reason=r.reason) for r in records]


def _took(m: Manifest) -> float | None:
    try:
        return float(m.labels[TOOK_SECONDS])
    except (KeyError, ValueError):
        return None


def snapshot_rows(manifests: Sequence[Manifest], starts: Iterable[StartRow], uri_of: Any) -> list[SnapshotRow]:
    """Every snapshot, oldest first, with the bytes it added over all earlier ones, then the snapshots driver
    starts restored from that no longer exist (``retained`` False; size unknown: 0)."""
    restored: dict[str, list[int]] = {}
    for s in starts:
        if s.snapshot:
            restored.setdefault(s.snapshot, []).append(s.epoch)
    seen: set[str] = set()
    rows = []
    for m in sorted(manifests, key=snapshot_order):
        new = {f.sha256: f.size for f in m.stored_files if f.sha256 not in seen}
        seen.update(f.sha256 for f in m.stored_files)
        rows.append(SnapshotRow(
            snapshot_id=m.snapshot_id, kind=m.kind.value, trigger=m.trigger.value, batch_id=m.batch_id,
            created_at=m.created_at, files=len(m.files), size=m.total_bytes,
            new_bytes=sum(new.values()) + m.inline_bytes,  # inline files: in this snapshot's manifest only
            code_version=m.code_version, uri=uri_of(m.snapshot_id),
            restored_by=tuple(restored.get(m.snapshot_id, ())), state_partitions=m.state_partitions,
            rescaled_from=m.labels.get(RESCALED_FROM), seconds=_took(m)))
    present = {m.snapshot_id for m in manifests}
    for snapshot_id, epochs in restored.items():
        if snapshot_id not in present:
            kind, _, rest = snapshot_id.partition("-")
            batch = rest.partition("-")[0]
            rows.append(SnapshotRow(
                snapshot_id=snapshot_id, kind=kind, trigger="?", batch_id=int(batch) if batch.isdigit() else -1,
                created_at="", files=0, size=0, new_bytes=0, code_version=None, uri=uri_of(snapshot_id),
                retained=False, restored_by=tuple(epochs)))
    return rows


def _snapshot_brief(m: Manifest | None, now: float) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"id": m.snapshot_id, "batch_id": m.batch_id, "created_at": m.created_at,
            "age": max(0.0, now - m.created.timestamp())}


def summarize(view: JobView, manifests: Sequence[Manifest], starts: Sequence[StartRow],
              window: float = HEALTH_WINDOW) -> JobSummary:
    """The list row of a job from what was read (pure: ``view.now`` is the clock)."""
    s: JobStatus | None = view.status
    now = view.now
    process = sum(1 for r in starts if r.restart and now - r.at <= window)
    in_driver = sum(1 for r in (s.query_restarts() if s else []) if now - r.at <= window)
    live = view.live and s is not None and s.state in ACTIVE_STATES
    return JobSummary(
        job=view.store.job, store=view.store.root.url,
        state="RESTARTING" if view.restarter is not None else (s.state.value if s else "STARTING"),
        state_text=state_text(view), live=live,
        epoch=s.epoch if s else (view.lease.epoch if view.lease else None),
        code_version=s.code_version if s else None, batch_id=s.batch_id if s else None,
        batch_age=None if s is None or s.batch_at is None else max(0.0, now - s.local(s.batch_at)),
        heartbeat_age=None if s is None else max(0.0, s.age(now)),
        lag=s.lag if s and live else None, process_restarts=process, driver_restarts=in_driver,
        latest_checkpoint=_snapshot_brief(latest_completed(manifests, (Kind.CHECKPOINT,)), now),
        latest_savepoint=_snapshot_brief(latest_completed(manifests, (Kind.SAVEPOINT,)), now),
        store_cost=describe_rates(s.store_rates, s.store_window) if s and s.store_window else None)


def job_summary(store: JobStore, *, now: float | None = None, cache: ManifestCache = MANIFESTS) -> JobSummary:
    """The list row of ``store``'s job; a row carrying ``problem`` when its store cannot be read."""
    at = time.time() if now is None else now
    try:
        view = observe(store, at)
        manifests = cache.manifests(store)
        starts = start_rows(read_starts(store), {m.snapshot_id for m in manifests})
    except StorageError as err:
        return JobSummary(store.job, store.root.url, "UNKNOWN", f"the job store cannot be read: {err}", False, None,
                          None, None, None, None, None, 0, 0, None, None, problem=str(err))
    return summarize(view, manifests, starts)


def job_report(store: JobStore, *, now: float | None = None, cache: ManifestCache = MANIFESTS) -> JobReport:
    """Everything the job page shows (raises the ConfigError of ``observe`` for a job never run there)."""
    at = time.time() if now is None else now
    view = observe(store, at)
    manifests = cache.manifests(store)
    starts = start_rows(read_starts(store), {m.snapshot_id for m in manifests})
    summary = summarize(view, manifests, starts)
    s = view.status
    last, stable = read_launch(store), read_launch(store, SPEC_STABLE)
    # observe() reads the supervisor only when it matters to the driver's liveness; the page shows it always.
    supervision = view.supervision or observe_supervision(store, at)
    supervisor = None
    if supervision.record is not None:
        record = supervision.record
        supervisor = record.describe() + ("" if supervision.live else f": not live ({supervision.why_not})")
        if supervision.live and record.standby_pid is not None:
            supervisor += f"; its standby driver (pid {record.standby_pid}) is " + (
                "ready" if record.standby_ready else "starting")
    return JobReport(
        summary=summary, status=s.to_dict() if s else None, starts=tuple(reversed(starts)),
        snapshots=tuple(reversed(snapshot_rows(manifests, starts, store.snapshot_uri))),
        in_driver_restarts=tuple(reversed(s.restarts)) if s else (),
        last_launch=_launch_dict(last), stable_launch=_launch_dict(stable),
        spark_ui=s.ui_url if s and summary.live else None, supervisor=supervisor,
        history=tuple(reversed(history(starts, s))), operation=_operation(store), service=service_owner(store),
        state_sample=sample.to_dict() if (sample := latest_sample(store)) is not None else None)


def service_owner(store: JobStore) -> str | None:
    """The job's owner in the supervision service (a HEAD and a GET), or None when it was never handed to it."""
    try:
        if not store.root.exists(handed_key(store.job)):
            return None
        owner = read_owner(store)
    except StorageError as err:
        return f"handed to the supervision service; its owner record is not readable: {err}"
    if owner is None or owner.released:
        return ("handed to the supervision service; no instance owns it now (one takes it within seconds while "
                "`ckpt service run` runs)")
    return f"supervision service instance {owner.instance} (ownership epoch {owner.epoch})"


def _operation(store: JobStore) -> dict[str, Any] | None:
    """The job's operation for the page (one GET); a damaged record is said, not raised: the page still shows."""
    try:
        found = read_operation(store)
    except StorageError as err:
        return {"text": f"operation record not readable: {err}", "record": None}
    if found is None:
        return None
    op = found.operation
    tail = f": {op.message}" if op.state.final and op.message else (f": {op.lines[-1]}" if op.lines else "")
    return {"text": op.describe() + tail, "record": op.to_dict()}


def history(starts: Sequence[StartRow], status: JobStatus | None) -> list[dict[str, Any]]:
    """The job's status history, oldest first: each driver start, each in-driver restart of the current
    driver and its resumption, and the state it is in now."""
    events: list[dict[str, Any]] = []
    for r in starts:
        what = ("restarted by its supervisor" if r.restart else "started") + f" (epoch {r.epoch}): {r.action}"
        if r.snapshot:
            what += f" from {r.snapshot}"
        if r.code_version:
            what += f", code {r.code_version}"
        events.append({"at": r.at, "epoch": r.epoch, "event": what})
    for restart in (status.query_restarts() if status else []):
        events.append({"at": restart.at, "epoch": status.epoch if status else None,
                       "event": f"query failed at batch {restart.from_batch} ({restart.cause}): "
                                f"restarted in its driver, attempt {restart.attempt}"})
        if restart.resumed_at:
            events.append({"at": restart.resumed_at, "epoch": status.epoch if status else None,
                           "event": f"resumed at batch {restart.resumed_batch}"})
    if status is not None:
        reason = f": {status.reason}" if status.reason else ""
        events.append({"at": status.updated_at, "epoch": status.epoch, "event": f"{status.state}{reason}"})
    return sorted(events, key=lambda e: e["at"])


def _launch_dict(launch: Launch | None) -> dict[str, Any] | None:
    if launch is None:
        return None
    d = launch.deployment
    return {"launch_id": launch.launch_id, "launched_at": launch.launched_at, "launched_by": launch.launched_by,
            "code_version": d.code_version, "job_file": d.job_file, "master": d.master, "restore": str(launch.restore),
            "ending": launch.ending, "exit_code": launch.exit_code, "end_reason": launch.end_reason}
