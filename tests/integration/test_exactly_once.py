"""The exactly-once proof (issue 6), one run for the three sinks: ckpt-files, the transactional ckpt-kafka sink,
the Ledger.

One stateful job per sink (dropDuplicates over one topic where every id arrives twice), side by side, each under
``ckpt run --supervise`` (the runtime runs one streaming query per job); their drivers are killed with kill -9
at every crash point of every sink's commit protocol and at random moments, while records keep arriving; then
each job stops with a savepoint, restores it on a fresh checkpoint location, crashes once more at its sink's
last step and takes more records. Every id is in each sink's committed output exactly once with its content,
and nothing uncommitted is visible (tests/support/exactlyonce.py). The seed is printed; CKPT_EO_SEED replays
the kill plans and random moments.

By default every crash point once (3 + 4 + 2) plus random kills up to ten kill -9s before the savepoints, and
the three after the restores: 13 in all. ``scripts/test --full`` takes ten kills per sink before the savepoints.
"""

from __future__ import annotations

import uuid

import pytest

from airflow_ckpt_provider.core.storage import S3Options
from tests.support.exactlyonce import EoSink, FilesSink, KafkaSink, LedgerSink, prove_exactly_once
from tests.support.runtimejob import JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

MIN_KILLS = 10  # kill -9s before the savepoints, over the three jobs
FULL_KILLS = 10  # per sink, with --full


def _job(env: JobEnv, name: str) -> JobEnv:
    """A job of its own on the test's topic, store bucket and servers; its files under the test's directory."""
    work = env.work / name
    work.mkdir()
    return JobEnv(env.s3, env.kafka, work, env.bucket, env.topic, job=f"eo-{name}-{uuid.uuid4().hex[:6]}")


def test_three_sinks_side_by_side_exactly_once_through_kills_at_every_commit_step_and_a_savepoint_restore(
        env: JobEnv, runs: list[Run], s3_options: S3Options, pytestconfig: pytest.Config) -> None:
    files, kafka, ledger = _job(env, "files"), _job(env, "kafka"), _job(env, "ledger")
    out = f"eo-{uuid.uuid4().hex[:10]}"
    env.kafka.create_topic(out, partitions=3)
    jobs: list[tuple[JobEnv, EoSink]] = [
        (files, FilesSink(f"s3://{env.bucket}/eo-out", s3_options)),
        (kafka, KafkaSink(env.kafka.bootstrap_servers, out)),
        (ledger, LedgerSink(ledger.work / "out.db", ledger.job)),
    ]
    full = bool(pytestconfig.getoption("--full", default=False))
    proof = prove_exactly_once(jobs, runs, min_kills=MIN_KILLS, kills_per_sink=FULL_KILLS if full else 0)
    print(proof.summary())
    for _, sink in jobs:
        kills = proof.kills_of(sink.name)
        fired = {k.how.removeprefix("crash point ") for k in kills if k.how.startswith("crash point ")}
        assert fired == set(sink.crash_points), (sink.name, fired)
        assert len(kills) == len(proof.plans[sink.name]) + 1  # the plan's kills and the crash after the restore
    randoms = sum(1 for k in proof.kills if k.how.startswith("random"))
    assert randoms >= 1 and len(proof.kills) >= MIN_KILLS + len(jobs), proof.summary()
