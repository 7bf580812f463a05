"""Example job: orders and revenue per customer from a Kafka topic, with Flink-style operations.

    ckpt run orders_job.py --job orders --store s3://bucket/jobs --supervise

Reads the ``ckpt-kafka`` source (offsets live in the checkpoint; they are committed to the
consumer group ``ORDERS_GROUP`` only after a batch completes, for lag monitoring), keeps the totals
in state, and writes each batch's updated totals to ``ORDERS_OUT/batch-<id>.json`` (replaced on
replay, so the output is idempotent). Settings come from the environment: ORDERS_BOOTSTRAP,
ORDERS_TOPIC, ORDERS_OUT, ORDERS_GROUP (default ``ckpt-orders``), ORDERS_MAX_PER_BATCH (default 500).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = Path(os.environ["ORDERS_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    orders = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", os.environ["ORDERS_BOOTSTRAP"])
        .option("subscribe", os.environ["ORDERS_TOPIC"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("ORDERS_MAX_PER_BATCH", "500"))
        .option("commitGroupId", os.environ.get("ORDERS_GROUP", "ckpt-orders"))
        .load()
    )
    totals = orders.selectExpr("CAST(key AS STRING) AS customer", "CAST(CAST(value AS STRING) AS INT) AS amount") \
        .groupBy("customer").agg({"*": "count", "amount": "sum"}) \
        .withColumnRenamed("count(1)", "orders").withColumnRenamed("sum(amount)", "revenue")

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted([r["customer"], r["orders"], r["revenue"]] for r in batch.collect())
        tmp = out / f".batch-{batch_id:06d}.json.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"batch-{batch_id:06d}.json")

    return totals.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
