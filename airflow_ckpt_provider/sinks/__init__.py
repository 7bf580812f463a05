"""Exactly-once sinks: the atomic ``ckpt-files`` file sink and the ledger for foreachBatch.

See docs/sinks.md. The transactional Kafka writer lives with the ckpt-kafka source in
``airflow_ckpt_provider.kafka.writer``; ``runtime.datasources.register_data_sources(spark)`` registers
both (the job runtime calls it).
"""

from __future__ import annotations

from airflow_ckpt_provider.core.policy.streambatch import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY

__all__ = ["BATCH_ID_PROPERTY", "QUERY_ID_PROPERTY"]
