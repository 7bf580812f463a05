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

import re
import shutil
import signal
from collections import Counter

import pytest

from airflow_ckpt_provider.core.policy.faults import PAUSE_ENV
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.support.exactlyonce import (
    EO_JOB,
    KAFKA_TASK_COMMIT,
    MAX_OFFSETS,
    RANDOM,
    WAIT,
    EoSink,
    Feeder,
    FilesSink,
    KafkaSink,
    LedgerSink,
    expected_rows,
    job_of_its_own,
    new_sink_topic,
    prove_exactly_once,
    wait_for,
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


def test_kafka_sink_commits_nothing_that_a_driver_elsewhere_could_not_replay_when_the_host_takes_the_checkpoint(
        env: JobEnv, runs: list[Run]) -> None:
    """Finding 2 (docs/reliability.md, scenario 1): the live checkpoint is on the driver host's disk, and the host is
    lost (kill -9, the checkpoint deleted) right after a task committed a batch to Kafka; the next driver starts
    with ``--restore latest-state`` on an empty checkpoint, as on another host. Checkpoint snapshots after batches are
    paused (CKPT_BENCH_PAUSE_CHECKPOINTS): only durable plans put anything in the store. The first loss is in batch 0's
    commit (no snapshot can hold it: the next driver resumes the first batch's plan, the same query), the second
    right after a task committed a later batch.
    Every id once in the sink, no (batch, partition, query) committed twice. Before durable plans each new driver
    started over (a new query), and the batches committed before the loss were written again."""
    job = job_of_its_own(env, "lost")
    sink = KafkaSink(env.kafka.bootstrap_servers, new_sink_topic(env.kafka))
    faults, pause = job.work / "faults", job.work / "pause-checkpoints"
    faults.mkdir()
    pause.touch()
    feeder = Feeder(job)

    def start(name: str) -> Run:
        run = job.run(name, job.work / f"checkpoint-{name}", "-v", "--restore", "latest-state", "--poll", "1",
                      max_offsets=MAX_OFFSETS, job_file=EO_JOB, conf=sink.conf(),
                      extra_env={**sink.env(), "CKPT_FAULT_DIR": str(faults), PAUSE_ENV: str(pause)})
        runs.append(run)
        return run

    def lose_host(run: Run, point: str) -> None:
        armed = faults / point
        wait_for(f"crash point {point} to fire", lambda: not armed.exists() or run.proc.poll() is not None, WAIT, run)
        assert run.proc.wait(WAIT) in (-signal.SIGKILL, 128 + signal.SIGKILL) and not armed.exists(), run.tail()
        shutil.rmtree(job.work / f"checkpoint-{run.name}")  # the host's disk went with it

    (faults / "kafka.commit.driver@0").touch()  # the ckpt-kafka source's batch 0 is empty: its driver-side commit
    feeder.feed()
    first = start("first")
    lose_host(first, "kafka.commit.driver@0")

    second = start("second")
    epoch = job.wait_status("the second driver to consume the first feed", lambda s: s.batch_id is not None
                            and job.consumed(s) == feeder.records and s.state is JobState.RUNNING, WAIT, second).epoch
    (faults / "kafka.task.after-commit").touch()
    feeder.feed()
    lose_host(second, "kafka.task.after-commit")

    third = start("third")
    feeder.feed()
    feeder.finish()
    final = job.wait_status(f"all {feeder.records} records consumed", lambda s: s.epoch > epoch
                            and job.consumed(s) == feeder.records and s.state is JobState.RUNNING, WAIT * 2, third)
    ack = job.request(RequestAction.STOP, final.epoch)
    assert ack.outcome is Outcome.COMPLETED and third.wait(WAIT) == EXIT_STOPPED, third.tail()

    second_log, third_log = second.log.read_text(), third.log.read_text()
    rows = sink.committed()
    counts = Counter(r[0] for r in rows)
    assert sorted(rows) == expected_rows(feeder.next_id), (
        f"duplicated {sorted(i for i, n in counts.items() if n > 1)[:10]}, "
        f"missing {sorted(set(range(feeder.next_id)) - set(counts))[:10]}")
    commits = Counter(KAFKA_TASK_COMMIT.findall(first.log.read_text() + second_log + third_log))
    assert commits and not [k for k, n in commits.items() if n > 1], commits
    assert "resuming that query at batch 0 as planned" in second_log, second.tail()
    assert re.search(r"snapshot \S+ \(batch \d+\): restored into", third_log), third.tail()
    print(f"lost live checkpoints: {feeder.next_id} ids, {len(commits)} (batch, partition, query) transactions, "
          f"{second_log.count('is already committed: skipped') + third_log.count('is already committed: skipped')} "
          "replayed partitions skipped by their markers")
