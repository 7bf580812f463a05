"""The health watch's judgement: a pure function of one poll's observation, the criteria and the watch's memory
(health_memory.py): what was found (``Finding``, each unhealthy one of one ``Unhealthy`` reason) and who restarts
the job meanwhile (``Restarting``). It reads neither the store nor the clock; the wording is health_messages.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from airflow_ckpt_provider.core.policy.health import HealthCriteria, restart_times
from airflow_ckpt_provider.core.policy.restart import Health, HealthRule
from airflow_ckpt_provider.core.records.deployments import Launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.status import (
    TERMINAL_STATES,
    JobState,
    JobStatus,
    Restart,
    RestartOwner,
    driver_live,
)
from airflow_ckpt_provider.core.records.supervision import STALE, Supervision, restarts_dead_driver
from airflow_ckpt_provider.core.views.jobview import on_its_way
from airflow_ckpt_provider.core.watches.health_memory import Memory
from airflow_ckpt_provider.core.watches.health_observe import Observation


class Unhealthy(StrEnum):
    """Why a job is unhealthy (the event's ``reason``)."""

    FAILED = "failed"  # state FAILED
    STOPPED = "stopped"  # state STOPPED: for a streaming job, an end nobody waited for
    NO_HEARTBEAT = "no_heartbeat"  # active, but its driver stopped reporting: probably dead
    TOO_MANY_RESTARTS = "too_many_restarts"  # crash loop
    NO_PROGRESS = "no_progress"  # data waits, no batch completes
    NOT_STARTED = "not_started"  # no driver of the expected deployment reported in time


class Finding(StrEnum):
    """What one poll found: an unhealthy finding (``REASONS`` gives its reason), healthy, or nothing decided."""

    FAILED = "failed"
    STOPPED = "stopped"
    DRIVER_RESTARTS = "driver_restarts"  # too many driver restarts: a crash loop
    RESTARTS = "restarts"  # too many restarts of the driver or of its query (count_query_restarts)
    DEAD = "dead"  # no heartbeat, and no supervisor restarts it
    QUERY_RESTART_DIED = "query_restart_died"  # the driver's own restart of its query: it died or hangs
    RESTART_ORPHANED = "restart_orphaned"  # a supervisor's restart whose supervisor is gone
    RESTART_OVERDUE = "restart_overdue"  # a supervisor's restart, live supervisor, long past its expected time
    STUCK = "stuck"  # data waits, no batch completes
    LAUNCH_ENDED = "launch_ended"  # the watched launch ended before its driver reported
    NOT_STARTED = "not_started"  # nothing of the watched deployment reported within the start timeout
    HEALTHY = "healthy"
    WAITING = "waiting"  # undecided: poll again


#: The reason of each unhealthy finding (HEALTHY and WAITING have none).
REASONS: Mapping[Finding, Unhealthy] = {
    Finding.FAILED: Unhealthy.FAILED,
    Finding.STOPPED: Unhealthy.STOPPED,
    Finding.DRIVER_RESTARTS: Unhealthy.TOO_MANY_RESTARTS,
    Finding.RESTARTS: Unhealthy.TOO_MANY_RESTARTS,
    Finding.DEAD: Unhealthy.NO_HEARTBEAT,
    Finding.QUERY_RESTART_DIED: Unhealthy.NO_HEARTBEAT,
    Finding.RESTART_ORPHANED: Unhealthy.NO_HEARTBEAT,
    Finding.RESTART_OVERDUE: Unhealthy.NO_HEARTBEAT,
    Finding.STUCK: Unhealthy.NO_PROGRESS,
    Finding.LAUNCH_ENDED: Unhealthy.NOT_STARTED,
    Finding.NOT_STARTED: Unhealthy.NOT_STARTED,
}


class Restarting(StrEnum):
    """Why a driver that failed or stopped reporting is not called unhealthy (yet): who restarts it, or an outage
    of the store that keeps its heartbeat from being judged."""

    FAILED_SUPERVISOR = "failed_supervisor"  # failed; the live supervisor restarts it
    FAILED_AFTER_OUTAGE = "failed_after_outage"  # failed; its supervisor could not write during an outage
    AFTER_OUTAGE = "after_outage"  # silent, but the store could not be read until lately
    BY_DRIVER = "by_driver"  # RESTARTING by its driver, which is live
    BY_SUPERVISOR = "by_supervisor"  # RESTARTING by a live supervisor, not overdue
    DIED_SUPERVISOR = "died_supervisor"  # silent; the live supervisor restarts it


#: Who restarts the job in each case (None: nobody known, an outage hides it).
RESTARTERS: Mapping[Restarting, RestartOwner | None] = {
    Restarting.FAILED_SUPERVISOR: RestartOwner.SUPERVISOR,
    Restarting.FAILED_AFTER_OUTAGE: RestartOwner.SUPERVISOR,
    Restarting.AFTER_OUTAGE: None,
    Restarting.BY_DRIVER: RestartOwner.DRIVER,
    Restarting.BY_SUPERVISOR: RestartOwner.SUPERVISOR,
    Restarting.DIED_SUPERVISOR: RestartOwner.SUPERVISOR,
}


@dataclass(frozen=True)
class Verdict:
    """One poll's judgement: what was found, who restarts the job meanwhile, and the facts its message tells."""

    finding: Finding
    status: JobStatus | None  # the watched deployment's status (the event's epoch, batch and state)
    restarts: int  # restarts within the health window
    now: float
    restarting: Restarting | None = None
    found: JobStatus | None = None  # status.json as found: maybe an older deployment's
    lease: LeaseRecord | None = None
    newer_lease: LeaseRecord | None = None  # a newer driver took the lease but has not reported
    supervision: Supervision | None = None
    launch: Launch | None = None  # spec/last.json (LAUNCH_ENDED: the launch that ended)
    readable_since: float | None = None  # the store answered again then, after an outage
    until: float | None = None  # after an outage: no heartbeat judged before then
    heartbeat_limit: float = 0.0  # the watch's heartbeat limit for the status
    batches: int = 0  # since the watch began
    healthy_since: float | None = None
    waiting_since: float = 0.0  # data waits with no new batch since then

    @property
    def health(self) -> Health | None:
        """The event's status: unhealthy, healthy, or None (undecided)."""
        if self.finding in REASONS:
            return Health.UNHEALTHY
        return Health.HEALTHY if self.finding is Finding.HEALTHY else None

    @property
    def reason(self) -> Unhealthy | None:
        return REASONS.get(self.finding)

    @property
    def restarter(self) -> RestartOwner | None:
        """Who restarts the job (None: nobody does, or nobody known)."""
        return None if self.restarting is None else RESTARTERS[self.restarting]

    @property
    def restart(self) -> Restart | None:
        return None if self.status is None else self.status.current_restart()


Check = Callable[[], "Finding | Restarting | None"]


def judge(obs: Observation, criteria: HealthCriteria, memory: Memory) -> Verdict:
    """The verdict on ``obs`` by ``criteria``, with ``memory`` as ``remember`` left it after ``obs``. Unhealthy:
    the first finding that applies; else healthy when it is awaited and shown; else waiting."""
    s, now = obs.status, obs.now
    times = restart_times(list(obs.starts))
    if criteria.count_query_restarts and s is not None:
        times = sorted(times + [r.at for r in s.query_restarts()])
    restarts = sum(1 for t in times if now - t <= criteria.health_window)
    finding, restarting = _unhealthy(obs, criteria, memory, times)
    if finding is None and criteria.expect is Health.HEALTHY and s is not None and _healthy(s, now, criteria, memory):
        finding = Finding.HEALTHY
    outage = restarting in (Restarting.AFTER_OUTAGE, Restarting.FAILED_AFTER_OUTAGE)
    return Verdict(
        finding or Finding.WAITING, s, restarts, now, restarting, found=obs.found, lease=obs.lease,
        newer_lease=obs.newer_lease, supervision=obs.supervision, launch=obs.launch,
        readable_since=obs.readable_since, until=_after_outage(obs, criteria, s) if outage and s else None,
        heartbeat_limit=_limit(s, criteria) if s else 0.0, batches=memory.batches(s) if s else 0,
        healthy_since=memory.healthy_since, waiting_since=memory.waiting_since)


def _first(*checks: Check) -> tuple[Finding | None, Restarting | None]:
    """The first finding of ``checks``; a check that finds who restarts the job finds no fault: the next run."""
    restarting = None
    for check in checks:
        found = check()
        if isinstance(found, Restarting):
            restarting = found
        elif found is not None:
            return found, restarting
    return None, restarting


def _unhealthy(obs: Observation, c: HealthCriteria, memory: Memory,
               times: list[float]) -> tuple[Finding | None, Restarting | None]:
    s, now = obs.status, obs.now
    if s is None:
        return _first(lambda: _crash_loop(c, times, now), lambda: _not_started(obs, c, memory))
    if s.state is not JobState.RUNNING and on_its_way(obs.launch, s, now, c.start_timeout):
        return None, None  # stopped or dead, but a newer launch (restart, upgrade, restore) is on its way
    if s.state in TERMINAL_STATES:  # a supervisor's restart may still be coming (_ended)
        return _first(lambda: _ended(obs, c, s), lambda: _crash_loop(c, times, now))
    return _first(lambda: _crash_loop(c, times, now), lambda: _dead(obs, c, s),
                  lambda: _stuck(c, s, now, memory))


def _supervision(obs: Observation) -> Supervision:
    if obs.supervision is None:
        raise ValueError("the observation lacks the supervisor the judgement needs (health_observe.observe reads "
                         "it for a FAILED driver, a supervisor's restart, or a silent driver)")
    return obs.supervision


def _limit(s: JobStatus, c: HealthCriteria) -> float:
    return c.heartbeat_timeout if c.heartbeat_timeout is not None else 3 * s.heartbeat_interval + 5


def _silenced(sup: Supervision, failed: JobStatus) -> bool:
    """Whether a job store outage may have kept the supervisor from acting on the failed driver: it was beating when
    the driver failed, and now it is live or only its heartbeat is stale (not ended, superseded or found dead)."""
    record = sup.record
    if record is None or record.updated_at + record.heartbeat_limit() < failed.updated_at:
        return False  # no supervisor, or one already silent when the driver failed
    return sup.live or sup.why_not.startswith(STALE)


def _after_outage(obs: Observation, c: HealthCriteria, s: JobStatus) -> float | None:
    """Until when heartbeats are not judged, or None: the watch could not read the store until
    ``readable_since``, nor could the driver and its supervisor write (and their requests retry for seconds):
    both get a whole heartbeat limit from then to report again, as the supervisor gives its driver."""
    since = obs.readable_since
    if since is None:
        return None
    limit = _limit(s, c)
    sup = _supervision(obs)
    if sup.record is not None:
        limit = max(limit, sup.record.heartbeat_limit())
    return since + limit if obs.now - since < limit else None


def _ended(obs: Observation, c: HealthCriteria, s: JobStatus) -> Finding | Restarting | None:
    if s.state is JobState.FAILED:
        sup = _supervision(obs)
        if restarts_dead_driver(s, sup, obs.now):
            return Restarting.FAILED_SUPERVISOR
        if _silenced(sup, s) and _after_outage(obs, c, s) is not None:
            return Restarting.FAILED_AFTER_OUTAGE  # its supervisor could not write its decision meanwhile
        return Finding.FAILED
    if s.state is JobState.STOPPED:
        return Finding.STOPPED
    return None


def _crash_loop(c: HealthCriteria, times: list[float], now: float) -> Finding | None:
    if c.max_restarts is None:
        return None
    if HealthRule(c.max_restarts, c.health_window, None).judge(times, None, False, now).health is Health.HEALTHY:
        return None
    return Finding.RESTARTS if c.count_query_restarts else Finding.DRIVER_RESTARTS


def _dead(obs: Observation, c: HealthCriteria, s: JobStatus) -> Finding | Restarting | None:
    """Reached for an active status only (_ended judges the others)."""
    now = obs.now
    live = driver_live(s, now, heartbeat_timeout=c.heartbeat_timeout, busy_timeout=c.start_timeout)
    if not live and _after_outage(obs, c, s) is not None:
        return Restarting.AFTER_OUTAGE
    restart = s.current_restart()
    if restart is not None and restart.by is RestartOwner.SUPERVISOR:
        return _restart_lost(obs, c, s, restart)
    if live:
        return Restarting.BY_DRIVER if restart is not None else None
    if restart is not None:  # by the driver, in its own session: it died or hangs
        return Finding.QUERY_RESTART_DIED
    if restarts_dead_driver(s, _supervision(obs), now):
        return Restarting.DIED_SUPERVISOR
    return Finding.DEAD


def _restart_lost(obs: Observation, c: HealthCriteria, s: JobStatus, restart: Restart) -> Finding | Restarting:
    """A supervisor's restart in progress: waited on while the supervisor is live, until ``expected_by`` plus the
    heartbeat limit; found lost once the supervisor is gone or the restart is overdue."""
    sup = _supervision(obs)
    if sup.live and obs.now - s.local(restart.expected_by) <= _limit(s, c):
        return Restarting.BY_SUPERVISOR
    return Finding.RESTART_ORPHANED if not sup.live else Finding.RESTART_OVERDUE


def _stuck(c: HealthCriteria, s: JobStatus, now: float, memory: Memory) -> Finding | None:
    if c.progress_timeout is None or s.state is not JobState.RUNNING:
        return None
    rule = HealthRule(sys.maxsize, c.health_window, c.progress_timeout)
    if rule.judge([], memory.waiting_since, s.data_waiting, now).health is Health.HEALTHY:
        return None
    return Finding.STUCK


def launch_ended(launch: Launch | None, c: HealthCriteria) -> bool:
    """Whether the watched launch (spec/last.json launched at/after ``started_after``) ended before its driver
    reported, as its supervisor recorded it."""
    if c.started_after is None or launch is None or launch.ended_at is None:
        return False
    return launch.launched_at >= c.started_after - 1


def _not_started(obs: Observation, c: HealthCriteria, memory: Memory) -> Finding | None:
    if launch_ended(obs.launch, c):
        return Finding.LAUNCH_ENDED
    if memory.pending_since is None or obs.now - memory.pending_since < c.start_timeout:
        return None
    return Finding.NOT_STARTED


def _healthy(s: JobStatus, now: float, c: HealthCriteria, memory: Memory) -> bool:
    if s.state is not JobState.RUNNING or memory.healthy_since is None:
        return False  # a RUNNING status whose driver died (its supervisor restarts it) is not health
    if not driver_live(s, now, heartbeat_timeout=c.heartbeat_timeout, busy_timeout=c.start_timeout):
        return False
    progressed = memory.batches(s) >= c.min_batches or s.idle  # idle: caught up, nothing to do
    return progressed and now - memory.healthy_since >= c.healthy_for
