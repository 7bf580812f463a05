"""The health watch's judgement as a pure function (core/watches/health_judge.py): hand-built observations, one per
finding and per "who restarts it", no store and no clock; and the message tables cover every verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, Restart, RestartOwner
from airflow_ckpt_provider.core.records.supervision import STALE, Supervision, SupervisorRecord, SupervisorState
from airflow_ckpt_provider.core.watches.health_judge import (
    REASONS,
    RESTARTERS,
    Finding,
    Restarting,
    Unhealthy,
    judge,
)
from airflow_ckpt_provider.core.watches.health_memory import Memory, remember
from airflow_ckpt_provider.core.watches.health_messages import MESSAGES, RESTARTING, Context, event, seen
from airflow_ckpt_provider.core.watches.health_observe import Observation
from tests.support.watchrecords import T0

UNHEALTHY = HealthCriteria(expect=Health.UNHEALTHY, heartbeat_timeout=5.0)


def status(state: JobState = JobState.RUNNING, *, at: float = T0, **changes: Any) -> JobStatus:
    """A status written at ``at`` by the driver of epoch 1 (pid 42 on host-a, heartbeat every 5 s)."""
    base: dict[str, Any] = {"job": "orders", "state": state, "epoch": 1, "updated_at": at, "started_at": T0 - 500,
                            "pid": 42, "host": "host-a", "heartbeat_interval": 5.0}
    return JobStatus(**base | changes)


def restarting(by: RestartOwner, *, at: float = T0, expected_by: float = T0 + 60) -> JobStatus:
    restart = Restart(by=by, attempt=2, cause="exit code 137: killed", delay=1.0, at=at, expected_by=expected_by)
    return status(JobState.RESTARTING, at=at, batch_id=9, restart=restart.to_dict())


def supervisor(live: bool, *, at: float = T0, why_not: str = "") -> Supervision:
    """The supervisor of launch L1 on host-b, its heartbeat at ``at``."""
    record = SupervisorRecord(job="orders", launch_id="L1", pid=77, host="host-b", state=SupervisorState.WATCHING,
                              started_at=T0 - 900, updated_at=at, interval=5.0)
    return Supervision(record, live, why_not)


NOBODY = Supervision(None, False)


def ended_launch(at: float) -> Launch:
    return Launch("orders", Deployment("job.py"), LATEST_STATE, at, "airflow:dag.restart", "L2", host="host-c",
                  log_file="/logs/L2.log", ended_at=at + 2, ending="config-error", exit_code=2,
                  end_reason="driver exited with code 2")


@dataclass(frozen=True)
class Case:
    """An observation at ``now`` (T0 unless given), criteria and memory, and what the judgement finds."""

    finding: Finding
    restarting: Restarting | None
    found: JobStatus | None
    criteria: HealthCriteria = UNHEALTHY
    memory: Memory = field(default_factory=Memory)
    now: float = T0
    observed: dict[str, Any] = field(default_factory=dict)

    def observation(self) -> Observation:
        return Observation(self.now, self.found, None, self.found, **self.observed)


QUERY_RESTART = Restart(by=RestartOwner.DRIVER, attempt=1, cause="query failed: boom", delay=0.0, at=T0 - 10,
                        expected_by=T0, from_batch=8).to_dict()
RESTARTS_OF_L1 = {"starts": ((1, T0 - 300, "L1"), (2, T0 - 200, "L1"), (3, T0 - 100, "L1"))}

CASES: dict[str, Case] = {
    "failed": Case(Finding.FAILED, None, status(JobState.FAILED, at=T0 - 60, reason="query failed: boom"),
                   observed={"supervision": NOBODY}),
    "stopped": Case(Finding.STOPPED, None, status(JobState.STOPPED, at=T0 - 60)),
    "crash loop": Case(Finding.DRIVER_RESTARTS, None, status(), HealthCriteria(max_restarts=2),
                       observed=RESTARTS_OF_L1),
    "restarts of the query too": Case(Finding.RESTARTS, None, status(restarts=[QUERY_RESTART]),
                                      HealthCriteria(max_restarts=1, count_query_restarts=True)),
    "dead": Case(Finding.DEAD, None, status(at=T0 - 60), observed={"supervision": NOBODY}),
    "a query restart that died": Case(Finding.QUERY_RESTART_DIED, None,
                                      restarting(RestartOwner.DRIVER, at=T0 - 400, expected_by=T0 - 390)),
    "a restart whose supervisor is gone": Case(
        Finding.RESTART_ORPHANED, None, restarting(RestartOwner.SUPERVISOR, at=T0 - 30),
        observed={"supervision": supervisor(False, at=T0 - 40, why_not=f"{STALE} for 40 s")}),
    "an overdue restart": Case(Finding.RESTART_OVERDUE, None,
                               restarting(RestartOwner.SUPERVISOR, at=T0 - 100, expected_by=T0 - 60),
                               observed={"supervision": supervisor(True)}),
    "stuck": Case(Finding.STUCK, None, status(batch_id=7, data_waiting=True),
                  HealthCriteria(expect=Health.UNHEALTHY, progress_timeout=60),
                  Memory(healthy_since=T0 - 100, healthy_epoch=1, progress_key=(1, 7), waiting_since=T0 - 61,
                         was_waiting=True)),
    "a launch that ended": Case(Finding.LAUNCH_ENDED, None, None, HealthCriteria(started_after=T0 - 10),
                                Memory(pending_since=T0 - 5), observed={"launch": ended_launch(T0 - 5)}),
    "not started": Case(Finding.NOT_STARTED, None, None, HealthCriteria(start_timeout=60),
                        Memory(pending_since=T0 - 60)),
    "healthy": Case(Finding.HEALTHY, None, status(batch_id=5), HealthCriteria(min_batches=2, healthy_for=10),
                    Memory(baseline=3, healthy_since=T0 - 10, healthy_epoch=1)),
    "running, nothing decided": Case(Finding.WAITING, None, status(batch_id=5), memory=Memory(baseline=3)),
    "a newer launch on its way": Case(Finding.WAITING, None, status(JobState.FAILED, at=T0 - 60),
                                      observed={"launch": Launch("orders", Deployment("job.py"), LATEST_STATE,
                                                                 T0 - 30, "airflow:dag.restart", "L3")}),
    # who restarts it: no fault found meanwhile
    "failed, its supervisor restarts it": Case(Finding.WAITING, Restarting.FAILED_SUPERVISOR,
                                               status(JobState.FAILED, at=T0 - 1),
                                               observed={"supervision": supervisor(True)}),
    "failed before an outage": Case(Finding.WAITING, Restarting.FAILED_AFTER_OUTAGE,
                                    status(JobState.FAILED, at=T0 - 60), now=T0 + 1,
                                    observed={"supervision": supervisor(False, at=T0 - 60, why_not=f"{STALE} for 61 s"),
                                              "readable_since": T0}),
    "silent after an outage": Case(Finding.WAITING, Restarting.AFTER_OUTAGE, status(at=T0 - 60),
                                   observed={"supervision": NOBODY, "readable_since": T0 - 1}),
    "a query restart by its driver": Case(Finding.WAITING, Restarting.BY_DRIVER, restarting(RestartOwner.DRIVER)),
    "a restart by the supervisor": Case(Finding.WAITING, Restarting.BY_SUPERVISOR,
                                        restarting(RestartOwner.SUPERVISOR, at=T0 - 30, expected_by=T0 + 30),
                                        observed={"supervision": supervisor(True)}),
    "died, its supervisor restarts it": Case(Finding.WAITING, Restarting.DIED_SUPERVISOR, status(at=T0 - 30),
                                             observed={"supervision": supervisor(True)}),
}


@pytest.mark.parametrize("name", CASES)
def test_judge_finds_each_verdict_from_a_hand_built_observation(name: str) -> None:
    case = CASES[name]
    verdict = judge(case.observation(), case.criteria, case.memory)
    assert (verdict.finding, verdict.restarting) == (case.finding, case.restarting)
    assert verdict.reason is REASONS.get(case.finding)
    assert verdict.restarter is (None if case.restarting is None else RESTARTERS[case.restarting])
    assert judge(case.observation(), case.criteria, case.memory) == verdict  # nothing hidden changes in between
    context = Context("orders", "s3://bucket/jobs/orders", case.criteria)
    assert seen(verdict, context)
    payload = event(verdict, context)
    if case.finding is Finding.WAITING:
        assert payload is None
    else:
        assert payload is not None and payload["message"].startswith("job orders")
        assert payload["status"] == ("healthy" if case.finding is Finding.HEALTHY else "unhealthy")


def test_who_restarts_it_is_a_field_of_the_verdict_and_heads_the_last_seen_line() -> None:
    case = CASES["a restart by the supervisor"]
    verdict = judge(case.observation(), case.criteria, case.memory)
    assert verdict.restarter is RestartOwner.SUPERVISOR
    assert seen(verdict, Context("orders", "/jobs", case.criteria)).startswith(
        "RESTARTING by the supervisor, attempt 2, expected running by ")
    outage = CASES["failed before an outage"]
    verdict = judge(outage.observation(), outage.criteria, outage.memory)
    assert verdict.until == T0 + 20  # a whole heartbeat limit (3 x 5 s + 5 s) after the store answered again


def test_every_finding_and_every_restarter_has_its_words() -> None:
    assert set(MESSAGES) == set(Finding) - {Finding.WAITING}
    assert set(REASONS) == set(Finding) - {Finding.WAITING, Finding.HEALTHY}
    assert set(REASONS.values()) == set(Unhealthy)
    assert set(RESTARTING) == set(RESTARTERS) == set(Restarting)
    assert {c.finding for c in CASES.values()} == set(Finding)
    assert {c.restarting for c in CASES.values()} - {None} == set(Restarting)


def test_judge_refuses_an_observation_without_the_supervisor_it_needs() -> None:
    failed = status(JobState.FAILED, at=T0 - 60)
    with pytest.raises(ValueError, match="lacks the supervisor"):
        judge(Observation(T0, failed, None, failed), UNHEALTHY, Memory())


def test_remember_counts_batches_from_the_first_a_new_driver_completes() -> None:
    first = status(batch_id=None)
    memory = remember(Memory(), Observation(T0, first, None, first))
    assert (memory.baseline, memory.no_batch_yet, memory.healthy_since) == (None, True, T0)
    later = status(batch_id=4, at=T0 + 10)
    memory = remember(memory, Observation(T0 + 10, later, None, later))
    assert (memory.baseline, memory.batches(later), memory.healthy_since) == (3, 1, T0)
    assert remember(memory, Observation(T0 + 20, None, None, None)).pending_since == T0 + 20
