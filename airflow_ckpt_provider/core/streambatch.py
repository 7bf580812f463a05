"""What code in a streaming batch can learn about it, and how it logs from Spark's Python workers.

Spark sets these local properties in every task of a micro-batch and in the foreachBatch thread;
the exactly-once sinks key their commits by them. No pyspark import.
"""

from __future__ import annotations

import logging
import sys

#: Spark's local properties of a streaming batch: set in every task and in the foreachBatch thread.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

#: The loggers whose commit and replay lines must reach the worker's stderr.
_WORKER_LOGGERS = ("airflow_ckpt_provider.sinks", "airflow_ckpt_provider.kafka")


def worker_logging() -> None:
    """Let the sinks' commit and replay lines reach stderr from Spark's Python workers, which configure no
    logging (a batch's commit runs in a fresh worker whose root logger drops INFO)."""
    if logging.getLogger().handlers:
        return
    for name in _WORKER_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
