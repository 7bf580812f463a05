"""Benchmark: what the driver's metrics cost (issue 46; target: at most 2% of the runtime bench's throughput).

    .venv/bin/python bench/metrics_bench.py [--records 7000000] [--warmup 30] [--turns 6] [--turn-window 12]
                                            [--scrape-every 0.2]

1. In this process, no Spark: the cost of what the driver's loop always does (``DriverMetrics.batch`` and
   ``snapshot`` per call), of one Prometheus scrape (the table read and written as text) and of one OTLP collection
   (the table read into OpenTelemetry's data points), in microseconds.
2. One job of the runtime bench (tests/jobs/kafka_count.py over a backlog topic, a checkpoint snapshot after every
   batch, ``ckpt run`` on local[2]) with ``--metrics-address 127.0.0.1`` and ``--metrics-otlp`` to a receiver of
   this bench's every second: after ``--warmup`` s, ``--turns`` windows of ``--turn-window`` s in pairs of
   alternating order, scraped every ``--scrape-every`` s (50 times Prometheus' usual 10 s) or not at all: the same
   driver JVM against itself (the runtime bench's turns, docs/benchmarks.md). The ratio of records/s scraped over
   not scraped, per pair; target >= 0.98. What runs in every turn (the per-batch counting, the OTLP exports) is
   bounded by part 1: its cost per second against a second of batches.

Prints the tables and a verdict; nothing is asserted. Starts its own SeaweedFS and tansu on 127.0.0.1 and stops
every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable
sys.path.insert(0, str(Path(__file__).resolve().parent))  # and the runtime bench's helpers

from runtime_bench import LogWatch, batches, first, produce, stop_run

from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.runtime.batchevents import BatchEvent
from airflow_ckpt_provider.runtime.metrics import DriverMetrics, _PrometheusCollector
from tests.support.prometheus import OtlpReceiver
from tests.support.runtimejob import JobEnv

TARGET = 0.98
PARTITIONS = 3
SETTLE_S = 2.0


def micro() -> dict[str, float]:
    """Microseconds per call of what the driver does always and of one scrape and one OTLP collection."""
    from prometheus_client import CollectorRegistry, generate_latest

    now = time.time()
    status = JobStatus(job="bench", state=JobState.RUNNING, epoch=1, updated_at=now, started_at=now, batch_id=9,
                       batch_at=now, lag=0)
    metrics = DriverMetrics("bench", "v1", epoch=lambda: 1, status=lambda: status,
                            settings={"checkpoint_interval": 0.0, "heartbeat_interval": 30.0})
    event = BatchEvent(9, {}, False, 20_000, seconds=0.4, rows_per_second=50_000.0, state_rows=10_000,
                       state_bytes=1 << 20)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_PrometheusCollector(metrics))
    n = 20_000
    found = {
        "batch()": timeit.timeit(lambda: metrics.batch(event), number=n) / n * 1e6,
        "snapshot()": timeit.timeit(lambda: metrics.snapshot("checkpoint", seconds=0.1, size=1 << 20,
                                                             uploaded=1 << 16, created_at=now), number=n) / n * 1e6,
        "a scrape (collect + text)": timeit.timeit(lambda: generate_latest(registry), number=500) / 500 * 1e6,
    }
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from airflow_ckpt_provider.runtime.metrics import _register_otel

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    _register_otel(metrics, provider.get_meter("bench"))
    found["an OTLP collection"] = timeit.timeit(reader.get_metrics_data, number=500) / 500 * 1e6
    provider.shutdown()
    return found


class Scraper:
    """GETs the driver's /metrics every ``every`` s while ``on`` is set."""

    def __init__(self, url: str, every: float) -> None:
        self.url, self.every, self.on, self.done = url, every, threading.Event(), threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if self.on.is_set():
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            self.done.wait(self.every)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)


def turns(watch: LogWatch, scraper: Scraper, opts: argparse.Namespace) -> list[tuple[bool, float, int]]:
    """(scraped, records/s, scrapes) per turn, pairs in alternating order."""
    read = batches(watch.events, 1)
    rate = sum(e.int(2) for e in read) / max(read[-1].t - read[0].t, 1.0) if read else 0.0
    needed = int(1.2 * rate * opts.turns * (opts.turn_window + SETTLE_S + 2))
    left = opts.records - sum(e.int(2) for e in read)
    if left < needed:  # an idle job logs no batches: the turns would wait for ever
        raise SystemExit(f"{left:,} records left in the backlog, the turns need about {needed:,}: raise --records")
    done = []
    for index in range(opts.turns):
        pair, second = divmod(index, 2)
        scraped = (second == 1) == (pair % 2 == 0)
        (scraper.on.set if scraped else scraper.on.clear)()
        before = scraper.scrapes
        switched = time.time()
        start = watch.wait("a batch after the switch", lambda ev, t=switched: first(ev, "batch", after=t + SETTLE_S))
        end = watch.wait(f"a batch {opts.turn_window:g} s later",
                         lambda ev, t=start.t: first(ev, "batch", after=t + opts.turn_window))
        window = [e for e in batches(watch.events, 1) if start.t < e.t <= end.t]
        rows = sum(e.int(2) for e in window)
        if any(e.int(2) < opts.max_offsets for e in window):
            raise SystemExit("the backlog ran out during the turns: raise --records")
        rate = rows / (end.t - start.t)
        done.append((scraped, rate, scraper.scrapes - before))
        print(f"  turn {index + 1} ({'scraped' if scraped else 'not scraped'}): {rows:,} rows in "
              f"{end.t - start.t:.1f} s = {rate:,.0f}/s, {scraper.scrapes - before} scrapes", file=sys.stderr)
    scraper.on.clear()
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=7_000_000, help="backlog records (default 7,000,000)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--max-offsets", type=int, default=20_000, help="maxOffsetsPerTrigger (default 20000)")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the turns (default 30)")
    parser.add_argument("--turns", type=int, default=6, help="turns, an even number (default 6)")
    parser.add_argument("--turn-window", type=float, default=12.0, help="seconds of batches per turn (default 12)")
    parser.add_argument("--scrape-every", type=float, default=0.2, help="seconds between scrapes (default 0.2)")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir, removed)")
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="ckpt-metrics-bench-"))
    costs = micro()
    otlp = OtlpReceiver()
    try:
        with EmbeddedServices() as services, contextlib.ExitStack() as stack:
            services.s3.create_bucket("bench")
            topic = f"bench-{uuid.uuid4().hex[:6]}"
            services.kafka.create_topic(topic, PARTITIONS)
            produce(services.kafka.bootstrap_servers, topic, opts.records, opts.keys)
            env = JobEnv(services.s3, services.kafka, work, "bench", topic, job=f"bench-{uuid.uuid4().hex[:8]}")
            run = env.run("metrics", work / "checkpoint", "-v", "--checkpoint-interval", "0",
                          "--metrics-address", "127.0.0.1", "--metrics-otlp", otlp.url, "--metrics-interval", "1",
                          max_offsets=opts.max_offsets)
            watch = LogWatch(run)
            stack.callback(stop_run, run, watch)
            begin = watch.wait("the first batch with rows", lambda ev: first(ev, "batch", test=lambda e: e.int(2) > 0))
            watch.wait(f"{opts.warmup:g} s of batches", lambda ev: first(ev, "batch", after=begin.t + opts.warmup))
            status = env.status()
            if status is None or status.metrics_url is None:
                raise SystemExit(f"the driver serves no metrics: status {status}")
            scraper = Scraper(status.metrics_url, opts.scrape_every)
            stack.callback(scraper.stop)
            done = turns(watch, scraper, opts)
            batch_s = statistics.median(b - a for a, b in zip(
                [e.t for e in batches(watch.events, 1)][:-1], [e.t for e in batches(watch.events, 1)][1:],
                strict=True))
    finally:
        otlp.stop()
        if opts.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    pairs = [(a, b) for a, b in zip(done[::2], done[1::2], strict=True)]
    ratios = [(a[1] / b[1]) if a[0] else (b[1] / a[1]) for a, b in pairs]
    print("# What the driver's metrics cost\n")
    print("| what | microseconds |\n| --- | ---: |")
    for what, us in costs.items():
        print(f"| {what} | {us:,.1f} |")
    always = costs["batch()"] / batch_s + costs["an OTLP collection"] / 1.0  # per second of batches, in us
    print(f"\nAlways on (a batch every {batch_s:.2f} s, an OTLP export every 1 s): {always:,.0f} us per second of "
          f"batches = {always / 1e6:.4%} of the driver's time (the export's encoding and POST run on its own "
          f"thread; {otlp.exports} exports received)\n")
    print("| pair | scraped /s | not scraped /s | ratio |\n| --- | ---: | ---: | ---: |")
    for i, ((a, b), ratio) in enumerate(zip(pairs, ratios, strict=True), 1):
        on, off = (a, b) if a[0] else (b, a)
        print(f"| {i} | {on[1]:,.0f} ({on[2]} scrapes) | {off[1]:,.0f} | {ratio:.3f} |")
    med = statistics.median(ratios)
    verdict = "met" if med >= TARGET else "NOT met"
    print(f"\nScraped every {opts.scrape_every:g} s against not scraped: median ratio {med:.3f} (target >= {TARGET}): "
          f"{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
