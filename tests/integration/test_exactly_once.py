"""The exactly-once proof (issue 6), once per sink: ckpt-files, the transactional ckpt-kafka sink, the Ledger.

A stateful job (dropDuplicates over a topic where every id arrives twice) runs under
``ckpt run --supervise``; its driver is killed with kill -9 ten times, at every crash point of the
sink's commit protocol and at random moments, while records keep arriving; then a stop with
savepoint, a restore on a fresh checkpoint location, one more crash, more records. Every id is in
the sink's committed output exactly once with its content, and nothing uncommitted is visible
(tests/exactlyonce.py). The seed is printed; CKPT_EO_SEED replays a run.
"""

from __future__ import annotations

import uuid

import pytest

from airflow_ckpt_provider.core.storage import S3Options
from tests.exactlyonce import FilesSink, KafkaSink, LedgerSink, prove_exactly_once
from tests.runtimejob import JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

KILLS = 10


def test_files_sink_exactly_once_through_ten_kills_and_a_savepoint_restore(env: JobEnv, runs: list[Run],
                                                                             s3_options: S3Options) -> None:
    sink = FilesSink(f"s3://{env.bucket}/eo-out", s3_options)
    proof = prove_exactly_once(env, sink, runs, kills=KILLS)
    print(proof.summary())


def test_kafka_sink_exactly_once_through_ten_kills_and_a_savepoint_restore(env: JobEnv, runs: list[Run]) -> None:
    out = f"eo-{uuid.uuid4().hex[:10]}"
    env.kafka.create_topic(out, partitions=3)
    proof = prove_exactly_once(env, KafkaSink(env.kafka.bootstrap_servers, out), runs, kills=KILLS)
    print(proof.summary())


def test_ledger_exactly_once_through_ten_kills_and_a_savepoint_restore(env: JobEnv, runs: list[Run]) -> None:
    proof = prove_exactly_once(env, LedgerSink(env.work / "out.db", env.job), runs, kills=KILLS)
    print(proof.summary())
