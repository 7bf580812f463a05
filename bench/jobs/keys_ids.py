"""The Flink side-by-side benchmark's job on this provider: per key a count and the set of ids seen.

CKPT_BENCH_IN: a directory of CSV files (``key,id`` lines; one file per batch). The same input and logic as the
Flink side (bench/flink/keys_ids_job.py). The sink only counts the rows a batch updated (writing output would weigh
on the times measured). With CKPT_BENCH_FAULT_DIR, a file ``sink`` there makes one foreachBatch call raise (whoever
deletes the file raises, and writes ``sink.fired``: the time and the batch id).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    from pyspark.sql import functions as F

    faults = Path(os.environ.get("CKPT_BENCH_FAULT_DIR", "/nonexistent"))
    state = (spark.readStream.schema("k STRING, id LONG").option("maxFilesPerTrigger", 1)
             .csv(os.environ["CKPT_BENCH_IN"]).groupBy("k").agg(F.count("*").alias("cnt"),
                                                                F.collect_set("id").alias("ids")))

    def write(batch: Any, batch_id: int) -> None:
        batch.count()

    fenced = ctx.fenced(write)

    def sink(batch: Any, batch_id: int) -> None:
        try:
            (faults / "sink").unlink()
        except FileNotFoundError:
            return fenced(batch, batch_id)
        (faults / "sink.fired").write_text(f"{time.time():.6f} {batch_id}")
        raise RuntimeError(f"injected sink failure at batch {batch_id}")

    return state.writeStream.outputMode("update").foreachBatch(sink)
