"""Example job, version 1: orders and revenue per customer from a Kafka topic.

    ckpt run orders_v1.py --job orders --store s3://bucket/jobs --supervise

Reads the orders from the ``ckpt-kafka`` source, keeps the totals per customer in state, and writes
each batch's updated totals as ``[customer, orders, revenue]`` rows to ``ORDERS_OUT/batch-<id>.json``
(replaced on replay, so the output is idempotent). Settings: see ``_orders.py``. The other
``orders_*`` files are later versions of this job, for upgrades: ``orders_v2.py`` (compatible),
``orders_incompatible.py`` and ``orders_v2_broken.py``.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.examples._orders import order_totals, output_dir, read_orders, write_rows
from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = output_dir()

    def write(batch: Any, batch_id: int) -> None:
        write_rows(out, batch_id, sorted([r["customer"], r["orders"], r["revenue"]] for r in batch.collect()))

    return order_totals(read_orders(spark)).writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
