"""The demo: a PySpark streaming job operated from Airflow like a Flink job, on the embedded default.

Starts SeaweedFS (S3) and tansu (Kafka) on 127.0.0.1, a throwaway Airflow home (sqlite), produces
orders, and runs the example DAGs in dags/ with ``airflow dags test`` (deferred tasks run in-process):

1. ``ckpt_keep_alive``: submit the example job (orders_v1.py) supervised on local Spark; while its
   health watch runs, kill -9 the driver: it is restarted from the latest completed checkpoint;
2. ``ckpt_savepoint_restore``: a savepoint on demand, and the job restored from it;
3. ``ckpt_upgrade_job``: upgrade to orders_v2.py keeping state (compatibility check, stop with
   savepoint, start v2 from it, verify);
4. stop with a final savepoint; the totals equal the produced stream exactly; where the snapshots are.

``World`` and ``AirflowHome`` are also what the system tests (tests/system) drive.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.control import Action, submit_request, wait_ack
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.launches import read_launch
from airflow_ckpt_provider.core.snapshots import list_snapshots
from airflow_ckpt_provider.core.status import JobStatus, read_status
from airflow_ckpt_provider.core.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.examples._orders import read_totals

DAGS = Path(__file__).absolute().parent.parent / "dags"
EXAMPLES = Path(__file__).absolute().parent / "examples"
CUSTOMERS = 50
TIMEOUT = 300.0
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
              "spark.ui.showConsoleProgress": "false"}


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


class World:
    """One job over one topic in one bucket: produce orders, read the job's state, kill its driver."""

    def __init__(self, services: EmbeddedServices, work: Path, *, job: str = "orders", bucket: str = "ckpt-demo",
                 topic: str = "orders", group: str = "ckpt-orders") -> None:
        self.services, self.work = services, work
        self.job, self.bucket, self.topic, self.group = job, bucket, topic, group
        self.produced = 0
        services.s3.create_bucket(bucket)
        services.kafka.create_topic(topic, partitions=3)
        s3 = services.s3
        self.s3_options = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                                    secret_access_key=s3.secret_key)
        self.store_url = f"s3://{bucket}/jobs"
        self.store = JobStore.open(self.store_url, job, self.s3_options)
        self.out = work / "out"

    def job_env(self) -> dict[str, str]:
        """The example job's settings (the Variable ``ckpt_orders_env``)."""
        return {"ORDERS_BOOTSTRAP": self.services.kafka.bootstrap_servers, "ORDERS_TOPIC": self.topic,
                "ORDERS_OUT": str(self.out), "ORDERS_GROUP": self.group, "ORDERS_MAX_PER_BATCH": "500"}

    def produce(self, count: int) -> None:
        """Order i: customer c<i % 50>, amount (7 i) % 100. One record per request (a tansu quirk)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.services.kafka.bootstrap_servers, "acks": "all",
                             "batch.num.messages": 1, "linger.ms": 0})
        for i in range(self.produced, self.produced + count):
            producer.produce(self.topic, key=f"c{i % CUSTOMERS:03d}".encode(), value=str(7 * i % 100).encode(),
                             partition=i % 3)
        if producer.flush(30) != 0:
            raise RuntimeError("orders still queued after 30 s")
        self.produced += count

    @contextlib.contextmanager
    def flowing(self, per_second: int = 20) -> Iterator[None]:
        """Orders keep arriving while inside (as in production): ``per_second`` each second."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(1.0):
                self.produce(per_second)

        thread = threading.Thread(target=run, name="orders-producer", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)

    def expected(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for i in range(self.produced):
            orders, revenue = found.get(f"c{i % CUSTOMERS:03d}", (0, 0))
            found[f"c{i % CUSTOMERS:03d}"] = (orders + 1, revenue + 7 * i % 100)
        return found

    def totals(self) -> dict[str, tuple[int, int]]:
        return read_totals(self.out) if self.out.exists() else {}

    def status(self) -> JobStatus | None:
        return read_status(self.store)

    def consumed(self, status: JobStatus) -> int:
        """Records of the topic the status's last batch had read (the checkpointed source offsets)."""
        return sum(int(offset) for source in status.offsets.values() if isinstance(source, dict)
                   for offset in source.get(self.topic, {}).values())

    def wait(self, what: str, ok: Callable[[JobStatus], bool], timeout: float = TIMEOUT) -> JobStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and ok(status):
                return status
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; last status: {self.status()}")

    def wait_all_consumed(self, timeout: float = TIMEOUT) -> JobStatus:
        return self.wait(f"all {self.produced} orders", lambda s: self.consumed(s) == self.produced, timeout)

    def kill_driver(self, status: JobStatus) -> None:
        """kill -9 of the driver's process group (JVM, Python driver, workers): a crashed machine."""
        assert status.pid is not None
        os.killpg(os.getpgid(status.pid), signal.SIGKILL)

    def stop_everything(self) -> None:
        """Kill what the job's launches left running here: the supervisor and its driver's process group."""
        status, launch = self.status(), read_launch(self.store)
        for pid in (launch.pid if launch else None, status.pid if status else None):
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


class AirflowHome:
    """A throwaway Airflow home (sqlite) whose connections and variables point at a World."""

    def __init__(self, world: World, path: Path, *, watch_seconds: float = 60.0) -> None:
        self.world, self.path = world, path
        s3 = world.services.s3
        store = {"conn_type": "ckpt_store", "host": s3.endpoint_url, "login": s3.access_key,
                 "password": s3.secret_key, "extra": {"store_url": world.store_url, "region_name": s3.region}}
        spark = {"conn_type": "ckpt_spark", "host": "local[2]", "extra": {"conf": SPARK_CONF}}
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(path),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_CKPT_STORE_DEFAULT": json.dumps(store),
            "AIRFLOW_CONN_CKPT_SPARK_DEFAULT": json.dumps(spark),
            "AIRFLOW_VAR_CKPT_ORDERS_ENV": json.dumps(world.job_env()),
            "CKPT_HOME": str(world.work / "ckpt-home"),
            "CKPT_EXAMPLE_JOB": world.job,
            "CKPT_EXAMPLE_WATCH_SECONDS": str(watch_seconds),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def airflow(self, *args: str, log_name: str, timeout: float = 900.0,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the ``airflow`` CLI of this environment (``env`` on top); output to ``<home>/<log_name>.log``."""
        log = self.path / f"{log_name}.log"
        argv = [sys.executable, "-m", "airflow", *args]
        with log.open("w") as out:
            done = subprocess.run(argv, env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                  text=True, timeout=timeout, check=False)
        return subprocess.CompletedProcess(argv, done.returncode, log.read_text(), "")

    def migrate(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        done = self.airflow("db", "migrate", log_name="db-migrate")
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{done.stdout[-3000:]}")

    def dags_test(self, dag_id: str, conf: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        """``airflow dags test DAG_ID`` (deferred tasks run in-process); returncode 0 iff the run succeeded.

        No scheduler runs here, so no stale exit report can fail a resumed task: deferrals need no minimum
        (``[ckpt] min_deferral`` 0; with a scheduler the operators hold each one 30 s, docs/airflow.md).
        """
        args = ["dags", "test", dag_id] + (["--conf", json.dumps(conf)] if conf else [])
        return self.airflow(*args, log_name=f"dags-test-{dag_id}-{time.monotonic_ns()}",
                            env={"AIRFLOW__CKPT__MIN_DEFERRAL": "0"})


def _expect_success(done: subprocess.CompletedProcess[str], dag_id: str) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"DAG {dag_id} failed (exit {done.returncode}); last lines:\n{done.stdout[-4000:]}")
    say(f"DAG {dag_id}: success")


def _kill_when_running(world: World, killed: list[JobStatus]) -> threading.Thread:
    """In the background: once the driver has committed two batches, kill -9 it and produce more orders."""

    def run() -> None:
        status = world.wait("two batches", lambda s: s.state == "RUNNING" and (s.batch_id or 0) >= 2)
        world.kill_driver(status)
        killed.append(status)
        say(f"kill -9 of the driver (pid {status.pid}, epoch {status.epoch}) at batch {status.batch_id}")
        world.produce(2000)
        say(f"produced 2000 more orders (total {world.produced})")

    thread = threading.Thread(target=run, name="demo-killer", daemon=True)
    thread.start()
    return thread


def scenario(world: World, home: AirflowHome) -> dict[str, Any]:
    world.produce(3000)
    say(f"produced 3000 orders to topic {world.topic}")

    say("1. DAG ckpt_keep_alive: submit the job supervised, watch its health; the driver gets killed meanwhile")
    killed: list[JobStatus] = []
    killer = _kill_when_running(world, killed)
    _expect_success(home.dags_test("ckpt_keep_alive"), "ckpt_keep_alive")
    killer.join(TIMEOUT)
    if not killed:
        raise RuntimeError("the driver was never killed: the job did not commit two batches in time")
    status = world.wait("the restarted driver", lambda s: s.epoch > killed[0].epoch and s.state == "RUNNING")
    source = status.restored_from or "its live checkpoint"
    say(f"restarted automatically from the latest completed checkpoint: epoch {killed[0].epoch} -> {status.epoch}, "
        f"resumed from {source}")

    say("2. DAG ckpt_savepoint_restore: a savepoint on demand, then the job restored from it")
    _expect_success(home.dags_test("ckpt_savepoint_restore", {"job": world.job}), "ckpt_savepoint_restore")
    status = world.wait("the restored driver", lambda s: s.state == "RUNNING")
    say(f"running again: epoch {status.epoch}, restored from {status.restored_from}")

    say("3. DAG ckpt_upgrade_job: upgrade to orders_v2.py (savepoint mode), state kept; orders keep arriving")
    conf = {"job": world.job, "job_file": str(EXAMPLES / "orders_v2.py"), "code_version": "v2",
            "upgrade_mode": "savepoint", "verify_batches": 2}
    with world.flowing():
        _expect_success(home.dags_test("ckpt_upgrade_job", conf), "ckpt_upgrade_job")
    say(f"orders produced while upgrading: total {world.produced}")
    status = world.wait_all_consumed()
    say(f"v2 runs: epoch {status.epoch}, code {status.code_version}, batch {status.batch_id}")
    return {"upgraded_epoch": status.epoch, "code_version": status.code_version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    parser.add_argument("--watch-seconds", type=float, default=45.0,
                        help="how long the keep-alive DAG watches the job's health (default 45)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    started = time.monotonic()
    world = None
    try:
        with EmbeddedServices() as services:
            say(f"SeaweedFS at {services.s3.endpoint_url}, tansu at {services.kafka.bootstrap_servers}")
            world = World(services, work)
            home = AirflowHome(world, work / "airflow", watch_seconds=args.watch_seconds)
            home.migrate()
            say(f"Airflow home {home.path} (logs of each DAG run there)")
            try:
                result = scenario(world, home)
                status = world.status()
                assert status is not None
                ack = wait_ack(world.store, submit_request(world.store, Action.STOP, status.epoch).id, TIMEOUT)
                exact = world.totals() == world.expected()
                from airflow_ckpt_provider.kafka.lag import consumer_group_lag

                lag = consumer_group_lag(services.kafka.bootstrap_servers, world.group, [world.topic]).total_lag
                snapshots = list_snapshots(world.store)
            finally:
                world.stop_everything()
        savepoints = [m for m in snapshots if m.kind.value == "savepoint"]
        print("\n=== airflow-ckpt-provider demo (through Airflow) ===")
        print(f"orders produced: {world.produced}; customers: {CUSTOMERS}")
        print(f"upgraded to code {result['code_version']} (epoch {result['upgraded_epoch']}); "
              f"stopped with final savepoint {ack.snapshot_id if ack else '-'}")
        print(f"snapshots in the job store {world.store.url}: {len(snapshots)} ({len(savepoints)} savepoints)")
        for m in savepoints:
            print(f"  {m.kind.value:10} batch {m.batch_id:>4}  {world.store.snapshot_uri(m.snapshot_id)}")
        print(f"consumer group {world.group} lag after the last batch: {lag}")
        print(f"final state equals the produced stream: {'YES' if exact else 'NO'}")
        print(f"total {time.monotonic() - started:.1f} s")
        return 0 if exact and lag == 0 and ack is not None else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
