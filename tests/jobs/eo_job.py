"""The exactly-once proof's job: one row per record id over a ckpt-kafka topic, into one exactly-once sink.

Every id arrives twice (tests/support/exactlyonce.py produces each one twice, at different times), and
``dropDuplicates(["id"])`` keeps the first: its state must survive every kill, or the second copy
would be written as well. Each output row is ``(id, key, part)``: the id (the record's value), the
record's key and its Kafka partition, so the output is known whatever the batch boundaries were.

Configured by environment variables (they travel through spark-submit to the driver and its workers):
CKPT_TEST_TOPIC, CKPT_TEST_BOOTSTRAP, CKPT_TEST_MAX_OFFSETS (records per batch), and CKPT_EO_SINK:

- ``files``: ``format("ckpt-files")`` at CKPT_EO_PATH (a directory or s3://bucket/prefix);
- ``kafka``: ``format("ckpt-kafka")`` into topic CKPT_EO_TOPIC, key = the key, value = JSON ``{"id", "part"}``
  (option commitAfterSnapshot from CKPT_EO_COMMIT_AFTER_SNAPSHOT when set);
- ``ledger``: foreachBatch through the Ledger (fenced by the lease and by the ledger's own fence) into table
  ``eo_out`` of the SQLite file CKPT_EO_DB, or of the PostgreSQL database CKPT_EO_DSN (a libpq DSN) when that is
  set, with the batch's query id and batch id on every row.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from airflow_ckpt_provider.core.policy.streambatch import QUERY_ID_PROPERTY
from airflow_ckpt_provider.runtime import JobContext, streaming_job

OUT_TABLE = "eo_out"
LEDGER_TABLE = "ckpt_ledger"


def connect_sqlite(path: str) -> sqlite3.Connection:
    """The output database: a SQLite file; the timeout rides out the test reading it meanwhile."""
    return sqlite3.connect(path, timeout=30)


def connect_postgres(dsn: str) -> Any:
    """The output database: PostgreSQL (psycopg 3, a transaction per connection until commit)."""
    import psycopg

    return psycopg.connect(dsn)


#: The output table, no unique key: a duplicate would show as a second row, not as an error.
OUT_DDL = (f"CREATE TABLE IF NOT EXISTS {OUT_TABLE} (id BIGINT NOT NULL, key TEXT NOT NULL, part INTEGER NOT NULL, "
           "query_id TEXT NOT NULL, batch_id BIGINT NOT NULL)")


def create_out_table(connect: Any) -> None:
    conn = connect()
    try:
        conn.cursor().execute(OUT_DDL)
        conn.commit()
    finally:
        conn.close()


@streaming_job
def build(spark: Any, ctx: JobContext) -> Any:
    records = (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", os.environ["CKPT_TEST_BOOTSTRAP"])
        .option("subscribe", os.environ["CKPT_TEST_TOPIC"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("CKPT_TEST_MAX_OFFSETS", "100"))
        .load()
    )
    rows = records.selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS id", "CAST(key AS STRING) AS key",
                              "partition AS part").dropDuplicates(["id"])
    sink = os.environ["CKPT_EO_SINK"]
    if sink == "files":
        return (rows.writeStream.format("ckpt-files").outputMode("append")
                .option("path", os.environ["CKPT_EO_PATH"]).option("job", ctx.job))
    if sink == "kafka":
        from airflow_ckpt_provider.kafka.writer import kafka_sink

        # Keyed records: Kafka's partitioner spreads every sink partition over every Kafka partition, so the
        # sink partitions' transactions overlap, as in users' jobs.
        out = rows.selectExpr("CAST(key AS BINARY) AS key", "to_json(named_struct('id', id, 'part', part)) AS value")
        after = os.environ.get("CKPT_EO_COMMIT_AFTER_SNAPSHOT")  # bench/durable_plans_bench.py turns it off
        return kafka_sink(out, job=ctx.job, topic=os.environ["CKPT_EO_TOPIC"],
                          **{"kafka.bootstrap.servers": os.environ["CKPT_TEST_BOOTSTRAP"]},
                          **({"commitAfterSnapshot": after} if after else {})).outputMode("append")
    if sink == "ledger":
        from airflow_ckpt_provider.sinks.ledger import Ledger, delete_batches

        dsn = os.environ.get("CKPT_EO_DSN")
        connect: Any = ((lambda: connect_postgres(dsn)) if dsn
                        else (lambda: connect_sqlite(os.environ["CKPT_EO_DB"])))
        mark = "%s" if dsn else "?"
        create_out_table(connect)
        # Rows carry their query and batch ids, so a restore of an older savepoint can undo later batches.
        ledger = Ledger(connect=connect, job=ctx.job, table=LEDGER_TABLE, ctx=ctx,
                        undo=delete_batches(OUT_TABLE, paramstyle="format" if dsn else "qmark"))
        ledger.check()

        def write(cursor: Any, batch: Any, batch_id: int) -> int:
            # The query id with each row lets the test match every row to its ledger entry.
            query_id = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
            rows = [(r["id"], r["key"], r["part"], query_id, batch_id) for r in batch.collect()]
            cursor.executemany(f"INSERT INTO {OUT_TABLE} (id, key, part, query_id, batch_id) VALUES "
                               f"({', '.join([mark] * 5)})", rows)
            return len(rows)  # the ledger records it (rows_written)

        return rows.writeStream.outputMode("append").foreachBatch(ledger.foreach_batch(write))
    raise ValueError(f"CKPT_EO_SINK={sink!r}: expected files, kafka or ledger")
