"""The health watch's words: one table from each ``Finding`` to its message, one from each ``Restarting`` to its
line, and the "last seen" line ``waiting_for`` repeats. Each message says what was expected, what was found
and what to do."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, Restart
from airflow_ckpt_provider.core.records.supervision import Supervision, SupervisorRecord
from airflow_ckpt_provider.core.views.jobview import when
from airflow_ckpt_provider.core.watches.base import ui, why
from airflow_ckpt_provider.core.watches.health_judge import Finding, Restarting, Verdict


@dataclass(frozen=True)
class Context:
    """What every message names besides the verdict: the job, its store and the criteria."""

    job: str
    url: str
    criteria: HealthCriteria

    def expected(self) -> str:
        return "running" if self.criteria.expect is Health.UNHEALTHY else "healthy"

    def deployment(self) -> str:
        c, parts = self.criteria, []
        if c.min_epoch is not None:
            parts.append(f"of epoch >= {c.min_epoch}")
        if c.started_after is not None:
            parts.append(f"started after {when(c.started_after)}")
        return "a driver " + " ".join(parts) if parts else "a driver"


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def _s(v: Verdict) -> JobStatus:
    assert v.status is not None, v.finding
    return v.status


def _r(v: Verdict) -> Restart:
    assert v.restart is not None, v.finding
    return v.restart


def _sup(v: Verdict) -> SupervisorRecord:
    record = v.supervision.record if v.supervision is not None else None
    assert record is not None, v.finding
    return record


def _gone(sup: Supervision | None) -> str:
    return "no supervisor restarts it (no record in supervisors/)" if sup is None else sup.gone()


def _where(s: JobStatus) -> str:
    return f", pid {s.pid} on {s.host}" if s.pid is not None else ""


def _last_failure(s: JobStatus | None) -> str:
    """'; after batch B: <cause>' from the driver's newest query restart, or ''."""
    restarts = s.query_restarts() if s is not None else []
    if not restarts:
        return ""
    last = restarts[-1]
    return "; " + (f"after batch {last.from_batch}: " if last.from_batch is not None else "") + last.cause


def _found(v: Verdict) -> str:
    s, newer = v.found, v.newer_lease
    if newer is not None:
        return f"a driver (epoch {newer.epoch}, {newer.owner}) took the lease but never reported"
    if s is None:
        return "no status.json" + (f" (lease epoch {v.lease.epoch})" if v.lease else ": the job never ran")
    return f"only the status of an older deployment ({s.state} at epoch {s.epoch}, started {when(s.started_at)})"


def _failed(v: Verdict, x: Context) -> str:
    s = _s(v)
    return (f"job {x.job}: expected it {x.expected()}, found FAILED at epoch {s.epoch} since {when(s.updated_at)}"
            f"{why(s)}. Restart it (it resumes from its latest checkpoint) after reading the driver log{ui(s)}")


def _stopped(v: Verdict, x: Context) -> str:
    s = _s(v)
    return (f"job {x.job}: expected it {x.expected()}, found STOPPED at epoch {s.epoch} since {when(s.updated_at)}"
            f"{why(s)}: a streaming job does not end on its own. Restart it if the stop was not intended (a restart "
            "resumes from its latest snapshot)")


def _restarts(v: Verdict, x: Context) -> str:
    c = x.criteria
    return (f"job {x.job}: expected fewer than {c.max_restarts} restarts (of the driver or of its query) within "
            f"{c.health_window:.0f} s, found {v.restarts}{_last_failure(v.status)}. Read the driver log (restarts: "
            f"deployments/ and status.json in {x.url})")


def _driver_restarts(v: Verdict, x: Context) -> str:
    c = x.criteria
    return (f"job {x.job}: expected fewer than {c.max_restarts} driver restarts within {c.health_window:.0f} s, "
            f"found {v.restarts} (deployments/ in {x.url}): it is crash-looping. Read the driver log before "
            "restarting it again")


def _dead(v: Verdict, x: Context) -> str:
    s = _s(v)
    return (f"job {x.job}: expected a heartbeat every {s.heartbeat_interval:g} s, found none for {s.age(v.now):.0f} s "
            f"({s.state} at epoch {s.epoch}{_where(s)}): its driver probably died, and {_gone(v.supervision)}. "
            "Restart the job (it resumes from its latest checkpoint)")


def _query_restart_died(v: Verdict, x: Context) -> str:
    s, r = _s(v), _r(v)
    return (f"job {x.job}: expected its driver's query restart (attempt {r.attempt}, {r.cause}) to run by "
            f"{_hms(r.expected_by)}, found RESTARTING at epoch {s.epoch}{_where(s)} with no heartbeat for "
            f"{s.age(v.now):.0f} s: its driver probably died. Restart the job (it resumes from its latest checkpoint)")


def _restarting_found(v: Verdict) -> str:
    s, r = _s(v), _r(v)
    return f"found it RESTARTING at epoch {s.epoch} since {when(r.at)} (attempt {r.attempt}, {r.cause})"


def _restart_orphaned(v: Verdict, x: Context) -> str:
    return (f"job {x.job}: expected its supervisor to restart the driver, {_restarting_found(v)} and "
            f"{_gone(v.supervision)}: nobody restarts it. Restart the job (it resumes from its latest checkpoint)")


def _restart_overdue(v: Verdict, x: Context) -> str:
    r = _r(v)
    overdue = v.now - (v.status.local(r.expected_by) if v.status is not None else r.expected_by)
    return (f"job {x.job}: expected the job running again by {_hms(r.expected_by)}, {_restarting_found(v)}: the "
            f"restart is {overdue:.0f} s overdue (limit {v.heartbeat_limit:.0f} s), though its "
            f"{_sup(v).describe()} is live. Read the launch log, then restart the job (it resumes from its latest "
            "checkpoint)")


def _stuck(v: Verdict, x: Context) -> str:
    s = _s(v)
    return (f"job {x.job}: expected batches to complete while data is waiting, found batch {s.batch_id} for "
            f"{v.now - v.waiting_since:.0f} s (limit {x.criteria.progress_timeout:.0f} s) at epoch {s.epoch}: the "
            f"query is stuck. Check the sink and the driver log{ui(s)}, then restart it")


def _launch_ended(v: Verdict, x: Context) -> str:
    last = v.launch
    assert last is not None, v.finding
    return (f"job {x.job}: launch {last.launch_id} ended before its driver reported: {last.end_reason} "
            f"(exit code {last.exit_code}); its log: {last.log_file} on {last.host}")


def _not_started(v: Verdict, x: Context) -> str:
    return (f"job {x.job}: expected {x.deployment()} to report within {x.criteria.start_timeout:.0f} s, found "
            f"{_found(v)}: its start probably failed. Check the launch (spark-submit) log")


def _healthy(v: Verdict, x: Context) -> str:
    s = _s(v)
    assert v.healthy_since is not None
    return (f"job {x.job} is healthy: RUNNING at epoch {s.epoch}, batch {s.batch_id}, {v.batches} batches since "
            f"the check began, healthy for {v.now - v.healthy_since:.0f} s{ui(s)}")


#: The message of each decided finding.
MESSAGES: Mapping[Finding, Callable[[Verdict, Context], str]] = {
    Finding.FAILED: _failed,
    Finding.STOPPED: _stopped,
    Finding.DRIVER_RESTARTS: _driver_restarts,
    Finding.RESTARTS: _restarts,
    Finding.DEAD: _dead,
    Finding.QUERY_RESTART_DIED: _query_restart_died,
    Finding.RESTART_ORPHANED: _restart_orphaned,
    Finding.RESTART_OVERDUE: _restart_overdue,
    Finding.STUCK: _stuck,
    Finding.LAUNCH_ENDED: _launch_ended,
    Finding.NOT_STARTED: _not_started,
    Finding.HEALTHY: _healthy,
}


def _outage(v: Verdict) -> tuple[str, str]:
    """(until when the store could not be read, until when no heartbeat is judged)."""
    assert v.readable_since is not None, v.restarting
    assert v.until is not None, v.restarting
    return _hms(v.readable_since), _hms(v.until)


def _failed_after_outage(v: Verdict) -> str:
    since, until = _outage(v)
    return (f"its driver failed, and the job store could not be read until {since}, so its {_sup(v).describe()} "
            f"is given until {until} to restart it")


def _after_outage(v: Verdict) -> str:
    since, until = _outage(v)
    return f"the job store could not be read until {since}, so no heartbeat is judged before {until}"


def _restarting_by(who: str) -> Callable[[Verdict], str]:
    def line(v: Verdict) -> str:
        r = _r(v)
        return f"RESTARTING by {who}, attempt {r.attempt}, expected running by {_hms(r.expected_by)}"
    return line


#: Who restarts the job, or why its heartbeat is not judged yet: the head of the "last seen" line.
RESTARTING: Mapping[Restarting, Callable[[Verdict], str]] = {
    Restarting.FAILED_SUPERVISOR: lambda v: f"its driver failed; the {_sup(v).describe()} restarts it",
    Restarting.FAILED_AFTER_OUTAGE: _failed_after_outage,
    Restarting.AFTER_OUTAGE: _after_outage,
    Restarting.BY_DRIVER: _restarting_by("its driver"),
    Restarting.BY_SUPERVISOR: _restarting_by("the supervisor"),
    Restarting.DIED_SUPERVISOR: lambda v: f"its driver died; the {_sup(v).describe()} restarts it",
}


def message(v: Verdict, x: Context) -> str:
    """The message of a decided verdict (KeyError for WAITING: it has none)."""
    return MESSAGES[v.finding](v, x)


def seen(v: Verdict, x: Context) -> str:
    """The "last seen" line: what the watch waits for and found, who restarts the job, the batches so far."""
    s = v.status
    if s is None:
        return f"waiting for {x.deployment()} to report; found {_found(v)}"
    batch = f"batch {s.batch_id}" if s.batch_id is not None else "no batch yet"
    line = f"{s.state} at epoch {s.epoch}, {batch}"
    if v.restarting is not None:
        return f"{RESTARTING[v.restarting](v)} ({line})"
    if s.state is JobState.RUNNING and v.healthy_since is not None:
        # No running clock in this line: the trigger logs it again only when it changes.
        c = x.criteria
        line += f", {max(0, v.batches)} of {c.min_batches} batches" + (
            f", healthy since {when(v.healthy_since)} (for {c.healthy_for:.0f} s)" if c.healthy_for else "")
    return line


def event(v: Verdict, x: Context) -> dict[str, Any] | None:
    """The terminal event of a decided verdict (None while undecided)."""
    health = v.health
    if health is None:
        return None
    s = v.status
    return {
        "status": health.value,
        "reason": v.reason.value if v.reason else None,
        "message": message(v, x),
        "job": x.job,
        "epoch": s.epoch if s else None,
        "batch_id": s.batch_id if s else None,
        "state": s.state.value if s else None,
        "ui_url": s.ui_url if s else None,
        "restarts": v.restarts,
    }
