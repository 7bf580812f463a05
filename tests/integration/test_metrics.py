"""The driver's metrics scraped by a real Prometheus (issue 46): a job of tests/jobs/kafka_count.py on local Spark,
tansu and SeaweedFS serves them (`--metrics-address 127.0.0.1`, a free port named in its status); `ckpt metrics
targets` writes the file_sd file Prometheus reads, `ckpt metrics rules` the alert rules it evaluates. The same
metrics go over OTLP/HTTP to a receiver of the test's (decoded with OpenTelemetry's protobufs).

The counts are exact (rows read, batches, the lease epoch) in the driver's own endpoint and in Prometheus. While
checkpoint snapshots keep up, the snapshot-age alert never was pending; the test then pauses the driver's snapshots
(the bench's pause file) while batches go on: the alert fires for this job and epoch; resumed, it clears. Once the
job stopped, its driver is no target any more.

A job writing to the ckpt-kafka sink counts what the sink's commit worker (a Python worker of Spark's, another
process) did with each batch: every batch committed once, every row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_ckpt_provider.core.policy.faults import PAUSE_ENV
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState
from tests.support.exactlyonce import EO_JOB, KafkaSink, job_of_its_own, new_sink_topic
from tests.support.prometheus import OtlpReceiver, Prometheus
from tests.support.runtimejob import JobEnv, produce, wait_logged

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
FIRST = 100


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The driver's endpoint as {(sample name, its labels but the common ones): value}."""
    with urllib.request.urlopen(url, timeout=5) as r:  # the driver's endpoint on 127.0.0.1
        text = r.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in {"ckpt_job", "epoch", "code_version"}))
            found[(s.name, rest)] = s.value
    return found


class Feed:
    """Records produced in the background, 10 every half second, until stopped: batches keep completing."""

    def __init__(self, env: JobEnv, start: int) -> None:
        self.env, self.next, self.stop_event = env, start, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(0.5):
            produce(self.env.kafka.bootstrap_servers, self.env.topic, self.next, 10)
            self.next += 10

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join(30)
        return self.next


def ckpt(env: JobEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "airflow_ckpt_provider.cli", *args], env=env.env(),
                          capture_output=True, text=True, timeout=120, check=False)


def test_prometheus_scrapes_exact_counts_and_fires_the_snapshot_age_alert_once_snapshots_pause(
        env: JobEnv, tmp_path: Path) -> None:
    pause = tmp_path / "pause-checkpoints"
    produce(env.kafka.bootstrap_servers, env.topic, 0, FIRST)
    otlp = OtlpReceiver()
    run = env.run("driver", tmp_path / "checkpoint", "--metrics-address", "127.0.0.1", "--checkpoint-interval", "2",
                  "--heartbeat-interval", "2", "--metrics-otlp", otlp.url, "--metrics-interval", "1", max_offsets=50,
                  extra_env={PAUSE_ENV: str(pause)})
    prometheus: Prometheus | None = None
    feed: Feed | None = None
    try:
        status = env.wait_status(f"RUNNING with {FIRST} records read", lambda s: (
            s.state is JobState.RUNNING and env.consumed(s) == FIRST and s.metrics_url is not None), TIMEOUT, run)
        assert status.metrics_url is not None and status.metrics_url.startswith("http://127.0.0.1:")
        assert status.batch_id is not None
        seen = scrape(status.metrics_url)
        assert seen[("ckpt_input_rows_total", ())] == FIRST  # every row the driver's batches read
        assert seen[("ckpt_batches_total", ())] == status.batch_id + 1  # a first start: batches 0 .. batch_id
        assert seen[("ckpt_lease_epoch", ())] == status.epoch
        assert seen[("ckpt_job_state", (("state", "RUNNING"),))] == 1
        assert seen[("ckpt_job_state", (("state", "FAILED"),))] == 0
        assert seen[("ckpt_checkpoint_interval_seconds", ())] == 2
        assert seen[("ckpt_lag_seconds", ())] == 0  # every record was there before the start, and all are read
        # The job's foreachBatch (JobContext.fenced) committed every batch once, in the driver's own process.
        assert seen[("ckpt_sink_batches_total", (("outcome", "committed"), ("sink", "foreachBatch")))] == \
            status.batch_id + 1
        # The same table over OTLP/HTTP (OpenTelemetry's SDK and exporter), with the job, epoch and version.
        exported = wait_logged("an OTLP export with every row read", lambda: otlp.values.get(
            ("ckpt_input_rows", ())) == FIRST, 30.0, run.log)
        assert exported and otlp.values[("ckpt_lease_epoch", ())] == status.epoch
        assert {"ckpt_job": env.job, "epoch": str(status.epoch), "code_version": "unknown"}.items() <= \
            otlp.attributes[-1].items()

        # Prometheus finds the driver through `ckpt metrics targets` and evaluates `ckpt metrics rules`.
        targets, rules = tmp_path / "targets.json", tmp_path / "ckpt.rules.yml"
        done = ckpt(env, "metrics", "targets", "--store", env.store_url, "--endpoint-url", env.s3.endpoint_url,
                    "--out", str(targets))
        assert done.returncode == 0, done.stderr
        netloc = status.metrics_url.split("/")[2]
        assert json.loads(targets.read_text()) == [{"targets": [netloc], "labels": {"ckpt_driver_host": status.host}}]
        done = ckpt(env, "metrics", "rules", "--hold", "3s", "--snapshot-age-floor", "10", "--out", str(rules))
        assert done.returncode == 0, done.stderr
        prometheus = Prometheus(tmp_path / "prometheus", targets, rules)
        job = env.job
        wait_logged(f"Prometheus scraping {FIRST} rows of job {job}", lambda: [
            r for r in prometheus.query(f'ckpt_input_rows_total{{ckpt_job="{job}"}}') if r["value"][1] == str(FIRST)],
            60.0, prometheus.log, run.log)

        # While snapshots keep up with batches the alert is never pending.
        feed = Feed(env, FIRST)
        snapshots_seen = (f'changes(ckpt_last_snapshot_timestamp_seconds{{ckpt_job="{job}",kind="checkpoint"}}[10m])'
                          ' >= 3')
        wait_logged("three checkpoint snapshots seen by Prometheus while batches complete",
                    lambda: prometheus.query(snapshots_seen), 90.0, prometheus.log, run.log)
        assert prometheus.query('ALERTS{alertname="CkptSnapshotTooOld"}[10m]') == []

        # Snapshots paused, batches going on: the alert fires for this job and epoch.
        pause.touch()
        paused_at = time.time()
        print(f"snapshots paused at {paused_at:.1f}")
        firing = wait_logged("CkptSnapshotTooOld firing", lambda: [
            a for a in prometheus.alerts() if a["labels"]["alertname"] == "CkptSnapshotTooOld"
            and a["state"] == "firing"], 90.0, prometheus.log, run.log)
        print(f"CkptSnapshotTooOld firing {time.time() - paused_at:.1f} s after the pause")
        assert [(a["labels"]["ckpt_job"], a["labels"]["epoch"], a["labels"]["severity"]) for a in firing] == [
            (job, str(status.epoch), "critical")]
        seen = scrape(status.metrics_url)
        last = seen[("ckpt_last_snapshot_timestamp_seconds", (("kind", "checkpoint"),))]
        assert last <= paused_at + 1.0  # no snapshot completed after the pause (one under way may have finished)
        assert seen[("ckpt_last_batch_timestamp_seconds", ())] - last > 10  # batches went on beyond the floor

        # Resumed: a snapshot catches up and the alert clears.
        pause.unlink()
        resumed_at = time.time()
        wait_logged("CkptSnapshotTooOld cleared", lambda: not [
            a for a in prometheus.alerts() if a["labels"]["alertname"] == "CkptSnapshotTooOld"] or None, 90.0,
            prometheus.log, run.log)
        print(f"CkptSnapshotTooOld cleared {time.time() - resumed_at:.1f} s after the resume")

        total = feed.stop()
        feed = None
        final = env.wait_status(f"all {total} records read", lambda s: env.consumed(s) == total, TIMEOUT, run)
        assert scrape(status.metrics_url)[("ckpt_input_rows_total", ())] == total
        wait_logged(f"Prometheus scraping {total} rows", lambda: [
            r for r in prometheus.query(f'ckpt_input_rows_total{{ckpt_job="{job}"}}') if r["value"][1] == str(total)],
            60.0, prometheus.log)
        assert env.request(RequestAction.STOP, final.epoch).outcome is Outcome.COMPLETED
        assert run.wait(120) == 0
        done = ckpt(env, "metrics", "targets", "--store", env.store_url, "--endpoint-url", env.s3.endpoint_url,
                    "--json")
        assert done.returncode == 0 and json.loads(done.stdout) == [], done.stdout + done.stderr  # stopped: no target
    finally:
        if feed is not None:
            feed.stop()
        if prometheus is not None:
            prometheus.stop()
        run.stop()
        otlp.stop()
        if pause.exists():
            os.unlink(pause)


def test_the_kafka_sinks_commit_worker_counts_every_batch_and_row_it_committed(env: JobEnv) -> None:
    job = job_of_its_own(env, "sink-metrics")
    sink = KafkaSink(env.kafka.bootstrap_servers, new_sink_topic(env.kafka))
    produce(env.kafka.bootstrap_servers, job.topic, 0, FIRST)
    run = job.run("driver", job.work / "checkpoint", "--metrics-address", "127.0.0.1", max_offsets=40,
                  job_file=EO_JOB, conf=sink.conf(), extra_env=sink.env())
    try:
        status = job.wait_status(f"RUNNING with {FIRST} records read", lambda s: (
            s.state is JobState.RUNNING and job.consumed(s) == FIRST and s.metrics_url is not None), TIMEOUT, run)
        assert status.metrics_url is not None
        seen = scrape(status.metrics_url)
        outcomes = {dict(labels)["outcome"]: value for (name, labels), value in seen.items()
                    if name == "ckpt_sink_batches_total" and dict(labels)["sink"] == "ckpt-kafka"}
        assert outcomes == {"committed": seen[("ckpt_batches_total", ())]}  # no replay, no abort, none fenced
        assert seen[("ckpt_sink_rows_total", (("sink", "ckpt-kafka"),))] == FIRST  # each id once
        assert sorted(row[0] for row in sink.committed()) == list(range(FIRST))
        assert job.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
        assert run.wait(120) == 0
    finally:
        run.stop()
