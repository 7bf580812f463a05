"""A transformWithState job whose ValueState schema is a setting, for the restore check's schema comparison
(tests/integration/test_checkpoint_spark.py): a count per ``k`` of JSON files in CKPT_EVOLVE_INPUT, its state
``count`` declared as CKPT_EVOLVE_SCHEMA (default ``n BIGINT``; extra fields are written as nulls)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


def counter(schema: str) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", schema)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            from pyspark.sql import Row

            found = self.count.get() if self.count.exists() else None
            n = (int(found[0]) if found else 0) + sum(1 for _ in rows)
            self.count.update((n, *([None] * schema.count(","))))
            yield Row(k=key[0], n=n)

        def close(self) -> None:
            pass

    return Count()


def query(spark: Any, schema: str) -> Any:
    return (spark.readStream.schema("k STRING").json(os.environ["CKPT_EVOLVE_INPUT"]).groupBy("k")
            .transformWithState(counter(schema), "k STRING, n LONG", "Update", "None")
            .writeStream.format("noop").outputMode("update"))


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    return query(spark, os.environ.get("CKPT_EVOLVE_SCHEMA", "n BIGINT"))
