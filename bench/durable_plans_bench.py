"""Benchmark: what durable plans cost the ckpt-kafka sink (core/snapshots/durableplan.py), side by side in one run.

    .venv/bin/python bench/durable_plans_bench.py [--ids 4000] [--max-offsets 200] [--rounds 3]

The exactly-once test job (tests/jobs/eo_job.py: dropDuplicates over a 3-partition ckpt-kafka topic into the
ckpt-kafka sink, 4 sink partitions) under ``ckpt run`` (local[2], a checkpoint snapshot after every batch, the
shipped settings) drains one backlog (every id twice) from the start, a fresh job and checkpoint each time:
A = durable plans on (commitAfterSnapshot auto: the live checkpoint is on this host's disk), B = off (false), in
alternating order (A B, B A, ...). Per job: records/s from the first batch with rows to the last (the driver's
``batch N: completed, R rows`` lines), the median time between two batches, and for A how long storing each plan
took and how often a task waited a second or more for it. Target: A's records/s within 10% of B's (median of
the pairs). Prints a table and the verdict; asserts nothing. Starts SeaweedFS and tansu on 127.0.0.1 and stops them.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.embedded import EmbeddedServices
from tests.support.exactlyonce import EO_JOB, KafkaSink, new_sink_topic
from tests.support.runtimejob import JobEnv, produce

TARGET = 0.10
WAIT_S = 600.0
_COMPLETED = re.compile(r"^(\S+ \S+) INFO \S+: job \S+ epoch \d+ batch (\d+): completed, (\d+) rows", re.M)
_STORED = re.compile(r"batch \d+: planned batch stored in the job store in ([\d.]+) s")
_WAITED = re.compile(r"waited ([\d.]+) s for the job store to hold the batch's plan")


@dataclass
class Drain:
    config: str
    records_per_s: float
    batches: int
    between_s: float  # median time between two batch completions
    stored_s: list[float]
    waits: int


def _at(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def drain(services: EmbeddedServices, work: Path, topic: str, records: int, config: str, max_offsets: int) -> Drain:
    """One fresh job drains the backlog; its numbers from its log."""
    env = JobEnv(services.s3, services.kafka, work, "bench", topic, job=f"plans-{uuid.uuid4().hex[:8]}")
    sink = KafkaSink(services.kafka.bootstrap_servers, new_sink_topic(services.kafka))
    name = f"{config}-{env.job}"
    run = env.run(name, work / f"checkpoint-{name}", "-v", "--poll", "1", max_offsets=max_offsets, job_file=EO_JOB,
                  conf=sink.conf(), extra_env={**sink.env(),
                                               "CKPT_EO_COMMIT_AFTER_SNAPSHOT": "auto" if config == "A" else "false"})
    try:
        done = env.wait_status(f"{records} records consumed", lambda s: env.consumed(s) == records
                               and s.state is JobState.RUNNING, WAIT_S, run)
        ack = env.request(RequestAction.STOP, done.epoch)
        if ack.outcome is not Outcome.COMPLETED:
            raise RuntimeError(f"the stop of {name} was not completed: {ack}")
        run.wait(WAIT_S)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    log = run.log.read_text()
    batches = [(_at(m[1]), int(m[3])) for m in _COMPLETED.finditer(log) if int(m[3]) > 0]
    if len(batches) < 3:
        raise RuntimeError(f"{name}: only {len(batches)} batches with rows; more --ids")
    elapsed = batches[-1][0] - batches[0][0]
    rows = sum(r for _, r in batches[1:])
    between = [b[0] - a[0] for a, b in itertools.pairwise(batches)]
    return Drain(config, rows / elapsed, len(batches), statistics.median(between),
                 [float(x) for x in _STORED.findall(log)], len(_WAITED.findall(log)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=4000, help="ids in the backlog (each produced twice)")
    parser.add_argument("--max-offsets", type=int, default=200, help="records per batch")
    parser.add_argument("--rounds", type=int, default=3, help="pairs A B / B A")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckpt-plans-bench-"))
    drains: list[Drain] = []
    started = time.monotonic()
    try:
        with EmbeddedServices() as services:
            services.s3.create_bucket("bench")
            topic = f"plans-{uuid.uuid4().hex[:6]}"
            services.kafka.create_topic(topic, 3)
            produce(services.kafka.bootstrap_servers, topic, 0, args.ids)
            produce(services.kafka.bootstrap_servers, topic, 0, args.ids)
            for rnd in range(args.rounds):
                for config in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
                    drains.append(drain(services, work, topic, 2 * args.ids, config, args.max_offsets))
                    d = drains[-1]
                    print(f"round {rnd + 1} {config}: {d.records_per_s:,.0f} records/s, {d.batches} batches, "
                          f"{d.between_s:.2f} s between batches", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a = [d for d in drains if d.config == "A"]
    b = [d for d in drains if d.config == "B"]
    ratios = [x.records_per_s / y.records_per_s for x, y in zip(a, b, strict=True)]
    stored = sorted(s for d in a for s in d.stored_s)
    print(f"# Durable plans: the ckpt-kafka sink with and without them ({time.monotonic() - started:.0f} s, "
          f"{2 * args.ids:,} records, {args.max_offsets} per batch)\n")
    print("| job | records/s | batches | median s between batches | plans stored (median / p90 / max s) | "
          "task waits >= 1 s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for d in drains:
        s = sorted(d.stored_s)
        plans = (f"{len(s)}: {statistics.median(s):.3f} / {s[int(0.9 * (len(s) - 1))]:.3f} / {s[-1]:.3f}"
                 if s else "-")
        print(f"| {d.config} | {d.records_per_s:,.0f} | {d.batches} | {d.between_s:.2f} | {plans} | "
              f"{d.waits if d.config == 'A' else '-'} |")
    ratio = statistics.median(ratios)
    print(f"\nA / B records/s per pair: {', '.join(f'{r:.3f}' for r in ratios)}; median {ratio:.3f}")
    if stored:
        print(f"plans stored: {len(stored)}, median {statistics.median(stored):.3f} s, max {stored[-1]:.3f} s")
    verdict = "met" if ratio >= 1 - TARGET else "MISSED"
    print(f"\nVerdict: durable plans cost {100 * (1 - ratio):.1f}% of the throughput (target <= {100 * TARGET:.0f}%): "
          f"{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
