"""Watches: pollers that wait for a job to be healthy (or not), a control request's answer, or a snapshot.

A watch reads the job store, keeps in memory what it must remember between looks (when the batch id
last changed, since when the job has been healthy), and answers each ``poll(now)`` with None while the
outcome is undecided, else the terminal event: a JSON-able dict whose ``status`` is from the watch's
closed set. The Airflow triggers and sensors run these (in a thread, or in the worker); nothing here
imports Airflow. Time is a parameter, so the rules are tested without sleeping.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from airflow_ckpt_provider.core.control import read_ack
from airflow_ckpt_provider.core.deployments import read_launch
from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError, StorageError
from airflow_ckpt_provider.core.jobstore import DEPLOYMENTS, SNAPSHOTS, JobStore
from airflow_ckpt_provider.core.jobview import JobView, starting_launch, when
from airflow_ckpt_provider.core.lease import read_lease
from airflow_ckpt_provider.core.manifest import Kind, Manifest, parse_enum
from airflow_ckpt_provider.core.outcomes import RequestOutcome
from airflow_ckpt_provider.core.restart import Health, HealthRule
from airflow_ckpt_provider.core.snapshots import latest_completed
from airflow_ckpt_provider.core.status import TERMINAL_STATES, JobState, JobStatus, read_status

log = logging.getLogger(__name__)


class Watch(Protocol):
    """What the triggers and sensors poll."""

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        """None while undecided, else the terminal event."""

    def waiting_for(self) -> str:
        """One line: what is awaited and what was last seen (for timeout events and logs)."""


class Unhealthy(StrEnum):
    """Why a job is unhealthy."""

    FAILED = "failed"  # state FAILED
    STOPPED = "stopped"  # state STOPPED: for a streaming job, an end nobody waited for
    NO_HEARTBEAT = "no_heartbeat"  # active, but its driver stopped reporting: probably dead
    TOO_MANY_RESTARTS = "too_many_restarts"  # crash loop
    NO_PROGRESS = "no_progress"  # data waits, no batch completes
    NOT_STARTED = "not_started"  # no driver of the expected deployment reported in time


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def heartbeat_limit(status: JobStatus, heartbeat_timeout: float | None) -> float:
    """Seconds without a heartbeat after which a RUNNING driver counts as dead (JobStatus.is_stale's rule)."""
    return heartbeat_timeout if heartbeat_timeout is not None else 3 * status.heartbeat_interval + 5


def is_silent(status: JobStatus, now: float, *, heartbeat_timeout: float | None, busy_timeout: float) -> bool:
    """An active driver that stopped reporting. RUNNING drivers report every heartbeat interval; a
    STARTING one may restore a snapshot and a STOPPING one takes its final savepoint without reporting,
    so those get ``busy_timeout`` (at least) before they count as dead (as the supervisor does)."""
    limit = heartbeat_limit(status, heartbeat_timeout)
    if status.state is JobState.RUNNING:
        return status.age(now) > limit
    if status.state in TERMINAL_STATES:
        return False
    return status.age(now) > max(limit, busy_timeout)


def _look(store: JobStore, now: float) -> JobView:
    """Status and lease; unlike jobview.observe, a job that does not exist yet is a view of nothing
    (observe lists the whole store to name the other jobs: too much for every poll)."""
    return JobView(store, read_status(store), read_lease(store), now)


def _non_negative(what: str, value: float | None) -> None:
    if value is not None and value < 0:
        raise ConfigError(f"{what} must be >= 0, found {value}")


# ------------------------------------------------------------------------------------------------
# Job health
# ------------------------------------------------------------------------------------------------


class JobHealthWatch:
    """Waits until the job is healthy, or unhealthy (``expect``).

    Statuses of an epoch below ``min_epoch``, or that started before ``started_after``, belong to an
    older deployment: the watched driver has "not started yet", and so has one whose lease a newer
    driver took before reporting. Unhealthy (first match): FAILED; STOPPED; ``max_restarts`` driver
    restarts within ``restart_window`` s (the deployments/ records: every start of the watched
    deployment but its first); no heartbeat for ``heartbeat_timeout`` s (default: JobStatus.is_stale's
    three intervals + 5 s; STARTING and STOPPING drivers, which restore or take a final savepoint
    without reporting, get ``start_timeout`` at least); data waiting and the batch id unchanged for
    ``progress_timeout`` s; no status of the watched deployment within ``start_timeout`` s of the
    first poll (or of a newer driver taking the lease). Healthy: RUNNING, ``min_batches`` batches
    committed since the watch first saw the deployment (or caught up: Spark found no new data in its
    sources, so there is nothing to make progress on), continuously for ``healthy_for`` s.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        expect: str = Health.HEALTHY,
        min_epoch: int | None = None,
        started_after: float | None = None,
        healthy_for: float = 0,
        min_batches: int = 0,
        heartbeat_timeout: float | None = None,
        max_restarts: int | None = None,
        restart_window: float = 600,
        progress_timeout: float | None = None,
        start_timeout: float = 300,
    ) -> None:
        try:
            self.expect = Health(expect)
        except ValueError:
            raise ConfigError(f"invalid expect {expect!r}: expected 'healthy' or 'unhealthy'") from None
        for what, value in (("healthy_for", healthy_for), ("min_batches", min_batches),
                            ("heartbeat_timeout", heartbeat_timeout), ("restart_window", restart_window),
                            ("progress_timeout", progress_timeout), ("start_timeout", start_timeout)):
            _non_negative(what, value)
        if max_restarts is not None and max_restarts < 1:
            raise ConfigError(f"max_restarts must be >= 1 (or None: restarts are not judged), found {max_restarts}")
        self.store = store
        self.min_epoch = min_epoch
        self.started_after = started_after
        self.healthy_for = healthy_for
        self.min_batches = min_batches
        self.heartbeat_timeout = heartbeat_timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.progress_timeout = progress_timeout
        self.start_timeout = start_timeout
        # What the watch remembers between polls.
        self._pending_since: float | None = None  # since when no status of the watched deployment exists
        self._baseline: int | None = None  # batches are counted after this batch id
        self._no_batch_yet = False  # the watched driver reported no batch yet: its first one counts
        self._healthy_since: float | None = None
        self._healthy_epoch: int | None = None
        self._progress_key: tuple[int, int | None] | None = None
        self._waiting_since = 0.0  # since when data waits with no new batch
        self._was_waiting = False
        self._deployments: dict[str, tuple[int, float, str | None] | None] = {}  # immutable records, read once
        self._seen = "nothing polled yet"

    # -- observe -------------------------------------------------------------------------------

    def _qualifies(self, status: JobStatus) -> bool:
        return (self.min_epoch is None or status.epoch >= self.min_epoch) and (
            self.started_after is None or status.started_at >= self.started_after
        )

    def _current(self, view: JobView) -> JobStatus | None:
        """The status of the watched deployment's current driver, or None if it has not reported."""
        s = view.status
        if s is None or not self._qualifies(s) or view.newer_lease is not None:
            return None
        return s

    def _starts(self) -> list[tuple[int, float, str | None]]:
        """(epoch, at, launch id) of every driver start of the watched deployment, by epoch."""
        for info in self.store.storage.list(DEPLOYMENTS):
            key = info.key
            if key in self._deployments or not key.endswith(".json"):
                continue
            try:
                epoch = int(key[len(DEPLOYMENTS) : -len(".json")])
                if self.min_epoch is not None and epoch < self.min_epoch:
                    self._deployments[key] = None
                    continue
                body = json.loads(self.store.storage.read(key))
                self._deployments[key] = (epoch, float(body["at"]), body.get("launch_id"))
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as err:
                log.warning("job %s: ignoring unreadable deployment record %s: %s", self.store.job, key, err)
                self._deployments[key] = None
        starts = [r for r in self._deployments.values() if r is not None]
        return sorted(s for s in starts if self.started_after is None or s[1] >= self.started_after)

    def _restart_times(self) -> list[float]:
        """Start times of the restarts: the starts a supervisor made after a launch's first (a launch from
        Airflow, an upgrade or its rollback is no crash); without launch ids, every start but the first."""
        times, launches = [], set()
        for index, (_epoch, at, launch_id) in enumerate(self._starts()):
            if (launch_id is None and index > 0) or (launch_id is not None and launch_id in launches):
                times.append(at)
            launches.add(launch_id)
        return times

    # -- decide --------------------------------------------------------------------------------

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = _now(now)
        view = _look(self.store, now)
        status = self._current(view)
        restart_times = self._restart_times()
        restarts = sum(1 for t in restart_times if now - t <= self.restart_window)
        if status is None:
            if self._pending_since is None:
                self._pending_since = now
        else:
            self._pending_since = None
            self._set_baseline(status)
        self._track_progress(status, now)
        self._seen = self._describe(view, status, now)

        unhealthy = self._unhealthy(view, status, restart_times, restarts, now)
        if unhealthy is not None:
            reason, message = unhealthy
            return self._event(Health.UNHEALTHY, reason, message, status, restarts)
        if self.expect is Health.HEALTHY and status is not None and self._healthy(status, now):
            return self._event(Health.HEALTHY, None, self._healthy_message(status, now), status, restarts)
        return None

    def _track_progress(self, status: JobStatus | None, now: float) -> None:
        if status is None or status.state is not JobState.RUNNING:
            self._healthy_since = None
            self._progress_key, self._was_waiting = None, False
            return
        if self._healthy_since is None or self._healthy_epoch != status.epoch:  # a restart is no continuity
            self._healthy_since, self._healthy_epoch = now, status.epoch
        key = (status.epoch, status.batch_id)
        if key != self._progress_key or not status.data_waiting or not self._was_waiting:
            self._progress_key, self._waiting_since = key, now  # a new batch, or data waits from now on
        self._was_waiting = status.data_waiting

    def _set_baseline(self, status: JobStatus) -> None:
        """The batch id batches are counted from. A driver that has not completed a batch since its start
        reports none: its first batch then counts as the first (not as ``id + 1`` batches)."""
        if status.batch_id is None:
            self._no_batch_yet = self._no_batch_yet or self._baseline is None
            return
        if self._no_batch_yet:
            self._baseline, self._no_batch_yet = status.batch_id - 1, False
        elif self._baseline is None or status.batch_id < self._baseline:
            self._baseline = status.batch_id  # first sight of a running job, or batch ids went back (a restore)

    def _batches(self, status: JobStatus) -> int:
        if status.batch_id is None or self._baseline is None:
            return 0
        return status.batch_id - self._baseline

    def _healthy(self, status: JobStatus, now: float) -> bool:
        if status.state is not JobState.RUNNING or self._healthy_since is None:
            return False
        progressed = self._batches(status) >= self.min_batches or status.idle  # idle: caught up, nothing to do
        return progressed and now - self._healthy_since >= self.healthy_for

    def _unhealthy(
        self, view: JobView, s: JobStatus | None, restart_times: list[float], restarts: int, now: float
    ) -> tuple[Unhealthy, str] | None:
        """The first unhealthy reason that applies, with its message; None if none does."""
        if s is None:
            return self._crash_loop(restart_times, restarts, now) or self._not_started(view, now)
        if s.state is not JobState.RUNNING and starting_launch(self.store, s, now, self.start_timeout):
            return None  # stopped or dead, but a newer launch (restart, upgrade, restore) is on its way
        return (self._ended(s) or self._crash_loop(restart_times, restarts, now) or self._dead(s, now)
                or self._stuck(s, now))

    def _ended(self, s: JobStatus) -> tuple[Unhealthy, str] | None:
        job = self.store.job
        if s.state is JobState.FAILED:
            return Unhealthy.FAILED, (
                f"job {job}: expected it {self._expected()}, found FAILED at epoch {s.epoch} since "
                f"{when(s.updated_at)}{_why(s)}. Restart it (it resumes from its latest checkpoint) after "
                f"reading the driver log{_ui(s)}"
            )
        if s.state is JobState.STOPPED:
            return Unhealthy.STOPPED, (
                f"job {job}: expected it {self._expected()}, found STOPPED at epoch {s.epoch} since "
                f"{when(s.updated_at)}{_why(s)}: a streaming job does not end on its own. Restart it if the "
                "stop was not intended (a restart resumes from its latest snapshot)"
            )
        return None

    def _crash_loop(self, restart_times: list[float], restarts: int, now: float) -> tuple[Unhealthy, str] | None:
        if self.max_restarts is None:
            return None
        verdict = HealthRule(self.max_restarts, self.restart_window, None).judge(restart_times, None, False, now)
        if verdict.health is Health.HEALTHY:
            return None
        return Unhealthy.TOO_MANY_RESTARTS, (
            f"job {self.store.job}: expected fewer than {self.max_restarts} driver restarts within "
            f"{self.restart_window:.0f} s, found {restarts} (deployments/ in {self.store.url}): it is "
            "crash-looping. Read the driver log before restarting it again"
        )

    def _dead(self, s: JobStatus, now: float) -> tuple[Unhealthy, str] | None:
        if not is_silent(s, now, heartbeat_timeout=self.heartbeat_timeout, busy_timeout=self.start_timeout):
            return None
        where = f", pid {s.pid} on {s.host}" if s.pid is not None else ""
        return Unhealthy.NO_HEARTBEAT, (
            f"job {self.store.job}: expected a heartbeat every {s.heartbeat_interval:g} s, found none for "
            f"{s.age(now):.0f} s ({s.state} at epoch {s.epoch}{where}): its driver probably died. Restart "
            "the job (it resumes from its latest checkpoint)"
        )

    def _stuck(self, s: JobStatus, now: float) -> tuple[Unhealthy, str] | None:
        if self.progress_timeout is None or s.state is not JobState.RUNNING:
            return None
        rule = HealthRule(sys.maxsize, self.restart_window, self.progress_timeout)
        if rule.judge([], self._waiting_since, s.data_waiting, now).health is Health.HEALTHY:
            return None
        return Unhealthy.NO_PROGRESS, (
            f"job {self.store.job}: expected batches to complete while data is waiting, found batch "
            f"{s.batch_id} for {now - self._waiting_since:.0f} s (limit {self.progress_timeout:.0f} s) at epoch "
            f"{s.epoch}: the query is stuck. Check the sink and the driver log{_ui(s)}, then restart it"
        )

    def _not_started(self, view: JobView, now: float) -> tuple[Unhealthy, str] | None:
        ended = self._launch_ended()
        if ended:
            return Unhealthy.NOT_STARTED, f"job {self.store.job}: {ended}"
        if self._pending_since is None or now - self._pending_since < self.start_timeout:
            return None
        return Unhealthy.NOT_STARTED, (
            f"job {self.store.job}: expected {self._deployment()} to report within {self.start_timeout:.0f} s, "
            f"found {self._found(view)}: its start probably failed. Check the launch (spark-submit) log"
        )

    def _launch_ended(self) -> str:
        """Why the watched launch (spec/last.json launched at/after ``started_after``) ended before its driver
        reported, as its supervisor recorded it; '' if it did not (or there is no readable record)."""
        if self.started_after is None:
            return ""
        try:
            last = read_launch(self.store)
        except StorageError:
            return ""
        if last is None or last.ended_at is None or last.launched_at < self.started_after - 1:
            return ""
        return (f"launch {last.launch_id} ended before its driver reported: {last.end_reason} "
                f"(exit code {last.exit_code}); its log: {last.log_file} on {last.host}")

    # -- tell ----------------------------------------------------------------------------------

    def _expected(self) -> str:
        return "running" if self.expect is Health.UNHEALTHY else "healthy"

    def _deployment(self) -> str:
        parts = []
        if self.min_epoch is not None:
            parts.append(f"of epoch >= {self.min_epoch}")
        if self.started_after is not None:
            parts.append(f"started after {when(self.started_after)}")
        return "a driver " + " ".join(parts) if parts else "a driver"

    def _found(self, view: JobView) -> str:
        s, newer = view.status, view.newer_lease
        if newer is not None:
            return f"a driver (epoch {newer.epoch}, {newer.owner}) took the lease but never reported"
        if s is None:
            return "no status.json" + (f" (lease epoch {view.lease.epoch})" if view.lease else ": the job never ran")
        return f"only the status of an older deployment ({s.state} at epoch {s.epoch}, started {when(s.started_at)})"

    def _describe(self, view: JobView, s: JobStatus | None, now: float) -> str:
        if s is None:
            return f"waiting for {self._deployment()} to report; found {self._found(view)}"
        line = f"{s.state} at epoch {s.epoch}, batch {s.batch_id}"
        if s.state is JobState.RUNNING and self._healthy_since is not None:
            # No running clock in this line: the trigger logs it again only when it changes.
            line += f", {max(0, self._batches(s))} of {self.min_batches} batches" + (
                f", healthy since {when(self._healthy_since)} (for {self.healthy_for:.0f} s)" if self.healthy_for
                else "")
        return line

    def _healthy_message(self, s: JobStatus, now: float) -> str:
        assert self._healthy_since is not None
        return (f"job {self.store.job} is healthy: RUNNING at epoch {s.epoch}, batch {s.batch_id}, "
                f"{self._batches(s)} batches since the check began, healthy for {now - self._healthy_since:.0f} s"
                f"{_ui(s)}")

    def waiting_for(self) -> str:
        return f"job {self.store.job}: expected it {self.expect.value}; last seen: {self._seen}"

    def _event(
        self, health: Health, reason: Unhealthy | None, message: str, s: JobStatus | None, restarts: int
    ) -> dict[str, Any]:
        return {
            "status": health.value,
            "reason": reason.value if reason else None,
            "message": message,
            "job": self.store.job,
            "epoch": s.epoch if s else None,
            "batch_id": s.batch_id if s else None,
            "state": s.state.value if s else None,
            "ui_url": s.ui_url if s else None,
            "restarts": restarts,
        }


def _why(s: JobStatus) -> str:
    return f" (reason: {s.reason})" if s.reason else ""


def _ui(s: JobStatus) -> str:
    return f" (Spark UI {s.ui_url})" if s.ui_url else ""


# ------------------------------------------------------------------------------------------------
# Control requests
# ------------------------------------------------------------------------------------------------


class RequestWatch:
    """Waits for the driver's answer to control request ``request_id`` written for epoch ``epoch``.

    Fails (without an ack) when that driver is gone: ended, silent (see ``is_silent``; ``busy_timeout``
    covers a final savepoint), or replaced by a newer one. It polls once more after noticing, so an
    ack written just after the final status (the driver's order) is not missed.
    """

    def __init__(self, store: JobStore, request_id: str, epoch: int, *, busy_timeout: float = 900.0) -> None:
        self.store = store
        self.request_id = request_id
        self.epoch = int(epoch)
        self.busy_timeout = busy_timeout
        self._gone: str | None = None
        self._seen = "nothing polled yet"

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = _now(now)
        ack = read_ack(self.store, self.request_id)
        if ack is not None:
            action = ack.action.value if ack.action else "unreadable request"
            verb = {"completed": "completed", "failed": "failed", "rejected": "was rejected"}[ack.outcome.value]
            message = f"job {self.store.job}: request {self.request_id} ({action}) {verb} by the driver of " \
                      f"epoch {ack.epoch}: {ack.message}"
            return self._event(RequestOutcome(ack.outcome.value), message, ack.to_dict())
        view = _look(self.store, now)
        gone = self._gone_reason(view, now)
        if gone is not None and self._gone is not None:  # gone on two polls in a row, no ack in between
            return self._event(RequestOutcome.FAILED, gone, None)
        self._gone = gone
        self._seen = gone or (f"{view.status.state} at epoch {view.status.epoch}" if view.status else "no status.json")
        return None

    def _gone_reason(self, view: JobView, now: float) -> str | None:
        job, rid, epoch = self.store.job, self.request_id, self.epoch
        s, lease = view.status, view.lease
        newer = max((x for x in (s.epoch if s else None, lease.epoch if lease else None) if x is not None),
                    default=None)
        if newer is not None and newer > epoch:
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found a newer "
                    f"driver (epoch {newer}) running the job, which rejects requests for another epoch; nothing "
                    "was done. Send the request again for the current epoch")
        if s is None or s.epoch != epoch:
            return None  # that driver has not reported yet
        if s.state in TERMINAL_STATES:
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found it "
                    f"{s.state} since {when(s.updated_at)}{_why(s)} without answering; check `ckpt job status`")
        if is_silent(s, now, heartbeat_timeout=None, busy_timeout=self.busy_timeout):
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found it "
                    f"{s.state} with no heartbeat for {s.age(now):.0f} s: it probably died without answering. "
                    "Restart the job (it resumes from its latest checkpoint)")
        return None

    def waiting_for(self) -> str:
        return (f"job {self.store.job}: expected an answer to request {self.request_id} from the driver of epoch "
                f"{self.epoch}; last seen: {self._seen}")

    def _event(self, outcome: RequestOutcome, message: str, ack: dict[str, Any] | None) -> dict[str, Any]:
        return {"status": outcome.value, "ack": ack, "message": message, "job": self.store.job,
                "request_id": self.request_id}


# ------------------------------------------------------------------------------------------------
# Snapshots
# ------------------------------------------------------------------------------------------------

_ID_TIME = re.compile(r"-(\d{8}T\d{6}Z)-[0-9a-f]{6}$")


class SnapshotWatch:
    """Waits for a completed snapshot (of ``kind``, if given) created at or after ``after`` (epoch seconds);
    answers with the latest completed one among them (core/snapshots.latest_completed)."""

    def __init__(self, store: JobStore, *, after: float, kind: str | None = None) -> None:
        self.store = store
        self.after = float(after)
        self.kind: Kind | None = parse_enum(Kind, kind) if kind is not None else None
        self._manifests: dict[str, Manifest | None] = {}  # manifests never change: read each once
        self._seen = "nothing polled yet"

    def _candidates(self) -> list[Manifest]:
        keys = [o.key for o in self.store.storage.list(SNAPSHOTS) if o.key.endswith("/manifest.json")]
        for key in keys:
            if key in self._manifests or self._older(key):
                continue
            try:
                m = Manifest.from_bytes(self.store.storage.read(key), self.store.storage.uri(key))
            except FileNotFoundError:  # disposed while we listed
                continue
            except SnapshotError as err:
                log.warning("job %s: skipping snapshot: %s", self.store.job, err)
                m = None
            self._manifests[key] = m if m is None or m.job == self.store.job else None
        present = set(keys)
        return [m for k, m in self._manifests.items() if m is not None and k in present]

    def _older(self, key: str) -> bool:
        """True when the id's timestamp (the creation second) shows the snapshot precedes ``after``:
        its manifest need not be read."""
        found = _ID_TIME.search(key[len(SNAPSHOTS) : -len("/manifest.json")])
        if not found:
            return False
        created = datetime.strptime(found.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        return created + 1 <= self.after

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        fresh = [m for m in self._candidates() if m.created.timestamp() >= self.after]
        kinds = (self.kind,) if self.kind else tuple(Kind)
        m = latest_completed(fresh, kinds)
        if m is None:
            self._seen = f"no completed {self._what()} since {when(self.after)} among {len(fresh)} new snapshots"
            return None
        uri = self.store.snapshot_uri(m.snapshot_id)
        return {
            "status": "completed", "snapshot_id": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id,
            "uri": uri, "created_at": m.created_at, "job": self.store.job,
            "message": f"job {self.store.job}: {m.kind.value} {m.snapshot_id} of batch {m.batch_id} completed at "
                       f"{m.created_at}: {uri}",
        }

    def _what(self) -> str:
        return self.kind.value if self.kind else "snapshot"

    def waiting_for(self) -> str:
        return (f"job {self.store.job}: expected a completed {self._what()} created after {when(self.after)}; "
                f"last seen: {self._seen}")
