"""S3 requests of one supervised job, measured, and extrapolated to 1,000 jobs (docs/scale.md).

    .venv/bin/python bench/store_requests_bench.py [--seconds 180] [--rate 50] [--sizes 10,100,1000,2500]

1. Runs the test job (tests/jobs/kafka_count.py) with ``ckpt run --supervise`` in local[2] against the
   embedded SeaweedFS and tansu, with the default runtime settings (a checkpoint snapshot every 60 s, 3
   kept, no periodic savepoints, heartbeat 30 s, lease read every 4 s, control poll 30 s; --run-args adds
   settings), while a producer writes a steady --rate records/s. Every S3 request of the driver and the
   supervisor goes through a counting reverse proxy (bench/s3count.py: AWS_ENDPOINT_URL points at it; no
   product code changes).
   Requests are counted over --seconds of steady state, which starts at the first batch with rows; the
   start (spawn to that batch) is reported apart.
2. One poll of each watch the Airflow triggers and sensors run (core/watches: job health as the
   keep-alive DAG's sensor configures it, snapshot, control request), through the same proxy.
3. Listing costs with a long snapshot history: for each N of --sizes, a fresh job store holding N
   savepoint manifests + 3 checkpoints and N objects (written with core/snapshots/manifest and core/store/jobstore),
   then the library's own reads: list_snapshots / latest_completed, apply_retention (dry run), the
   snapshot watch's poll, and the objects LIST each snapshot makes (core/snapshots/snapshotwrite.write_snapshot).

Prints markdown tables (stdout), progress on stderr, and writes the figures as JSON (--out). Prices:
AWS S3 Standard request prices from AWS's public pricing page (us-east-1: PUT, COPY, POST, LIST
$0.005 per 1,000; GET and all other requests $0.0004 per 1,000; DELETE free): an estimate. Starts its
own SeaweedFS and tansu on 127.0.0.1 and stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` and `bench` importable

from airflow_ckpt_provider.core.records.ownership import Timings
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile, Trigger, new_snapshot_id
from airflow_ckpt_provider.core.store.jobstore import OBJECTS, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.watches.health_observe import FULL_LOOK_EVERY as HEALTH_FULL_S
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.launcher.service import FULL_LOOK_EVERY as SERVICE_FULL_S
from airflow_ckpt_provider.launcher.service import LOOK_EVERY as SERVICE_LOOK_S
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from bench.runtime_bench import BenchError, LogWatch, first, stop_run
from bench.s3count import CountingProxy, Hit
from tests.support.runtimejob import JobEnv

PARTITIONS = 3
BUCKET = "bench"
OPS = ("GET", "HEAD", "PUT", "POST", "LIST", "DELETE")
KINDS = ("status", "lease", "control", "snapshots", "objects", "pending", "locks", "supervisors", "deployments",
         "spec", "other")
#: USD per request, AWS S3 Standard, us-east-1 (aws.amazon.com/s3/pricing): PUT/COPY/POST/LIST, GET and others.
PRICE_WRITE = 0.005 / 1000
PRICE_READ = 0.0004 / 1000
WRITE_TIER = ("PUT", "POST", "LIST")
READ_TIER = ("GET", "HEAD")
HOURS_PER_MONTH = 730
JOBS = 1000
SENSOR_POKE_S = 10.0  # sensors/base.WatchSensor's default poke_interval
SERVICE_INSTANCES = 2  # the supervision service's instances in the model (high availability)
RENEW_S = Timings().renew_every  # each instance renews (a PUT) and reads the bell (a GET) this often
TRIGGER_POLL_S = 5.0  # triggers/base.WatchTrigger's default poll_interval (operators' waits)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- load -------------------------------------------------------------------------------------------

class SteadyProducer(threading.Thread):
    """``rate`` records/s, keyed k0..k9, round-robin over the partitions, in 10 ticks per second.

    ``batch.num.messages=1``: tansu answers ListOffsets(LATEST) with the last record batch's base offset + 1
    (/work/shared/ENVIRONMENT.md); one record per batch makes that the true end."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.stop_flag = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "batch.num.messages": 1,
                             "linger.ms": 0})
        started = time.monotonic()
        while not self.stop_flag.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                i = self.sent
                producer.produce(self.topic, key=f"k{i % 10}".encode(), value=str(i).encode(),
                                 partition=i % PARTITIONS)
                self.sent += 1
            producer.poll(0)
            self.stop_flag.wait(0.1)
        producer.flush(10)


# -- memory -----------------------------------------------------------------------------------------

def _kib(path: str, field: str) -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def memory(supervisor: int, driver_session: int | None) -> dict[str, float]:
    """MiB: the supervisor's RSS and PSS, and the driver session's JVM, Python driver and other processes' RSS."""
    found = {"supervisor_rss": (_kib(f"/proc/{supervisor}/status", "VmRSS") or 0) / 1024,
             "supervisor_pss": (_kib(f"/proc/{supervisor}/smaps_rollup", "Pss") or 0) / 1024,
             "jvm_rss": 0.0, "python_driver_rss": 0.0, "workers_rss": 0.0}
    if driver_session is None:
        return found
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or _session(int(proc.name)) != driver_session:
            continue
        rss = (_kib(f"{proc}/status", "VmRSS") or 0) / 1024
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        role = ("jvm_rss" if argv[0].endswith(b"java") else
                "python_driver_rss" if any(a.endswith(b"entrypoint.py") for a in argv) else "workers_rss")
        found[role] += rss
    return found


# -- counting ---------------------------------------------------------------------------------------

def tally(hits: Iterable[Hit]) -> dict[str, Any]:
    """Requests by operation, by (kind, operation) and by role, with bytes and keys listed."""
    hits = list(hits)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for h in hits:
        by_kind[h.prefix][h.op] += 1
    return {
        "requests": len(hits),
        "by_op": dict(Counter(h.op for h in hits)),
        "by_role": dict(Counter(h.role for h in hits)),
        "by_kind": {k: dict(v) for k, v in by_kind.items()},
        "bytes_sent": sum(h.sent for h in hits),
        "bytes_received": sum(h.received for h in hits),
        "list_keys": sum(h.keys for h in hits if h.op == "LIST"),
        "deleted_keys": sum(h.keys for h in hits if h.op == "DELETE"),
        "errors": dict(Counter(f"{h.op} {h.prefix} {h.status}" for h in hits if h.status >= 400)),
    }


def cost_per_month(by_op: dict[str, float], jobs: int = 1) -> tuple[float, float]:
    """(USD per month, USD if DeleteObjects were billed as POST) for ``by_op`` requests per hour per job."""
    write = sum(by_op.get(op, 0) for op in WRITE_TIER)
    read = sum(by_op.get(op, 0) for op in READ_TIER)
    usd = (write * PRICE_WRITE + read * PRICE_READ) * HOURS_PER_MONTH * jobs
    return usd, usd + by_op.get("DELETE", 0) * PRICE_WRITE * HOURS_PER_MONTH * jobs


# -- the job ----------------------------------------------------------------------------------------

def run_job(services: EmbeddedServices, proxy: CountingProxy, args: argparse.Namespace,
            workdir: Path) -> dict[str, Any]:
    topic = f"scale-{uuid.uuid4().hex[:6]}"
    services.kafka.create_topic(topic, PARTITIONS)
    env = JobEnv(services.s3, services.kafka, workdir, BUCKET, topic, job=f"scale-{uuid.uuid4().hex[:8]}")
    producer = SteadyProducer(services.kafka.bootstrap_servers, topic, args.rate)
    producer.start()
    # the product's default unless given (tests/support/runtimejob.py would snapshot after every batch)
    interval = args.checkpoint_interval or f"{RuntimeConfig(job='bench', store='/bench').checkpoint_interval:g}"
    extra = ["--checkpoint-interval", interval, *shlex.split(args.run_args)]
    spawn_mark, spawned = proxy.mark(), time.time()
    run = env.run("job", workdir / "checkpoint", "--supervise", "-v", *extra, max_offsets=args.max_offsets,
                  extra_env={"AWS_ENDPOINT_URL": proxy.url})
    watch = LogWatch(run)
    samples: list[dict[str, float]] = []
    try:
        begin = watch.wait("the first batch with rows", lambda ev: first(ev, "batch", test=lambda e: e.int(2) > 0))
        if args.idle:  # no more input: measured once the last batch's snapshot (within an interval) is done
            producer.stop_flag.set()
            settle = float(interval) + 15.0 if interval != "none" else 15.0
            log(f"idle: the producer stopped; measuring after {settle:g} s")
            time.sleep(settle)  # the measurement's start, not a wait for an event
        start_mark, t0 = proxy.mark(), time.time()
        objects0 = len(env.store().storage.list(OBJECTS))  # direct to SeaweedFS: not counted
        log(f"steady state from batch {begin.int(1)} ({t0 - spawned:.1f} s after the spawn); measuring "
            f"{args.seconds:g} s")
        spawn = first(watch.events, "spawn")
        session = _session(spawn.int(0)) if spawn else None
        while time.time() < t0 + args.seconds:
            watch.sample()
            watch.poll()
            if run.proc.poll() is not None:
                raise BenchError(f"ckpt run exited with {run.proc.returncode}\n{run.tail()}")
            samples.append(memory(run.proc.pid, session))
            time.sleep(min(5.0, max(0.0, t0 + args.seconds - time.time())))
        end_mark, t1 = proxy.mark(), time.time()
        objects1 = len(env.store().storage.list(OBJECTS))
        events = watch.poll()
        restarts = [e for e in events if e.kind in ("exit", "qfailed")]
        window = [e for e in events if t0 <= e.t <= t1]
        batches = [e for e in window if e.kind == "batch"]
        snapshots = [e for e in window if e.kind == "snapshot"]
        watches = poll_watches(env, proxy, services)
    finally:
        stop_run(run, watch)
        producer.stop_flag.set()
        producer.join(15)
    seconds = t1 - t0
    steady = proxy.since(start_mark, end_mark)
    return {
        "job": env.job, "rate": args.rate, "produced": producer.sent, "seconds": seconds,
        "startup_seconds": t0 - spawned,
        "startup": tally(proxy.since(spawn_mark, start_mark)),
        "steady": tally(steady),
        "steady_by_role": {role: tally(h for h in steady if h.role == role)
                           for role in sorted({h.role for h in steady})},
        "batches": len(batches), "rows": sum(e.int(2) for e in batches),
        "checkpoint_snapshots": sum(e.fields[1] == "checkpoint" for e in snapshots),
        "savepoints": sum(e.fields[1] == "savepoint" for e in snapshots),
        "snapshot_seconds": statistics.median(float(e.fields[2]) for e in snapshots) if snapshots else None,
        "objects_before": objects0, "objects_after": objects1,
        "restarts_or_failures": len(restarts),
        "memory_mib": {k: max(s[k] for s in samples) for k in samples[0]} if samples else {},
        "memory_mib_last": samples[-1] if samples else {},
        "watches": watches,
        "load": os.getloadavg()[0],
    }


def poll_watches(env: JobEnv, proxy: CountingProxy, services: EmbeddedServices) -> dict[str, Any]:
    """One poll (two for the health watch: its first reads the deployment records) of each watch, counted."""
    from airflow_ckpt_provider.core.policy.health import HealthCriteria
    from airflow_ckpt_provider.core.policy.restart import Health
    from airflow_ckpt_provider.core.records.status import read_status
    from airflow_ckpt_provider.core.watches.control import RequestWatch
    from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
    from airflow_ckpt_provider.core.watches.snapshot import SnapshotWatch

    s3 = services.s3
    store = JobStore.open(env.store_url, env.job, S3Options(
        endpoint_url=proxy.url, region=s3.region, access_key_id=s3.access_key, secret_access_key=s3.secret_key))
    status = read_status(env.store())
    epoch = status.epoch if status else 1
    # the keep-alive DAG's health watch (dags/example_ckpt_keep_alive.py)
    health = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY, max_restarts=3, health_window=600,
                                                  progress_timeout=300))
    polls: list[tuple[str, Callable[[], object]]] = [
        ("job health, first poll", health.poll),
        ("job health, next polls", health.poll),
        ("snapshot, after=now", SnapshotWatch(store, after=time.time()).poll),
        ("control request answer", RequestWatch(store, "bench-no-such-request", epoch).poll),
    ]
    found: dict[str, Any] = {}
    for name, poll in polls:
        mark, started = proxy.mark(), time.perf_counter()
        poll()
        elapsed = time.perf_counter() - started
        hits = proxy.since(mark, role=lambda r: r == "watch")
        found[name] = {**tally(hits), "seconds": elapsed,
                       "detail": [f"{h.op} {h.prefix} {h.status}" for h in hits]}
    return found


# -- listing with long histories --------------------------------------------------------------------

FIRST_SNAPSHOT = "checkpoint snapshot + retention, first in the process"
NEXT_SNAPSHOT = "checkpoint snapshot + retention, next"


def listing(services: EmbeddedServices, proxy: CountingProxy, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """For each N: a store with N savepoints + 3 checkpoints and N objects; requests of the library's reads."""
    from airflow_ckpt_provider.core.snapshots.catalog import (
        apply_retention,
        create_snapshot,
        forget_manifests,
        latest_completed,
        list_snapshots,
    )
    from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
    from airflow_ckpt_provider.core.snapshots.snapshotwrite import forget_objects
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.core.watches.snapshot import SnapshotWatch
    from tests.support.ckptfactory import make_checkpoint, write_batch

    s3 = services.s3
    direct = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                       secret_access_key=s3.secret_key)
    counted = S3Options(endpoint_url=proxy.url, region=s3.region, access_key_id=s3.access_key,
                        secret_access_key=s3.secret_key)
    t0 = datetime.now(UTC) - timedelta(days=30)
    results = []
    for n in sizes:
        job = f"history-{n}-{uuid.uuid4().hex[:6]}"
        setup = JobStore.open(f"s3://{BUCKET}/jobs", job, direct)
        started = time.perf_counter()

        def put(i: int, kind: Kind, setup: JobStore = setup, job: str = job) -> None:
            created = t0 + timedelta(minutes=10 * i)
            digest = f"{i:064x}"
            m = Manifest(job=job, snapshot_id=new_snapshot_id(kind, i, created), kind=kind, trigger=Trigger.PERIODIC,
                         batch_id=i, created_at=created.isoformat(timespec="milliseconds"), query_id="q",
                         checkpoint="file:///c", files=(ManifestFile("metadata", 45, digest),))
            setup.storage.create(setup.manifest_key(m.snapshot_id), m.to_bytes())
            setup.storage.write(setup.object_key(digest), b"x" * 45)

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: put(i, Kind.SAVEPOINT), range(n)))
            list(pool.map(lambda i: put(i, Kind.CHECKPOINT), range(n, n + 3)))
        log(f"history N={n}: wrote {n + 3} manifests and objects in {time.perf_counter() - started:.1f} s")
        store = JobStore.open(f"s3://{BUCKET}/jobs", job, counted)
        row: dict[str, Any] = {"n": n}
        reads: list[tuple[str, Callable[[], object]]] = [
            ("latest_completed(list_snapshots)", lambda store=store: latest_completed(list_snapshots(store))),
            ("apply_retention (default policy, dry run)",
             lambda store=store: apply_retention(store, RetentionPolicy(), dry_run=True)),
            ("snapshot watch poll", lambda store=store: SnapshotWatch(store, after=time.time()).poll()),
            ("objects LIST of a snapshot", lambda store=store: store.storage.list(OBJECTS)),
        ]
        # A checkpoint snapshot and its retention as the runtime's snapshotter takes them, in a process that has
        # not listed this store yet (what every snapshot cost before the process kept its lists), then the next.
        ckpt = make_checkpoint(Path(tempfile.mkdtemp(prefix="history-ckpt-")), 2)
        batch = iter(range(2, 100))

        def snapshot(store: JobStore = store, ckpt: Path = ckpt, batch: Iterator[int] = batch) -> None:
            write_batch(ckpt, next(batch))
            create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT)
            apply_retention(store, RetentionPolicy())

        def cold_snapshot() -> None:  # the reads above filled this process's lists: a new process has none
            forget_objects()
            forget_manifests()
            snapshot()

        reads += [(FIRST_SNAPSHOT, cold_snapshot), (NEXT_SNAPSHOT, snapshot)]
        for name, read in reads:
            mark, started = proxy.mark(), time.perf_counter()
            read()
            elapsed = time.perf_counter() - started
            t = tally(proxy.since(mark, role=lambda r: r == "watch"))
            row[name] = {"LIST": t["by_op"].get("LIST", 0), "GET": t["by_op"].get("GET", 0),
                         "keys_listed": t["list_keys"], "bytes": t["bytes_received"], "seconds": round(elapsed, 3),
                         "requests": t["requests"]}
        shutil.rmtree(ckpt, ignore_errors=True)
        results.append(row)
        setup.storage.delete([o.key for o in setup.storage.list("")])
    return results


# -- report -----------------------------------------------------------------------------------------

def per_hour(count: float, seconds: float) -> float:
    return count * 3600.0 / seconds


def report(job: dict[str, Any], history: list[dict[str, Any]], args: argparse.Namespace) -> None:
    secs = job["seconds"]
    steady = job["steady"]
    print(f"# S3 requests of one supervised job ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)\n")
    print(f"Steady state {secs:.0f} s (after a {job['startup_seconds']:.0f} s start), {job['rate']:g} records/s "
          f"produced, {job['batches']} batches ({job['rows']} rows), {job['checkpoint_snapshots']} checkpoint "
          f"snapshots + {job['savepoints']} savepoints (median {job['snapshot_seconds'] or 0:.2f} s each), "
          f"objects in the store {job['objects_before']} -> {job['objects_after']}; driver restarts or query "
          f"failures: {job['restarts_or_failures']}; load average {job['load']:.1f} at the end.\n")
    batches_h, snaps_h = per_hour(job["batches"], secs), per_hour(job["checkpoint_snapshots"], secs)
    print(f"Batches per hour: {batches_h:,.0f}; checkpoint snapshots per hour: {snaps_h:,.0f}.\n")

    print("## Requests per job per hour, by job store prefix and operation (driver + supervisor)\n")
    print("| prefix | " + " | ".join(OPS) + " | all | per batch |")
    print("| --- | " + " | ".join("---:" for _ in OPS) + " | ---: | ---: |")
    for kind in KINDS:
        row = steady["by_kind"].get(kind)
        if not row:
            continue
        total = sum(row.values())
        print(f"| {kind} | " + " | ".join(f"{per_hour(row.get(op, 0), secs):,.0f}" for op in OPS)
              + f" | {per_hour(total, secs):,.0f} | {total / max(1, job['batches']):.2f} |")
    by_op = {op: per_hour(steady["by_op"].get(op, 0), secs) for op in OPS}
    print("| **all** | " + " | ".join(f"**{by_op[op]:,.0f}**" for op in OPS)
          + f" | **{per_hour(steady['requests'], secs):,.0f}** | {steady['requests'] / max(1, job['batches']):.2f} |")
    print()
    for role, t in job["steady_by_role"].items():
        print(f"- {role}: {per_hour(t['requests'], secs):,.0f} requests/h ("
              + ", ".join(f"{op} {per_hour(t['by_op'].get(op, 0), secs):,.0f}" for op in OPS if t["by_op"].get(op))
              + "); by prefix " + ", ".join(f"{k} {per_hour(sum(v.values()), secs):,.0f}"
                                            for k, v in sorted(t["by_kind"].items())))
    mib = 2**20
    print(f"- bytes per hour: sent {per_hour(steady['bytes_sent'], secs) / mib:,.1f} MiB, received "
          f"{per_hour(steady['bytes_received'], secs) / mib:,.1f} MiB; keys returned by LISTs "
          f"{per_hour(steady['list_keys'], secs):,.0f}/h; keys deleted {per_hour(steady['deleted_keys'], secs):,.0f}/h")
    if steady["errors"]:
        print(f"- answers >= 400 (expected: 404 of absent keys, 412 of lost conditional writes): {steady['errors']}")
    st = job["startup"]
    print(f"- one start (spawn to the first batch with rows, {job['startup_seconds']:.0f} s): {st['requests']} "
          "requests (" + ", ".join(f"{op} {st['by_op'][op]}" for op in OPS if st["by_op"].get(op)) + "); by prefix "
          + ", ".join(f"{k} {sum(v.values())}" for k, v in sorted(st["by_kind"].items())))

    snap = job["checkpoint_snapshots"] or 1
    kinds = steady["by_kind"]
    lists_objects = kinds.get("objects", {}).get("LIST", 0)
    lists_snapshots = kinds.get("snapshots", {}).get("LIST", 0)
    print("\n## LISTs per snapshot\n")
    print(f"Measured: {lists_objects / snap:.2f} LIST of objects/ and {lists_snapshots / snap:.2f} LIST of "
          f"snapshots/ per checkpoint snapshot; {kinds.get('snapshots', {}).get('GET', 0) / snap:.2f} manifest GETs. "
          f"Bound from the code: ceil(objects / 1000) + ceil(manifests / 1000) LIST pages per snapshot "
          f"(write_snapshot lists objects/, apply_retention lists snapshots/), plus one GET per manifest.")

    print(f"\n## 1,000 jobs (extrapolated: {JOBS} x the measured job)\n")
    rps = {op: by_op[op] * JOBS / 3600 for op in OPS}
    usd, usd_del = cost_per_month(by_op, JOBS)
    print("| | " + " | ".join(OPS) + " | all |")
    print("| --- | " + " | ".join("---:" for _ in OPS) + " | ---: |")
    print("| requests/s, runtime | " + " | ".join(f"{rps[op]:,.1f}" for op in OPS) + f" | {sum(rps.values()):,.1f} |")
    steady_poll = job["watches"]["job health, next polls"]["by_op"]
    full_poll = job["watches"]["job health, first poll"]["by_op"]
    # a health watch: its steady polls, and a full one every FULL_LOOK_EVERY s (core/watches/health_observe.py)
    polls, fulls = 3600 / args.health_poke, 3600 / HEALTH_FULL_S
    sensor_h = {op: steady_poll.get(op, 0) * (polls - fulls) + full_poll.get(op, 0) * fulls for op in OPS}
    srps = {op: sensor_h[op] * JOBS / 3600 for op in OPS}
    print(f"| requests/s, 1,000 health watches (poke {args.health_poke:g} s) | "
          + " | ".join(f"{srps[op]:,.1f}" for op in OPS) + f" | {sum(srps.values()):,.1f} |")
    # the supervision service's looks (launcher/service.py, counted in tests/unit/launcher/test_service.py): a full
    # look (4 GETs) every FULL_LOOK_EVERY s, a glance (1 GET) at each LOOK_EVERY between; its instances' renewals
    looks_h = 4 * 3600 / SERVICE_FULL_S + (3600 / SERVICE_LOOK_S - 3600 / SERVICE_FULL_S)
    service = {"GET": looks_h * JOBS / 3600 + SERVICE_INSTANCES / RENEW_S, "PUT": SERVICE_INSTANCES / RENEW_S}
    service_rps = sum(service.values())
    print(f"| requests/s, the supervision service ({SERVICE_INSTANCES} instances: looks, renewals, bell) | "
          + " | ".join(f"{service.get(op, 0):,.1f}" for op in OPS) + f" | {service_rps:,.1f} |")
    total = sum(rps.values()) + sum(srps.values()) + service_rps
    print(f"| **all** | | | | | | | **{total:,.1f}** (target: 500) |")
    s_usd, _ = cost_per_month({op: sensor_h[op] for op in OPS}, JOBS)
    print(f"\nMonthly request cost at AWS S3 Standard list prices ({HOURS_PER_MONTH} h; estimate): runtime "
          f"${usd:,.0f} (${usd_del:,.0f} if DeleteObjects were billed as a POST), health watches ${s_usd:,.0f}. "
          f"Per job: ${usd / JOBS:,.2f} + ${s_usd / JOBS:,.2f}.")

    print("\n## One poll of each watch (what a trigger or sensor costs per poke)\n")
    print("| watch | requests | detail | s |")
    print("| --- | ---: | --- | ---: |")
    for name, t in job["watches"].items():
        print(f"| {name} | {t['requests']} | {', '.join(t['detail'])} | {t['seconds']:.3f} |")

    print("\n## Memory (MiB, highest sample)\n")
    mem = job["memory_mib"]
    print(f"supervisor RSS {mem.get('supervisor_rss', 0):.0f} (PSS {mem.get('supervisor_pss', 0):.0f}); driver "
          f"JVM {mem.get('jvm_rss', 0):.0f}, Python driver {mem.get('python_driver_rss', 0):.0f}, Python workers "
          f"{mem.get('workers_rss', 0):.0f}")

    if history:
        history_table(history)


def history_table(history: list[dict[str, Any]]) -> None:
    """One row per N, one column per read: LIST / GET / keys listed / seconds (all requests for the snapshots)."""
    print("\n## Listing with a long snapshot history (N savepoints + 3 checkpoints, N objects)\n")
    names = [k for k in history[0] if k != "n"]
    print("| N | " + " | ".join(f"{n}: LIST / GET / keys listed / s" for n in names) + " |")
    print("| ---: | " + " | ".join("---" for _ in names) + " |")
    for row in history:
        print(f"| {row['n']:,} | " + " | ".join(
            f"{row[n]['LIST']} / {row[n]['GET']} / {row[n]['keys_listed']:,} / {row[n]['seconds']:.2f}"
            + (f" ({row[n]['requests']} requests)" if n in (FIRST_SNAPSHOT, NEXT_SNAPSHOT) else "")
            for n in names) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="seconds of steady state measured (180)")
    parser.add_argument("--rate", type=float, default=50.0, help="records per second produced (50)")
    parser.add_argument("--max-offsets", type=int, default=200, help="maxOffsetsPerTrigger (200)")
    parser.add_argument("--idle", action="store_true",
                        help="stop producing after the first batch with rows and measure the idle job")
    parser.add_argument("--checkpoint-interval", help="pass --checkpoint-interval to ckpt run (default: the "
                        "product's default, 60 s)")
    parser.add_argument("--run-args", default="", help="more settings for ckpt run, e.g. '--lease-interval 8 "
                        "--fence-grace 19' (docs/scale.md: busy jobs at 1,000)")
    parser.add_argument("--health-poke", type=float, default=SENSOR_POKE_S,
                        help=f"the health watches' poke in the 1,000-job model ({SENSOR_POKE_S:g} s)")
    parser.add_argument("--sizes", default="10,100,1000,2500",
                        help="snapshot history sizes for the listing measurement ('' skips it)")
    parser.add_argument("--skip-job", action="store_true", help="only the listing measurement")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "store-requests-bench.json")
    parser.add_argument("--workdir", type=Path, help="keep the job's logs and checkpoint here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="store-requests-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    started = time.monotonic()
    try:
        with EmbeddedServices() as services:
            services.s3.create_bucket(BUCKET)
            with CountingProxy(services.s3.port, job_root="jobs") as proxy:
                job = None if args.skip_job else run_job(services, proxy, args, workdir)
                history = listing(services, proxy, sizes) if sizes else []
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = {"args": {k: str(v) for k, v in vars(args).items()}, "job": job, "history": history,
               "wall_seconds": time.monotonic() - started}
    args.out.write_text(json.dumps(figures, indent=1, default=str))
    if job is not None:
        report(job, history, args)
    elif history:
        report_history_only(history)
    log(f"figures in {args.out}; {time.monotonic() - started:.0f} s in all")
    return 0


def report_history_only(history: list[dict[str, Any]]) -> None:
    history_table(history)


if __name__ == "__main__":
    sys.exit(main())
