"""Benchmark: how many jobs one supervision service instance supervises, and what each costs it (issue 42).

    .venv/bin/python bench/service_capacity_bench.py [--jobs 20 100 300] [--seconds 60]

For each count N: N jobs handed to the service on SeaweedFS (started on 127.0.0.1 and stopped here) behind the
counting proxy (bench/s3count.py), each with a launch recorded as started and a live supervisor record (simulated
supervisors: this process's pid on this host, so the instance keeps them and starts nothing; no Spark). One real
``ckpt service run`` instance with the product's timings (a look at every job every 2 s) claims them all; then, for
``--seconds``, the instance's CPU (utime + stime from /proc), its resident memory, its store requests by operation and
whether it started any of them by mistake are measured. Prints a table per count and a JSON line; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.ownership import read_owner
from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, write_supervisor
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, open_storage
from airflow_ckpt_provider.embedded import EmbeddedS3
from airflow_ckpt_provider.launcher.handover import hand_over
from bench.s3count import CountingProxy

BUCKET = "bench"
RENEW_EVERY = 2.0
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def hand_jobs(url: str, opts: S3Options, work: Path, n: int) -> list[JobStore]:
    """N handed jobs, each with a launch recorded as started here and a live supervisor record."""
    job_file = work / "orders.py"
    job_file.write_text("# never started: its supervisor is simulated\n")
    stores, now = [], time.time()
    for i in range(n):
        store = JobStore(open_storage(url, opts), f"job-{i:04d}")
        launch = hand_over(store, Deployment(job_file=str(job_file)), restore=LATEST_STATE, store_url=url, s3=opts,
                           handed_by="bench")
        started = msgspec.structs.replace(launch, pid=os.getpid(), host=socket.gethostname())
        store.storage.write(SPEC_LAST, started.to_bytes())
        write_supervisor(store, SupervisorRecord(
            job=store.job, launch_id=launch.launch_id, pid=os.getpid(), host=socket.gethostname(),
            state=SupervisorState.WATCHING, started_at=now, updated_at=now, interval=5.0))
        stores.append(store)
    return stores


def one_count(s3: EmbeddedS3, opts: S3Options, work: Path, n: int, seconds: float) -> dict[str, Any]:
    url = f"s3://{BUCKET}/capacity{n}"
    stores = hand_jobs(url, opts, work, n)
    with CountingProxy(int(s3.endpoint_url.rsplit(":", 1)[1])) as proxy:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
               "CKPT_HOME": str(work / f"home{n}")}
        log = work / f"instance-{n}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_ckpt_provider.cli", "service", "run", "--store", url, "--instance",
                 f"svc-{n}", "--endpoint-url", proxy.url, "--region", s3.region], env=env, stdout=out,
                stderr=subprocess.STDOUT)
        try:
            began = time.monotonic()
            while sum(1 for s in stores if read_owner(s) is not None) < n:
                if time.monotonic() - began > 600 or proc.poll() is not None:
                    raise SystemExit(f"{n} jobs: not all claimed; instance log {log}:\n{log.read_text()[-2000:]}")
                time.sleep(0.5)
            claimed = time.monotonic() - began
            time.sleep(2 * RENEW_EVERY)  # its first looks as owner done
            mark, cpu0, t0 = proxy.mark(), _cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            hits = [h for h in proxy.since(mark) if h.role != "watch"]  # the instance's requests, not this process's
            cpu, elapsed, rss = _cpu_seconds(proc.pid) - cpu0, time.monotonic() - t0, _rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
    ops = Counter(h.op for h in hits)
    started = [s for s in stores if (last := read_launch(s)) is not None and last.pid != os.getpid()]
    return {"jobs": n, "claimed_s": round(claimed, 1), "seconds": round(elapsed, 1),
            "cpu_percent": round(100 * cpu / elapsed, 1), "rss_mib": round(rss, 1),
            "requests_per_s": round(len(hits) / elapsed, 1),
            "requests_per_job_s": round(len(hits) / elapsed / n, 2), "by_op": dict(ops),
            "started_by_mistake": len(started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[20, 100, 300])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="ckpt-capacity-") as tmp, EmbeddedS3(workdir=Path(tmp) / "s3") as s3:
        s3.create_bucket(BUCKET)
        opts = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                         secret_access_key=s3.secret_key)
        for n in args.jobs:
            result = one_count(s3, opts, Path(tmp), n, args.seconds)
            results.append(result)
            print(f"{n:>4} jobs: claimed in {result['claimed_s']} s; over {result['seconds']} s: CPU "
                  f"{result['cpu_percent']}% of a core, RSS {result['rss_mib']} MiB, {result['requests_per_s']} "
                  f"store requests/s ({result['requests_per_job_s']} per job: {result['by_op']}), started by mistake "
                  f"{result['started_by_mistake']}", flush=True)
    print(json.dumps({"service_capacity": results}))


if __name__ == "__main__":
    main()
