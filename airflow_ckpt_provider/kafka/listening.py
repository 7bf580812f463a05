"""A StreamingQueryListener whose progress events cross py4j once, as Spark's JSON of the progress.

pyspark builds the QueryProgressEvent it hands a Python listener field by field through py4j
(``StreamingQueryProgress.fromJObject``): a call into the JVM for each field of the progress, of each source and
state operator, for each entry of its maps, and a converted Java exception at the end of each map it iterates.
For the counting test job that was ~0.1 s of the driver's CPU per event on the slower 2-core VM, paid again by
each Python listener of the session (the driver's batch listener and the ckpt-kafka commit router), on Spark's
listener thread. Spark's JSON of the same progress (``StreamingQueryProgress.json``, what Spark Connect sends
its listeners) is one call, and pyspark parses it into the same classes (``fromJson``). The event differs only
in a source's offsets, which are the same JSON value serialized again by Python (other spacing), and in
observed metrics, whose rows pyspark's parser keeps flat.
"""

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
