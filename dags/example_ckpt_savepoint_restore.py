"""On-demand savepoint, and restore from a chosen savepoint (Flink's ``savepoint`` and ``run -s``).

Triggered by hand: takes a savepoint of the running job; with ``restore_from`` set, restarts the job from
that snapshot (an older one is time travel: the job replays from its offsets), else from the savepoint just
taken; then waits until the restored job makes progress.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from airflow_ckpt_provider.operators.snapshot import TriggerSavepointOperator
from airflow_ckpt_provider.sensors.job_health import JobHealthSensor

# [START howto_savepoint_restore]
with DAG(
    dag_id="ckpt_savepoint_restore",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "job": Param("orders", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"),
        "restore_from": Param("", type="string",
                              description="A snapshot id or URI to restore; empty: the savepoint taken by this run"),
    },
    tags=["ckpt", "example"],
) as dag:
    # deferrable: the waits run in the triggerer (the default is Airflow's [operators] default_deferrable)
    savepoint = TriggerSavepointOperator(task_id="savepoint", job="{{ params.job }}", deferrable=True)
    restore = RestartStreamingJobOperator(
        task_id="restore",
        job="{{ params.job }}",
        restore="{{ params.restore_from or ti.xcom_pull(task_ids='savepoint')['snapshot_id'] }}",
        stop_mode="cancel",
        deferrable=True,
    )
    verify = JobHealthSensor(task_id="verify", job="{{ params.job }}", expect="healthy", min_batches=1,
                             timeout=600, deferrable=True)
    savepoint >> restore >> verify
# [END howto_savepoint_restore]
