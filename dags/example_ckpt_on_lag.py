"""Scheduled on "the lag of job X above N": an asset event each time its consumer group falls behind.

The asset's watcher (``KafkaLagEventTrigger``) reads the group's lag in the triggerer every 30 s and fires once
when the total lag rises above the threshold; it re-arms when the lag is back below ``rearm_below``, so a
lasting lag is one event, not one per poll. Brokers come from the ``kafka`` connection ``kafka_default``
(host ``host:port``, extra: librdkafka settings); the job commits its offsets to ``CKPT_EXAMPLE_GROUP``
(default ``ckpt-orders``, the example job's ``ORDERS_GROUP``). Unpause the DAG to start the watcher.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_ckpt_provider.triggers.events import KafkaLagEventTrigger

JOB = os.environ.get("CKPT_EXAMPLE_JOB", "orders")
GROUP = os.environ.get("CKPT_EXAMPLE_GROUP", "ckpt-orders")
log = logging.getLogger(__name__)

# [START howto_on_lag]
lagging = Asset(
    f"ckpt://ckpt_store_default/{JOB}/kafka-lag-above-10000",
    watchers=[AssetWatcher(
        name=f"{JOB}_lag_above_10000",
        trigger=KafkaLagEventTrigger(group=GROUP, threshold=10_000, rearm_below=1_000, kafka_conn_id="kafka_default"),
    )],
)

with DAG(
    dag_id="ckpt_on_lag",
    schedule=[lagging],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["ckpt", "example"],
) as dag:

    @task
    def react_to_lag(*, triggering_asset_events: Any = None) -> list[int]:
        """Page someone, scale the job out, or pause a producer: here, log what was seen."""
        seen = []
        for event in triggering_asset_events[lagging]:
            lag = event.extra["payload"]
            log.warning("group %s is %d records behind (threshold %d)", lag["group"], lag["total_lag"],
                        lag["threshold"])
            seen.append(lag["total_lag"])
        return seen

    react_to_lag()
# [END howto_on_lag]
