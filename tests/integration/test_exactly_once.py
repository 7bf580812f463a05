"""The exactly-once proof (issue 6) of the three sinks in one run: ckpt-files, the transactional ckpt-kafka
sink, the Ledger.

One stateful job per sink (dropDuplicates over a topic where every id arrives twice) under
``ckpt run --supervise``, the three side by side with one kill plan: their drivers are killed with kill -9 at
every crash point of every sink's commit protocol and at random moments while records keep arriving; each job
stops with a savepoint, restores it on a fresh checkpoint location, crashes there at its sink's last step and
takes more records. Every id is in each sink's committed output exactly once with its content, and nothing
uncommitted is visible (tests/support/exactlyonce.py). The seed is printed; CKPT_EO_SEED replays the plan
and the random moments.

By default every crash point once (3 + 4 + 2, the last of each sink after its restore) and one random kill:
10 kill -9s. ``scripts/test --full`` takes ten per sink: 30.
"""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.store.storage import S3Options
from tests.support.exactlyonce import (
    RANDOM,
    EoSink,
    FilesSink,
    KafkaSink,
    LedgerSink,
    job_of_its_own,
    new_sink_topic,
    prove_exactly_once,
)
from tests.support.runtimejob import JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

MIN_KILLS = 10  # kill -9s in all, over the three jobs
FULL_KILLS = 10  # per sink, with --full
SIDE_BY_SIDE = True  # the three jobs at once (a thread each), not one after the other


def test_three_sinks_exactly_once_through_kills_at_every_commit_step_random_kills_and_a_savepoint_restore(
        env: JobEnv, runs: list[Run], s3_options: S3Options, pytestconfig: pytest.Config) -> None:
    files, kafka, ledger = job_of_its_own(env, "files"), job_of_its_own(env, "kafka"), job_of_its_own(env, "ledger")
    out = new_sink_topic(env.kafka)
    jobs: list[tuple[JobEnv, EoSink]] = [
        (files, FilesSink(f"s3://{env.bucket}/eo-out", s3_options)),
        (kafka, KafkaSink(env.kafka.bootstrap_servers, out)),
        (ledger, LedgerSink(ledger.work / "out.db", ledger.job)),
    ]
    full = bool(pytestconfig.getoption("--full", default=False))
    proof = prove_exactly_once(jobs, runs, min_kills=MIN_KILLS, kills_per_sink=FULL_KILLS if full else 0,
                               side_by_side=SIDE_BY_SIDE)
    print(proof.summary())
    for _, sink in jobs:
        kills = proof.kills_of(sink.name)
        fired = [k.how.removeprefix("crash point ") for k in kills if k.how.startswith("crash point ")]
        assert sorted(fired) == sorted(sink.crash_points), (sink.name, fired)
        assert len(kills) == len(proof.plans[sink.name]) + 1  # and the crash after the restore
    assert len(proof.kills) >= MIN_KILLS and any(RANDOM in k.how for k in proof.kills), proof.summary()
    if full:
        assert all(len(proof.kills_of(s.name)) >= FULL_KILLS for _, s in jobs), proof.summary()
