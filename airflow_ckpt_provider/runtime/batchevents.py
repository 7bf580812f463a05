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
    seconds: float | None = None  # the batch's duration (Spark's triggerExecution)
    rows_per_second: float | None = None  # Spark's processedRowsPerSecond
    state_rows: int | None = None  # rows in the query's state stores (None: a stateless query)
    state_bytes: int | None = None  # memory the state stores used

    @property
    def idle(self) -> bool:
        return self.batch_id < 0


class BatchListener:
    """Forwards batch progress to the driver loop (listener calls must return quickly)."""

    def __init__(self, events: queue.Queue[BatchEvent]) -> None:
        self.events = events

    def as_spark_listener(self) -> Any:
        from airflow_ckpt_provider.kafka.listening import ProgressListener  # imports pyspark

        events = self.events

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
                events.put(BatchEvent(int(p.batchId), offsets, waiting, int(p.numInputRows), lag, **_measures(p)))

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
