"""What an alert about a streaming job says: the job, its state as the store has it, its latest completed snapshot
and savepoint, and what to run. One text for Airflow's notifiers and deadline callbacks (notifications/job.py).

Design notes: docs/metrics.md#design-notes-coreviewsalertingpy."""

from __future__ import annotations

import time

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.records.pending import human_age
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import JobStore


def alert_text(store: JobStore, what: str, *, now: float | None = None) -> str:
    """``what`` happened to ``store``'s job, and what the job store says about it; a store that cannot be read is
    said, never raised (an alert must go out)."""
    at = time.time() if now is None else now
    job, url = store.job, store.root.url
    parts = [f"job {job}: {what}"]
    try:
        status = read_status(store)
        manifests = list_snapshots(store)
    except CkptError as err:
        parts.append(f"its job store cannot be read ({err})")
    else:
        if status is None:
            parts.append("no driver has reported yet")
        else:
            beat = human_age(at - status.updated_at)
            parts.append(f"{status.state.value} at epoch {status.epoch}, heartbeat {beat} ago"
                         + (f", batch {status.batch_id}" if status.batch_id is not None else ""))
        for label, kinds in (("latest completed snapshot", tuple(Kind)), ("latest savepoint", (Kind.SAVEPOINT,))):
            m = latest_completed(manifests, kinds)
            parts.append(f"{label} {m.snapshot_id} (batch {m.batch_id}, {human_age(at - m.created.timestamp())} old)"
                         if m else f"no {label.removeprefix('latest ')}")
    where = f"--job {job} --store {url.rstrip('/')}"
    parts.append(f"run `ckpt job status {where}`; to restart it from its latest state: `ckpt job restart {where}` "
                 "(or the DAG's restart task)")
    return "; ".join(parts)
