"""Benchmark of the ckpt-files sink: rows/s versus Spark's built-in parquet file sink (at-least-once),
the same query side by side in one run, to a local directory and to SeaweedFS S3.

    .venv/bin/python bench/file_sink_bench.py [--rows 1200000] [--files 4] [--size 100] [--repeat 5]

The query reads Parquet input files with Spark's file source (one file per batch, availableNow) and
writes a stateless projection. Prints rows/s (batch time, from the query's progress) and the ratio
to the baseline (target >= 0.80); nothing is asserted. Spark's parquet sink cannot write to S3 here
(no hadoop-aws), so the S3 figure is compared with the local parquet baseline and, the fair baseline (issue
19), with the same sink writing to a local directory. Starts its own SeaweedFS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.embedded import EmbeddedS3, local_spark


def make_input(directory: Path, rows: int, files: int, size: int) -> None:
    """``files`` Parquet files of rows/files rows: an id, a key, a number and a payload of ``size`` bytes."""
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

    directory.mkdir(parents=True)
    per = rows // files
    for i in range(files):
        ids = pa.array(range(i * per, (i + 1) * per), pa.int64())
        table = pa.table({"id": ids, "k": pa.array([f"k{j % 1000}" for j in range(per)]),
                          "x": pa.array([j * 0.5 for j in range(per)]), "payload": pa.array(["p" * size] * per)})
        pq.write_table(table, directory / f"part-{i:03d}.parquet")
        os.utime(directory / f"part-{i:03d}.parquet", (1_790_000_000 + i, 1_790_000_000 + i))


def run(spark: Any, input_dir: Path, sink: str, target: str, rows: int) -> float:
    """Rows/s over the batches' own time of one query from scratch into ``target``."""
    work = Path(tempfile.mkdtemp(prefix="file-sink-bench-"))
    schema = spark.read.parquet(str(input_dir)).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    df = stream.selectExpr("id", "k", "x * 2 AS x2", "payload")
    writer = df.writeStream.option("checkpointLocation", str(work / "ckpt")).trigger(availableNow=True)
    if sink == "parquet":
        writer = writer.format("parquet").option("path", target)
    else:
        writer = writer.format("ckpt-files").option("path", target).option("job", "bench")
    try:
        query = writer.start()
        if not query.awaitTermination(900):
            raise RuntimeError(f"{sink} to {target} did not finish in 900 s")
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        done = sum(p["numInputRows"] for p in progress)
        if done != rows:
            raise RuntimeError(f"{sink} wrote {done} rows, expected {rows}")
        return float(done / (sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_committed(target: str, rows: int) -> None:
    from airflow_ckpt_provider.sinks.filelayout import committed_batches
    from airflow_ckpt_provider.sinks.filemaintenance import verify_sink

    got = sum(m.rows for m in committed_batches(target))
    report = verify_sink(target)
    if got != rows or not report.ok:
        raise RuntimeError(f"ckpt-files at {target}: {got} committed rows (expected {rows}), {report.problems}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--files", type=int, default=4, help="input files = batches")
    parser.add_argument("--size", type=int, default=100, help="payload bytes per row")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = args.rows // args.files * args.files
    base = Path(tempfile.mkdtemp(prefix="file-sink-bench-"))
    with EmbeddedS3(workdir=base / "seaweedfs") as s3:
        s3.create_bucket("bench")
        os.environ.update(s3.env())  # the Python workers (tasks and commits) read S3 settings from here
        make_input(base / "in", rows, args.files, args.size)
        spark = local_spark("file-sink-bench", **{f"spark.executorEnv.{k}": v for k, v in s3.env().items()})
        from airflow_ckpt_provider.runtime.datasources import register_data_sources

        register_data_sources(spark)
        results: dict[str, list[float]] = {"parquet": [], "local": [], "s3": []}
        try:
            # Warm-up of both targets (JIT, Python workers; for S3 the workers' boto3 import and client), so that
            # the first measured S3 query does not pay them alone.
            run(spark, base / "in", "ckpt-files", str(base / "warm"), rows)
            run(spark, base / "in", "ckpt-files", f"s3://bench/warm-{uuid.uuid4().hex[:8]}", rows)
            for i in range(args.repeat):
                order = ["parquet", "local", "s3"]
                for name in order if i % 2 == 0 else reversed(order):
                    target = (f"s3://bench/run-{uuid.uuid4().hex[:8]}" if name == "s3"
                              else str(base / f"out-{name}-{i}"))
                    results[name].append(run(spark, base / "in", "parquet" if name == "parquet" else "ckpt-files",
                                             target, rows))
                    if name != "parquet":
                        check_committed(target, rows)
                print(f"round {i + 1}: parquet {results['parquet'][-1]:,.0f}/s, ckpt-files local "
                      f"{results['local'][-1]:,.0f}/s, ckpt-files s3 {results['s3'][-1]:,.0f}/s", file=sys.stderr)
        finally:
            spark.stop()
            shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    print(f"\nrows: {rows} x ~{args.size + 30} B in {args.files} batches, medians of {args.repeat} rounds")
    print(f"{'Spark parquet sink (local)':32} {med(results['parquet']):>12,.0f} rows/s")
    for name, label, base_name in (("local", "ckpt-files (local dir)", "parquet"),
                                   ("s3", "ckpt-files (SeaweedFS S3)", "parquet"),
                                   ("s3", "ckpt-files S3 / ckpt-files local", "local")):
        ratios = [r / b for r, b in zip(results[name], results[base_name], strict=True)]
        ratio = med(ratios)
        rate = f"{med(results[name]):>12,.0f} rows/s" if base_name == "parquet" else " " * 19
        print(f"{label:32} {rate}   ratio {ratio:.2f} (per round {', '.join(f'{r:.2f}' for r in ratios)}) "
              f"({'pass' if ratio >= 0.8 else 'MISS'}, target >= 0.80)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
