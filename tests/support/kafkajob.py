"""A Spark driver for crash tests: count records per key from a ckpt-kafka topic (stateful, update mode).

    python tests/support/kafkajob.py --bootstrap HOST:PORT --topic T --checkpoint DIR --out DIR
        [--trigger processing|availableNow] [--max-offsets N]

Each batch writes ``<out>/<batch id>.json`` (the keys it updated with their running counts; a
replayed batch replaces its file), so the last file holding a key has its final count. With
``--trigger processing`` it runs until killed; with ``availableNow`` it exits 0 once everything
present at start is counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: make `tests` importable

from airflow_ckpt_provider.kafka.source import register
from tests.support.sparkjobs import json_sink, spark_session

_TIMEOUT_S = 600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--trigger", choices=["processing", "availableNow"], default="processing")
    parser.add_argument("--max-offsets", type=int, default=500)
    args = parser.parse_args(argv)

    spark = spark_session("ckpt-kafkajob")
    register(spark)
    counts = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
        .groupBy("key")
        .count()
    )
    writer = (
        counts.writeStream.outputMode("update")
        .foreachBatch(json_sink(args.out))
        .option("checkpointLocation", args.checkpoint)
    )
    writer = writer.trigger(availableNow=True) if args.trigger == "availableNow" else writer.trigger(
        processingTime="100 milliseconds"
    )
    query = writer.start()
    finished = query.awaitTermination(_TIMEOUT_S)
    if query.exception() is not None or not finished:
        query.stop()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
