"""What the orders example jobs share: the source, the state (totals per customer), the batch files.

Settings come from the environment (they travel through spark-submit to the driver):
ORDERS_BOOTSTRAP, ORDERS_TOPIC, ORDERS_OUT, ORDERS_GROUP (default ``ckpt-orders``),
ORDERS_MAX_PER_BATCH (default 500). A record is one order: key = customer, value = amount.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_orders(spark: Any) -> Any:
    """The orders stream as (customer, amount) from the ``ckpt-kafka`` source.

    Offsets live in the checkpoint; they are committed to the consumer group ``ORDERS_GROUP`` only
    after a batch completes, for lag monitoring.
    """
    return (
        spark.readStream.format("ckpt-kafka")
        .option("kafka.bootstrap.servers", os.environ["ORDERS_BOOTSTRAP"])
        .option("subscribe", os.environ["ORDERS_TOPIC"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", os.environ.get("ORDERS_MAX_PER_BATCH", "500"))
        .option("commitGroupId", os.environ.get("ORDERS_GROUP", "ckpt-orders"))
        .load()
        .selectExpr("CAST(key AS STRING) AS customer", "CAST(CAST(value AS STRING) AS INT) AS amount")
    )


def order_totals(orders: Any) -> Any:
    """The job's state: orders and revenue per customer (a streaming aggregation keyed by customer).

    Any version that keeps this exact grouping and these aggregates restores the others' state.
    """
    return (
        orders.groupBy("customer").agg({"*": "count", "amount": "sum"})
        .withColumnRenamed("count(1)", "orders").withColumnRenamed("sum(amount)", "revenue")
    )


def output_dir() -> Path:
    out = Path(os.environ["ORDERS_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_rows(out: Path, batch_id: int, rows: list[Any]) -> None:
    """Replace ``batch-<id>.json`` (idempotent on replay): write aside, then rename into place."""
    tmp = out / f".batch-{batch_id:06d}.json.tmp"
    tmp.write_text(json.dumps(rows))
    tmp.replace(out / f"batch-{batch_id:06d}.json")


def read_totals(out: Path) -> dict[str, tuple[int, int]]:
    """Each customer's (orders, revenue) in the newest batch file that updated it (update mode).

    Reads the rows of every version: v1's ``[customer, orders, revenue]`` and v2's objects.
    """
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(out.glob("batch-*.json")):
        for row in json.loads(path.read_text()):
            if isinstance(row, dict):
                found[row["customer"]] = (int(row["orders"]), int(row["revenue"]))
            else:
                found[row[0]] = (int(row[1]), int(row[2]))
    return found
