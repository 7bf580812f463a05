"""Benchmark: the CPU an idle ckpt-kafka query costs its driver and the broker, by spark.sql.streaming.pollingDelay.

One local[2] query reads an empty two-partition topic on the embedded tansu into the noop sink; after it started,
the CPU of this process's tree (the JVM, pyspark's source runner and daemons) and of the broker is measured over
--seconds of idling, once per delay in one run: Spark's default (10 ms) and the jobs' default (``IDLE_POLL`` in
runtime/sparkchecks.py). Figures are printed, never asserted.

    .venv/bin/python bench/idle_poll_bench.py [--seconds 40] [--delays 10ms,100ms,250ms]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psutil

from airflow_ckpt_provider.embedded import EmbeddedKafka, local_spark
from airflow_ckpt_provider.kafka.source import register
from airflow_ckpt_provider.runtime.sparkchecks import IDLE_POLL


def tree_cpu(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and its live descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue  # gone meanwhile
    return total


def idle_cost(kafka: EmbeddedKafka, delay: str, seconds: float, work: Path) -> tuple[float, float]:
    """(query CPU-s, broker CPU-s) over ``seconds`` of an idle query polling every ``delay``."""
    spark = local_spark(f"idle-{delay}", **{IDLE_POLL[0]: delay})
    try:
        register(spark)
        query = (spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                 .option("subscribe", "idle").option("startingOffsets", "earliest").load()
                 .writeStream.format("noop").option("checkpointLocation", str(work / f"ckpt-{delay}")).start())
        query.processAllAvailable()  # started and caught up: idle from here on
        me, broker = psutil.Process(), psutil.Process(kafka.pid or 0)
        before, broker_before = tree_cpu(me), tree_cpu(broker)
        time.sleep(seconds)
        cost = tree_cpu(me) - before, tree_cpu(broker) - broker_before
        query.stop()
        return cost
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="idle seconds measured per delay (default 40)")
    parser.add_argument("--delays", default=f"10ms,{IDLE_POLL[1]}", help="pollingDelay values, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-poll-") as tmp, EmbeddedKafka(workdir=Path(tmp) / "tansu") as kafka:
        kafka.create_topic("idle", 2)
        print(f"idle ckpt-kafka query, local[2], {args.seconds:.0f} s per delay (CPU seconds)")
        print(f"{'pollingDelay':>12} {'query':>8} {'broker':>8} {'query, % of a core':>20}")
        for delay in args.delays.split(","):
            query, broker = idle_cost(kafka, delay.strip(), args.seconds, Path(tmp))
            print(f"{delay.strip():>12} {query:8.1f} {broker:8.1f} {100 * query / args.seconds:19.0f}%")


if __name__ == "__main__":
    main()
