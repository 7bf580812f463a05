"""Benchmark: rescaling a job's state through a savepoint against a plain stop and restart, by state size.

    .venv/bin/python bench/rescale_bench.py [--sizes 10000,100000,1000000] [--partitions 2:5]

For each size, one deployment of bench/jobs/keys_count.py (a count per key over a file source, RocksDB state,
2 partitions) is launched as the operators launch it (``ckpt run --supervise`` detached, spec/last.json) and
fed one file of SIZE distinct keys: its state then holds SIZE keys. Then, side by side on that job:

1. plain: stop with savepoint, start again from it, to the first batch of a new 10-key file;
2. rescale to 5 partitions (``ckpt job rescale``'s steps, launcher/upgrade.py): the check (a savepoint to check
   against, then a spark-submit that restores it on a copy, repartitions and runs one empty batch), the stop with
   savepoint, the repartition of that savepoint on a copy and its save as a savepoint, the start from it to the
   first batch of a new 10-key file.

Times are this script's clock around each step (the rescale's steps from its progress lines). Prints one table
and the ratio of the rescale to the plain stop and restart; nothing is asserted. Starts its own SeaweedFS on
127.0.0.1 (the job store) and stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec
from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedS3
from airflow_ckpt_provider.launcher.deploy import launch
from airflow_ckpt_provider.launcher.upgrade import run_upgrade

JOB = Path(__file__).parent / "jobs" / "keys_count.py"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TIMEOUT = 900.0


@dataclass
class Result:
    size: int
    state_bytes: int = 0
    plain: dict[str, float] = field(default_factory=dict)
    rescale: dict[str, float] = field(default_factory=dict)


class Bench:
    def __init__(self, s3: EmbeddedS3, work: Path, start: int, to: int) -> None:
        self.s3, self.work, self.start, self.to = s3, work, start, to
        self.options = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                                 secret_access_key=s3.secret_key)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        self.store_url = f"s3://{bucket}/jobs"

    def run(self, size: int) -> Result:
        job = f"keys-{size}-{uuid.uuid4().hex[:4]}"
        store = JobStore.open(self.store_url, job, self.options)
        inp, out = self.work / job / "in", self.work / job / "out"
        inp.mkdir(parents=True)
        feed(inp, 0, size, "keys")
        env = {"CKPT_BENCH_IN": str(inp), "CKPT_BENCH_OUT": str(out), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        conf = {"spark.sql.shuffle.partitions": str(self.start), "spark.ui.enabled": "false",
                "spark.sql.streaming.stateStore.providerClass": ROCKSDB, "spark.driver.memory": "2g"}
        deployment = Deployment(str(JOB), code_version="bench", checkpoint=str(self.work / job / "ckpt"), conf=conf,
                                env=env, heartbeat_interval=1.0, checkpoint_interval=None)
        result = Result(size)
        began = time.time()
        record = self.launch(store, deployment, LATEST_STATE)
        try:
            loaded = batch_with(out, size, began, record)
            say(f"{job}: {size:,} keys in the state after {loaded - began:.1f} s")
            status = read_status(store)
            assert status is not None
            # 1. plain: stop with savepoint, start from it, to the first batch of new data.
            began = time.time()
            ack = request(store, RequestAction.STOP, status.epoch)
            result.plain["stop with savepoint"] = time.time() - began
            result.state_bytes = load_manifest(store, str(ack.snapshot_id)).total_bytes
            began = time.time()
            feed(inp, 1, NEW_KEYS, "new")
            record = self.launch(store, deployment, RestoreSpec(RestoreMode.SNAPSHOT, str(ack.snapshot_id)))
            result.plain["start to first batch"] = batch_with(out, NEW_KEYS, began, record) - began
            say(f"{job}: plain stop and start: {sum(result.plain.values()):.1f} s")
            # 2. the rescale's steps, timed by their progress lines.
            marks: list[tuple[float, str]] = []

            def progress(line: str) -> None:
                marks.append((time.time(), line))
                say(f"{job}: {line}")
                if line.startswith("4/5 starting"):
                    feed(inp, 2, NEW_KEYS, "newer")

            began = time.time()
            run_upgrade(store, self.store_url, self.options,
                        UpgradeSettings(partitions=self.to, verify_batches=1, check_timeout=TIMEOUT,
                                        stop_timeout=TIMEOUT, verify_timeout=TIMEOUT),
                        say=progress, requested_by="rescale_bench")
            starting = _mark(marks, "4/5 starting")
            result.rescale = {
                "check": _mark(marks, "2/5 stopping") - began,
                "stop with savepoint": _mark(marks, "3/5 repartitioning") - _mark(marks, "2/5 stopping"),
                "repartition + save": starting - _mark(marks, "3/5 repartitioning"),
                "start to first batch": batch_with(out, NEW_KEYS, starting, None) - starting,
            }
            return result
        finally:
            final = read_status(store)
            if final is not None and final.state is JobState.RUNNING:
                request(store, RequestAction.CANCEL, final.epoch)

    def launch(self, store: JobStore, deployment: Deployment, restore: RestoreSpec) -> Launch:
        return launch(store, deployment, restore=restore, store_url=self.store_url, s3=self.options,
                      launched_by="rescale_bench")


NEW_KEYS = 10


def feed(inp: Path, n: int, keys: int, prefix: str) -> None:
    """Input file ``n``: ``keys`` distinct keys (written aside, then renamed: the file source sees it whole)."""
    tmp = inp / f".{n:03d}.json.tmp"
    with tmp.open("w") as f:
        for i in range(keys):
            f.write(json.dumps({"key": f"{prefix}-{i:08d}"}) + "\n")
    tmp.replace(inp / f"{n:03d}.json")


def request(store: JobStore, action: RequestAction, epoch: int) -> Ack:
    ack = wait_ack(store, submit_request(store, action, epoch).id, TIMEOUT, poll=0.2)
    if ack is None or ack.outcome is not Outcome.COMPLETED:
        raise SystemExit(f"{action.value} of job {store.job} did not complete: {ack}")
    return ack


def batch_with(out: Path, rows: int, after: float, record: Launch | None) -> float:
    """When the sink wrote a batch that updated ``rows`` keys, after ``after`` (the batch file's mtime)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for path in sorted(out.glob("batch-*")) if out.exists() else []:
            mtime = path.stat().st_mtime
            if mtime >= after and path.read_text().strip() == str(rows):
                return mtime
        time.sleep(0.1)
    log = Path(str(record.log_file)).read_text()[-3000:] if record is not None else ""
    raise SystemExit(f"no batch of {rows} keys in {out} within {TIMEOUT:.0f} s\n{log}")


def _mark(marks: list[tuple[float, str]], prefix: str) -> float:
    return next(t for t, line in marks if line.startswith(prefix))


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def table(results: list[Result], start: int, to: int) -> str:
    rows = [f"Rescale {start} -> {to} partitions versus a plain stop and restart (seconds; one run each)", ""]
    header = ["keys", "state", "plain stop", "plain start", "plain total", "check", "stop", "repartition+save",
              "start", "rescale total", "rescale / plain"]
    rows.append(" | ".join(header))
    for r in results:
        plain = sum(r.plain.values())
        rs = r.rescale
        total = sum(rs.values())
        cells = [f"{r.size:,}", f"{r.state_bytes / 1e6:.1f} MB", f"{r.plain['stop with savepoint']:.1f}",
                 f"{r.plain['start to first batch']:.1f}", f"{plain:.1f}", f"{rs['check']:.1f}",
                 f"{rs['stop with savepoint']:.1f}", f"{rs['repartition + save']:.1f}",
                 f"{rs['start to first batch']:.1f}", f"{total:.1f}", f"{total / plain:.2f}x"]
        rows.append(" | ".join(cells))
    return "\n".join(rows)


def main(argv: list[str] | None = None, report: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="state sizes in keys, comma-separated")
    parser.add_argument("--partitions", default="2:5", help="FROM:TO state partitions (default 2:5)")
    args = parser.parse_args(argv)
    start, to = (int(x) for x in args.partitions.split(":"))
    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="rescale-bench-") as tmp:
        os.environ.setdefault("CKPT_HOME", str(Path(tmp) / "home"))
        with EmbeddedS3(workdir=Path(tmp) / "s3") as s3:
            os.environ.update(s3.env())  # the rescale's check and repartition processes reach the job store
            bench = Bench(s3, Path(tmp), start, to)
            results = [bench.run(size) for size in sizes]
    report(table(results, start, to))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
