"""Operate the same streaming jobs from Dagster: a resource (the job store and Spark), ops for each verb,
sensors over the same watches as the Airflow triggers, and asset checks (docs/dagster.md).

A thin layer like the Airflow one (operators/, sensors/), importing nothing of it: the decisions live in core/
and the launching in launcher/, which both layers call. Install with the ``dagster`` extra.
"""

from __future__ import annotations

from airflow_ckpt_provider.dagster.assets import job_output_asset, job_output_checks, job_output_sensor
from airflow_ckpt_provider.dagster.ops import (
    CKPT_RESOURCE,
    cancel_streaming_job,
    dispose_snapshots,
    rescale_streaming_job,
    restart_from_snapshot,
    restart_streaming_job,
    stop_streaming_job,
    submit_streaming_job,
    trigger_savepoint,
    upgrade_streaming_job,
    wait_until_healthy,
)
from airflow_ckpt_provider.dagster.resources import CkptResource
from airflow_ckpt_provider.dagster.sensors import job_health_sensor, kafka_lag_sensor, snapshot_sensor

__all__ = [
    "CKPT_RESOURCE",
    "CkptResource",
    "cancel_streaming_job",
    "dispose_snapshots",
    "job_health_sensor",
    "job_output_asset",
    "job_output_checks",
    "job_output_sensor",
    "kafka_lag_sensor",
    "rescale_streaming_job",
    "restart_from_snapshot",
    "restart_streaming_job",
    "snapshot_sensor",
    "stop_streaming_job",
    "submit_streaming_job",
    "trigger_savepoint",
    "upgrade_streaming_job",
    "wait_until_healthy",
]
