"""Exactly-once sinks: an atomic file sink, a transactional Kafka sink and a ledger for foreachBatch.

See docs/sinks.md. ``register_sinks(spark)`` makes the data-source sinks available in a session
(the job runtime calls it); the Kafka sink is ``writeStream.format("ckpt-kafka")`` and comes with
the source's registration.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

#: Spark's local properties of a streaming batch: set in every task and in the foreachBatch thread.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def register_sinks(spark: Any) -> None:
    """Register ``ckpt-files`` (and ``ckpt-kafka``, reader and transactional writer) in ``spark``."""
    from airflow_ckpt_provider.kafka.source import register
    from airflow_ckpt_provider.sinks.files import CkptFilesDataSource

    register(spark)
    spark.dataSource.register(CkptFilesDataSource)


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
