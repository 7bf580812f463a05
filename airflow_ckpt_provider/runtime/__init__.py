"""Runs inside the Spark driver: a supervised streaming query with snapshots, control and fencing.

Write a job as a function that builds the query's writer, and mark it::

    @streaming_job
    def build(spark, ctx):
        counts = spark.readStream.format("ckpt-kafka").option(...).load().groupBy("key").count()
        return counts.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))

then launch it with ``ckpt run job.py --job NAME --store s3://...``. Never imports Airflow.
"""

from __future__ import annotations

from airflow_ckpt_provider.runtime.driver import JobBuilder, JobContext
from airflow_ckpt_provider.runtime.jobfile import streaming_job

__all__ = ["JobBuilder", "JobContext", "streaming_job"]
