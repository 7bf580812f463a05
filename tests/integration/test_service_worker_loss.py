"""The Airflow worker that submitted three jobs destroyed under them (issue 42), as a process group before the
namespace hosts: a "worker" process runs three real SubmitStreamingJobOperator tasks with ``supervision="service"``
(each hands its job over and waits in the worker until the job runs), then the worker's whole process group is
killed with kill -9. Every job keeps running (nothing of them was in that group: the service's instances started
them); a later kill -9 of one driver is restarted by its supervisor, which the service keeps; the counts of all three
jobs are exact. Real processes: two `ckpt service run`, SeaweedFS, tansu, three local Spark drivers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.status import JobState, read_status
from tests.support.runtimejob import (
    JOB_FILE,
    SPARK_CONF,
    JobEnv,
    expected_counts,
    produce,
    stop_supervisor,
    wait_logged,
)
from tests.support.serviceinstances import Instance

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

TIMEOUT = 240.0
RECORDS = 400
JOBS = 3

#: The worker: three submit tasks handing their jobs to the service, each waiting in the worker until RUNNING; then
#: it stays up until it is killed, as an Airflow worker between tasks.
WORKER = """
import json, sys, time
from airflow_ckpt_provider.operators.job import SubmitStreamingJobOperator

class TI:
    stats_tags = {}

    def xcom_push(self, key, value):
        pass

jobs = json.loads(sys.argv[1])
for job in jobs:
    op = SubmitStreamingJobOperator(
        task_id=f"submit-{job['job']}", job=job["job"], job_file=job["job_file"], env=job["env"], conf=job["conf"],
        checkpoint=job["checkpoint"], heartbeat_interval=1.0, restart_strategy="fixed-delay", restart_attempts=3,
        restart_delay=1.0, supervision="service", deferrable=False, poll_interval=0.5, start_timeout=240)
    print("submitted", json.dumps(op.execute({"ti": TI()})), flush=True)
print("worker idle", flush=True)
time.sleep(3600)
"""


def test_the_workers_process_group_killed_under_three_handed_jobs_leaves_them_running_exact_counts(
        env: JobEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CKPT_HOME", str(home))
    base = {**os.environ, "CKPT_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "AWS_ACCESS_KEY_ID": env.s3.access_key, "AWS_SECRET_ACCESS_KEY": env.s3.secret_key}
    jobs = [dataclasses.replace(env, work=tmp_path / f"job{i}", job=f"{env.job}-{i}") for i in range(JOBS)]
    conf = dict(c.split("=", 1) for c in SPARK_CONF)
    specs = [{"job": j.job, "job_file": str(JOB_FILE), "checkpoint": str(j.work / "checkpoint"), "conf": conf,
              "env": {"CKPT_TEST_TOPIC": env.topic, "CKPT_TEST_BOOTSTRAP": env.kafka.bootstrap_servers,
                      "CKPT_TEST_OUT": str(j.out), "CKPT_TEST_MAX_OFFSETS": "100"}} for j in jobs]
    produce(env.kafka.bootstrap_servers, env.topic, 0, RECORDS // 2)
    instances = {name: Instance(name, env, tmp_path, base) for name in ("svc-a", "svc-b")}
    logs = [i.log for i in instances.values()]
    store_conn = json.dumps({"conn_type": "ckpt_store", "host": env.s3.endpoint_url, "login": env.s3.access_key,
                             "password": env.s3.secret_key,
                             "extra": {"store_url": env.store_url, "region_name": env.s3.region}})
    worker_log = tmp_path / "worker.log"
    with worker_log.open("ab") as out:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(specs)],
                                  env={**base, "AIRFLOW_CONN_CKPT_STORE_DEFAULT": store_conn}, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def submitted() -> bool:
            assert worker.poll() is None, worker_log.read_text()[-4000:]  # the worker failed: say why at once
            return "worker idle" in worker_log.read_text()

        wait_logged("the worker's three tasks done (each job RUNNING)", submitted, TIMEOUT, worker_log, *logs)
        assert worker_log.read_text().count("submitted ") == JOBS
        group = os.getpgid(worker.pid)
        before = {j.job: read_status(j.store()) for j in jobs}
        for job, status in before.items():
            assert status is not None and status.state is JobState.RUNNING, (job, status)
            assert status.pid is not None and os.getpgid(status.pid) != group  # not the worker's
        launches = {j.job: read_launch(j.store()) for j in jobs}
        for job, launch in launches.items():
            assert launch is not None and launch.pid is not None and os.getpgid(launch.pid) != group, (job, launch)

        # The worker destroyed: its process group killed with kill -9.
        os.killpg(group, signal.SIGKILL)
        worker.wait(10)
        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2, RECORDS // 4)
        for j in jobs:  # every job goes on: more batches by the same driver
            wait_logged(f"{j.job} counting on at the same epoch", lambda j=j: (
                (s := read_status(j.store())) is not None and s.epoch == before[j.job].epoch
                and j.consumed(s) == RECORDS // 2 + RECORDS // 4 and s), TIMEOUT, *logs)

        # A later kill -9 of one driver: its supervisor (kept by the service) restarts it.
        victim = jobs[0]
        status = read_status(victim.store())
        assert status is not None and status.pid is not None
        os.killpg(os.getpgid(status.pid), signal.SIGKILL)
        wait_logged(f"{victim.job} restarted at a newer epoch", lambda: (
            (s := read_status(victim.store())) is not None and s.state is JobState.RUNNING
            and s.epoch > before[victim.job].epoch and s), TIMEOUT, *logs)
        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2 + RECORDS // 4, RECORDS // 4)
        for j in jobs:
            done = wait_logged(f"all {RECORDS} records counted by {j.job}", lambda j=j: (
                (s := read_status(j.store())) is not None and j.consumed(s) == RECORDS and s), TIMEOUT, *logs)
            assert j.request(RequestAction.STOP, done.epoch).outcome is Outcome.COMPLETED
    finally:
        if worker.poll() is None:
            os.killpg(os.getpgid(worker.pid), signal.SIGKILL)
        for instance in instances.values():
            instance.stop()
        for j in jobs:
            last = read_launch(j.store())
            if last is not None:
                stop_supervisor(j.store(), last.launch_id)
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert text.count("relaunched it from the latest state") == 0, text[-4000:]  # the supervisors restarted drivers
    for j in jobs:
        assert j.final_counts() == expected_counts(RECORDS), j.job
