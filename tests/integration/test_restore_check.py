"""The restore check end to end: orders_v1 runs under ``ckpt run`` (tansu, SeaweedFS, local Spark) while
the new versions are checked against its savepoint with ``check_restore`` (spark-submit in check mode).

One v1 run is shared by all checks; v1 keeps consuming new orders while they run. v2's check runs detached, as
an upgrade starts it (``start_check``: its record, then ``ckpt run --check-restore --check-id``), and its verdict
is read from the job store by the upgrade's watch, while the others run in this process; a second detached check
is killed with kill -9 and its watch reports it failed. The checks must change nothing: the job store is
byte-for-byte the same apart from v1's heartbeats (status.json) and the detached checks' records (checks/),
v1 keeps its lease and commits batches, and its final totals are exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airflow_ckpt_provider import examples
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.restore_check import CHECK_ENV, CheckStarted, check_key, outcome_key, read_end
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import CHECKS, STATUS, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.watches.restore_check import RestoreCheckWatch
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.examples._orders import read_totals
from airflow_ckpt_provider.launcher.restore_check import check_restore, check_spec, start_check
from airflow_ckpt_provider.launcher.submit import SubmitSpec, gate_file, parse_conf
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck
from tests.support.runtimejob import SPARK_CONF, JobEnv, Run, snapshot_args

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

        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(job_file), "--job", self.job,
                "--store", self.store_url, "--checkpoint", str(checkpoint), "--master", "local[2]"]
        for conf in SPARK_CONF:
            argv += ["--conf", conf]
        log = self.work / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([*argv, *snapshot_args(args)], env=self.orders_env(self.out), stdout=out,
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


    def start_check(self, job_file: Path, checkpoint: Path, out: Path) -> CheckStarted:
        """The check as an upgrade starts it: recorded, then run detached; its verdict goes to the job store."""
        settings = {k: v for k, v in self.orders_env(out).items()
                    if k.startswith("ORDERS_") or k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")}
        deployment = Deployment(str(job_file), code_version="v2", conf=parse_conf(SPARK_CONF),
                                checkpoint=str(checkpoint), env=settings)
        s3 = S3Options(endpoint_url=self.s3.endpoint_url, region=self.s3.region, access_key_id=self.s3.access_key,
                       secret_access_key=self.s3.secret_key)
        return start_check(self.store(), deployment, store_url=self.store_url, timeout=CHECK_TIMEOUT, s3=s3,
                           started_by="test_restore_check")


def verdict(store: JobStore, check_id: str, timeout: float) -> tuple[dict[str, object], float]:
    """The event of the upgrade's watch on check ``check_id`` (polled as the operator does when not deferrable),
    and how long it took."""
    watch, started = RestoreCheckWatch(store, check_id), time.monotonic()
    while (event := watch.poll()) is None:
        assert time.monotonic() - started < timeout, watch.waiting_for()
        time.sleep(1.0)
    return event, time.monotonic() - started


def wait_for(what: str, found: Callable[[], set[int]], timeout: float = TIMEOUT) -> set[int]:
    deadline = time.monotonic() + timeout
    while not (result := found()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.5)
    return result


def check_processes(check_id: str) -> set[int]:
    """Processes of this host whose environment names the check (its spark-submit and Spark's Python inherit it)."""
    marker = f"{CHECK_ENV}={check_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:  # gone meanwhile, or another user's
                continue
    return found


def store_contents(store: JobStore) -> dict[str, str]:
    """SHA-256 of every object of the job store but the driver's heartbeat and the detached checks' records."""
    return {o.key: hashlib.sha256(store.storage.read(o.key)).hexdigest()
            for o in store.storage.list() if o.key != STATUS and not o.key.startswith(CHECKS)}


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path,
        launcher_env: Path) -> OrdersEnv:
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
    # v1 may have read all 600 by the savepoint: more orders, so a batch follows it whatever v1 had read.
    produce_orders(env.kafka.bootstrap_servers, env.topic, 600, 150)
    batch_before = env.wait_status("a batch after the savepoint",
                                   lambda s: (s.batch_id or 0) > (savepoint.batch_id or 0), TIMEOUT, v1).batch_id
    total = 900  # v1 keeps committing batches while the checks run
    produce_orders(env.kafka.bootstrap_servers, env.topic, 750, total - 750)
    check_out = env.work / "check-out"
    detached = env.start_check(EXAMPLES / "orders_v2.py", checkpoint, check_out)  # recorded, then started
    with pytest.raises(ConfigError, match=rf"expected no restore check of job {env.job} running, found restore "
                                          rf"check {detached.check_id} of .*orders_v2.py \(pid {detached.pid} on "):
        env.start_check(EXAMPLES / "orders_v2.py", checkpoint, check_out)  # one check of a job at a time
    jobs = [EXAMPLES / "orders_incompatible.py", EXAMPLES / "orders_v2_broken.py", STATELESS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # with the detached one: three spark-submits at first
        results = pool.map(lambda job: env.check(job, checkpoint, check_out), jobs)
        compatible, seconds = verdict(store, detached.check_id, CHECK_TIMEOUT)
        # kill -9 of a detached check while its spark-submit runs: the watch says failed within two polls.
        killed = env.start_check(EXAMPLES / "orders_v2.py", checkpoint, check_out)
        assert killed.pid is not None
        spark = wait_for("the killed check's spark-submit", lambda: check_processes(killed.check_id) - {killed.pid})
        groups = {os.getpgid(pid) for pid in spark}  # its spark-submit's session, with Spark's Python
        os.kill(killed.pid, signal.SIGKILL)
        for group in groups:  # the orphans: they would run to their own timeout
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        failed, noticed = verdict(store, killed.check_id, 30)
        (incompatible, _), (broken, _), (stateless, _) = results

    # v2, detached: same state, other output. The newest snapshot is the savepoint; the live checkpoint is newer.
    assert compatible["status"] == "compatible", compatible
    assert (compatible["check_id"], compatible["snapshot_id"], compatible["batch_id"]) == (
        detached.check_id, savepoint.snapshot_id, savepoint.batch_id)
    ended = read_end(store, detached.check_id)
    assert ended is not None and ended.report["outcome"] == "compatible"
    assert (ended.report["snapshot_operators"], ended.report["new_operators"],
            ended.report["non_restored_operators"]) == ([0], [0], [])
    assert f"orders_v2.py can restore savepoint {savepoint.snapshot_id} (batch {savepoint.batch_id})" in \
        str(compatible["reason"])
    assert "operator 0 (stateStoreSave)" in str(compatible["reason"])
    assert "newer than every snapshot" in str(compatible["reason"])
    assert seconds < CHECK_TIMEOUT
    assert "CKPT_RESTORE_CHECK " in Path(str(detached.log_file)).read_text()  # Spark's output, in the check's log
    # Killed: a clear failure, not a hang, and no verdict.
    assert failed["status"] == "failed" and noticed < 10, (failed, noticed)
    assert str(failed["message"]).startswith(f"job {env.job}: expected a verdict from restore check "
                                             f"{killed.check_id} of ")
    assert "found none and its process no longer exists; no verdict" in str(failed["message"])
    assert read_end(store, killed.check_id) is None
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
    assert sorted(o.key for o in store.storage.list(CHECKS)) == sorted(
        [check_key(detached.check_id), outcome_key(detached.check_id), check_key(killed.check_id)])
    assert read_lease(store) == lease
    # status.json reports batches with the next heartbeat: wait for the batch of the orders produced before the checks.
    after = env.wait_status("v1 running on, past the batch before the checks",
                            lambda s: s.state is JobState.RUNNING and (s.batch_id or 0) > (batch_before or 0),
                            TIMEOUT, v1)
    assert after.epoch == status.epoch
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
