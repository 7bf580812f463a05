"""The exactly-once proof (issue 6), once per sink: ckpt-files, the transactional ckpt-kafka sink, the Ledger.

A stateful job (dropDuplicates over a topic where every id arrives twice) runs under
``ckpt run --supervise``; its driver is killed with kill -9 at every crash point of the sink's
commit protocol and at random moments, while records keep arriving; then a stop with savepoint, a
restore on a fresh checkpoint location, one more crash, more records. Every id is in the sink's
committed output exactly once with its content, and nothing uncommitted is visible
(tests/support/exactlyonce.py). The seed is printed; CKPT_EO_SEED replays a run.

By default each sink takes every crash point once plus one random kill (plus the crash after the
restore): 15 kill -9s in all. ``scripts/test --full`` takes ten kills per sink.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from airflow_ckpt_provider.core.storage import S3Options
from tests.support.exactlyonce import EoSink, FilesSink, KafkaSink, LedgerSink, prove_exactly_once
from tests.support.runtimejob import JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

FULL_KILLS = 10  # per sink, with --full


@pytest.fixture
def kills(pytestconfig: pytest.Config) -> Callable[[EoSink], int]:
    """Kills per sink: every crash point once and one random kill; ten with --full."""
    full = bool(pytestconfig.getoption("--full", default=False))
    return lambda sink: max(FULL_KILLS, len(sink.crash_points) + 1) if full else len(sink.crash_points) + 1


def test_files_sink_exactly_once_through_kills_at_every_commit_step_and_a_savepoint_restore(
        env: JobEnv, runs: list[Run], s3_options: S3Options, kills: Callable[[EoSink], int]) -> None:
    sink = FilesSink(f"s3://{env.bucket}/eo-out", s3_options)
    proof = prove_exactly_once(env, sink, runs, kills=kills(sink))
    print(proof.summary())


def test_kafka_sink_exactly_once_through_kills_at_every_commit_step_and_a_savepoint_restore(
        env: JobEnv, runs: list[Run], kills: Callable[[EoSink], int]) -> None:
    out = f"eo-{uuid.uuid4().hex[:10]}"
    env.kafka.create_topic(out, partitions=3)
    sink = KafkaSink(env.kafka.bootstrap_servers, out)
    proof = prove_exactly_once(env, sink, runs, kills=kills(sink))
    print(proof.summary())


def test_ledger_exactly_once_through_kills_at_every_commit_step_and_a_savepoint_restore(
        env: JobEnv, runs: list[Run], kills: Callable[[EoSink], int]) -> None:
    sink = LedgerSink(env.work / "out.db", env.job)
    proof = prove_exactly_once(env, sink, runs, kills=kills(sink))
    print(proof.summary())
