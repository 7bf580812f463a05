"""Benchmark of the ckpt-kafka source: records/s versus a plain confluent-kafka consumer, and the cost
of committing offsets on completion, measured side by side in one run.

    .venv/bin/python bench/kafka_bench.py [--records 600000] [--size 100] [--repeat 3]

Prints ratios (targets: source >= 0.60 of the plain consumer; commit-on-completion costs < 3%);
nothing is asserted. Starts its own tansu broker on 127.0.0.1 and a local[2] Spark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

from airflow_ckpt_provider.embedded import EmbeddedKafka, local_spark

PARTITIONS = 3


def produce(bootstrap: str, topic: str, records: int, size: int) -> None:
    """Fill the topic fast (batched), then end each partition with a one-record batch.

    tansu answers ListOffsets(LATEST) with the base offset of the last record batch + 1 (see
    ENVIRONMENT.md); a final single-record batch per partition makes that the true end.
    """
    from confluent_kafka import Producer

    payload = b"x" * size
    bulk = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                     "batch.num.messages": 10000, "compression.type": "none"})
    for i in range(records - PARTITIONS):
        while True:
            try:
                bulk.produce(topic, value=payload, key=str(i % 1000).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                bulk.poll(0.05)
        if i % 10000 == 0:
            bulk.poll(0)
    assert bulk.flush(120) == 0
    last = Producer({"bootstrap.servers": bootstrap, "acks": "all", "batch.num.messages": 1})
    for p in range(PARTITIONS):
        last.produce(topic, value=payload, key=b"end", partition=p)
    assert last.flush(30) == 0


def plain_consumer(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of one confluent-kafka consumer reading all partitions with assign() and batch consume."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen = nbytes = 0
        start = time.perf_counter()
        while seen < records:
            for msg in consumer.consume(num_messages=10000, timeout=5.0):
                if msg.error() is None:
                    seen += 1
                    nbytes += len(msg.value() or b"")
        return seen / (time.perf_counter() - start)
    finally:
        consumer.close()


def noop_listener() -> Any:
    """A listener that does nothing: the control that shows the noise between identical setups."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Noop(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Noop()


def source_run(spark: Any, bootstrap: str, topic: str, records: int, group: str | None) -> tuple[float, float]:
    """(records/s over the batches' own time, records/s wall clock from start to the last batch).

    ``group``: None for the plain source, "-" for the no-op listener control, else the commit group.
    """
    from airflow_ckpt_provider.kafka.committer import disable_commit_on_completion, enable_commit_on_completion

    control = noop_listener() if group == "-" else None
    if control is not None:
        spark.streams.addListener(control)
        group = None
    listener = enable_commit_on_completion(spark, group, bootstrap, topics=[topic]) if group else None
    ckpt = f"/tmp/kafka-bench-{uuid.uuid4().hex[:8]}"
    try:
        df = (spark.readStream.format("ckpt-kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", records // 2).load())
        start = time.perf_counter()
        query = (df.selectExpr("length(value) AS n").writeStream.format("noop")
                 .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        query.awaitTermination(600)
        wall = time.perf_counter() - start
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = sum(p["numInputRows"] for p in progress)
        busy_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        if rows != records:
            raise RuntimeError(f"the source read {rows} records, expected {records}")
        if listener is not None:  # the last batch's progress event may still be on its way
            deadline = time.monotonic() + 30
            while sum(listener.committer.committed_offsets().get(topic, {}).values()) < records:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"group {group} did not reach the end offsets within 30 s")
                time.sleep(0.05)
        return rows / busy_s, rows / wall
    finally:
        if listener is not None:
            disable_commit_on_completion(spark, listener)
        if control is not None:
            spark.streams.removeListener(control)
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)


def spark_session() -> Any:
    from airflow_ckpt_provider.kafka.source import register

    spark = local_spark("kafka-bench")
    register(spark)
    return spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with EmbeddedKafka() as kafka:
        topic = "bench"
        kafka.create_topic(topic, PARTITIONS)
        t0 = time.perf_counter()
        produce(kafka.bootstrap_servers, topic, args.records, args.size)
        print(f"produced {args.records} records of {args.size} B in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        spark = spark_session()
        try:
            source_run(spark, kafka.bootstrap_servers, topic, args.records, None)  # warm-up (JIT, workers)
            plain: list[float] = []
            src: list[float] = []
            src_wall: list[float] = []
            committed: list[float] = []
            control: list[float] = []
            for i in range(args.repeat):
                plain.append(plain_consumer(kafka.bootstrap_servers, topic, args.records))
                runs = [("plain", None), ("commit", f"bench-group-{i}"), ("control", "-")]
                for name, group in runs if i % 2 == 0 else reversed(runs):
                    busy, wall = source_run(spark, kafka.bootstrap_servers, topic, args.records, group)
                    {"plain": src, "commit": committed, "control": control}[name].append(busy)
                    if name == "plain":
                        src_wall.append(wall)
                print(f"round {i + 1}: plain consumer {plain[-1]:,.0f}/s, source {src[-1]:,.0f}/s, "
                      f"source+commit {committed[-1]:,.0f}/s, source+no-op listener {control[-1]:,.0f}/s",
                      file=sys.stderr)
        finally:
            spark.stop()
    med = statistics.median
    # Rounds interleave the two variants, so compare them pairwise: the median of per-round
    # differences is robust to a round that the machine's other work slowed down.
    ratio, cost = med(src) / med(plain), med([1 - c / s for s, c in zip(src, committed, strict=True)])
    noise = [1 - c / s for s, c in zip(src, control, strict=True)]
    print(f"\nrecords: {args.records} x {args.size} B over {PARTITIONS} partitions, medians of {args.repeat} rounds")
    print(f"{'plain confluent-kafka consumer':34} {med(plain):>12,.0f} records/s")
    print(f"{'ckpt-kafka source (batch time)':34} {med(src):>12,.0f} records/s   ratio {ratio:.2f} "
          f"({'pass' if ratio >= 0.6 else 'MISS'}, target >= 0.60)")
    wall_ratio = med(src_wall) / med(plain)
    print(f"{'ckpt-kafka source (wall clock)':34} {med(src_wall):>12,.0f} records/s   ratio {wall_ratio:.2f}")
    print(f"{'source + commit on completion':34} {med(committed):>12,.0f} records/s   cost {cost:+.1%} "
          f"(median of per-round differences) "
          f"({'pass' if cost < 0.03 else 'MISS'}, target < 3%)")
    print(f"{'control: no-op listener':34} {med(control):>12,.0f} records/s   'cost' {med(noise):+.1%} "
          f"(per round {min(noise):+.0%} to {max(noise):+.0%}: the noise between identical setups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
