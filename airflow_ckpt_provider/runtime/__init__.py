"""Runs inside the Spark driver: a supervised streaming query with snapshots, control and fencing.
Never imports Airflow.

Design notes: docs/runtime.md#design-notes-runtime__init__py."""

from __future__ import annotations

from airflow_ckpt_provider.runtime.driver import JobBuilder, JobContext
from airflow_ckpt_provider.runtime.jobfile import streaming_job

__all__ = ["JobBuilder", "JobContext", "streaming_job"]
