"""Keep a streaming job alive: submit it (supervised, with a restart strategy), watch its health, restart it
from the latest completed checkpoint when it turns unhealthy, and apply snapshot retention.

Scheduled every 30 minutes: each run reconnects to the running job (it is never submitted twice), watches it
until the next run is due, and restarts it only if the watch saw it FAILED, silent (no heartbeat), restarting
too often or stuck without progress while data waits. Settings: the Airflow connections ``ckpt_store_default``
(job store) and ``ckpt_spark_default`` (Spark), and the Variable ``ckpt_orders_env`` (the job's settings:
ORDERS_BOOTSTRAP, ORDERS_TOPIC, ORDERS_OUT, ...).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.notifications.job import StreamingJobNotifier
from airflow_ckpt_provider.operators.job import SubmitStreamingJobOperator
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from airflow_ckpt_provider.operators.snapshot import DisposeSnapshotsOperator
from airflow_ckpt_provider.sensors.job_health import JobHealthSensor

JOB = os.environ.get("CKPT_EXAMPLE_JOB", "orders")
#: The job's code (tests on their hosts run other jobs with this DAG).
JOB_FILE = os.environ.get("CKPT_EXAMPLE_JOB_FILE", str(Path(examples.__file__).parent / "orders_v1.py"))
#: How long each run watches the job: the schedule's period (system tests shorten it).
WATCH = timedelta(seconds=float(os.environ.get("CKPT_EXAMPLE_WATCH_SECONDS", "1800")))

# [START howto_keep_alive]
with DAG(
    dag_id="ckpt_keep_alive",
    schedule=timedelta(minutes=30),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,  # env below renders to a dict
    tags=["ckpt", "example"],
    # A failed task (the submit, the restart) says which job, its state, its latest completed snapshot and what to
    # run; give `then=` any notifier (Slack's, SMTP's) whose text uses {{ ckpt_alert }} to send it there.
    default_args={"on_failure_callback": StreamingJobNotifier(job=JOB)},
) as dag:
    submit = SubmitStreamingJobOperator(
        task_id="submit",
        job=JOB,
        job_file=JOB_FILE,
        code_version="v1",
        restore="latest-state",
        env="{{ var.json.ckpt_orders_env }}",
        restart_strategy="exponential-delay",  # Flink's defaults: 1 s initial, x1.5, 1 min max
        max_restarts_in_window=5,
        health_window=600,
        checkpoint_interval=0,  # a checkpoint snapshot after every batch
        # A heartbeat every 5 s (the default is 30): the health watch below notices a lost host within a minute
        # instead of five, for about $3 a month more in store requests (docs/scale.md).
        heartbeat_interval=5,
        keep_checkpoints=3,
        savepoint_interval=600,  # a periodic savepoint every 10 minutes
        keep_savepoints=6,
        deferrable=True,  # waits in the triggerer (the default is Airflow's [operators] default_deferrable)
    )
    watch = JobHealthSensor(
        task_id="watch_health",
        job=JOB,
        expect="unhealthy",  # succeeds when the job turns unhealthy; otherwise times out and is skipped
        max_restarts=3,
        health_window=600,
        progress_timeout=300,
        # A poke every 30 s (the sensors' default is 10): one GET of status.json a poke while the job runs, so
        # 1,000 such watches cost the store 43 requests a second instead of 110 (docs/scale.md).
        poke_interval=30,
        timeout=WATCH.total_seconds(),
        soft_fail=True,
        deferrable=True,
    )
    restart = RestartStreamingJobOperator(task_id="restart", job=JOB, restore="latest-state", deferrable=True)
    retention = DisposeSnapshotsOperator(
        task_id="retention",
        job=JOB,
        keep_checkpoints=3,
        keep_savepoints=6,
        max_savepoint_age=7 * 24 * 3600,
        trigger_rule="none_failed",
    )
    submit >> watch >> restart >> retention
# [END howto_keep_alive]
