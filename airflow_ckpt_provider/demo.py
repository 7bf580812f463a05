"""The demo: Flink-style operations for a PySpark streaming job, on the embedded default.

Starts SeaweedFS (S3) and tansu (Kafka) on 127.0.0.1, produces orders, and runs the example job
(airflow_ckpt_provider/examples/orders_job.py) with ``ckpt run --supervise`` on local Spark:

1. batches run; a checkpoint snapshot goes to S3 after each one;
2. a savepoint on request (``ckpt job savepoint``);
3. kill -9 of the driver: the supervisor restarts it from the latest completed checkpoint;
4. stop with savepoint (``ckpt job stop``): the batch in flight commits, the driver exits 0;
5. that savepoint restored on a fresh checkpoint location (another machine), more orders;
6. the totals equal the produced stream exactly; the consumer group's lag is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.control import Ack, Action, submit_request, wait_ack
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.snapshots import list_snapshots
from airflow_ckpt_provider.core.status import JobStatus, read_status
from airflow_ckpt_provider.core.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedServices

JOB_FILE = Path(__file__).parent / "examples" / "orders_job.py"
JOB, BUCKET, TOPIC, GROUP = "orders", "ckpt-demo", "orders", "ckpt-orders"
CUSTOMERS = 50
TIMEOUT = 240.0


class Demo:
    def __init__(self, services: EmbeddedServices, work: Path) -> None:
        self.services, self.work = services, work
        self.produced = 0
        s3 = services.s3
        self.store = JobStore.open(f"s3://{BUCKET}/jobs", JOB, S3Options(
            endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
            secret_access_key=s3.secret_key))

    def produce(self, count: int) -> None:
        """Order i: customer c<i % 50>, amount (7 i) % 100. One record per request (a tansu quirk)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.services.kafka.bootstrap_servers, "acks": "all",
                             "batch.num.messages": 1, "linger.ms": 0})
        for i in range(self.produced, self.produced + count):
            producer.produce(TOPIC, key=f"c{i % CUSTOMERS:03d}".encode(), value=str(7 * i % 100).encode())
        producer.flush(30)
        self.produced += count
        say(f"produced {count} orders (total {self.produced})")

    def run(self, name: str, checkpoint: Path, *args: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(JOB_FILE), "--job", JOB,
                "--store", f"s3://{BUCKET}/jobs", "--checkpoint", str(checkpoint), "-v",
                "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2", *args]
        env = {**os.environ, **self.services.s3.env(), "ORDERS_BOOTSTRAP": self.services.kafka.bootstrap_servers,
               "ORDERS_TOPIC": TOPIC, "ORDERS_OUT": str(self.work / "out"), "ORDERS_GROUP": GROUP}
        say(f"ckpt run {JOB_FILE.name} --job {JOB} {' '.join(args)}  (log: {self.work / name}.log)")
        with open(self.work / f"{name}.log", "ab") as log:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, what: str, ok: Callable[[JobStatus], bool], proc: subprocess.Popen[bytes]) -> JobStatus:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            status = read_status(self.store)
            if status is not None and ok(status):
                return status
            if proc.poll() is not None:
                raise RuntimeError(f"the job exited with {proc.returncode} while waiting for {what}; see its log")
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {TIMEOUT:.0f} s waiting for {what}")

    def request(self, action: Action, epoch: int) -> Ack:
        request = submit_request(self.store, action, epoch)
        ack = wait_ack(self.store, request.id, TIMEOUT, poll=0.3)
        if ack is None:
            raise RuntimeError(f"no answer to {action.value} within {TIMEOUT:.0f} s")
        say(f"{action.value}: {ack.outcome.value}: {ack.message}")
        return ack

    def consumed(self, status: JobStatus) -> int:
        return sum(int(offset) for source in status.offsets.values() if isinstance(source, dict)
                   for offset in source.get(TOPIC, {}).values())

    def totals(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for path in sorted((self.work / "out").glob("batch-*.json")):  # update mode: the last batch wins
            for customer, orders, revenue in json.loads(path.read_text()):
                found[customer] = (orders, revenue)
        return found

    def expected(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for i in range(self.produced):
            orders, revenue = found.get(f"c{i % CUSTOMERS:03d}", (0, 0))
            found[f"c{i % CUSTOMERS:03d}"] = (orders + 1, revenue + 7 * i % 100)
        return found


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def scenario(demo: Demo) -> dict[str, Any]:
    first = demo.work / "machine-a" / "checkpoint"
    demo.produce(3000)
    sup = demo.run("supervised", first, "--supervise", "--restart-strategy", "fixed-delay",
                   "--restart-attempts", "3", "--restart-delay", "1")
    try:
        status = demo.wait("two batches", lambda s: (s.batch_id or 0) >= 2, sup)
        say(f"running: epoch {status.epoch}, batch {status.batch_id}, last snapshot "
            f"{(status.last_snapshot or {}).get('id')}")
        demo.request(Action.SAVEPOINT, status.epoch)

        before = status.batch_id or 0
        status = demo.wait("another batch", lambda s: (s.batch_id or 0) > before, sup)
        assert status.pid is not None
        os.killpg(os.getpgid(status.pid), signal.SIGKILL)
        killed_at = time.monotonic()
        say(f"kill -9 of the driver (pid {status.pid}) at batch {status.batch_id}")
        demo.produce(2000)
        killed_epoch = status.epoch
        status = demo.wait("the restarted driver's first batch",
                           lambda s: s.epoch > killed_epoch and s.batch_id is not None, sup)
        say(f"restarted from the latest completed checkpoint: epoch {status.epoch}, batch {status.batch_id} "
            f"committed {time.monotonic() - killed_at:.1f} s after the kill")
        status = demo.wait("all orders so far", lambda s: demo.consumed(s) == demo.produced, sup)
        stop = demo.request(Action.STOP, status.epoch)
        code = sup.wait(TIMEOUT)
        say(f"supervisor exited with {code}")
    finally:
        _kill(sup)

    second = demo.work / "machine-b" / "checkpoint"
    demo.produce(1000)
    again = demo.run("restored", second, "--restore", str(stop.snapshot_uri))
    try:
        status = demo.wait("all orders", lambda s: demo.consumed(s) == demo.produced, again)
        say(f"restored {status.restored_from} on a fresh checkpoint location; batch {status.batch_id}")
        final = demo.request(Action.STOP, status.epoch)
        again.wait(TIMEOUT)
    finally:
        _kill(again)
    return {"savepoint": stop.snapshot_id, "final": final.snapshot_id, "exit": code}


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    started = time.monotonic()
    try:
        with EmbeddedServices() as services:
            services.s3.create_bucket(BUCKET)
            services.kafka.create_topic(TOPIC, partitions=3)
            say(f"SeaweedFS at {services.s3.endpoint_url}, tansu at {services.kafka.bootstrap_servers}")
            demo = Demo(services, work)
            result = scenario(demo)
            exact = demo.totals() == demo.expected()
            from airflow_ckpt_provider.kafka.lag import consumer_group_lag

            lag = consumer_group_lag(services.kafka.bootstrap_servers, GROUP, [TOPIC]).total_lag
            snapshots = list_snapshots(demo.store)
        print("\n=== airflow-ckpt-provider demo ===")
        print(f"orders produced: {demo.produced}; customers: {CUSTOMERS}")
        print(f"supervised run: savepoint on request, kill -9 and restart, stop with savepoint "
              f"{result['savepoint']} (exit {result['exit']})")
        print(f"restored on another checkpoint location, final savepoint {result['final']}")
        print(f"snapshots in the job store: {len(snapshots)} "
              f"({sum(1 for m in snapshots if m.kind.value == 'savepoint')} savepoints)")
        print(f"consumer group {GROUP} lag after the last batch: {lag}")
        print(f"final state equals the produced stream: {'YES' if exact else 'NO'}")
        print(f"total {time.monotonic() - started:.1f} s")
        return 0 if exact and lag == 0 and result["exit"] == 0 else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
