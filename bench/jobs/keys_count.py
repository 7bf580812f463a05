"""The rescale benchmark's job: a count per key over JSON files (a file source: any state size, no broker).

CKPT_BENCH_IN: the directory of input files (one ``{"key": ...}`` object per line; one file per batch);
the sink keeps only the number of rows each batch updated (``CKPT_BENCH_OUT/batch-<id>``), so writing output
does not weigh on the times measured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = Path(os.environ["CKPT_BENCH_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    counts = (spark.readStream.schema("key STRING").option("maxFilesPerTrigger", 1)
              .json(os.environ["CKPT_BENCH_IN"]).groupBy("key").count())

    def write(batch: Any, batch_id: int) -> None:
        (out / f"batch-{batch_id:06d}").write_text(str(batch.count()))

    return counts.writeStream.outputMode("update").foreachBatch(ctx.fenced(write))
