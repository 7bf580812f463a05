"""The restore check end to end: orders_v1 runs under ``ckpt run`` (tansu, SeaweedFS, local Spark) while
the new versions are checked against its savepoint with ``check_restore`` (spark-submit in check mode).

One v1 run is shared by all checks (two at a time); v1 keeps consuming new orders while they run. The checks must
change nothing: the job store is byte-for-byte the same apart from v1's heartbeats (status.json),
v1 keeps its lease and commits batches, and its final totals are exact.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.control import Outcome, RequestAction
from airflow_ckpt_provider.core.jobstore import STATUS, JobStore
from airflow_ckpt_provider.core.lease import read_lease
from airflow_ckpt_provider.core.status import JobState
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.examples._orders import read_totals
from airflow_ckpt_provider.launcher.restorecheck import check_restore, check_spec
from airflow_ckpt_provider.launcher.submit import SubmitSpec, gate_file, parse_conf
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from airflow_ckpt_provider.runtime.restoreverdict import CheckOutcome, RestoreCheck
from tests.support.runtimejob import SPARK_CONF, JobEnv, Run

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
CHECK_TIMEOUT = 240.0
CUSTOMERS = 20
PER_BATCH = 100
EXAMPLES = Path(examples.__file__).parent
STATELESS = Path(__file__).parent.parent / "jobs" / "orders_stateless.py"


def produce_orders(bootstrap: str, topic: str, start: int, count: int) -> None:
    """Order i: customer c<i % 20>, amount 7 i % 100, partition i % 3.

    ``batch.num.messages=1``: tansu's ListOffsets(LATEST) answers the last record BATCH's base offset + 1.
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "batch.num.messages": 1, "linger.ms": 0})
    try:
        for i in range(start, start + count):
            producer.produce(topic, key=f"c{i % CUSTOMERS:03d}".encode(), value=str(7 * i % 100).encode(),
                             partition=i % 3)
        assert producer.flush(30) == 0, "orders still queued after 30 s"
    finally:
        del producer


def expected_totals(total: int) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for i in range(total):
        orders, revenue = found.get(f"c{i % CUSTOMERS:03d}", (0, 0))
        found[f"c{i % CUSTOMERS:03d}"] = (orders + 1, revenue + 7 * i % 100)
    return found


class OrdersEnv(JobEnv):
    """A JobEnv that runs the orders example instead of the test count job."""

    def orders_env(self, out: Path) -> dict[str, str]:
        return {**self.env(), "ORDERS_BOOTSTRAP": self.kafka.bootstrap_servers, "ORDERS_TOPIC": self.topic,
                "ORDERS_OUT": str(out), "ORDERS_GROUP": f"ckpt-{self.job}", "ORDERS_MAX_PER_BATCH": str(PER_BATCH)}

    def run_job(self, name: str, job_file: Path, checkpoint: Path, *args: str) -> Run:
        import subprocess
        import sys

        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(job_file), "--job", self.job,
                "--store", self.store_url, "--checkpoint", str(checkpoint), "--master", "local[2]"]
        for conf in SPARK_CONF:
            argv += ["--conf", conf]
        log = self.work / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([*argv, *args], env=self.orders_env(self.out), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return Run(name, proc, log)

    def check(self, job_file: Path, checkpoint: Path, out: Path) -> tuple[RestoreCheck, float]:
        config = RuntimeConfig(job=self.job, store=self.store_url, checkpoint=str(checkpoint),
                               endpoint_url=self.s3.endpoint_url, region=self.s3.region)
        spec = SubmitSpec(job_file=str(job_file), config=config, conf=parse_conf(SPARK_CONF))
        started = time.monotonic()
        report = check_restore(spec, CHECK_TIMEOUT, log_file=str(self.work / f"check-{job_file.stem}.log"),
                               env=self.orders_env(out))
        return report, time.monotonic() - started


def store_contents(store: JobStore) -> dict[str, str]:
    """SHA-256 of every object of the job store but the driver's heartbeat."""
    return {o.key: hashlib.sha256(store.storage.read(o.key)).hexdigest()
            for o in store.storage.list() if o.key != STATUS}


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path) -> OrdersEnv:
    return OrdersEnv(s3_server, kafka_server, tmp_path, bucket, topic)


def test_new_versions_are_checked_against_the_running_jobs_state_without_touching_it(
    env: OrdersEnv, runs: list[Run]
) -> None:
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, 600)
    checkpoint = env.work / "checkpoint"
    # No scheduled snapshots: v1 then writes nothing to the job store but its heartbeat while the checks run.
    runs.append(v1 := env.run_job("v1", EXAMPLES / "orders_v1.py", checkpoint, "--checkpoint-interval", "none"))
    status = env.wait_status("batch 2 completed", lambda s: (s.batch_id or 0) >= 2, TIMEOUT, v1)
    savepoint = env.request(RequestAction.SAVEPOINT, status.epoch)
    assert savepoint.outcome is Outcome.COMPLETED, savepoint

    store = env.store()
    before, lease = store_contents(store), read_lease(store)
    assert lease is not None and not lease.released
    batch_before = env.wait_status("a batch after the savepoint",
                                   lambda s: (s.batch_id or 0) > (savepoint.batch_id or 0), TIMEOUT, v1).batch_id
    total = 900  # v1 keeps committing batches while the checks run
    produce_orders(env.kafka.bootstrap_servers, env.topic, 600, total - 600)
    check_out = env.work / "check-out"
    jobs = [EXAMPLES / "orders_v2.py", EXAMPLES / "orders_incompatible.py", EXAMPLES / "orders_v2_broken.py",
            STATELESS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two spark-submits at a time: 2 cores, v1 runs too
        (compatible, seconds), (incompatible, _), (broken, _), (stateless, _) = pool.map(
            lambda job: env.check(job, checkpoint, check_out), jobs)

    # v2: same state, other output. The newest snapshot is the savepoint; the live checkpoint is newer.
    assert compatible.outcome is CheckOutcome.COMPATIBLE, compatible
    assert (compatible.snapshot_id, compatible.batch_id) == (savepoint.snapshot_id, savepoint.batch_id)
    assert (compatible.snapshot_operators, compatible.new_operators, compatible.non_restored_operators) == (
        (0,), (0,), ())
    assert f"orders_v2.py can restore savepoint {savepoint.snapshot_id} (batch {savepoint.batch_id})" in \
        compatible.reason
    assert "operator 0 (stateStoreSave)" in compatible.reason
    assert "newer than every snapshot" in compatible.reason
    assert seconds < CHECK_TIMEOUT
    # A new grouping key: Spark's own state schema check refuses v1's state.
    assert incompatible.outcome is CheckOutcome.INCOMPATIBLE, incompatible
    assert incompatible.exit_code == 5
    assert incompatible.snapshot_id == savepoint.snapshot_id
    assert incompatible.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    assert "Existing key_schema=StructType(StructField(customer,StringType,true))" in incompatible.reason
    assert "Streaming Query" not in incompatible.reason and "\tat " not in incompatible.reason
    # The sink's bug is not the check's business: the state restores.
    assert broken.outcome is CheckOutcome.COMPATIBLE, broken
    assert broken.new_operators == (0,)
    # No stateful operator at all: v1's state would not be restored (Spark refuses it too).
    assert stateless.outcome is CheckOutcome.INCOMPATIBLE, stateless
    assert stateless.error_class == "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
    assert (stateless.snapshot_operators, stateless.new_operators, stateless.non_restored_operators) == (
        (0,), (), (0,))

    # Nothing was touched: the store, the lease, the running driver; no check output or leftovers.
    assert store_contents(store) == before
    assert read_lease(store) == lease
    after = env.wait_status("v1 running on", lambda s: s.state is JobState.RUNNING, TIMEOUT, v1)
    assert after.epoch == status.epoch
    assert (after.batch_id or 0) > (batch_before or 0), "v1 committed batches while the checks ran"
    assert not list(check_out.glob("batch-*.json")), "a check ran the new code's sink"
    check_config = check_spec(SubmitSpec(job_file=str(STATELESS), config=RuntimeConfig(
        job=env.job, store=env.store_url, checkpoint=str(checkpoint))), CHECK_TIMEOUT).config
    assert not Path(gate_file(check_config)).exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"ckpt-restore-check-{env.job}-*"))

    # v1 ends exactly: every order counted once.
    env.wait_status(f"all {total} orders", lambda s: env.consumed(s) == total, TIMEOUT, v1)
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert v1.wait(TIMEOUT) == EXIT_STOPPED
    assert read_totals(env.out) == expected_totals(total)
