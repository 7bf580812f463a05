"""Exactly-once sinks: an atomic file sink, a transactional Kafka sink and a ledger for foreachBatch.

See docs/sinks.md. ``register_sinks(spark)`` makes the data-source sinks available in a session
(the job runtime calls it); the Kafka sink is ``writeStream.format("ckpt-kafka")`` and comes with
the source's registration.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError

#: Spark's local properties of a streaming batch: set in every task and in the foreachBatch thread.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def register_sinks(spark: Any) -> None:
    """Register ``ckpt-files`` (and ``ckpt-kafka``, reader and transactional writer) in ``spark``."""
    from airflow_ckpt_provider.kafka.source import register
    from airflow_ckpt_provider.sinks.files import CkptFilesDataSource

    register(spark)
    spark.dataSource.register(CkptFilesDataSource)


#: The sinks that are Python data sources: Spark 4.3 runs them in append mode only.
APPEND_ONLY = ("ckpt-files", "ckpt-kafka")


def output_mode(writer: Any) -> tuple[str | None, str | None]:
    """(format, output mode) of a DataStreamWriter, read from its JVM object; (None, None) if that fails.

    pyspark has no getter for either; the classic DataStreamWriter keeps them in private fields.
    """
    try:
        jwriter = writer._jwrite
        values = []
        for name in ("source", "outputMode"):
            field = jwriter.getClass().getDeclaredField(name)
            field.setAccessible(True)
            values.append(str(field.get(jwriter)))
        return values[0], values[1]
    except Exception:  # Spark Connect, another Spark version: the sink's own check still applies
        return None, None


def check_output_mode(writer: Any) -> None:
    """Refuse update or complete mode for the ckpt sinks when the query is defined, not at its first batch.

    Spark refuses them for every Python data source sink, but only when the first batch is planned,
    with a long Java stack trace ("requirement failed: ckpt-files does not support Update mode").
    """
    source, mode = output_mode(writer)
    if source in APPEND_ONLY and mode is not None and mode.lower() != "append":
        raise ConfigError(
            f"the {source} sink supports the append output mode only, found outputMode({mode.lower()!r}): Spark "
            "4.3 runs Python data source sinks in append mode. Use outputMode('append') (with a watermark for "
            "aggregations), or write the changed rows with foreachBatch and the ledger"
        )


def worker_logging() -> None:
    """Let the sinks' commit and replay lines reach stderr from Spark's Python workers, which configure no
    logging (a batch's commit runs in a fresh worker whose root logger drops INFO)."""
    sinks = logging.getLogger("airflow_ckpt_provider.sinks")
    if logging.getLogger().handlers or sinks.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    sinks.addHandler(handler)
    sinks.setLevel(logging.INFO)
    sinks.propagate = False
