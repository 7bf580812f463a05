"""A rescale killed with kill -9 at each of its steps ends with the job on its old or its new partitions, running
once, never lost (tansu, SeaweedFS, local Spark, RocksDB state; ``ckpt job rescale`` of a recorded deployment).

One deployment of orders_v1 (2 state partitions) goes through, in order:

1. the driver killed during its stop with savepoint: its supervisor restarts it; the rescale says the stop did
   not complete, the old job still runs and nothing was changed; the job runs on 2 partitions;
2. the rescale's repartition process killed once its copy is repartitioned, and
3. killed while saving the repartitioned savepoint (its files uploaded, no manifest): each time the rescale
   rolls back, the job runs on 2 partitions from the stop's savepoint, and no rescale savepoint exists;
4. the rescale's own process killed right after the stop: the job is stopped; run again, the rescale goes on
   from the stop's savepoint, the job runs on 3 partitions;
5. killed right after it started the job on 5 partitions: the job runs on 5; run again it is refused (already 5).

After each step exactly one supervisor runs the job (the lease's holder), and at the end the totals equal the
orders produced, exactly.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.policy.modes import RestartStrategyName
from airflow_ckpt_provider.core.records.control import RequestAction
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.examples._orders import read_totals
from tests.integration.test_rescale import RescaleEnv, _wait_totals
from tests.integration.test_restore_check import expected_totals, produce_orders

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400),
              pytest.mark.full(proven_by="integration/test_rescale.py::test_ckpt_job_rescale_moves_a_deployment_... "
                                         "(the rescale's process killed after saving, run again: the new partitions)")]

TIMEOUT = 180.0


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path,
        launcher_env: Path) -> RescaleEnv:
    return RescaleEnv(s3_server, kafka_server, tmp_path, bucket, topic)


class Rescaler:
    """``ckpt job rescale`` of the test's job, in a session of its own (a crash point kills its process group)."""

    def __init__(self, env: RescaleEnv, faults: Path) -> None:
        self.faults = faults
        argv, self.environ = env.rescale_cli(faults)
        self.argv = [*argv, "--stop-timeout", "60"]

    def run(self, partitions: int, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        if crash:
            (self.faults / crash).touch()
        done = subprocess.run([*self.argv, "--partitions", str(partitions)], env=self.environ, capture_output=True,
                              text=True, timeout=900, check=False, start_new_session=True)
        assert crash is None or not (self.faults / crash).exists(), f"crash point {crash} did not fire:\n" + \
            done.stderr[-3000:]
        return done


def running(env: RescaleEnv, after_epoch: int, log_file: str | None) -> JobStatus:
    """The job RUNNING at an epoch above ``after_epoch``, reported by one driver holding the lease."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        status = env.status()
        if status is not None and status.state is JobState.RUNNING and status.epoch > after_epoch:
            lease = read_lease(env.store())
            assert lease is not None and lease.epoch == status.epoch and not lease.released
            return status
        assert time.monotonic() < deadline, (f"no driver above epoch {after_epoch} RUNNING in {TIMEOUT:.0f} s: "
                                             f"{status}\n" + Path(str(log_file)).read_text()[-3000:])
        time.sleep(0.5)


def partitions_now(env: RescaleEnv, epoch: int) -> int | None:
    """The running job's state partitions, from a savepoint taken now."""
    ack = env.request(RequestAction.SAVEPOINT, epoch)
    newest = latest_completed(list_snapshots(env.store(), Kind.SAVEPOINT))
    assert newest is not None and newest.snapshot_id == ack.snapshot_id, ack
    return newest.state_partitions


def _stop_requests(store: JobStore) -> list[str]:
    return [o.key for o in store.storage.list("control/") if o.key.startswith("control/stop-")
            and not o.key.endswith(".ack.json")]


def rescale_savepoints(store: JobStore) -> list[str]:
    return [m.snapshot_id for m in list_snapshots(store) if m.trigger is Trigger.RESCALE]


def test_a_rescale_killed_at_each_step_leaves_the_job_on_its_old_or_new_partitions_running_once_with_exact_totals(
        env: RescaleEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    store, faults = env.store(), env.work / "faults"
    faults.mkdir()
    monkeypatch.setenv("CKPT_FAULT_DIR", str(faults))  # the drivers the deployment launches see it too
    total = 300
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, total)
    record = env.deploy(restart_strategy=RestartStrategyName.FIXED_DELAY, restart_attempts=3, restart_delay=1.0)
    rescale = Rescaler(env, faults)
    try:
        status = running(env, 0, record.log_file)
        _wait_totals(env, total, record.log_file)

        # 1. The driver killed during its stop with savepoint: its supervisor restarts it on the old partitions.
        done = rescale.run(3, "stop.before-savepoint")
        assert done.returncode != 0 and "the stop with savepoint did not complete" in done.stderr, done.stderr[-3000:]
        assert re.search(r"the old job still runs \(epoch \d+\), nothing was changed", done.stderr), done.stderr[-3000:]
        status = running(env, status.epoch, record.log_file)
        assert partitions_now(env, status.epoch) == 2 and rescale_savepoints(store) == []

        # 2., 3. The repartition process killed: after the repartition, while saving (no manifest: invisible).
        for crash in ("rescale.repartitioned", "rescale.save.uploaded"):
            done = rescale.run(3, crash)
            assert done.returncode != 0, done.stderr[-3000:]
            rolled_back = r"rolled back to \S+ from savepoint-\S+ on its old partitions: it runs again"
            assert re.search(rolled_back, done.stderr), done.stderr[-3000:]
            last = read_launch(store)
            assert last is not None
            status = running(env, status.epoch, last.log_file)
            assert partitions_now(env, status.epoch) == 2 and rescale_savepoints(store) == []
            total += 50
            produce_orders(env.kafka.bootstrap_servers, env.topic, total - 50, 50)
            _wait_totals(env, total, last.log_file)

        # 4. The rescale's own process killed after the stop: the job waits, stopped; run again, the command finds
        # the operation at its stop step and resumes it (no second stop).
        stops = len(_stop_requests(store))
        done = rescale.run(3, "rescale.after-stop")
        assert done.returncode == -9, done.stderr[-3000:]
        stopped = env.status()
        assert stopped is not None and stopped.state is JobState.STOPPED
        done = rescale.run(3)
        assert done.returncode == 0 and "resuming it, not starting another" in done.stderr, done.stderr[-3000:]
        assert len(_stop_requests(store)) == stops + 1  # the killed run's, waited for again: not a second one
        last = read_launch(store)
        assert last is not None
        status = running(env, status.epoch, last.log_file)
        assert partitions_now(env, status.epoch) == 3 and len(rescale_savepoints(store)) == 1

        # 5. Killed right after it started the job on 5 partitions: the job runs on 5; run again, the command
        # resumes at the start step, finds that launch and verifies it (no second launch); once more: nothing to do.
        done = rescale.run(5, "rescale.after-start")
        assert done.returncode == -9, done.stderr[-3000:]
        last = read_launch(store)
        assert last is not None
        status = running(env, status.epoch, last.log_file)
        assert partitions_now(env, status.epoch) == 5 and len(rescale_savepoints(store)) == 2
        again = rescale.run(5)
        assert again.returncode == 0 and "resuming it, not starting another" in again.stderr, again.stderr[-3000:]
        resumed = read_launch(store)
        assert resumed is not None and resumed.launch_id == last.launch_id
        again = rescale.run(5)
        assert again.returncode != 0 and "already has 5 partitions" in again.stderr, again.stderr[-3000:]

        total += 100
        produce_orders(env.kafka.bootstrap_servers, env.topic, total - 100, 100)
        _wait_totals(env, total, last.log_file)
        assert read_totals(env.out) == expected_totals(total)
        assert env.status() is not None and running(env, status.epoch - 1, last.log_file).epoch == status.epoch
    finally:
        status_now = env.status()
        if status_now is not None and status_now.state is JobState.RUNNING:
            env.request(RequestAction.CANCEL, status_now.epoch)
