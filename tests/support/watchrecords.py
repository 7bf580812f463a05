"""What the watches' unit tests share: a fixed clock (``T0``) and the job store records a watch reads, written
as the driver, the supervisor and the launcher write them (a heartbeat, deployment records, a lease, a launch,
a supervisor's record, a RESTARTING status, a restore check's start and verdict)."""

from __future__ import annotations

import json
from typing import Any

from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.restore_check import CheckEnded, CheckStarted, record_end, record_start
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, Restart, RestartOwner, write_status
from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, write_supervisor
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, LEASE, SPEC_LAST, JobStore
from airflow_ckpt_provider.core.watches.job_health import Unhealthy

#: The tests' "now": the watches take the time as an argument, so no test sleeps.
T0 = 1_800_000_000.0
#: The keys of every JobHealthWatch event.
PAYLOAD_KEYS = {"status", "reason", "message", "job", "epoch", "batch_id", "state", "ui_url", "restarts"}


def report(store: JobStore, now: float, *, state: JobState = JobState.RUNNING, epoch: int = 1,
           started_at: float = T0 - 100, **changes: Any) -> JobStatus:
    """The driver's heartbeat at ``now``."""
    base: dict[str, Any] = {"job": "orders", "state": state, "epoch": epoch, "updated_at": now,
                            "started_at": started_at, "heartbeat_interval": 5.0}
    status = JobStatus(**base | changes)
    assert write_status(store, status)
    return status


def deployed(store: JobStore, epoch: int, at: float, launch_id: str | None = None) -> None:
    """The record runtime/startup.prepare_checkpoint writes at each driver start (older versions wrote no
    launch_id)."""
    body: dict[str, Any] = {"epoch": epoch, "at": at, "restore": "latest-state", "action": "resume",
                            "snapshot": None, "reason": "test", "lineage_since": 0.0, "lineage_base": None}
    if launch_id is not None:
        body["launch_id"] = launch_id
    store.storage.write(f"{DEPLOYMENTS}{epoch:010d}.json", json.dumps(body).encode())


def leased(store: JobStore, epoch: int) -> None:
    store.storage.write(LEASE, LeaseRecord("orders", epoch, f"host:{epoch}", "host", 100 + epoch, T0).to_bytes())



def relaunch(store: JobStore, at: float, launch_id: str = "L2") -> None:
    """spec/last.json: a launch at ``at`` (a restart, an upgrade, a restore) whose driver has not reported."""
    record = Launch("orders", Deployment("job.py"), "latest-state", at, "airflow:dag.restart", launch_id)
    store.storage.write(SPEC_LAST, record.to_bytes())


def unhealthy(event: dict[str, Any] | None, reason: Unhealthy) -> dict[str, Any]:
    """The event, asserted to be unhealthy for ``reason`` with the full payload."""
    assert event is not None, f"expected unhealthy ({reason}), found no event"
    assert set(event) == PAYLOAD_KEYS
    assert (event["status"], event["reason"]) == ("unhealthy", reason.value), event["message"]
    return event


def supervised(store: JobStore, now: float, *, launch_id: str = "20270115T080000Z-aaaaaa",
               state: SupervisorState = SupervisorState.WATCHING, host: str = "host-b", pid: int = 77,
               ending: str | None = None, end_reason: str | None = None, standalone: bool = True) -> SupervisorRecord:
    """supervisors/<launch id>.json as a supervisor on ``host`` writes it, its heartbeat at ``now`` (5 s polls)."""
    record = SupervisorRecord(job="orders", launch_id=launch_id, pid=pid, host=host, state=state,
                              started_at=now - 300, updated_at=now, interval=5.0, grace=30.0, standalone=standalone,
                              attempt=2, epoch=1, ending=ending, exit_code=1 if ending else None,
                              end_reason=end_reason)
    return write_supervisor(store, record)


def restarting(store: JobStore, now: float, *, epoch: int = 1, expected_by: float | None = None, attempt: int = 2,
               host: str = "host-b", pid: int = 77, by: RestartOwner = RestartOwner.SUPERVISOR) -> JobStatus:
    """status.json as a supervisor writes it before its restart delay: RESTARTING with its own pid and host."""
    restart = Restart(by=by, attempt=attempt, cause="exit code 137: killed", delay=1.0, at=now,
                      expected_by=now + 61 if expected_by is None else expected_by, from_batch=9)
    return report(store, now, state=JobState.RESTARTING, epoch=epoch, batch_id=9, pid=pid, host=host,
                  restart=restart.to_dict(), reason="driver died: its supervisor restarts it")


def check_started(store: JobStore, check_id: str, at: float = T0, *, pid: int | None = 4321, host: str = "worker-1",
                  timeout: float = 600.0) -> CheckStarted:
    """checks/<id>.json: a restore check of orders_v2.py started at ``at`` on ``host`` (launcher/restore_check)."""
    started = CheckStarted("orders", check_id, "orders_v2.py", "v2", at, timeout, host,
                           "airflow:upgrade.upgrade run r1 try 1", pid=pid, log_file=f"/ckpt/check-{check_id}.log")
    record_start(store, started)
    return started


def check_ended(store: JobStore, check_id: str, outcome: CheckOutcome, at: float = T0 + 60) -> CheckEnded:
    """checks/<id>.outcome.json: the verdict the check process records, with its report."""
    report = {"outcome": outcome.value, "reason": f"the verdict of {check_id}", "snapshot_id": "savepoint-7-x",
              "batch_id": 7, "seconds": 41.5}
    ended = CheckEnded(check_id, outcome, f"the verdict of {check_id}", at, report)
    record_end(store, ended)
    return ended
