"""Rescaling the state through savepoints (tansu, SeaweedFS, local Spark, RocksDB state).

``ckpt job rescale`` moves a running deployment of orders_v1 from 2 to 4 state partitions (check on a copy, stop
with savepoint, repartition and save, start, verify). Its process is killed with kill -9 once the repartitioned
savepoint is saved; run again, it starts the job from that savepoint. The totals stay exact, and a second rescale
to the same count is refused with the driver, its lease and the snapshots untouched. Then ``ckpt job edit`` deletes a
customer's state the same way (issue 45's State Processor through the upgrade flow): afterwards that customer counts
only the orders after the edit, every other one exactly. With ``--full``, the rescale step alone:

orders_v1 (a streaming aggregation per customer) runs with 2 state partitions and stops with a savepoint; the
rescale step (``ckpt run --check-restore --restore <savepoint> --rescale-to 5 --save-rescaled``, as a rescale
starts it) repartitions a restored copy with Spark's offline repartition, runs the job's empty batch on it and
saves the repartition batch as a savepoint of its own; the job restarts from that savepoint, takes more orders,
stops again and is rescaled 5 -> 3 the same way. The totals equal the produced orders exactly after each
step; a rescale to the count the state already has is refused, and nothing is written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import (
    RESCALED_FROM,
    Kind,
    Manifest,
    Trigger,
)
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.examples._orders import read_totals
from airflow_ckpt_provider.launcher.submit import parse_conf
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck
from tests.integration.test_restore_check import OrdersEnv, expected_totals, produce_orders
from tests.support.manifests import labels_timed, rescaled_from
from tests.support.runtimejob import ROCKSDB, SPARK_CONF, Run

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
CHECK_TIMEOUT = 240.0
EXAMPLES = Path(examples.__file__).parent


class RescaleEnv(OrdersEnv):
    def run_job(self, name: str, job_file: Path, checkpoint: Path, *args: str) -> Run:
        return super().run_job(name, job_file, checkpoint, "--conf", ROCKSDB, "--checkpoint-interval", "none", *args)

    def rescale(self, savepoint: str, partitions: int, checkpoint: Path) -> RestoreCheck:
        return self.rescale_step(EXAMPLES / "orders_v1.py", checkpoint, savepoint, partitions,
                                 env=self.orders_env(self.work / "check-out"), timeout=CHECK_TIMEOUT)

    def deploy(self, **settings: Any) -> Launch:
        """orders_v1 with RocksDB state in 2 partitions launched as the operators launch it (a recorded deployment,
        ``ckpt run --supervise`` detached); ``settings``: more Deployment fields."""
        from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
        from airflow_ckpt_provider.core.records.deployments import Deployment
        from airflow_ckpt_provider.launcher.deploy import launch

        env = {k: v for k, v in self.orders_env(self.out).items()
               if k.startswith("ORDERS_") or k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")}
        deployment = Deployment(str(EXAMPLES / "orders_v1.py"), code_version="v1", checkpoint=str(self.work / "ckpt"),
                                conf=parse_conf([*SPARK_CONF, ROCKSDB]), env=env, heartbeat_interval=1.0,
                                **settings)
        return launch(self.store(), deployment, restore=LATEST_STATE, store_url=self.store_url, s3=self.s3_options(),
                      launched_by="test")

    def s3_options(self) -> S3Options:
        return S3Options(endpoint_url=self.s3.endpoint_url, region=self.s3.region, access_key_id=self.s3.access_key,
                         secret_access_key=self.s3.secret_key)

    def rescale_cli(self, faults: Path) -> tuple[list[str], dict[str, str]]:
        """``ckpt job rescale`` of this job without --partitions, and its environment (crash points in ``faults``)."""
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "job", "rescale", "--store", self.store_url,
                "--job", self.job, "--endpoint-url", self.s3.endpoint_url, "--region", self.s3.region]
        return argv, {**self.env(), "AWS_ACCESS_KEY_ID": self.s3.access_key,
                      "AWS_SECRET_ACCESS_KEY": self.s3.secret_key, "CKPT_FAULT_DIR": str(faults)}

    def run_until_stopped(self, name: str, checkpoint: Path, restore: str, total: int) -> Manifest:
        """Run orders_v1 from ``restore`` until its totals count ``total`` orders, then stop it with a savepoint."""
        run = self.run_job(name, EXAMPLES / "orders_v1.py", checkpoint, "--restore", restore)
        try:
            deadline = time.monotonic() + TIMEOUT
            while sum(n for n, _ in read_totals(self.out).values()) < total:
                assert run.proc.poll() is None, run.tail()
                assert time.monotonic() < deadline, f"{name}: totals short of {total} orders after {TIMEOUT:.0f} s"
                time.sleep(0.5)
            status = self.status()
            assert status is not None
            ack = self.request(RequestAction.STOP, status.epoch)
            assert ack.outcome is Outcome.COMPLETED, ack
            assert run.proc.wait(60) == EXIT_STOPPED, run.tail()
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
        assert read_totals(self.out) == expected_totals(total), f"{name}: totals differ from the orders produced"
        assert ack.snapshot_id is not None
        return load_manifest(self.store(), ack.snapshot_id)


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path,
        launcher_env: Path) -> RescaleEnv:
    return RescaleEnv(s3_server, kafka_server, tmp_path, bucket, topic)


@pytest.mark.full(proven_by="test_ckpt_job_rescale_moves_a_deployment_... (the same step, run by the "
                             "rescale: repartition, check, save; totals exact after it; the same count refused)")
def test_state_rescaled_2_to_5_to_3_through_savepoints_keeps_the_totals_exact(env: RescaleEnv) -> None:
    checkpoint = env.work / "checkpoint"
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, 400)
    source = env.run_until_stopped("on-2", checkpoint, "latest-state", 400)
    assert source.state_partitions == 2 and source.trigger is Trigger.STOP
    total = 400
    for partitions in (5, 3):
        verdict = env.rescale(source.snapshot_id, partitions, checkpoint)
        assert verdict.outcome is CheckOutcome.COMPATIBLE and verdict.state_partitions == partitions, verdict
        assert verdict.rescaled_snapshot_id is not None, verdict
        rescaled = load_manifest(env.store(), verdict.rescaled_snapshot_id)
        assert (rescaled.kind, rescaled.trigger, rescaled.batch_id, rescaled.state_partitions) == (
            Kind.SAVEPOINT, Trigger.RESCALE, source.batch_id + 1, partitions)
        assert labels_timed(rescaled) == rescaled_from(source)
        assert rescaled.offsets == source.offsets  # the repartition batch reads no input
        produce_orders(env.kafka.bootstrap_servers, env.topic, total, 200)
        total += 200
        after = env.run_until_stopped(f"on-{partitions}", checkpoint, rescaled.snapshot_id, total)
        assert after.state_partitions == partitions and after.batch_id > rescaled.batch_id
        source = after

    # The same count again: refused before Spark is asked, nothing written to the job store.
    snapshots = [m.snapshot_id for m in list_snapshots(env.store())]
    with pytest.raises(ConfigError, match=rf"rescale of snapshot {source.snapshot_id} \(batch {source.batch_id}\) "
                                          r"to 3 partitions refused: the state already has 3 partitions"):
        env.rescale(source.snapshot_id, 3, checkpoint)
    assert [m.snapshot_id for m in list_snapshots(env.store())] == snapshots


def test_ckpt_job_rescale_moves_a_deployment_to_4_partitions_through_a_kill_refuses_the_same_count_then_edit_deletes(
        env: RescaleEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import subprocess

    from airflow_ckpt_provider.core.records.deployments import read_launch
    from airflow_ckpt_provider.core.records.lease import read_lease
    from airflow_ckpt_provider.core.records.status import JobState
    from tests.integration.test_restore_check import CUSTOMERS

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    store = env.store()
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, 400)
    first = env.deploy(checkpoint_interval=None)
    faults = env.work / "faults"
    faults.mkdir()
    cli, cli_env = env.rescale_cli(faults)
    try:
        _wait_totals(env, 400, first.log_file)
        # The rescale's own process killed with kill -9 once the repartitioned savepoint is saved: the job is
        # stopped, nothing runs it. Running the command again finishes the rescale from what the store shows.
        (faults / "rescale.after-save").touch()
        killed = subprocess.run([*cli, "--partitions", "4"], env=cli_env, capture_output=True, text=True,
                                timeout=900, check=False, start_new_session=True)
        assert killed.returncode == -9 and not (faults / "rescale.after-save").exists(), killed.stderr[-3000:]
        lines = [ln for ln in killed.stderr.splitlines() if ln[:4] in ("1/5 ", "2/5 ", "3/5 ", "4/5 ")]
        # No scheduled snapshots: the check takes a savepoint to check against first (the job keeps running).
        assert [ln[:3] for ln in lines] == ["1/5"] * 3 + ["2/5", "2/5", "3/5", "3/5"], killed.stderr
        assert "has no snapshot to check against: taking a savepoint" in lines[0]
        stopped = env.status()
        assert stopped is not None and stopped.state is JobState.STOPPED
        done = subprocess.run([*cli, "--partitions", "4", "--json"], env=cli_env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        result = json.loads(done.stdout)
        # The operation recorded its step (the repartition, with its check's id): the run resumes it, no second stop.
        assert "resuming it, not starting another" in done.stderr and "2/5" not in done.stderr, done.stderr[-3000:]
        source = load_manifest(store, result["snapshot_id"])
        rescaled = load_manifest(store, result["rescaled_snapshot_id"])
        assert (source.trigger, source.state_partitions) == (Trigger.STOP, 2)
        assert (rescaled.trigger, rescaled.state_partitions, rescaled.labels[RESCALED_FROM]) == (
            Trigger.RESCALE, 4, source.snapshot_id)
        assert [m.snapshot_id for m in list_snapshots(store) if m.trigger is Trigger.RESCALE] == [
            rescaled.snapshot_id]  # the run after the kill started from the saved one, it did not rescale again
        last = read_launch(store)
        assert last is not None and last.launch_id != first.launch_id
        assert str(last.restore) == rescaled.snapshot_id
        produce_orders(env.kafka.bootstrap_servers, env.topic, 400, 200)
        _wait_totals(env, 600, last.log_file)
        assert read_totals(env.out) == expected_totals(600)

        # The same count again: refused before anything stops; the running driver, its lease and the store stay.
        status, lease = env.status(), read_lease(store)
        assert status is not None and status.state is JobState.RUNNING and lease is not None
        snapshots = [m.snapshot_id for m in list_snapshots(store)]
        again = subprocess.run([*cli, "--partitions", "4"], env=cli_env, capture_output=True, text=True, timeout=900,
                               check=False)
        assert again.returncode != 0
        assert "refused before anything was stopped" in again.stderr and "already has 4 partitions" in again.stderr, \
            again.stderr[-3000:]
        after, lease_after = env.status(), read_lease(store)
        assert after is not None and after.state is JobState.RUNNING and after.epoch == status.epoch
        assert lease_after is not None and (lease_after.epoch, lease_after.owner) == (lease.epoch, lease.owner)
        assert [m.snapshot_id for m in list_snapshots(store)] == snapshots

        # The State Processor through the same flow (issue 45): `ckpt job edit --delete-keys` checks the deletion on
        # a copy of the latest state, stops the job with a savepoint, deletes customer c001 from it into a new
        # savepoint, starts the job from that and verifies it. c001 then counts only the orders after the edit.
        edit = [*cli[:cli.index("rescale")], "edit", *cli[cli.index("rescale") + 1:]]
        done = subprocess.run([*edit, "--delete-keys", "0:key_customer = 'c001'", "--json"], env=cli_env,
                              capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        result = json.loads(done.stdout)
        steps = [ln[:3] for ln in done.stderr.splitlines() if ln[:4] in ("1/5 ", "2/5 ", "3/5 ", "4/5 ")]
        assert steps[0] == "1/5" and {"2/5", "3/5", "4/5"} <= set(steps), done.stderr[-3000:]
        assert "deleting the keys of operator 0 where key_customer = 'c001'" in done.stderr
        source = load_manifest(store, result["snapshot_id"])
        edited = load_manifest(store, result["rescaled_snapshot_id"])
        assert (source.trigger, source.state_partitions) == (Trigger.STOP, 4)
        assert (edited.batch_id, edited.state_partitions, edited.labels["rewritten_from"],
                edited.labels["keys_deleted"], edited.labels["rows_removed"]) == (
            source.batch_id + 1, 4, source.snapshot_id, "0:key_customer = 'c001'", "1")
        last = read_launch(store)
        assert last is not None and str(last.restore) == edited.snapshot_id
        produce_orders(env.kafka.bootstrap_servers, env.topic, 600, 200)
        want = expected_totals(800)
        after = [i for i in range(600, 800) if i % CUSTOMERS == 1]
        want["c001"] = (len(after), sum(7 * i % 100 for i in after))
        _wait_until_totals(env, want, last.log_file)
    finally:
        status = env.status()
        if status is not None and status.state is JobState.RUNNING:
            env.request(RequestAction.CANCEL, status.epoch)


def _wait_totals(env: RescaleEnv, total: int, log_file: str | None) -> None:
    deadline = time.monotonic() + TIMEOUT
    while sum(n for n, _ in read_totals(env.out).values()) < total:
        assert time.monotonic() < deadline, (f"totals short of {total} orders after {TIMEOUT:.0f} s; log "
                                             f"{log_file}:\n" + Path(str(log_file)).read_text()[-3000:])
        time.sleep(0.5)


def _wait_until_totals(env: RescaleEnv, want: dict[str, tuple[int, int]], log_file: str | None) -> None:
    """Until the newest totals are ``want``; the assertion shows both after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while (found := read_totals(env.out)) != want:
        assert time.monotonic() < deadline, (f"totals {found} are not {want} after {TIMEOUT:.0f} s; log {log_file}:\n"
                                             + Path(str(log_file)).read_text()[-3000:])
        time.sleep(0.5)
