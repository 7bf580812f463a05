"""A StreamingQueryListener whose progress events cross py4j once, as Spark's JSON of the progress.

Design notes: docs/kafka.md#design-notes-kafkalisteningpy."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent, StreamingQueryListener


class _ProgressAsJson(JStreamingQueryListener):
    """The Java side's Python peer (pyspark's, which converts every event): progress events come as JSON."""

    def onQueryProgress(self, jevent: Any) -> None:
        progress = json.loads(jevent.progress().json())
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress}))


class ProgressListener(StreamingQueryListener):
    """Register with ``spark.streams.addListener`` as any listener; its ``onQueryProgress`` gets the event parsed
    from Spark's JSON (the module docstring). Started, idle and terminated events come as pyspark makes them."""

    @property
    def _jlistener(self) -> Any:  # pyspark's hook: the Java listener that addListener registers
        found = getattr(self, "_jlistenerobj", None)
        if found is None:
            from pyspark import SparkContext

            jvm = SparkContext._jvm
            assert jvm is not None, "a listener is registered on a running session"
            found = self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
        return found
