"""Upgrade a streaming job from the UI: trigger with the job, the new code and the upgrade mode.

The Params are validated by Airflow before the run is created (a bad upgrade mode never reaches the job);
the operator then checks, BEFORE stopping anything, that Spark can restore the job's current state with the
new code, stops the old job with a savepoint, starts the new code from it, verifies progress and rolls back
to the old code and the same savepoint if the new code fails. With "partitions" set, the same run also
rescales the job's state to that many partitions (Spark's offline repartition of the savepoint, on a copy;
RocksDB state only); the rollback then also goes back to the old partitions.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.operators.upgrade import UpgradeStreamingJobOperator

EXAMPLES = Path(examples.__file__).parent

# [START howto_upgrade]
with DAG(
    dag_id="ckpt_upgrade_job",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,  # Params keep their types in the operator's arguments
    params={
        "job": Param("orders", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                     description="The job to upgrade (its name in the job store)"),
        "job_file": Param(str(EXAMPLES / "orders_v2.py"), type="string", minLength=1,
                          description="The new code: a Python file with a @streaming_job function"),
        "code_version": Param("v2", type="string", minLength=1, description="The new code's version label"),
        "upgrade_mode": Param("savepoint", enum=["savepoint", "last-state", "stateless"],
                              description="savepoint: stop with a savepoint and restore it; last-state: cancel "
                                          "and restore the latest checkpoint; stateless: start without state"),
        "allow_non_restored_state": Param(False, type="boolean",
                                          description="Allow dropping state the new code no longer has"),
        "verify_batches": Param(None, type=["null", "integer"], minimum=0, maximum=100,
                                description="Batches the new code must complete to pass verification (empty: 2, "
                                            "or none on a job caught up with no new input)"),
        "partitions": Param(None, type=["null", "integer"], minimum=1, maximum=10_000,
                            description="Rescale the state to this many partitions (empty: keep them); needs "
                                        "upgrade mode savepoint and RocksDB state"),
    },
    tags=["ckpt", "example"],
) as dag:
    UpgradeStreamingJobOperator(
        task_id="upgrade",
        job="{{ params.job }}",
        job_file="{{ params.job_file }}",
        code_version="{{ params.code_version }}",
        upgrade_mode="{{ params.upgrade_mode }}",
        allow_non_restored_state="{{ params.allow_non_restored_state }}",
        verify_batches="{{ params.verify_batches }}",
        partitions="{{ params.partitions }}",
        verify_timeout=300,
        deferrable=True,  # waits in the triggerer (the default is Airflow's [operators] default_deferrable)
    )
# [END howto_upgrade]
