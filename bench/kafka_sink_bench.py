"""Benchmark of the transactional ckpt-kafka sink versus a plain idempotent-producer sink, side by side in one run.

    .venv/bin/python bench/kafka_sink_bench.py [--records 300000] [--size 100] [--repeat 5]

The same query (ckpt-kafka source -> key, value) is written by ``writeStream.format("ckpt-kafka")``
(one transaction per task, marker offsets, ckpt.* headers) and by a minimal at-least-once
DataSourceStreamArrowWriter with an idempotent producer (same Arrow-to-record code, no transaction,
no headers, flush per task). Rounds interleave the two; prints rows/s and the ratio (target >= 0.80).
Starts its own tansu broker on 127.0.0.1 and a local[2] Spark.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from kafka_bench import PARTITIONS, produce, spark_session  # bench/ is on sys.path when run as a script
from pyspark.sql.datasource import (  # noqa: TID253 - the baseline subclasses pyspark; a script, never imported
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from airflow_ckpt_provider.embedded import EmbeddedKafka


class PlainKafkaWriter(DataSourceStreamArrowWriter):
    """At-least-once baseline: enable.idempotence, acks=all, flush at the end of each task."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from confluent_kafka import Producer

        from airflow_ckpt_provider.kafka.writer import produce_batch

        producer = Producer({"bootstrap.servers": self.options["kafka.bootstrap.servers"], "linger.ms": 5,
                             "enable.idempotence": True, "acks": "all"})
        try:
            for rb in iterator:
                produce_batch(producer, rb, self.options["topic"], None)
            if producer.flush(60):
                raise RuntimeError("records not delivered in 60 s")
        finally:
            producer.close()
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class PlainKafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "plain-kafka-bench"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return PlainKafkaWriter(dict(self.options))


def count(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (to the fetch end; tansu's ListOffsets(LATEST) is off for multi-record batches)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        pending, seen, deadline = set(range(PARTITIONS)), 0, time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10000, 1.0):
                if msg.error() is None:
                    seen += 1
                else:
                    pending.discard(msg.partition())
        return seen
    finally:
        consumer.close()


def sink_run(spark: Any, kafka: EmbeddedKafka, source: str, records: int, fmt: str) -> tuple[float, float]:
    """(rows/s over the batches' own time, rows/s wall clock) of one query into a fresh topic."""
    out = f"out-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(out, PARTITIONS)
    ckpt = f"/tmp/kafka-sink-bench-{uuid.uuid4().hex[:8]}"
    try:
        df = (spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", records // 2).load().select("key", "value"))
        start = time.perf_counter()
        query = (df.writeStream.format(fmt).option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                 .option("topic", out).option("job", f"bench-{uuid.uuid4().hex[:6]}")
                 .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        query.awaitTermination(600)
        wall = time.perf_counter() - start
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = sum(p["numInputRows"] for p in progress)
        busy_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        written = count(kafka.bootstrap_servers, out)
        if rows != records or written != records:
            raise RuntimeError(f"{fmt}: read {rows}, wrote {written}, expected {records}")
        return rows / busy_s, rows / wall
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with EmbeddedKafka() as kafka:
        topic = "bench-in"
        kafka.create_topic(topic, PARTITIONS)
        produce(kafka.bootstrap_servers, topic, args.records, args.size)
        spark = spark_session()
        spark.dataSource.register(PlainKafkaDataSource)
        results: dict[str, list[tuple[float, float]]] = {"ckpt-kafka": [], "plain-kafka-bench": []}
        try:
            sink_run(spark, kafka, topic, args.records, "plain-kafka-bench")  # warm-up (JIT, workers)
            for i in range(args.repeat):
                order = ["ckpt-kafka", "plain-kafka-bench"]
                for fmt in order if i % 2 == 0 else reversed(order):
                    results[fmt].append(sink_run(spark, kafka, topic, args.records, fmt))
                print(f"round {i + 1}: transactional {results['ckpt-kafka'][-1][0]:,.0f}/s, "
                      f"idempotent {results['plain-kafka-bench'][-1][0]:,.0f}/s", file=sys.stderr)
        finally:
            spark.stop()
    med = statistics.median
    tx = med(b for b, _ in results["ckpt-kafka"])
    plain = med(b for b, _ in results["plain-kafka-bench"])
    tx_wall = med(w for _, w in results["ckpt-kafka"])
    plain_wall = med(w for _, w in results["plain-kafka-bench"])
    ratio = tx / plain
    # Rounds interleave the two sinks: the median of per-round ratios is robust to a round that the
    # machine's other work slowed down.
    paired = [t / p for (t, _), (p, _) in zip(results["ckpt-kafka"], results["plain-kafka-bench"], strict=True)]
    print(f"\nrecords: {args.records} x {args.size} B over {PARTITIONS} partitions, 2 batches per run, "
          f"medians of {args.repeat} rounds")
    print(f"{'idempotent producer sink (batch time)':40} {plain:>10,.0f} rows/s")
    print(f"{'transactional ckpt-kafka (batch time)':40} {tx:>10,.0f} rows/s   ratio {ratio:.2f} "
          f"({'pass' if ratio >= 0.8 else 'MISS'}, target >= 0.80)")
    print(f"{'per-round ratios (batch time)':40} {', '.join(f'{r:.2f}' for r in paired)}   median {med(paired):.2f}")
    print(f"{'wall clock: idempotent / transactional':40} {plain_wall:>10,.0f} / {tx_wall:,.0f} rows/s   "
          f"ratio {tx_wall / plain_wall:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
