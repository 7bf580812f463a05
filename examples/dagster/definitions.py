"""Dagster Definitions mirroring the Airflow example DAGs (dags/): the same job (airflow_ckpt_provider/examples/
orders_v1.py) operated from Dagster over the same job store.

| Airflow DAG              | here                                                                             |
| ------------------------ | -------------------------------------------------------------------------------- |
| ckpt_keep_alive          | job ``ckpt_keep_alive`` every 30 min (submit or reconnect, retention) and sensor |
|                          | ``orders_health``: a run of ``ckpt_restart`` when the job turns unhealthy         |
| ckpt_savepoint_restore   | job ``ckpt_savepoint_restore``: savepoint, restart from it, wait until healthy    |
| ckpt_upgrade_job         | job ``ckpt_upgrade_job``: restore check, stop with savepoint, new code, verify,   |
|                          | roll back (the op ``upgrade_streaming_job``; edit its config in the launchpad)    |
| ckpt_on_savepoint        | sensor ``orders_savepoints``: a run of ``ckpt_on_savepoint`` per new savepoint,    |
|                          | and a materialization of the asset ``orders/savepoints``                          |
| ckpt_on_lag              | sensor ``ckpt_orders_lag``: a run of ``ckpt_on_lag`` each time the lag rises       |
| (asset)                  | ``orders/output``: one materialization per window of committed batches (sensor    |
|                          | ``orders_output``), checks ``fresh`` and ``lag``                                  |

Settings (the environment, read when the code location loads): ``CKPT_STORE`` (the job store URL),
``AWS_ENDPOINT_URL``/``AWS_REGION``/``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` for S3, ``CKPT_SPARK_MASTER``
(default local[2]), ``CKPT_EXAMPLE_JOB`` (default orders), ``CKPT_ORDERS_ENV`` (the job's settings as JSON:
ORDERS_BOOTSTRAP, ORDERS_TOPIC, ORDERS_OUT, ...), ``CKPT_EXAMPLE_GROUP`` and ``CKPT_EXAMPLE_BOOTSTRAP`` (the lag
sensor). Load it with ``dagster dev -f examples/dagster/definitions.py`` (docs/dagster.md).
"""

# No ``from __future__ import annotations``: Dagster reads the annotations of decorated functions (the context's
# type, config classes, resources) at definition time and does not resolve them from strings.
import json
import os
from pathlib import Path

import dagster as dg

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.dagster import (
    CKPT_RESOURCE,
    CkptResource,
    dispose_snapshots,
    job_health_sensor,
    job_output_asset,
    job_output_checks,
    job_output_sensor,
    kafka_lag_sensor,
    restart_from_snapshot,
    restart_streaming_job,
    snapshot_sensor,
    submit_streaming_job,
    trigger_savepoint,
    upgrade_streaming_job,
    wait_until_healthy,
)

JOB = os.environ.get("CKPT_EXAMPLE_JOB", "orders")
EXAMPLES = Path(examples.__file__).parent
JOB_FILE = str(EXAMPLES / "orders_v1.py")
GROUP = os.environ.get("CKPT_EXAMPLE_GROUP", "ckpt-orders")


def _env(name: str) -> str | None:
    """An optional setting as a dg.EnvVar (Dagster shows its name, never its value), None when unset."""
    return dg.EnvVar(name) if os.environ.get(name) else None


# [START dagster_resource]
ckpt = CkptResource(
    store_url=dg.EnvVar("CKPT_STORE"),
    endpoint_url=_env("AWS_ENDPOINT_URL"),
    region_name=_env("AWS_REGION"),
    access_key_id=_env("AWS_ACCESS_KEY_ID"),
    secret_access_key=_env("AWS_SECRET_ACCESS_KEY"),
    master=os.environ.get("CKPT_SPARK_MASTER", "local[2]"),
    spark_conf={"spark.sql.shuffle.partitions": "4"},
)
# [END dagster_resource]

# [START dagster_keep_alive]
keep_alive = dg.GraphDefinition(
    name="ckpt_keep_alive",
    node_defs=[submit_streaming_job, dispose_snapshots],
    dependencies={"dispose_snapshots": {"after": dg.DependencyDefinition("submit_streaming_job")}},
).to_job(config={"ops": {
    "submit_streaming_job": {"config": {
        "job": JOB, "job_file": JOB_FILE, "code_version": "v1", "restore": "latest-state",
        "env": json.loads(os.environ.get("CKPT_ORDERS_ENV", "{}")),
        "settings": {"restart_strategy": "exponential-delay", "max_restarts_in_window": "5",
                     "health_window": "600", "checkpoint_interval": "0", "keep_checkpoints": "3",
                     "savepoint_interval": "600", "keep_savepoints": "6"}}},
    "dispose_snapshots": {"config": {"job": JOB, "keep_checkpoints": 3, "keep_savepoints": 6,
                                     "max_savepoint_age": 7 * 24 * 3600}},
}})
every_30_minutes = dg.ScheduleDefinition(name="ckpt_keep_alive_every_30_min", job=keep_alive,
                                         cron_schedule="*/30 * * * *")
restart = dg.GraphDefinition(name="ckpt_restart", node_defs=[restart_streaming_job]).to_job(
    config={"ops": {"restart_streaming_job": {"config": {"job": JOB, "restore": "latest-state"}}}})
health = job_health_sensor(JOB, restart_job=restart)  # the keep-alive DAG's watch_health -> restart
# [END dagster_keep_alive]

# [START dagster_savepoint_restore]
savepoint_restore = dg.GraphDefinition(
    name="ckpt_savepoint_restore",
    node_defs=[trigger_savepoint, restart_from_snapshot, wait_until_healthy],
    dependencies={
        "restart_from_snapshot": {"snapshot": dg.DependencyDefinition("trigger_savepoint")},
        "wait_until_healthy": {"started": dg.DependencyDefinition("restart_from_snapshot")},
    },
).to_job(config={"ops": {
    "trigger_savepoint": {"config": {"job": JOB}},
    "restart_from_snapshot": {"config": {"job": JOB, "stop_mode": "cancel"}},
    "wait_until_healthy": {"config": {"job": JOB, "min_batches": 1, "timeout": 600}},
}})
# [END dagster_savepoint_restore]

# [START dagster_upgrade]
upgrade = dg.GraphDefinition(name="ckpt_upgrade_job", node_defs=[upgrade_streaming_job]).to_job(config={"ops": {
    "upgrade_streaming_job": {"config": {
        "job": JOB,
        "job_file": str(EXAMPLES / "orders_v2.py"),  # the new code
        "code_version": "v2",
        "upgrade_mode": "savepoint",  # or last-state, stateless
        "allow_non_restored_state": False,
        "verify_batches": 2,
        "partitions": None,  # a number: also rescale the state to that many partitions (savepoint mode, RocksDB)
        "verify_timeout": 300,
    }},
}})
# [END dagster_upgrade]


# [START dagster_on_savepoint]
savepoints = dg.AssetSpec(dg.AssetKey([JOB, "savepoints"]), group_name="ckpt",
                          description=f"The savepoints of job {JOB}: one materialization each")


@dg.op
def use_savepoint(context: dg.OpExecutionContext) -> dict[str, str]:
    """Copy it off-site, register it in a catalog, restore a test environment from it...: here, log it."""
    tags = context.run.tags
    context.log.info("savepoint %s of batch %s: %s", tags["ckpt/snapshot_id"], tags["ckpt/batch_id"], tags["ckpt/uri"])
    return {k: tags[f"ckpt/{k}"] for k in ("snapshot_id", "batch_id", "uri")}


on_savepoint = dg.GraphDefinition(name="ckpt_on_savepoint", node_defs=[use_savepoint]).to_job()
new_savepoints = snapshot_sensor(JOB, run_job=on_savepoint, asset_key=savepoints.key)
# [END dagster_on_savepoint]


# [START dagster_on_lag]
@dg.op
def react_to_lag(context: dg.OpExecutionContext) -> int:
    """Page someone, scale the job out, or pause a producer: here, log what was seen."""
    lag = int(context.run.tags["ckpt/total_lag"])
    context.log.warning("group %s is %d records behind", context.run.tags["ckpt/group"], lag)
    return lag


on_lag = dg.GraphDefinition(name="ckpt_on_lag", node_defs=[react_to_lag]).to_job()
lagging = kafka_lag_sensor(GROUP, threshold=10_000, rearm_below=1_000, run_job=on_lag,
                           bootstrap_servers=os.environ.get("CKPT_EXAMPLE_BOOTSTRAP", "127.0.0.1:9092"))
# [END dagster_on_lag]

# [START dagster_output_asset]
output = job_output_asset(JOB)
output_checks = job_output_checks(JOB, output, max_batch_age=600, max_lag=10_000)
output_windows = job_output_sensor(JOB, output)
# [END dagster_output_asset]

defs = dg.Definitions(
    assets=[output, savepoints],
    asset_checks=output_checks,
    jobs=[keep_alive, restart, savepoint_restore, upgrade, on_savepoint, on_lag],
    schedules=[every_30_minutes],
    sensors=[health, new_savepoints, lagging, output_windows],
    resources={CKPT_RESOURCE: ckpt},
)
