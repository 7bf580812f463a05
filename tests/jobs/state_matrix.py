"""One query holding every stateful operator, for the state matrix (tests/support/statematrixrun.py).

Every record of the ckpt-kafka topic is a JSON object ``{"id", "k", "sk", "ref", "dup", "t"}`` (t: event time in
epoch seconds; no processing time reaches the output, so it does not depend on where batches end). The query is
the union of one branch per operator, each writing rows ``(op, key, value)`` into ``format("ckpt-files")``
(append) at CKPT_MATRIX_SINK, all under one 5-minute watermark:

- ``dedup``: ``dropDuplicates(["id"])`` over every record (``dup`` ones repeat an earlier id): each id once;
- ``dedup_ww``: ``dropDuplicatesWithinWatermark(["id"])``: each id once;
- ``window``: a count per (1-minute window, k), written when the watermark closes the window;
- ``session``: a count per (session window of ``sk``, 45 s gap), written when the watermark closes it;
- ``join``: a stream-stream inner join of orders (``ref`` null) and payments (``ref``: an order's id) within
  10 minutes of event time: every (order, payment) pair once;
- ``pandas_state``: ``applyInPandasWithState`` per k: count and id sum, written at its event-time timeout;
- ``tws_pandas``: ``transformWithStateInPandas`` per k: a ValueState count, written at an event-time timer;
- ``tws_rows``: ``transformWithState`` per k in processing time: a ListState of ids and a MapState sk -> count
  (with a one-day TTL, which never expires here), written with the key's ``last`` record (Spark allows TTL in
  processing time only, where timers would depend on the clock).

Every key's timeout and timers stay 10 minutes ahead of its latest record; only the last record (``k`` =
"flush", a day later) moves the watermark past them and past every window and session. ``dup`` records feed
the two dedup branches only.

CKPT_MATRIX_VARIANT: ``v1`` (default); ``v2`` a compatible upgrade (a stateless filter keeping every record);
``incompatible`` dedups on (id, k), a state schema Spark cannot restore.
CKPT_TEST_TOPIC, CKPT_TEST_BOOTSTRAP and CKPT_TEST_MAX_OFFSETS (records per batch) as in the other test jobs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from airflow_ckpt_provider.runtime import JobContext, streaming_job

RECORD = "id BIGINT, k STRING, sk STRING, ref BIGINT, dup BOOLEAN, last BOOLEAN, t BIGINT"
OUTPUT = "op STRING, key STRING, value STRING"
DELAY = "5 minutes"
AHEAD_MS = 600_000  # timeouts and timers: 10 minutes after the key's latest record
TTL_MS = 86_400_000
VARIANTS = ("v1", "v2", "incompatible")


def tws_pandas_processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class CountAtTimer(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "n BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            frames = list(rows)
            n = sum(len(f) for f in frames)
            latest = max(int(f["t"].max()) for f in frames) * 1000
            found = self.count.get() if self.count.exists() else None
            self.count.update(((int(found[0]) if found else 0) + n,))
            for timer in list(self.handle.listTimers()):
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(latest + AHEAD_MS)
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            import pandas as pd

            found = self.count.get() if self.count.exists() else None
            self.count.clear()
            yield pd.DataFrame({"op": ["tws_pandas"], "key": [key[0]], "value": [str(found[0] if found else 0)]})

        def close(self) -> None:
            pass

    return CountAtTimer()


def tws_rows_processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class ListMapAtLast(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.ids = handle.getListState("ids", "id BIGINT")
            self.sessions = handle.getMapState("sessions", "sk STRING", "n BIGINT", TTL_MS)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            read = list(rows)
            self.ids.appendList([(int(r["id"]),) for r in read])
            for sk in sorted({str(r["sk"]) for r in read}):
                found = self.sessions.getValue((sk,)) if self.sessions.containsKey((sk,)) else None
                self.sessions.updateValue((sk,), ((int(found[0]) if found else 0) + sum(r["sk"] == sk for r in read),))
            if not any(r["last"] for r in read):
                return
            import json

            from pyspark.sql import Row

            ids = sorted(int(i) for (i,) in self.ids.get())
            sessions = {str(sk): int(n) for (sk,), (n,) in self.sessions.iterator()}
            self.ids.clear()
            self.sessions.clear()
            yield Row(op="tws_rows", key=key[0], value=json.dumps({"ids": ids, "sk": sessions}, sort_keys=True))

        def close(self) -> None:
            pass

    return ListMapAtLast()


def count_and_sum(key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState: (count, id sum) per k; written and dropped at the event-time timeout."""
    import pandas as pd

    if state.hasTimedOut:
        count, total = state.get
        state.remove()
        yield pd.DataFrame({"op": ["pandas_state"], "key": [key[0]], "value": [f"{count} {total}"]})
        return
    count, total = state.get if state.exists else (0, 0)
    latest = 0
    for frame in frames:
        count += len(frame)
        total += int(frame["id"].sum())
        latest = max(latest, int(frame["t"].max()))
    state.update((count, total))
    state.setTimeoutTimestamp(latest * 1000 + AHEAD_MS)


def matrix(events: Any, variant: str) -> Any:
    """The union of every operator's branch over ``events`` (columns of RECORD and ``ts``)."""
    from pyspark.sql import functions as F

    if variant not in VARIANTS:
        raise ValueError(f"CKPT_MATRIX_VARIANT={variant!r}: expected one of {', '.join(VARIANTS)}")
    events = events.withWatermark("ts", DELAY)
    if variant == "v2":
        events = events.where("id >= -1")  # keeps every record: a compatible change of the code
    fresh = events.where("NOT dup")
    keyed = fresh.where("k <> 'flush'")
    dedup_keys = ["id", "k"] if variant == "incompatible" else ["id"]
    dedup = events.dropDuplicates(dedup_keys).selectExpr("'dedup' AS op", "CAST(id AS STRING) AS key", "'' AS value")
    dedup_ww = (events.dropDuplicatesWithinWatermark(["id"])
                .selectExpr("'dedup_ww' AS op", "CAST(id AS STRING) AS key", "'' AS value"))
    window = (fresh.groupBy(F.window("ts", "1 minute"), "k").count()
              .selectExpr("'window' AS op", "concat(CAST(CAST(window.start AS BIGINT) AS STRING), ' ', k) AS key",
                          "CAST(count AS STRING) AS value"))
    session = (fresh.groupBy(F.session_window("ts", "45 seconds"), "sk").count()
               .selectExpr("'session' AS op",
                           "concat(CAST(CAST(session_window.start AS BIGINT) AS STRING), ' ', sk) AS key",
                           "concat(CAST(CAST(session_window.end AS BIGINT) AS STRING), ' ', CAST(count AS STRING)) "
                           "AS value"))
    orders = fresh.where("ref IS NULL AND k <> 'flush'").selectExpr("id AS lid", "ts AS lts")
    payments = fresh.where("ref IS NOT NULL").selectExpr("id AS rid", "ref", "ts AS rts")
    join = (orders.join(payments, F.expr("ref = lid AND rts BETWEEN lts - INTERVAL 10 minutes AND "
                                         "lts + INTERVAL 10 minutes"), "inner")
            .selectExpr("'join' AS op", "concat(CAST(lid AS STRING), ' ', CAST(rid AS STRING)) AS key",
                        "'' AS value"))
    pandas_state = (keyed.select("k", "id", "t", "ts").groupBy("k")
                    .applyInPandasWithState(count_and_sum, OUTPUT, "count BIGINT, total BIGINT", "append",
                                            "EventTimeTimeout"))
    tws_pandas = (keyed.select("k", "t", "ts").groupBy("k")
                  .transformWithStateInPandas(tws_pandas_processor(), OUTPUT, "Append", "EventTime"))
    tws_rows = (keyed.select("k", "id", "sk", "last").groupBy("k")
                .transformWithState(tws_rows_processor(), OUTPUT, "Append", "ProcessingTime"))
    return (dedup.unionByName(dedup_ww).unionByName(window).unionByName(session).unionByName(join)
            .unionByName(pandas_state).unionByName(tws_pandas).unionByName(tws_rows))


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    from pyspark.sql import functions as F

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
    out = matrix(events, os.environ.get("CKPT_MATRIX_VARIANT", "v1"))
    return (out.writeStream.format("ckpt-files").outputMode("append")
            .option("path", os.environ["CKPT_MATRIX_SINK"]).option("job", ctx.job))
