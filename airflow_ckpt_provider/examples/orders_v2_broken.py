"""Example job: ``orders_v2.py`` with a bug in its sink, to test the rollback of a failed upgrade.

What changed: the sink raises on every batch ("orders v2-broken: simulated bug"). Why the restore
check passes anyway: the state is v1's (the same grouping and aggregates, from
``_orders.order_totals``), so Spark restores it; the check never runs the sink (it replaces it), so
only running the new version shows the bug: its first batch fails and the upgrade must roll back
to v1 from the savepoint taken before it.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.examples._orders import order_totals, read_orders
from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    totals = order_totals(read_orders(spark)).selectExpr(
        "customer", "orders", "revenue", "ROUND(revenue / orders, 2) AS avg_order_value"
    )

    def write(batch: Any, batch_id: int) -> None:
        raise RuntimeError(f"orders v2-broken: simulated bug (batch {batch_id} not written)")

    return totals.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
