"""Batch events: what Spark's query listener hands the job driver's loop (runtime/driver.py).

Runs in the Spark driver's Python process. Listener calls must return quickly, so the listener only
puts a :class:`BatchEvent` on a queue: a batch completed (its end offsets, whether data waits), or a
trigger found no new data. pyspark is imported when the listener is built, not at module level.
"""

from __future__ import annotations

import json
import queue
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchEvent:
    """A batch completed; ``batch_id`` -1: a trigger found no new data (Spark's QueryIdleEvent)."""

    batch_id: int
    offsets: dict[str, Any]
    data_waiting: bool
    rows: int
    lag: int | None = None  # Kafka records between the batch's end offsets and the latest ones Spark saw


    @property
    def idle(self) -> bool:
        return self.batch_id < 0


class BatchListener:
    """Forwards batch progress to the driver loop (listener calls must return quickly)."""

    def __init__(self, events: queue.Queue[BatchEvent]) -> None:
        self.events = events

    def as_spark_listener(self) -> Any:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        events = self.events

        class Listener(StreamingQueryListener):
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
                    lags.append(records_behind(end, latest))
                lag = None if not lags or None in lags else sum(x for x in lags if x is not None)
                events.put(BatchEvent(int(p.batchId), offsets, waiting, int(p.numInputRows), lag))

            def onQueryIdle(self, event: Any) -> None:  # posted at most every noDataProgressEventInterval
                events.put(BatchEvent(-1, {}, False, 0))

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()


def records_behind(end: Any, latest: Any) -> int | None:
    """Records between Kafka-shaped end and latest offsets ({"topic": {"0": 42}}, as ckpt-kafka and Spark's
    Kafka source write them; other keys, like ckpt-kafka's commit group, are not topics); None when ``latest``
    names no topic. A partition missing from ``end`` counts from 0; an end beyond latest counts as caught up."""
    topics, done = _topics(latest), _topics(end)
    if not topics or not isinstance(end, dict):
        return None
    return sum(max(0, high - done.get(topic, {}).get(p, 0)) for topic, parts in topics.items()
               for p, high in parts.items())


def _topics(offsets: Any) -> dict[str, dict[str, int]]:
    if not isinstance(offsets, dict):
        return {}
    return {t: parts for t, parts in offsets.items() if isinstance(parts, dict) and parts
            and all(isinstance(o, int) and not isinstance(o, bool) for o in parts.values())}


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
