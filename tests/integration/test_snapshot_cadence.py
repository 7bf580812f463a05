"""Checkpoint snapshots by time (issue 43): the live checkpoint is written every batch, a snapshot once per
``checkpoint_interval`` while batches complete, and the last batch is snapshotted within an interval of the job
going idle (the recovery point objective in docs/scale.md). Real Spark (local[2]), tansu and SeaweedFS."""

from __future__ import annotations

import itertools

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.support.runtimejob import JobEnv, Run, expected_counts, produce

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
INTERVAL = 3.0


def test_checkpoint_snapshots_come_once_an_interval_and_cover_the_last_batch_once_idle(
    env: JobEnv, runs: list[Run]
) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 3000)
    checkpoint = env.work / "checkpoint"
    runs.append(a := env.run("a", checkpoint, "--checkpoint-interval", f"{INTERVAL:g}", "--keep-checkpoints", "1000",
                             max_offsets=100))
    # 30 batches of 100, then idle: the newest snapshot reaches the last batch without another batch to trigger it.
    status = env.wait_status("all 3000 read and the last batch snapshotted",
                             lambda s: env.consumed(s) == 3000 and s.batch_id is not None
                             and (s.last_snapshot or {}).get("batch_id") == s.batch_id, TIMEOUT, a)
    committed = sorted(b for entries in env.commits().values() for b, _t in entries)
    assert committed == list(range(committed[0], status.batch_id + 1)), "every batch committed once, in order"
    snapshots = [m for m in list_snapshots(env.store()) if m.kind is Kind.CHECKPOINT]
    assert snapshots[-1].batch_id == status.batch_id
    # Never sooner than the interval after the previous one (the manifest's time is taken at the same step of each).
    for earlier, later in itertools.pairwise(snapshots):
        gap = (later.created - earlier.created).total_seconds()
        assert gap >= INTERVAL - 0.5, (earlier.snapshot_id, later.snapshot_id, gap)
    # The live checkpoint has every batch; the snapshots only some of them (batches here take well under 3 s).
    assert len(snapshots) < len(committed), [m.batch_id for m in snapshots]
    assert max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == status.batch_id

    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    assert env.final_counts() == expected_counts(3000)
