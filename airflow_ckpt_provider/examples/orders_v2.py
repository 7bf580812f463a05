"""Example job, version 2: a COMPATIBLE upgrade of ``orders_v1.py``.

What changed: each output row is an object that also carries the average order value per customer
and ``"version": 2``. Why it is compatible: the source and the state are v1's (the same grouping by
customer and the same two aggregates, from ``_orders.order_totals``); the average is computed from
the totals after the aggregation, in the output only, so Spark restores v1's state as it is.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.examples._orders import order_totals, output_dir, read_orders, write_rows
from airflow_ckpt_provider.runtime import JobContext, streaming_job

VERSION = 2


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = output_dir()
    totals = order_totals(read_orders(spark)).selectExpr(
        "customer", "orders", "revenue", "ROUND(revenue / orders, 2) AS avg_order_value"
    )

    def write(batch: Any, batch_id: int) -> None:
        rows = [{**r.asDict(), "version": VERSION} for r in batch.collect()]
        write_rows(out, batch_id, sorted(rows, key=lambda row: row["customer"]))

    return totals.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
