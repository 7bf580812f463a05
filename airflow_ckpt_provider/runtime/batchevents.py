"""Batch events: what Spark's query listener hands the job driver's loop (runtime/driver.py).

Runs in the Spark driver's Python process. Listener calls must return quickly, so the listener only
puts a :class:`BatchEvent` on a queue: a batch completed (its end offsets, whether data waits), or a
trigger found no new data. pyspark is imported when the listener is built, not at module level.
"""

from __future__ import annotations

import json
import math
import queue
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.kafka.offsets import kafka_offsets_or_none


@dataclass(frozen=True)
class BatchEvent:
    """A batch completed; ``batch_id`` -1: a trigger found no new data (Spark's QueryIdleEvent)."""

    batch_id: int
    offsets: dict[str, Any]
    data_waiting: bool
    rows: int
    lag: int | None = None  # Kafka records between the batch's end offsets and the latest ones Spark saw
    lag_seconds: float | None = None  # how long ago the oldest record of those arrived (``LagClock``)
    seconds: float | None = None  # the batch's duration (Spark's triggerExecution)
    rows_per_second: float | None = None  # Spark's processedRowsPerSecond
    state_rows: int | None = None  # rows in the query's state stores (None: a stateless query)
    state_bytes: int | None = None  # memory the state stores used

    @property
    def idle(self) -> bool:
        return self.batch_id < 0


class BatchListener:
    """Forwards batch progress to the driver loop (listener calls must return quickly)."""

    def __init__(self, events: queue.Queue[BatchEvent], clock: Callable[[], float] = time.time) -> None:
        self.events = events
        self.lag_clock = LagClock()
        self.clock = clock

    def as_spark_listener(self) -> Any:
        from airflow_ckpt_provider.kafka.listening import ProgressListener  # imports pyspark

        events, lag_clock, clock = self.events, self.lag_clock, self.clock

        class Listener(ProgressListener):  # each progress event crosses py4j once, as JSON
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                offsets, waiting, lags = {}, False, []
                for i, s in enumerate(p.sources):
                    end = _json(s.endOffset)
                    offsets[_source_name(i, s.description)] = end
                    latest = _json(s.latestOffset)
                    waiting = waiting or (latest is not None and latest != end)
                    lags.append(records_behind(s.endOffset, s.latestOffset))
                lag = None if not lags or None in lags else sum(x for x in lags if x is not None)
                seconds = lag_clock.observe(clock(), [(s.endOffset, s.latestOffset) for s in p.sources])
                events.put(BatchEvent(int(p.batchId), offsets, waiting, int(p.numInputRows), lag,
                                      lag_seconds=seconds, **_measures(p)))

            def onQueryIdle(self, event: Any) -> None:  # posted at most every noDataProgressEventInterval
                events.put(BatchEvent(-1, {}, False, 0))

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()


def _measures(progress: Any) -> dict[str, Any]:
    """The batch's duration, rate and state size from its progress (runtime/metrics.py)."""
    took = (progress.durationMs or {}).get("triggerExecution")
    rate = progress.processedRowsPerSecond
    operators = progress.stateOperators or []
    return {"seconds": None if took is None else took / 1000.0,
            "rows_per_second": None if rate is None or math.isnan(rate) else float(rate),  # NaN: an empty batch
            "state_rows": sum(int(op.numRowsTotal) for op in operators) if operators else None,
            "state_bytes": sum(int(op.memoryUsedBytes) for op in operators) if operators else None}


def records_behind(end: str | None, latest: str | None) -> int | None:
    """Records between a source's end and latest offsets as query progress gives them (JSON texts), when both
    are Kafka-shaped (kafka/offsets.kafka_offsets_or_none: ckpt-kafka's and Spark's Kafka source's); None
    otherwise. A partition missing from ``end`` counts from 0; an end beyond latest counts as caught up."""
    done, topics = kafka_offsets_or_none(end), kafka_offsets_or_none(latest)
    if done is None or topics is None:
        return None
    return sum(max(0, high - done.get(topic, {}).get(p, 0)) for topic, parts in topics.items()
               for p, high in parts.items())


Partition = tuple[str, int]


class LagClock:
    """How many seconds a query is behind its Kafka sources: for each partition, how long ago the first record after
    the batch's end offset arrived, i.e. when the latest offset Spark saw first passed that end offset. The time is
    interpolated between the latest offsets seen at successive batches, as kafka-lag-exporter estimates a consumer
    group's time lag; the precision is the time between batches. A lag older than every observation kept (the
    driver started behind) is a lower bound: the age of the oldest observation. None where a source is not Kafka.
    """

    KEPT = 4096  # observations at most (the oldest that still anchors the lag is always kept)

    def __init__(self) -> None:
        self._seen: deque[tuple[float, dict[Partition, int]]] = deque()

    def observe(self, at: float, sources: list[tuple[str | None, str | None]]) -> float | None:
        """The lag after a batch whose sources ended at, and saw as latest, these offsets (query progress' JSON)."""
        end: dict[Partition, int] = {}
        latest: dict[Partition, int] = {}
        for done_text, latest_text in sources:
            done, top = kafka_offsets_or_none(done_text), kafka_offsets_or_none(latest_text)
            if done is None or top is None:
                return None
            latest.update(((t, p), o) for t, parts in top.items() for p, o in parts.items())
            end.update(((t, p), o) for t, parts in done.items() for p, o in parts.items())
        self._seen.append((at, latest))
        # The observations before the newest one at or below every end offset anchor nothing any more.
        while len(self._seen) > 1 and all(o <= end.get(k, 0) for k, o in self._seen[1][1].items()):
            self._seen.popleft()
        while len(self._seen) > self.KEPT:
            self._seen.popleft()
        return max((at - self._arrived(k, end.get(k, 0)) for k, high in latest.items() if high > end.get(k, 0)),
                   default=0.0)

    def _arrived(self, key: Partition, offset: int) -> float:
        """When the record at ``offset`` of ``key`` arrived: between the last observation whose latest offset was at
        or below it and the first beyond it (the oldest observation if none was at or below it)."""
        before: tuple[float, int] | None = None
        for at, latest in self._seen:
            high = latest.get(key, 0)
            if high > offset:
                if before is None:
                    return at
                t0, o0 = before
                return t0 + (at - t0) * (offset + 1 - o0) / (high - o0)  # it exists once latest > offset
            before = (at, high)
        return self._seen[-1][0]  # not reached: caught up (not called then)


def _source_name(index: int, description: str) -> str:
    """A stable name for a source: Spark's description without the JVM object hash."""
    return f"{index}:{re.sub(r'@[0-9a-f]+$', '', description).rsplit('.', 1)[-1]}"


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
