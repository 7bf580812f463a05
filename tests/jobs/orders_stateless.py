"""A test job: the orders example without its state (each batch's orders as they come), for the
restore check's non-restored state: the snapshot's aggregation state has no operator in this query."""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.examples._orders import output_dir, read_orders, write_rows
from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = output_dir()

    def write(batch: Any, batch_id: int) -> None:
        write_rows(out, batch_id, sorted([r["customer"], r["amount"]] for r in batch.collect()))

    return read_orders(spark).writeStream.outputMode("append").foreachBatch(ctx.fenced(write))
