"""Sensors over the same watches as the Airflow triggers and sensors (core/watches/, kafka/lag.py): a job's
health, each new savepoint, a consumer group's lag rising above a threshold.

A watch that announces a stream of events keeps a cursor; here it is the sensor's cursor (``context.cursor``),
so a restarted daemon neither repeats nor skips an event. The health watch remembers what it saw between looks
(since when data waits without a new batch): it is kept in the code location's process between ticks, and a
restart of that process starts it over, as a triggerer restart does for the Airflow trigger.
"""

# No ``from __future__ import annotations``: Dagster reads the annotations of decorated functions (the context's
# type, config classes, resources) at definition time and does not resolve them from strings.
import json
from collections.abc import Sequence
from typing import Any

import dagster as dg

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.watches.base import Watch
from airflow_ckpt_provider.core.watches.events import SnapshotEventWatch
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.dagster.ops import CKPT_RESOURCE
from airflow_ckpt_provider.dagster.resources import CkptResource

#: Health watches kept between ticks, by sensor name and job store (see the module's docstring).
_HEALTH_WATCHES: dict[tuple[str, str], Watch] = {}


def _cursor(context: dg.SensorEvaluationContext) -> dict[str, Any] | None:
    return json.loads(context.cursor) if context.cursor else None


def job_health_sensor(
    job: str,
    *,
    restart_job: dg.JobDefinition | None = None,
    name: str | None = None,
    criteria: HealthCriteria | None = None,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """Each tick polls ``job``'s health watch (``criteria``, default: JobHealthSensor(expect="unhealthy")'s, as
    the keep-alive DAG uses it: FAILED, STOPPED, no heartbeat and nobody restarting it, 3 restarts in 600 s, 300 s
    without a batch while data waits). Unhealthy: a run of ``restart_job`` (one per epoch and reason), else a
    skip that says so. A job its supervisor restarts is not unhealthy."""
    criteria = criteria or HealthCriteria(expect=Health.UNHEALTHY, max_restarts=3, health_window=600,
                                          progress_timeout=300)
    sensor_name = name or f"{job.replace('-', '_').replace('.', '_')}_health"

    @dg.sensor(name=sensor_name, job=restart_job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status, required_resource_keys={CKPT_RESOURCE},
               description=f"Job {job}: a run of the restart job when it turns unhealthy")
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        ckpt: CkptResource = getattr(context.resources, CKPT_RESOURCE)
        store = ckpt.job_store(job)
        key = (sensor_name, store.url)
        watch = _HEALTH_WATCHES.get(key)
        if watch is None:
            watch = _HEALTH_WATCHES[key] = JobHealthWatch(store, criteria)
        event = watch.poll()
        if event is None or event["status"] != Health.UNHEALTHY.value:
            return dg.SkipReason(watch.waiting_for())
        _HEALTH_WATCHES.pop(key, None)  # the next tick judges afresh (e.g. the restarted driver)
        context.log.warning(event["message"])
        if restart_job is None:
            return dg.SkipReason(f"unhealthy, and no restart job to run: {event['message']}")
        run = dg.RunRequest(run_key=f"{job}-unhealthy-{event.get('epoch')}-{event.get('reason')}",
                            tags={"ckpt/job": job, "ckpt/reason": str(event.get("reason"))})
        return dg.SensorResult(run_requests=[run])

    return _sensor


def snapshot_sensor(
    job: str,
    *,
    run_job: dg.JobDefinition | None = None,
    asset_key: dg.AssetKey | None = None,
    kinds: Sequence[str] = ("savepoint",),
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    run_config: Any = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """Each new completed snapshot of ``kinds`` (core/watches/events.SnapshotEventWatch, as the Airflow asset
    watcher): a run of ``run_job`` keyed on the snapshot id (tags ``ckpt/snapshot_id``, ``ckpt/batch_id``,
    ``ckpt/uri``) and, with ``asset_key``, a materialization of that asset with the snapshot's id, kind, batch
    and URI. The snapshots present when the sensor first ticks are the baseline: not announced."""
    sensor_name = name or f"{job.replace('-', '_').replace('.', '_')}_{'_'.join(kinds)}s"

    @dg.sensor(name=sensor_name, job=run_job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status, required_resource_keys={CKPT_RESOURCE},
               description=f"Job {job}: each new completed {' or '.join(kinds)}")
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        ckpt: CkptResource = getattr(context.resources, CKPT_RESOURCE)
        watch = SnapshotEventWatch(ckpt.job_store(job), kinds=kinds, cursor=_cursor(context))
        events = []
        while (event := watch.poll()) is not None:
            events.append(event)
        cursor = watch.cursor()
        if not events:
            if watch.baseline and cursor is not None:
                context.update_cursor(json.dumps(cursor))
            return dg.SkipReason(watch.waiting_for())
        runs = [dg.RunRequest(run_key=e["snapshot_id"], run_config=run_config or {},
                              tags={"ckpt/job": job, "ckpt/snapshot_id": e["snapshot_id"],
                                    "ckpt/batch_id": str(e["batch_id"]), "ckpt/uri": e["uri"]})
                for e in events] if run_job is not None else []
        materializations = [dg.AssetMaterialization(
            asset_key=asset_key, description=e["message"],
            metadata={"snapshot_id": e["snapshot_id"], "kind": e["kind"], "batch_id": e["batch_id"],
                      "uri": dg.MetadataValue.url(e["uri"]), "created_at": e["created_at"], "trigger": e["trigger"]},
        ) for e in events] if asset_key is not None else []
        return dg.SensorResult(run_requests=runs, asset_events=materializations, cursor=json.dumps(cursor))

    return _sensor


def kafka_lag_sensor(
    group: str,
    *,
    threshold: int,
    bootstrap_servers: str,
    topics: Sequence[str] | None = None,
    run_job: dg.JobDefinition | None = None,
    rearm_below: int | None = None,
    kafka_conf: dict[str, Any] | None = None,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A run of ``run_job`` each time the total lag of consumer ``group`` rises above ``threshold``: once per
    crossing, re-armed below ``rearm_below`` (kafka/lag.LagAboveWatch, as the Airflow asset watcher)."""
    sensor_name = name or f"{group.replace('-', '_').replace('.', '_')}_lag"

    @dg.sensor(name=sensor_name, job=run_job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status,
               description=f"Consumer group {group}: its lag rose above {threshold}")
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        from airflow_ckpt_provider.kafka.lag import LagAboveWatch  # confluent_kafka: not at load time

        watch = LagAboveWatch(bootstrap_servers, group, topics, threshold=threshold, rearm_below=rearm_below,
                              conf=kafka_conf, cursor=_cursor(context))
        event = watch.poll()
        cursor = json.dumps(watch.cursor())
        if event is None:
            context.update_cursor(cursor)
            return dg.SkipReason(watch.waiting_for())
        runs = [dg.RunRequest(run_key=None, tags={"ckpt/group": group, "ckpt/total_lag": str(event["total_lag"])})]
        return dg.SensorResult(run_requests=runs if run_job is not None else [], cursor=cursor)

    return _sensor
