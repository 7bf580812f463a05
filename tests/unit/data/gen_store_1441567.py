"""Writes status.json, lease.json, spec/last.json and spec/stable.json with release 1441567's code (the release
before the typed records), for tests/unit/core/records/test_store_1441567.py. Run with that release on the path:

    git worktree add /tmp/rel1441567 1441567
    PYTHONPATH=/tmp/rel1441567 .venv/bin/python tests/unit/data/gen_store_1441567.py \
        tests/unit/data/store-1441567/orders
    git worktree remove /tmp/rel1441567
"""
import pathlib
import sys

from airflow_ckpt_provider.core.deployments import Deployment, Launch
from airflow_ckpt_provider.core.lease import LeaseRecord
from airflow_ckpt_provider.core.modes import RestoreSpec
from airflow_ckpt_provider.core.status import JobState, JobStatus, Restart, RestartOwner

out = pathlib.Path(sys.argv[1])
restart = Restart(by=RestartOwner.DRIVER, attempt=1, cause="query failed: StreamingQueryException", delay=2.0,
                  at=1795846400.0, expected_by=1795846410.0, from_batch=6, resumed_at=1795846404.5, resumed_batch=7)
status = JobStatus(job="orders", state=JobState.RUNNING, epoch=3, updated_at=1795846500.25, started_at=1795846200.0,
                   reason="running", batch_id=9, batch_at=1795846499.0, offsets={"orders": {"0": 120, "1": 98}},
                   lag=0, data_waiting=False, idle=True,
                   last_snapshot={"id": "savepoint-7-20261127T101500Z-0a1b2c", "kind": "savepoint", "batch_id": 7},
                   restored_from="s3://ckpt/jobs/orders/snapshots/savepoint-7-20261127T101500Z-0a1b2c", pid=4242,
                   host="airflow-worker-1", app_id="local-1795846200", ui_url="http://127.0.0.1:4040",
                   code_version="v2", heartbeat_interval=5.0, restarts=[restart.to_dict()], restart_count=1)
lease = LeaseRecord(job="orders", epoch=3, owner="airflow-worker-1:4242:9f8e7d", host="airflow-worker-1", pid=4242,
                    acquired_at=1795846200.5, poll_interval=1.0, outage_tolerance=29.0)
dep = Deployment(checkpoint="s3://ckpt/checkpoints/orders", job_file="/opt/jobs/orders_v2.py",
                 code_version="v2", master="spark://spark-master:7077", deploy_mode="client",
                 conf={"spark.executor.memory": "1g"}, py_files=("/opt/jobs/helpers.py",), files=(),
                 python_env="ship", env={"ORDERS_TOPIC": "orders"})
launch = Launch(job="orders", deployment=dep, restore=RestoreSpec.parse("savepoint-7-20261127T101500Z-0a1b2c"),
                launched_at=1795846190.0, launched_by="airflow:orders_dag.upgrade:1",
                launch_id="20261127T104950Z-4d5e6f", pid=4200, host="airflow-worker-1",
                log_file="/var/log/ckpt/orders/20261127T104950Z-4d5e6f.log")
ended = Launch(**{**launch.__dict__, "launch_id": "20261127T090000Z-0a0b0c", "restore": "latest",
                  "ended_at": 1795840000.0, "ending": "stopped", "exit_code": 0, "end_reason": "stop requested"})
(out / "spec").mkdir(parents=True, exist_ok=True)
(out / "status.json").write_bytes(status.to_bytes())
(out / "lease.json").write_bytes(lease.to_bytes())
(out / "spec" / "last.json").write_bytes(launch.to_bytes())
(out / "spec" / "stable.json").write_bytes(ended.to_bytes())
print("ok")
