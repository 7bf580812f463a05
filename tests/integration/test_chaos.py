"""Chaos: kill -9 a supervised driver at random moments, at least ten times; the result is exact.

``ckpt run --supervise`` keeps the job alive; every kill takes down the driver's whole process
group (spark-submit's JVM, the Python driver, its workers) while records keep arriving. The seed
is printed so a failing run can be replayed (CKPT_CHAOS_SEED).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.control import Action, Outcome
from airflow_ckpt_provider.core.status import ACTIVE_STATES, JobState, JobStatus
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.runtimejob import JobEnv, Run, expected_counts, kill_driver, produce

pytestmark = pytest.mark.integration

KILLS = 10
CHUNK = 300  # records produced before each driver's life: three batches of 100
TOTAL = (KILLS + 1) * CHUNK


@pytest.fixture
def env(s3_server: EmbeddedS3, kafka_server: EmbeddedKafka, bucket: str, topic: str, tmp_path: Path) -> JobEnv:
    return JobEnv(s3_server, kafka_server, tmp_path, bucket, topic)


@pytest.fixture
def supervisor(env: JobEnv) -> Iterator[Run]:
    run = env.run("supervisor", env.work / "checkpoint", "--supervise", "-v", "--restart-strategy", "fixed-delay",
                  "--restart-attempts", str(KILLS * 3), "--restart-delay", "0.5", max_offsets=100)
    yield run
    run.stop()


def test_ten_kill_9s_of_a_supervised_driver_lose_and_duplicate_nothing(env: JobEnv, supervisor: Run) -> None:
    seed = int(os.environ.get("CKPT_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"chaos seed {seed}")
    rng = random.Random(seed)
    produced = 0

    def feed() -> None:  # the known stream: record i has key k<i % 10>; every driver finds data waiting
        nonlocal produced
        produce(env.kafka.bootstrap_servers, env.topic, produced, CHUNK)
        produced += CHUNK

    feed()
    killed: list[tuple[int, str, int | None]] = []
    first_batch: dict[int, int] = {}
    epoch = 0
    while len(killed) < KILLS:
        status = env.wait_status(f"a driver newer than epoch {epoch}",
                                 lambda s, e=epoch: s.epoch > e and s.state in ACTIVE_STATES, 180, supervisor)
        epoch = status.epoch
        # A random moment in this driver's life: 0.5-10 s after it took the lease, while it restores,
        # starts its query or runs its first batch (kills 2, 5, 8), or after 1-2 batches it completed
        # itself, somewhere inside the next ones (the other 7).
        if len(killed) % 3 == 1:
            time.sleep(rng.uniform(0.5, 10.0))
        else:
            batches = rng.randint(1, 2)

            def done(s: JobStatus, e: int = epoch, n: int = batches) -> bool:
                if s.epoch != e or s.batch_id is None:
                    return False
                return s.batch_id - first_batch.setdefault(e, s.batch_id) + 1 >= n

            env.wait_status(f"{batches} batches of epoch {epoch}", done, 180, supervisor)
            time.sleep(rng.uniform(0.0, 2.5))
        status = env.status()
        assert status is not None
        assert status.epoch == epoch, f"driver of epoch {epoch} died on its own: {status}\n{supervisor.tail()}"
        kill_driver(status)
        killed.append((epoch, status.state.value, status.batch_id))
        feed()  # while the supervisor restarts the driver

    final = env.wait_status(f"all {TOTAL} records counted", lambda s: env.consumed(s) == TOTAL and
                            s.state is JobState.RUNNING, 300, supervisor)
    assert env.request(Action.STOP, final.epoch).outcome is Outcome.COMPLETED
    assert supervisor.wait(180) == EXIT_STOPPED
    print(f"kills (epoch, state, batch): {killed}")

    assert sum(1 for _e, state, batch in killed if state == "RUNNING" and batch is not None) >= 7, killed
    assert env.final_counts() == expected_counts(TOTAL)
    assert final.epoch == KILLS + 1
    log = supervisor.log.read_text()
    assert len(re.findall(r"driver exited with code -9 ", log)) == KILLS, supervisor.tail()
    assert len(re.findall(r"restarting in 0\.5 s", log)) == KILLS
    # Every restart resumed from the latest completed checkpoint (no time travel, no data loss).
    assert log.count("restore latest-state") == KILLS + 1
