"""Example job: an INCOMPATIBLE change of ``orders_v1.py``, whose state Spark refuses to restore.

What changed: the totals are kept per customer AND order size (``small`` below 50, ``large`` from
50), so each customer has two rows. Why it is incompatible: the grouping key of the state is now
(customer, size) instead of (customer); restored from v1's checkpoint, Spark refuses to start with
its state schema check (the key schema of the stored state differs from the new query's). Such a
change needs a fresh start (``--restore none``) or a state migration, not an upgrade.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.examples._orders import output_dir, read_orders, write_rows
from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = output_dir()
    totals = (
        read_orders(spark)
        .selectExpr("customer", "IF(amount < 50, 'small', 'large') AS size", "amount")
        .groupBy("customer", "size").agg({"*": "count", "amount": "sum"})
        .withColumnRenamed("count(1)", "orders").withColumnRenamed("sum(amount)", "revenue")
    )

    def write(batch: Any, batch_id: int) -> None:
        rows = [[r["customer"], r["size"], r["orders"], r["revenue"]] for r in batch.collect()]
        write_rows(out, batch_id, sorted(rows))

    return totals.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
