"""What the watches' unit tests share: a fixed clock (``T0``) and the job store records a watch reads, written
as the driver, the supervisor and the launcher write them (a heartbeat, deployment records, a lease, a launch)."""

from __future__ import annotations

import json
from typing import Any

from airflow_ckpt_provider.core.deployments import Deployment, Launch
from airflow_ckpt_provider.core.jobstore import DEPLOYMENTS, LEASE, SPEC_LAST, JobStore
from airflow_ckpt_provider.core.lease import LeaseRecord
from airflow_ckpt_provider.core.status import JobState, JobStatus, write_status
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
