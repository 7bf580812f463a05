"""A job reading named sources (Spark 4.2's source evolution, offset log v2), the names a setting, for the restore
check's source comparison (tests/integration/test_checkpoint_spark.py): a count per ``k`` of the JSON files in
CKPT_NAMED_INPUT/<name> for each name of CKPT_NAMED_SOURCES (comma-separated)."""

from __future__ import annotations

import os
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


def query(spark: Any, names: str) -> Any:
    frames = [spark.readStream.schema("k STRING").name(name).json(os.path.join(os.environ["CKPT_NAMED_INPUT"], name))
              for name in names.split(",")]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.groupBy("k").count().writeStream.format("noop").outputMode("update")


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    return query(spark, os.environ["CKPT_NAMED_SOURCES"])
