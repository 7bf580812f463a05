"""An upgrade of a job handed to the supervision service (issue 42): `ckpt job upgrade` records the operation and only
waits; the owning instance acts on it. That instance is killed with kill -9 between the stop and the start (a crash
point right after the stop's savepoint): the other instance takes the job over, finds the operation at its stop step
and resumes it from the recorded request, so the upgrade completes exactly once (one stop, one new launch), and the
counts stay exact. Then `ckpt job restart` of the same job: the owning instance stops it with a savepoint and
launches it again (one stop, one launch, the same deployment). Real processes: two `ckpt service run`, SeaweedFS,
tansu, local Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, read_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.operations import OperationState, read_operation
from airflow_ckpt_provider.core.records.ownership import read_owner
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.store.jobstore import CONTROL
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher.handover import hand_over
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
RECORDS = 600


def test_an_upgrade_whose_owning_instance_dies_between_stop_and_start_is_finished_once_by_the_other_then_a_restart_by_the_owner_exact_counts(  # noqa: E501  # the name says what it proves
        env: JobEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, faults = tmp_path / "home", tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv("CKPT_HOME", str(home))
    base = {**os.environ, "CKPT_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "AWS_ACCESS_KEY_ID": env.s3.access_key, "AWS_SECRET_ACCESS_KEY": env.s3.secret_key}
    s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region, access_key_id=env.s3.access_key,
                   secret_access_key=env.s3.secret_key)
    store = env.store()
    produce(env.kafka.bootstrap_servers, env.topic, 0, RECORDS // 2)
    deployment = Deployment(
        job_file=str(JOB_FILE), code_version="v1", checkpoint=str(tmp_path / "checkpoint"), heartbeat_interval=1.0,
        checkpoint_interval=0.0, restart_strategy="fixed-delay", restart_attempts=3, restart_delay=1.0,
        conf=dict(c.split("=", 1) for c in SPARK_CONF),
        env={"CKPT_TEST_TOPIC": env.topic, "CKPT_TEST_BOOTSTRAP": env.kafka.bootstrap_servers,
             "CKPT_TEST_OUT": str(env.out), "CKPT_TEST_MAX_OFFSETS": "100"})
    # The instances see the crash point; the command that asks for the upgrade does not.
    instances = {name: Instance(name, env, tmp_path, {**base, "CKPT_FAULT_DIR": str(faults)})
                 for name in ("svc-a", "svc-b")}
    logs = [i.log for i in instances.values()]
    first = hand_over(store, deployment, restore=LATEST_STATE, store_url=env.store_url, s3=s3, handed_by="test")
    launches = [first.launch_id]
    try:
        running = wait_logged("the handed job RUNNING with its first records counted", lambda: (
            (s := read_status(store)) is not None and s.state is JobState.RUNNING and env.consumed(s) >= 100 and s),
            TIMEOUT, *logs)
        (faults / "upgrade.after-stop").touch()  # the acting instance's process group dies right after the stop
        upgrade = subprocess.run(
            [sys.executable, "-m", "airflow_ckpt_provider.cli", "job", "upgrade", "--store", env.store_url, "--job",
             store.job, "--endpoint-url", env.s3.endpoint_url, "--region", env.s3.region, "--job-file",
             str(JOB_FILE), "--code-version", "v2", "--verify-batches", "0", "--verify-timeout", "120", "--json"],
            env=base, capture_output=True, text=True, timeout=900, check=False)
        assert upgrade.returncode == 0, upgrade.stdout[-2000:] + upgrade.stderr[-4000:]
        result = json.loads(upgrade.stdout)
        assert (result["from_version"], result["to_version"], result["upgrade_mode"]) == ("v1", "v2", "savepoint")
        assert not (faults / "upgrade.after-stop").exists()  # it fired
        dead = [i for i in instances.values() if i.proc.poll() is not None]
        assert [i.proc.returncode for i in dead] == [-9], [i.name for i in dead]
        survivor = next(name for name, i in instances.items() if i.proc.poll() is None)
        owner = read_owner(store)
        assert owner is not None and owner.instance == survivor and owner.epoch == 2

        found = read_operation(store)
        assert found is not None and found.operation.state is OperationState.SUCCEEDED
        op = found.operation
        assert op.actor == f"supervision service instance {survivor}"
        assert any(line.startswith(f"supervision service instance {survivor} resumes upgrade {op.id} at step 2 (Stop)")
                   for line in op.lines), op.lines
        stops = [o.key for o in store.storage.list(CONTROL) if o.key.startswith(f"{CONTROL}stop-")
                 and not o.key.endswith(".ack.json")]
        assert len(stops) == 1, stops  # one stop: the survivor waited for its answer, it did not stop again
        ack = read_ack(store, stops[0][len(CONTROL):-len(".json")])
        assert ack is not None and ack.outcome is Outcome.COMPLETED and ack.snapshot_id == result["snapshot_id"]
        last = read_launch(store)
        assert last is not None and last.deployment.code_version == "v2" and str(last.restore) == ack.snapshot_id
        assert last.launched_by == f"upgrade {op.id} step 3 start (supervision service instance {survivor})"
        launches.append(last.launch_id)
        assert len({first.launch_id, last.launch_id}) == 2  # exactly one new deployment

        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2, RECORDS // 2)
        done = wait_logged(f"all {RECORDS} records counted by v2", lambda: (
            (s := read_status(store)) is not None and env.consumed(s) == RECORDS and s), TIMEOUT, *logs)
        assert done.epoch > running.epoch and done.code_version == "v2"

        # A restart of the handed job: `ckpt job restart` records it and waits; the owning instance acts on it.
        restart = subprocess.run(
            [sys.executable, "-m", "airflow_ckpt_provider.cli", "job", "restart", "--store", env.store_url, "--job",
             store.job, "--endpoint-url", env.s3.endpoint_url, "--region", env.s3.region, "--stop-mode", "savepoint",
             "--start-timeout", "180", "--json"], env=base, capture_output=True, text=True, timeout=600, check=False)
        assert restart.returncode == 0, restart.stdout[-2000:] + restart.stderr[-4000:]
        restarted = json.loads(restart.stdout)
        found = read_operation(store)
        assert found is not None
        op = found.operation
        assert (op.kind, op.state, op.actor) == ("restart", OperationState.SUCCEEDED,
                                                 f"supervision service instance {survivor}")
        assert (restarted["restarted_by"], restarted["restore"]) == ("operation", "latest-state")
        assert restarted["epoch"] > done.epoch and restarted["snapshot_id"], restarted
        stops = [o.key for o in store.storage.list(CONTROL) if o.key.startswith(f"{CONTROL}stop-")
                 and not o.key.endswith(".ack.json")]
        assert len(stops) == 2, stops  # the upgrade's and the restart's: one each
        again = read_launch(store)
        assert again is not None and again.launch_id == restarted["launch_id"]
        assert again.launched_by == f"restart {op.id} step 2 start (supervision service instance {survivor})"
        assert again.deployment == last.deployment  # the same deployment, v2
        launches.append(again.launch_id)
        assert env.request(RequestAction.STOP, restarted["epoch"]).outcome is Outcome.COMPLETED
    finally:
        for instance in instances.values():
            instance.stop()
        for launch_id in launches:
            stop_supervisor(store, launch_id)
    assert env.final_counts() == expected_counts(RECORDS)
