"""JobHealthWatch: waits until a job is healthy, or until it is not, and says why (``Unhealthy``)."""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.deployments import read_launch
from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.health import HealthCriteria, restart_times
from airflow_ckpt_provider.core.jobstore import DEPLOYMENTS, JobStore
from airflow_ckpt_provider.core.jobview import JobView, starting_launch, when
from airflow_ckpt_provider.core.outage import ReadableAgain
from airflow_ckpt_provider.core.restart import Health, HealthRule
from airflow_ckpt_provider.core.status import (
    TERMINAL_STATES,
    JobState,
    JobStatus,
    Restart,
    RestartOwner,
    driver_live,
)
from airflow_ckpt_provider.core.supervision import (
    STALE,
    Supervision,
    observe_supervision,
    restarts_dead_driver,
)
from airflow_ckpt_provider.core.watches.base import current_time, look, ui, why

log = logging.getLogger(__name__)


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def _silenced(sup: Supervision, failed: JobStatus) -> bool:
    """Whether a job store outage may have kept the supervisor from acting on the failed driver: it was beating when
    the driver failed, and now it is live or only its heartbeat is stale (not ended, superseded or found dead)."""
    record = sup.record
    if record is None or record.updated_at + record.heartbeat_limit() < failed.updated_at:
        return False  # no supervisor, or one already silent when the driver failed
    return sup.live or sup.why_not.startswith(STALE)


def _last_failure(s: JobStatus | None) -> str:
    """'; after batch B: <cause>' from the driver's newest query restart, or ''."""
    restarts = s.query_restarts() if s is not None else []
    if not restarts:
        return ""
    last = restarts[-1]
    return "; " + (f"after batch {last.from_batch}: " if last.from_batch is not None else "") + last.cause


class Unhealthy(StrEnum):
    """Why a job is unhealthy."""

    FAILED = "failed"  # state FAILED
    STOPPED = "stopped"  # state STOPPED: for a streaming job, an end nobody waited for
    NO_HEARTBEAT = "no_heartbeat"  # active, but its driver stopped reporting: probably dead
    TOO_MANY_RESTARTS = "too_many_restarts"  # crash loop
    NO_PROGRESS = "no_progress"  # data waits, no batch completes
    NOT_STARTED = "not_started"  # no driver of the expected deployment reported in time


class JobHealthWatch:
    """Waits until the job is healthy, or unhealthy (``criteria.expect``), by ``criteria`` (core/health.py).

    Statuses of an epoch below ``min_epoch``, or that started before ``started_after``, belong to an
    older deployment: the watched driver has "not started yet", and so has one whose lease a newer
    driver took before reporting. Unhealthy (first match): FAILED; STOPPED; ``max_restarts`` driver
    restarts within ``health_window`` s (the deployments/ records: every start of the watched
    deployment but its first); no heartbeat for ``heartbeat_timeout`` s (default: core/status.heartbeat_limit's
    three intervals + 5 s; STARTING and STOPPING drivers, which restore or take a final savepoint
    without reporting, get ``start_timeout`` at least); data waiting and the batch id unchanged for
    ``progress_timeout`` s; no status of the watched deployment within ``start_timeout`` s of the
    first poll (or of a newer driver taking the lease). Healthy: RUNNING, ``min_batches`` batches
    committed since the watch first saw the deployment (or caught up: Spark found no new data in its
    sources, so there is nothing to make progress on), continuously for ``healthy_for`` s.

    A restart in progress is not a dead job: a RESTARTING status is waited on while its owner is live
    (the supervisor's record in supervisors/, core/supervision.py) until its ``expected_by`` plus the
    heartbeat limit; and a driver that stopped reporting while its supervisor is live is the supervisor's
    to restart (for the driver's heartbeat limit plus the supervisor's reaction time). NO_HEARTBEAT then
    says why nobody restarts it: the supervisor is gone, gave up, or its restart is overdue.
    """

    def __init__(self, store: JobStore, criteria: HealthCriteria | None = None) -> None:
        self.store = store
        self.criteria = HealthCriteria() if criteria is None else criteria
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
        self._last: JobStatus | None = None  # the watched deployment's status at the last poll
        self._supervision_seen: Supervision | None = None  # read at most once per poll, when it matters
        self._restarting = ""  # who restarts the job, for the describe line ('' when nobody does)
        self._reads = ReadableAgain()  # of the store, on the polls' clock

    # -- observe -------------------------------------------------------------------------------

    def _qualifies(self, status: JobStatus) -> bool:
        return (self.criteria.min_epoch is None or status.epoch >= self.criteria.min_epoch) and (
            self.criteria.started_after is None or status.started_at >= self.criteria.started_after
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
                if self.criteria.min_epoch is not None and epoch < self.criteria.min_epoch:
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
        return sorted(s for s in starts if self.criteria.started_after is None or s[1] >= self.criteria.started_after)

    def _restart_times(self) -> list[float]:
        return restart_times(self._starts())

    # -- decide --------------------------------------------------------------------------------

    def _supervision(self, now: float) -> Supervision:
        """The job's supervisor (core/supervision.py), read once per poll."""
        if self._supervision_seen is None:
            self._supervision_seen = observe_supervision(self.store, now)
        return self._supervision_seen

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = current_time(now)
        try:
            return self._poll(now)
        except StorageError:  # the poller logs it and polls again
            self._reads.failed()
            raise

    def _poll(self, now: float) -> dict[str, Any] | None:
        view = look(self.store, now)
        self._reads.worked(now)
        self._supervision_seen, self._restarting = None, ""
        status = self._current(view)
        restart_times = self._restart_times()
        if self.criteria.count_query_restarts and status is not None:
            restart_times = sorted(restart_times + [r.at for r in status.query_restarts()])
        restarts = sum(1 for t in restart_times if now - t <= self.criteria.health_window)
        if status is None:
            if self._pending_since is None:
                self._pending_since = now
        else:
            self._pending_since = None
            self._set_baseline(status)
        self._track_progress(status, now)

        unhealthy = self._unhealthy(view, status, restart_times, restarts, now)
        self._seen = self._describe(view, status, now)
        self._last = status
        if unhealthy is not None:
            reason, message = unhealthy
            return self._event(Health.UNHEALTHY, reason, message, status, restarts)
        if self.criteria.expect is Health.HEALTHY and status is not None and self._healthy(status, now):
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
        c = self.criteria  # a RUNNING status whose driver died (its supervisor restarts it) is not health
        if not driver_live(status, now, heartbeat_timeout=c.heartbeat_timeout, busy_timeout=c.start_timeout):
            return False
        progressed = self._batches(status) >= self.criteria.min_batches or status.idle  # idle: caught up, nothing to do
        return progressed and now - self._healthy_since >= self.criteria.healthy_for

    def _unhealthy(
        self, view: JobView, s: JobStatus | None, restart_times: list[float], restarts: int, now: float
    ) -> tuple[Unhealthy, str] | None:
        """The first unhealthy reason that applies, with its message; None if none does."""
        if s is None:
            return self._crash_loop(None, restart_times, restarts, now) or self._not_started(view, now)
        if s.state is not JobState.RUNNING and starting_launch(self.store, s, now, self.criteria.start_timeout):
            return None  # stopped or dead, but a newer launch (restart, upgrade, restore) is on its way
        if s.state in TERMINAL_STATES:  # a supervisor's restart may still be coming (_ended)
            return self._ended(s, now) or self._crash_loop(s, restart_times, restarts, now)
        return self._crash_loop(s, restart_times, restarts, now) or self._dead(s, now) or self._stuck(s, now)

    def _ended(self, s: JobStatus, now: float) -> tuple[Unhealthy, str] | None:
        job = self.store.job
        if s.state is JobState.FAILED:
            sup = self._supervision(now)
            if restarts_dead_driver(s, sup, now):
                assert sup.record is not None
                self._restarting = f"its driver failed; the {sup.record.describe()} restarts it"
                return None
            if _silenced(sup, s) and (until := self._after_outage(s, now)) is not None:
                # Its supervisor could not write its decision (RESTARTING, or ended) while the store was out.
                assert self._reads.since is not None
                assert sup.record is not None
                self._restarting = (f"its driver failed, and the job store could not be read until "
                                    f"{_hms(self._reads.since)}, so its {sup.record.describe()} is given until "
                                    f"{_hms(until)} to restart it")
                return None
            return Unhealthy.FAILED, (
                f"job {job}: expected it {self._expected()}, found FAILED at epoch {s.epoch} since "
                f"{when(s.updated_at)}{why(s)}. Restart it (it resumes from its latest checkpoint) after "
                f"reading the driver log{ui(s)}"
            )
        if s.state is JobState.STOPPED:
            return Unhealthy.STOPPED, (
                f"job {job}: expected it {self._expected()}, found STOPPED at epoch {s.epoch} since "
                f"{when(s.updated_at)}{why(s)}: a streaming job does not end on its own. Restart it if the "
                "stop was not intended (a restart resumes from its latest snapshot)"
            )
        return None

    def _crash_loop(self, s: JobStatus | None, restart_times: list[float], restarts: int,
                    now: float) -> tuple[Unhealthy, str] | None:
        if self.criteria.max_restarts is None:
            return None
        rule = HealthRule(self.criteria.max_restarts, self.criteria.health_window, None)
        verdict = rule.judge(restart_times, None, False, now)
        if verdict.health is Health.HEALTHY:
            return None
        if self.criteria.count_query_restarts:
            return Unhealthy.TOO_MANY_RESTARTS, (
                f"job {self.store.job}: expected fewer than {self.criteria.max_restarts} restarts (of the driver or "
                f"of its query) within {self.criteria.health_window:.0f} s, found {restarts}{_last_failure(s)}. Read "
                f"the driver log (restarts: deployments/ and status.json in {self.store.url})"
            )
        return Unhealthy.TOO_MANY_RESTARTS, (
            f"job {self.store.job}: expected fewer than {self.criteria.max_restarts} driver restarts within "
            f"{self.criteria.health_window:.0f} s, found {restarts} (deployments/ in {self.store.url}): it is "
            "crash-looping. Read the driver log before restarting it again"
        )

    def _after_outage(self, s: JobStatus, now: float) -> float | None:
        """Until when heartbeats are not judged, or None: this watch could not read the store until
        ``_reads.since``, nor could the driver and its supervisor write (and their requests retry for seconds):
        both get a whole heartbeat limit from then to report again, as the supervisor gives its driver."""
        since = self._reads.since
        if since is None:
            return None
        c = self.criteria
        limit = c.heartbeat_timeout if c.heartbeat_timeout is not None else 3 * s.heartbeat_interval + 5
        sup = self._supervision(now)
        if sup.record is not None:
            limit = max(limit, sup.record.heartbeat_limit())
        return since + limit if self._reads.within(now, limit) else None

    def _dead(self, s: JobStatus, now: float) -> tuple[Unhealthy, str] | None:
        # Reached for an active status only (_ended judges the others).
        c = self.criteria
        live = driver_live(s, now, heartbeat_timeout=c.heartbeat_timeout, busy_timeout=c.start_timeout)
        if not live and (until := self._after_outage(s, now)) is not None:  # reads supervisors/ only then
            assert self._reads.since is not None
            self._restarting = (f"the job store could not be read until {_hms(self._reads.since)}, so no "
                                f"heartbeat is judged before {_hms(until)}")
            return None
        restart = s.current_restart()
        if restart is not None and restart.by is RestartOwner.SUPERVISOR:
            return self._restart_lost(s, restart, now)
        if live:
            if restart is not None:
                self._restarting = f"RESTARTING by its driver, attempt {restart.attempt}, expected running by " \
                                   f"{_hms(restart.expected_by)}"
            return None
        where = f", pid {s.pid} on {s.host}" if s.pid is not None else ""
        if restart is not None:  # by the driver, in its own session: it died or hangs
            return Unhealthy.NO_HEARTBEAT, (
                f"job {self.store.job}: expected its driver's query restart (attempt {restart.attempt}, "
                f"{restart.cause}) to run by {_hms(restart.expected_by)}, found RESTARTING at epoch {s.epoch}"
                f"{where} with no heartbeat for {s.age(now):.0f} s: its driver probably died. Restart the job "
                "(it resumes from its latest checkpoint)"
            )
        sup = self._supervision(now)
        if restarts_dead_driver(s, sup, now):
            assert sup.record is not None
            self._restarting = f"its driver died; the {sup.record.describe()} restarts it"
            return None
        return Unhealthy.NO_HEARTBEAT, (
            f"job {self.store.job}: expected a heartbeat every {s.heartbeat_interval:g} s, found none for "
            f"{s.age(now):.0f} s ({s.state} at epoch {s.epoch}{where}): its driver probably died, and "
            f"{self._gone(sup)}. Restart the job (it resumes from its latest checkpoint)"
        )

    def _restart_lost(self, s: JobStatus, restart: Restart, now: float) -> tuple[Unhealthy, str] | None:
        """A supervisor's restart in progress: waited on while the supervisor is live, until ``expected_by``
        plus the heartbeat limit; NO_HEARTBEAT once the supervisor is gone or the restart is overdue."""
        c = self.criteria
        limit = c.heartbeat_timeout if c.heartbeat_timeout is not None else 3 * s.heartbeat_interval + 5
        sup = self._supervision(now)
        late = now - restart.expected_by
        found = (f"found it RESTARTING at epoch {s.epoch} since {when(restart.at)} (attempt {restart.attempt}, "
                 f"{restart.cause})")
        if sup.live and late <= limit:
            self._restarting = (f"RESTARTING by the supervisor, attempt {restart.attempt}, expected running by "
                                f"{_hms(restart.expected_by)}")
            return None
        if not sup.live:
            return Unhealthy.NO_HEARTBEAT, (
                f"job {self.store.job}: expected its supervisor to restart the driver, {found} and "
                f"{self._gone(sup)}: nobody restarts it. Restart the job (it resumes from its latest checkpoint)"
            )
        assert sup.record is not None
        return Unhealthy.NO_HEARTBEAT, (
            f"job {self.store.job}: expected the job running again by {_hms(restart.expected_by)}, {found}: the "
            f"restart is {late:.0f} s overdue (limit {limit:.0f} s), though its {sup.record.describe()} is live. "
            "Read the launch log, then restart the job (it resumes from its latest checkpoint)"
        )

    @staticmethod
    def _gone(sup: Supervision) -> str:
        if sup.record is None:
            return "no supervisor restarts it (no record in supervisors/)"
        return sup.gone()

    def _stuck(self, s: JobStatus, now: float) -> tuple[Unhealthy, str] | None:
        if self.criteria.progress_timeout is None or s.state is not JobState.RUNNING:
            return None
        rule = HealthRule(sys.maxsize, self.criteria.health_window, self.criteria.progress_timeout)
        if rule.judge([], self._waiting_since, s.data_waiting, now).health is Health.HEALTHY:
            return None
        return Unhealthy.NO_PROGRESS, (
            f"job {self.store.job}: expected batches to complete while data is waiting, found batch "
            f"{s.batch_id} for {now - self._waiting_since:.0f} s (limit {self.criteria.progress_timeout:.0f} s) at "
            f"epoch {s.epoch}: the query is stuck. Check the sink and the driver log{ui(s)}, then restart it"
        )

    def _not_started(self, view: JobView, now: float) -> tuple[Unhealthy, str] | None:
        ended = self._launch_ended()
        if ended:
            return Unhealthy.NOT_STARTED, f"job {self.store.job}: {ended}"
        if self._pending_since is None or now - self._pending_since < self.criteria.start_timeout:
            return None
        return Unhealthy.NOT_STARTED, (
            f"job {self.store.job}: expected {self._deployment()} to report within "
            f"{self.criteria.start_timeout:.0f} s, found {self._found(view)}: its start probably failed. Check the "
            "launch (spark-submit) log"
        )

    def _launch_ended(self) -> str:
        """Why the watched launch (spec/last.json launched at/after ``started_after``) ended before its driver
        reported, as its supervisor recorded it; '' if it did not (or there is no readable record)."""
        if self.criteria.started_after is None:
            return ""
        try:
            last = read_launch(self.store)
        except StorageError:
            return ""
        if last is None or last.ended_at is None or last.launched_at < self.criteria.started_after - 1:
            return ""
        return (f"launch {last.launch_id} ended before its driver reported: {last.end_reason} "
                f"(exit code {last.exit_code}); its log: {last.log_file} on {last.host}")

    # -- tell ----------------------------------------------------------------------------------

    def _expected(self) -> str:
        return "running" if self.criteria.expect is Health.UNHEALTHY else "healthy"

    def _deployment(self) -> str:
        parts = []
        if self.criteria.min_epoch is not None:
            parts.append(f"of epoch >= {self.criteria.min_epoch}")
        if self.criteria.started_after is not None:
            parts.append(f"started after {when(self.criteria.started_after)}")
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
        batch = f"batch {s.batch_id}" if s.batch_id is not None else "no batch yet"
        line = f"{s.state} at epoch {s.epoch}, {batch}"
        if self._restarting:
            return f"{self._restarting} ({line})"
        if s.state is JobState.RUNNING and self._healthy_since is not None:
            # No running clock in this line: the trigger logs it again only when it changes.
            c = self.criteria
            line += f", {max(0, self._batches(s))} of {c.min_batches} batches" + (
                f", healthy since {when(self._healthy_since)} (for {c.healthy_for:.0f} s)" if c.healthy_for else "")
        return line

    def _healthy_message(self, s: JobStatus, now: float) -> str:
        assert self._healthy_since is not None
        return (f"job {self.store.job} is healthy: RUNNING at epoch {s.epoch}, batch {s.batch_id}, "
                f"{self._batches(s)} batches since the check began, healthy for {now - self._healthy_since:.0f} s"
                f"{ui(s)}")

    def progress(self) -> tuple[int, bool]:
        """As of the last poll: the batches the watched deployment completed since the watch began, and whether it
        was caught up with no new input (idle), which counts as progress for ``min_batches``."""
        last = self._last
        return (0, False) if last is None else (max(0, self._batches(last)), last.idle)

    def waiting_for(self) -> str:
        if self.criteria.expect is Health.UNHEALTHY:  # a watch for faults, not a wait for them
            return f"job {self.store.job}: watching for a fault; last seen: {self._seen}"
        return f"job {self.store.job}: expected it {self.criteria.expect.value}; last seen: {self._seen}"

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
