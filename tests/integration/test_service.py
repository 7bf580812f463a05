"""The supervision service end to end (issue 42): two instances (`ckpt service run`, real processes) on SeaweedFS, a
job handed to them (tests/jobs/kafka_count.py, local[2], tansu), counted exactly.

The instance that owns the job is killed with kill -9 while a savepoint is asked: the other takes the job over at the
next epoch and finds its supervisor running (the job goes on, no relaunch), and the savepoint completes once. Then
the supervisor alone is killed: the owner adopts its running driver with a new supervisor of the same launch (the
same driver and epoch go on, nothing restarts). Then that supervisor and the driver are killed together, as when the
host they ran on is lost: the owner relaunches the job from its latest state, once. The counts are exact. The
instances serve their metrics (`--metrics-address`): the survivor counts the takeover, the adoption and the relaunch
of the job, once each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.ownership import read_owner
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.records.supervision import SupervisorState, read_supervisor
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher.handover import hand_over
from tests.support.prometheus import read_endpoint
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

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
RECORDS = 800


def test_a_handed_job_outlives_its_owning_instance_its_lost_supervisors_driver_is_adopted_and_relaunched_once(
        env: JobEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CKPT_HOME", str(home))
    environ = {**os.environ, "CKPT_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "AWS_ACCESS_KEY_ID": env.s3.access_key, "AWS_SECRET_ACCESS_KEY": env.s3.secret_key}
    s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region, access_key_id=env.s3.access_key,
                   secret_access_key=env.s3.secret_key)
    store = env.store()
    produce(env.kafka.bootstrap_servers, env.topic, 0, RECORDS // 2)
    deployment = Deployment(
        job_file=str(JOB_FILE), checkpoint=str(tmp_path / "checkpoint"), heartbeat_interval=1.0,
        restart_strategy="fixed-delay", restart_attempts=3, restart_delay=1.0,
        conf=dict(c.split("=", 1) for c in SPARK_CONF),
        env={"CKPT_TEST_TOPIC": env.topic, "CKPT_TEST_BOOTSTRAP": env.kafka.bootstrap_servers,
             "CKPT_TEST_OUT": str(env.out), "CKPT_TEST_MAX_OFFSETS": "200"})
    instances = {name: Instance(name, env, tmp_path, environ, "--metrics-address", "127.0.0.1")
                 for name in ("svc-a", "svc-b")}
    logs = [i.log for i in instances.values()]
    first_launch = hand_over(store, deployment, restore=LATEST_STATE, store_url=env.store_url, s3=s3,
                             handed_by="test")
    launches = [first_launch.launch_id]
    try:
        running = wait_logged("the handed job RUNNING with a batch", lambda: (
            (s := read_status(store)) is not None and s.state is JobState.RUNNING and s.batch_id is not None and s),
            TIMEOUT, *logs)
        owner = read_owner(store)
        assert owner is not None and owner.epoch == 1 and owner.instance in instances
        started = read_launch(store)
        assert started is not None and started.launch_id == first_launch.launch_id and started.pid is not None

        # 1. The owning instance killed with kill -9 while a savepoint is asked: the other takes the job over and
        # finds the supervisor running; the savepoint completes once (the driver acts on it, not the service).
        asked = submit_request(store, RequestAction.SAVEPOINT, running.epoch, requested_by="test")
        os.kill(instances[owner.instance].proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        instances[owner.instance].proc.wait(10)
        other = next(name for name in instances if name != owner.instance)
        taken = wait_logged(f"{other} owning the job", lambda: (
            (o := read_owner(store)) is not None and o.instance == other and o), 60.0, *logs)
        assert taken.epoch == 2
        times = {"takeover after the owner's kill -9, s": round(time.monotonic() - killed, 1)}
        saved = wait_ack(store, asked.id, 60.0, poll=0.2)
        assert saved is not None and saved.outcome is Outcome.COMPLETED and saved.snapshot_id, saved
        savepoints = [m.snapshot_id for m in list_snapshots(store) if m.kind is Kind.SAVEPOINT]
        assert savepoints == [saved.snapshot_id]  # exactly once
        supervisor = read_supervisor(store, first_launch.launch_id)
        assert supervisor is not None and supervisor.state is not SupervisorState.ENDED
        os.kill(supervisor.pid, 0)  # still runs: it did not die with the instance that started it
        time.sleep(3 * 0.5)  # three of the new owner's looks: it keeps the running supervisor, starts nothing
        last = read_launch(store)
        assert last is not None and last.launch_id == first_launch.launch_id
        now = read_status(store)
        assert now is not None and now.epoch == running.epoch

        # 2. The supervisor alone killed (its driver runs on): the owner adopts the driver with a new supervisor. Its
        # record names the driver's epoch (written as it saw the driver run): what the owner adopts by.
        known = wait_logged("the supervisor's record naming its running driver's epoch", lambda: (
            (r := read_supervisor(store, first_launch.launch_id)) is not None and r.epoch == running.epoch and r),
            30.0, *logs)
        os.kill(known.pid, signal.SIGKILL)
        lost_at = time.monotonic()
        adopted = wait_logged("a new supervisor of the same launch watching the running driver", lambda: (
            (r := read_supervisor(store, first_launch.launch_id)) is not None and r.pid != supervisor.pid
            and r.state is SupervisorState.WATCHING and r), 60.0, *logs)
        times["supervisor killed to the driver adopted, s"] = round(time.monotonic() - lost_at, 1)
        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2, RECORDS // 4)
        going = wait_logged("the same driver counting on under the adopting supervisor", lambda: (
            (s := read_status(store)) is not None and env.consumed(s) == RECORDS // 2 + RECORDS // 4 and s),
            TIMEOUT, *logs)
        assert (going.epoch, going.pid) == (running.epoch, now.pid)  # nothing restarted
        last = read_launch(store)
        assert last is not None and last.launch_id == first_launch.launch_id and last.pid == adopted.pid
        supervisor = adopted

        # 3. The supervisor and its driver killed together (their host lost): the owner relaunches, once.
        os.kill(supervisor.pid, signal.SIGKILL)
        assert now.pid is not None
        os.killpg(os.getpgid(now.pid), signal.SIGKILL)
        lost = time.monotonic()
        relaunched = wait_logged("a relaunch by the new owner RUNNING at a newer epoch", lambda: (
            (s := read_status(store)) is not None and s.state is JobState.RUNNING and s.epoch > running.epoch
            and s), TIMEOUT, *logs)
        times["running again after the supervisor and driver were killed, s"] = round(time.monotonic() - lost, 1)
        last = read_launch(store)
        assert last is not None and last.launch_id != first_launch.launch_id
        launches.append(last.launch_id)
        assert last.launched_by.startswith(f"supervision service {other}: its supervisor")
        assert str(last.restore) == "latest-state"

        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2 + RECORDS // 4, RECORDS // 4)
        done = wait_logged(f"all {RECORDS} records counted", lambda: (
            (s := read_status(store)) is not None and env.consumed(s) == RECORDS and s), TIMEOUT, *logs)
        assert done.epoch == relaunched.epoch
        ack = env.request(RequestAction.STOP, done.epoch)
        assert ack.outcome is Outcome.COMPLETED, ack
        wait_logged("the relaunch's supervisor ended", lambda: (
            (r := read_supervisor(store, last.launch_id)) is not None and r.state is SupervisorState.ENDED), 60.0,
            *logs)
        time.sleep(3 * 0.5)  # three more looks: a stopped job stays stopped
        final = read_launch(store)
        assert final is not None and final.launch_id == last.launch_id and final.ending == "stopped"

        # What the surviving instance counted, scraped where `ckpt metrics targets --service` finds it.
        targets = subprocess.run([sys.executable, "-m", "airflow_ckpt_provider.cli", "metrics", "targets",
                                  "--service", "--store", env.store_url, "--endpoint-url", env.s3.endpoint_url,
                                  "--json"], env=environ, capture_output=True, text=True, timeout=60, check=False)
        assert targets.returncode == 0, targets.stderr
        found = {t["labels"]["ckpt_service_instance"]: t["targets"][0] for t in json.loads(targets.stdout)}
        assert set(found) == set(instances)  # the killed one too: silent for minutes, CkptServiceDown fires for it
        seen = read_endpoint(f"http://{found[other]}/metrics")
        mine = {(name, dict(labels).get("action", "")): value for (name, labels), value in seen.items()
                if dict(labels).get("ckpt_instance") == other and dict(labels).get("ckpt_job") == env.job}
        assert mine == {("ckpt_service_takeovers_total", ""): 1, ("ckpt_service_actions_total", "adopted"): 1,
                        ("ckpt_service_actions_total", "relaunched"): 1}, mine
        assert seen[("ckpt_service_jobs_owned", (("ckpt_instance", other),))] == 1
    finally:
        for instance in instances.values():
            instance.stop()
        extra: list[str] = []  # also a launch the test did not expect (a relaunch where it failed)
        with contextlib.suppress(StorageError):
            extra = [found.launch_id] if (found := read_launch(store)) is not None else []
        for launch_id in {*launches, *extra}:
            stop_supervisor(store, launch_id)
    print(f"service: {times}")
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert text.count("relaunched it from the latest state") == 1, text[-4000:]
    assert text.count("adopted the running driver of epoch") == 1, text[-4000:]
    assert env.final_counts() == expected_counts(RECORDS)
    owner = read_owner(store)
    assert owner is not None and owner.released  # the surviving instance released it at its clean stop
