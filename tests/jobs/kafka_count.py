"""A test job: count records per key from a ckpt-kafka topic; one JSON file per batch id.

Configured by environment variables (they travel through spark-submit to the driver):
CKPT_TEST_TOPIC, CKPT_TEST_BOOTSTRAP, CKPT_TEST_OUT, CKPT_TEST_MAX_OFFSETS (records per batch),
CKPT_TEST_COMMIT_GROUP (the source's commitGroupId: its brokers then appear in the status' offsets).
With CKPT_TEST_FAULT_DIR, a file ``task`` there makes one task raise (a Python UDF on the executor; local
mode does not retry tasks, so the query fails) and a file ``sink`` makes one foreachBatch call raise; the
process that raises deletes the file first, so each fires once, and writes ``<name>.fired`` (the time, and
the key or batch id it raised at)
(CKPT_TEST_FAULTS=sink leaves the UDF out: benchmarks). CKPT_TEST_VARIANT makes a job no restart
fixes: ``schema`` groups by another key (the state's key schema no longer fits), ``append`` asks for an
output mode Spark refuses for an aggregation, ``nomodule`` imports a module the sink lacks.
The sink replaces ``batch-<id>.json`` on replay (idempotent by batch id) and, once the lease check
right before Spark's commit passed, appends ``<batch id> <time>`` to ``commits-epoch-<epoch>.log``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    out = Path(os.environ["CKPT_TEST_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    records = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", os.environ["CKPT_TEST_BOOTSTRAP"])
        .option("subscribe", os.environ["CKPT_TEST_TOPIC"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("CKPT_TEST_MAX_OFFSETS", "200"))
    )
    if os.environ.get("CKPT_TEST_COMMIT_GROUP"):  # the group's offsets follow completed batches
        records = records.option("commitGroupId", os.environ["CKPT_TEST_COMMIT_GROUP"])
    records = records.load()
    keys = records.selectExpr("CAST(key AS STRING) AS key")
    faults = os.environ.get("CKPT_TEST_FAULT_DIR")
    if faults and "task" in os.environ.get("CKPT_TEST_FAULTS", "task,sink"):  # a UDF costs every record
        from pyspark.sql.functions import udf

        keys = keys.select(udf(lambda key: _fault(faults, "task", key))("key").alias("key"))
    variant = os.environ.get("CKPT_TEST_VARIANT", "")
    counts = (keys.selectExpr("key", "length(key) AS size").groupBy("key", "size") if variant == "schema"
              else keys.groupBy("key")).count()

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted((r["key"], r["count"]) for r in batch.collect())
        tmp = out / f".batch-{batch_id:06d}.json.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"batch-{batch_id:06d}.json")

    fenced_write = ctx.fenced(write)

    def write_and_log(batch: Any, batch_id: int) -> None:
        if variant == "nomodule":
            import ckpt_test_missing_module  # type: ignore[import-not-found]  # noqa: F401  # missing on purpose
        if faults:
            _fault(faults, "sink", batch_id)
        fenced_write(batch, batch_id)  # raises once fenced, before or after writing: Spark does not commit
        with open(out / f"commits-epoch-{ctx.epoch}.log", "a") as f:  # passed the last check before commit
            f.write(f"{batch_id} {time.time():.6f}\n")

    mode = "append" if variant == "append" else "update"
    return counts.writeStream.outputMode(mode).foreachBatch(write_and_log)


def _fault(directory: str, name: str, value: Any) -> Any:
    """Raise once if the test armed ``name`` in ``directory`` (whoever deletes the file raises); else ``value``."""
    try:
        (Path(directory) / name).unlink()
    except FileNotFoundError:
        return value
    (Path(directory) / f"{name}.fired").write_text(f"{time.time():.6f} {value}")
    raise RuntimeError(f"injected {name} failure at {value!r}")
