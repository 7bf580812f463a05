"""The Airflow worker's host destroyed under three running jobs (issue 42), on the namespace hosts of issue 41.

Topology: ``store`` (SeaweedFS: the job store, the files sinks' bucket), ``kafka`` (tansu), ``launcher`` (the test's
feed and readers), ``launcher-2`` (the Airflow worker: three real SubmitStreamingJobOperator tasks with
``supervision="service"``, each handing its job over with its own settings and waiting in the worker until the job
runs), ``service-a`` and ``service-b`` (one ``ckpt service run`` each; the supervisors and drivers an instance starts
run on its host). Each job is tests/jobs/eo_job.py into a ckpt-files sink of its own, local[2].

Once the three tasks are done, the worker's host is lost (link down, then kill -9 of every process on it: no FIN,
no RST). Claims: nothing of the jobs ran on the worker (their drivers and supervisors are processes of the service
hosts); every job goes on at the same epoch; a later kill -9 of one driver is restarted by its supervisor, which the
service keeps (no relaunch by the service); every id exactly once in each job's sink.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.storage import S3Options
from tests.support import hosts
from tests.support.exactlyonce import EO_JOB, FilesSink, expected_rows
from tests.support.hostjobs import (
    BUCKET,
    MAX_OFFSETS,
    WAIT,
    Feed,
    Scenario,
    run_scenario,
    start_services,
    stop_services,
)
from tests.support.runtimejob import SPARK_CONF, JobEnv

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

JOBS = 3
SERVICES = ("service-a", "service-b")

#: The worker: three submit tasks handing their jobs to the service, each waiting in the worker until RUNNING; then
#: it stays up until its host is lost, as an Airflow worker between tasks.
WORKER = """
import json, sys, time
from airflow_ckpt_provider.operators.job import SubmitStreamingJobOperator

class TI:
    stats_tags = {}

    def xcom_push(self, key, value):
        pass

for job in json.loads(sys.argv[1]):
    op = SubmitStreamingJobOperator(
        task_id=f"submit-{job['job']}", job=job["job"], job_file=job["job_file"], env=job["env"], conf=job["conf"],
        checkpoint=job["checkpoint"], heartbeat_interval=1.0, restart_strategy="fixed-delay", restart_attempts=3,
        restart_delay=1.0, supervision="service", deferrable=False, poll_interval=0.5, start_timeout=240)
    print("submitted", json.dumps(op.execute({"ti": TI()})), flush=True)
print("worker idle", flush=True)
time.sleep(3600)
"""


@dataclasses.dataclass
class Job:
    env: JobEnv
    sink: FilesSink
    checkpoint: Path

    def spec(self) -> dict[str, Any]:
        """What its submit task is given: the job file, its settings and Spark's, its live checkpoint."""
        return {"job": self.env.job, "job_file": str(EO_JOB), "checkpoint": str(self.checkpoint),
                "conf": dict(c.split("=", 1) for c in SPARK_CONF),
                "env": {"CKPT_TEST_TOPIC": self.env.topic, "CKPT_TEST_BOOTSTRAP": self.env.kafka.bootstrap_servers,
                        "CKPT_TEST_MAX_OFFSETS": str(MAX_OFFSETS), **self.sink.env()}}


def test_the_airflow_workers_host_lost_under_three_handed_jobs_leaves_them_running_exactly_once(
        tmp_path: Path) -> None:
    run_scenario("worker host lost", "files", tmp_path, "wloss", _run,
                 roles=["store", "kafka", "launcher", "launcher-2", *SERVICES])


def _run(sc: Scenario, feed: Feed) -> None:
    topo, times = sc.topo, sc.times
    s3 = S3Options(endpoint_url=sc.env.s3.endpoint_url, region=sc.env.s3.region,
                   access_key_id=sc.env.s3.access_key, secret_access_key=sc.env.s3.secret_key)
    jobs = [Job(dataclasses.replace(sc.env, job=f"{sc.env.job}-{i}"),
                FilesSink(f"s3://{BUCKET}/out-{i}", s3), sc.work / f"checkpoint-{i}") for i in range(JOBS)]
    services = start_services(sc, SERVICES)
    logs = [log for _proc, log in services.values()]
    store_conn = json.dumps({"conn_type": "ckpt_store", "host": sc.env.s3.endpoint_url, "login": sc.env.s3.access_key,
                             "password": sc.env.s3.secret_key,
                             "extra": {"store_url": sc.env.store_url, "region_name": sc.env.s3.region}})
    worker_log = sc.work / "worker.log"
    with worker_log.open("ab") as out:
        worker = topo["launcher-2"].popen(
            [sys.executable, "-c", WORKER, json.dumps([j.spec() for j in jobs])], own_hostname=True,
            env={**os.environ, "AIRFLOW_CONN_CKPT_STORE_DEFAULT": store_conn, "CKPT_HOME": str(sc.work / "home-worker"),
                 "AWS_ACCESS_KEY_ID": sc.env.s3.access_key, "AWS_SECRET_ACCESS_KEY": sc.env.s3.secret_key},
            stdout=out, stderr=subprocess.STDOUT)
    try:
        feed.start()

        def submitted() -> bool:
            assert worker.poll() is None, worker_log.read_text()[-4000:]  # the worker failed: say why at once
            return "worker idle" in worker_log.read_text()

        _until("the worker's three tasks done (each job RUNNING)", submitted, 300.0, worker_log, *logs)
        assert worker_log.read_text().count("submitted ") == JOBS
        on_worker = set(topo["launcher-2"].pids())
        before: dict[str, JobStatus] = {}
        for j in jobs:
            status = sc.in_launcher(j.env.status)
            launch = sc.in_launcher(lambda j=j: read_launch(j.env.store()))
            assert status is not None and status.state is JobState.RUNNING, (j.env.job, status)
            services_hosts = {topo[r].hostname for r in SERVICES}
            # recorded by the task, started by an instance on its host: nothing of the job on the worker
            assert launch is not None and launch.host in services_hosts, launch
            assert status.pid not in on_worker and launch.pid not in on_worker
            assert status.host in services_hosts, (status.host, status)
            before[j.env.job] = status
        times["drivers' hosts"] = sorted(s.host or "" for s in before.values())

        # The worker's host lost: link down, then kill -9 of everything on it.
        topo.kill_host("launcher-2")
        t_lost = time.time()
        assert worker.wait(30) == -signal.SIGKILL
        for j in jobs:  # every job goes on at the same epoch: batches after the loss
            _until(f"{j.env.job} committing batches after the worker's loss", lambda j=j: (
                (s := sc.in_launcher(j.env.status)) is not None and s.epoch == before[j.env.job].epoch
                and s.batch_at is not None and s.batch_at > t_lost + 2 and s), WAIT, *logs)
        times["all three jobs on at the same epoch after the loss, s"] = round(time.time() - t_lost, 1)

        # A later kill -9 of one driver: its supervisor, which the service keeps, restarts it.
        victim = jobs[0]
        status = sc.in_launcher(victim.env.status)
        assert status is not None and status.pid is not None
        os.killpg(os.getpgid(status.pid), signal.SIGKILL)
        t_kill = time.time()
        restarted = _until(f"{victim.env.job} running at a newer epoch", lambda: (
            (s := sc.in_launcher(victim.env.status)) is not None and s.state is JobState.RUNNING
            and s.epoch > before[victim.env.job].epoch and s), WAIT, *logs)
        times["driver kill to RUNNING again, s"] = round(time.time() - t_kill, 1)
        assert restarted.host == status.host  # the same supervisor on the same service host

        feed.finish()
        for j in jobs:
            final = _until(f"all {feed.records} records consumed by {j.env.job}", lambda j=j: (
                (s := sc.in_launcher(j.env.status)) is not None and s.state is JobState.RUNNING
                and j.env.consumed(s) == feed.records and s), WAIT, *logs)
            ack = sc.in_launcher(j.env.request, RequestAction.STOP, final.epoch)
            assert ack.outcome is Outcome.COMPLETED, ack
    finally:
        feed.halt()
        stop_services(services)
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    times["relaunches by the service"] = text.count("relaunched it from the latest state")
    assert times["relaunches by the service"] == 0, text[-4000:]  # the supervisors restarted the driver
    times["ids"] = feed.next_id
    for j in jobs:
        rows = sc.in_launcher(j.sink.committed)
        times[f"{j.env.job}: committed rows"] = len(rows)
        assert sorted(rows) == expected_rows(feed.next_id), j.env.job
        sc.in_launcher(j.sink.check_nothing_uncommitted)


def _until(what: str, check: Any, timeout: float, *logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except AssertionError:
            raise
        except Exception:  # the store answers again on the next look
            found = None
        if found:
            return found
        time.sleep(0.3)
    tails = "\n".join(f"--- {log} ---\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.exists())
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
