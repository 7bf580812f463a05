"""A test job per kind of state, for rescaling through savepoints (tests/integration/test_rescale_kinds.py).

Every record of the ckpt-kafka topic is a JSON object ``{"side", "id", "k", "ref", "v", "t"}`` (t: the event
time in epoch seconds, so the query is deterministic: no processing time anywhere). CKPT_KINDS_KIND picks the
query; each writes ``format("ckpt-files")`` (append) at CKPT_KINDS_SINK:

- ``agg_dedup``: ``dropDuplicates(["id"])`` then a count per (1-minute event-time window, k) under a 2-minute
  watermark: two stateful operators (``dedupe``, ``stateStoreSave``); a window's row is written once, with its
  final count, when the watermark passes its end. Rows ``(window_start, k, count)``.
- ``join``: a stream-stream inner join of the topic's ``L`` records (orders: id, k) with its ``R`` records
  (payments: id, ref = the order's id), both sides under a 2-minute watermark and matched within 10 minutes
  of event time (``symmetricHashJoin``: four state stores). Rows ``(lid, k, lt, rid, rt)``. Spark plans the
  self-join's source twice: the query has two ckpt-kafka sources over the same topic, each side reading it whole.
- ``tws``: Python ``transformWithState`` per k with a ValueState (the count of k's records), a ListState
  (every record id of k) and a MapState (v -> count); per batch one row per k that had records:
  ``(k, count, ids sorted, counts as sorted JSON)``. The rows of a batch are applied in id order, so the
  state after a batch does not depend on the order Spark hands them over.

CKPT_TEST_TOPIC, CKPT_TEST_BOOTSTRAP and CKPT_TEST_MAX_OFFSETS (records per batch) as in the other test jobs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job

KINDS = ("agg_dedup", "join", "tws")
RECORD = "side STRING, id BIGINT, k STRING, ref BIGINT, v STRING, t BIGINT"
WINDOW = "1 minute"
DELAY = "2 minutes"
JOIN_RANGE = "10 minutes"
TWS_OUTPUT = "k STRING, count BIGINT, ids ARRAY<BIGINT>, counts STRING"


def count_list_map() -> Any:
    """A StatefulProcessor per key: a ValueState count, a ListState of every id, a MapState v -> count; one row
    per batch (defined here: pyspark is imported when the query is built, not when the job file loads)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class CountListMap(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n BIGINT")
            self.ids = handle.getListState("ids", "id BIGINT")
            self.counts = handle.getMapState("counts", "v STRING", "n BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            import json

            from pyspark.sql import Row

            new = sorted((int(r["id"]), str(r["v"])) for r in rows)
            found = self.count.get() if self.count.exists() else None
            count = (int(found[0]) if found else 0) + len(new)
            self.count.update((count,))
            self.ids.appendList([(i,) for i, _ in new])
            counts = {str(v): int(n) for (v,), (n,) in self.counts.iterator()}
            for _, v in new:
                counts[v] = counts.get(v, 0) + 1
            for v in {v for _, v in new}:
                self.counts.updateValue((v,), (counts[v],))
            ids = sorted(int(i) for (i,) in self.ids.get())
            yield Row(k=key[0], count=count, ids=ids, counts=json.dumps(counts, sort_keys=True))

        def close(self) -> None:
            pass

    return CountListMap()


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    from pyspark.sql import functions as F

    kind = os.environ["CKPT_KINDS_KIND"]
    records = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", os.environ["CKPT_TEST_BOOTSTRAP"])
        .option("subscribe", os.environ["CKPT_TEST_TOPIC"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("CKPT_TEST_MAX_OFFSETS", "100"))
        .load()
    )
    events = (records.select(F.from_json(F.col("value").cast("string"), RECORD).alias("e")).select("e.*")
              .withColumn("ts", F.timestamp_seconds("t")))
    if kind == "agg_dedup":
        out = (events.withWatermark("ts", DELAY).dropDuplicates(["id"])
               .groupBy(F.window("ts", WINDOW), "k").count()
               .selectExpr("CAST(window.start AS BIGINT) AS window_start", "k", "count"))
    elif kind == "join":
        orders = events.where("side = 'L'").selectExpr("id AS lid", "k", "ts AS lts").withWatermark("lts", DELAY)
        payments = events.where("side = 'R'").selectExpr("id AS rid", "ref", "ts AS rts").withWatermark("rts", DELAY)
        out = (orders.join(payments, F.expr(f"ref = lid AND rts BETWEEN lts - INTERVAL {JOIN_RANGE} AND "
                                            f"lts + INTERVAL {JOIN_RANGE}"), "inner")
               .selectExpr("lid", "k", "CAST(lts AS BIGINT) AS lt", "rid", "CAST(rts AS BIGINT) AS rt"))
    elif kind == "tws":
        out = (events.select("k", "id", "v").groupBy("k")
               .transformWithState(count_list_map(), TWS_OUTPUT, "Append", "None"))
    else:
        raise ValueError(f"CKPT_KINDS_KIND={kind!r}: expected one of {', '.join(KINDS)}")
    return (out.writeStream.format("ckpt-files").outputMode("append")
            .option("path", os.environ["CKPT_KINDS_SINK"]).option("job", ctx.job))
