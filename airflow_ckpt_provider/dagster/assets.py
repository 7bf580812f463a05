"""A streaming job's output as a Dagster asset: materialized per window of committed batches (a sensor reads the
job's heartbeat), with asset checks for freshness (the heartbeat, the last batch's age) and for lag.

The job runs outside Dagster (it never finishes, so no run materializes it): the asset is external
(``dg.AssetSpec``), its materializations are reported by ``job_output_sensor``, and its checks read the job's
status (core/records/status.py) as the health watch does (core/records/status.heartbeat_limit, driver_live).
"""

# No ``from __future__ import annotations``: Dagster reads the annotations of decorated functions (the context's
# type, config classes, resources) at definition time and does not resolve them from strings.
import json
import time
from collections.abc import Callable, Sequence

import dagster as dg

from airflow_ckpt_provider.core.records.status import JobState, JobStatus, driver_live, heartbeat_limit, read_status
from airflow_ckpt_provider.dagster.ops import CKPT_RESOURCE
from airflow_ckpt_provider.dagster.resources import CkptResource


def job_output_asset(job: str, *, key: dg.AssetKey | None = None, description: str | None = None,
                     group_name: str = "ckpt") -> dg.AssetSpec:
    """The asset of ``job``'s output (default key ``[job, "output"]``); the job writes it, Dagster observes it."""
    return dg.AssetSpec(key or dg.AssetKey([job, "output"]), group_name=group_name, kinds={"spark"},
                        description=description or f"The output of the streaming job {job}, one materialization "
                                                   "per window of committed batches", metadata={"ckpt/job": job})


def job_output_sensor(job: str, asset: dg.AssetSpec, *, name: str | None = None, minimum_interval_seconds: int = 60,
                      default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                      ) -> dg.SensorDefinition:
    """A materialization of ``asset`` each tick the job committed batches since the last one: the window
    (first and last batch id), the epoch, the offsets and the lag it reported. The cursor is the last batch
    announced (with its epoch: a restore that goes back in batch ids starts a new window)."""

    @dg.sensor(name=name or f"{job.replace('-', '_').replace('.', '_')}_output",
               minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys={CKPT_RESOURCE}, description=f"Job {job}: each window of committed batches")
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        ckpt: CkptResource = getattr(context.resources, CKPT_RESOURCE)
        status = read_status(ckpt.job_store(job))
        last = json.loads(context.cursor) if context.cursor else None
        if status is None or status.batch_id is None:
            return dg.SkipReason(f"job {job}: no batch committed yet")
        if last is not None and (last["epoch"], last["batch_id"]) == (status.epoch, status.batch_id):
            return dg.SkipReason(f"job {job}: no batch since {status.batch_id} (epoch {status.epoch})")
        first = last["batch_id"] + 1 if last is not None and last["batch_id"] < status.batch_id else status.batch_id
        materialization = dg.AssetMaterialization(
            asset_key=asset.key, description=f"job {job}: batches {first}..{status.batch_id}",
            metadata={"first_batch_id": first, "batch_id": status.batch_id, "epoch": status.epoch,
                      "batch_at": status.batch_at, "lag": status.lag, "offsets": dg.MetadataValue.json(status.offsets)})
        cursor = json.dumps({"epoch": status.epoch, "batch_id": status.batch_id})
        return dg.SensorResult(asset_events=[materialization], cursor=cursor)

    return _sensor


def job_output_checks(job: str, asset: dg.AssetSpec, *, max_batch_age: float = 600.0, max_lag: int | None = None,
                      heartbeat_timeout: float | None = None,
                      clock: Callable[[], float] = time.time) -> Sequence[dg.AssetChecksDefinition]:
    """Asset checks on ``job``'s output: ``fresh`` (a live heartbeat, as the health watch judges it, and the last
    batch at most ``max_batch_age`` s old unless the job is caught up) and, with ``max_lag``, ``lag`` (the records
    behind the latest offsets the job reported, at most ``max_lag``)."""

    def _status(ckpt: CkptResource) -> JobStatus | None:
        return read_status(ckpt.job_store(job))

    @dg.asset_check(asset=asset.key, name="fresh", required_resource_keys={CKPT_RESOURCE},
                    description=f"Job {job}: a live heartbeat and a batch within {max_batch_age:g} s")
    def fresh(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        status, now = _status(getattr(context.resources, CKPT_RESOURCE)), clock()
        if status is None:
            return dg.AssetCheckResult(passed=False, description=f"job {job}: no status.json: it never ran here")
        heartbeat_age, limit = status.age(now), heartbeat_limit(status, heartbeat_timeout=heartbeat_timeout)
        batch_age = None if status.batch_at is None else now - status.local(status.batch_at)
        metadata = {"state": status.state.value, "epoch": status.epoch, "batch_id": status.batch_id,
                    "heartbeat_age_s": round(heartbeat_age, 1), "heartbeat_limit_s": limit,
                    "batch_age_s": None if batch_age is None else round(batch_age, 1), "idle": status.idle}
        if status.state is not JobState.RUNNING or not driver_live(status, now, heartbeat_timeout=heartbeat_timeout):
            return dg.AssetCheckResult(passed=False, metadata=metadata, description=(
                f"job {job}: expected RUNNING with a heartbeat within {limit:.0f} s, found {status.state} with the "
                f"last heartbeat {heartbeat_age:.0f} s ago; see `ckpt job status`"))
        if not status.idle and (batch_age is None or batch_age > max_batch_age):
            found = ("no batch yet" if batch_age is None
                     else f"the last one (batch {status.batch_id}) {batch_age:.0f} s ago")
            return dg.AssetCheckResult(passed=False, metadata=metadata, description=(
                f"job {job}: expected a batch within {max_batch_age:g} s while data waits, found {found}"))
        return dg.AssetCheckResult(passed=True, metadata=metadata)

    checks = [fresh]
    if max_lag is not None:

        @dg.asset_check(asset=asset.key, name="lag", required_resource_keys={CKPT_RESOURCE},
                        description=f"Job {job}: at most {max_lag} records behind its sources")
        def lag(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            status = _status(getattr(context.resources, CKPT_RESOURCE))
            if status is None or status.lag is None:
                return dg.AssetCheckResult(passed=False, description=f"job {job}: no lag reported yet")
            return dg.AssetCheckResult(
                passed=status.lag <= max_lag,
                metadata={"lag": status.lag, "max_lag": max_lag, "batch_id": status.batch_id},
                description=f"job {job}: {status.lag} records behind (at most {max_lag})")

        checks.append(lag)
    return checks
