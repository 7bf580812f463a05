"""A control request reaches the running driver by a knock at its door, not its poll (issue 43): real Spark
(local[2]), tansu and SeaweedFS; the driver polls once an hour, so only the knock can bring the requests in time."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.support.runtimejob import JobEnv, Run, expected_counts, produce

pytestmark = pytest.mark.integration

TIMEOUT = 180.0


def test_a_savepoint_and_a_stop_are_acted_on_at_the_knock_of_their_asker_without_a_poll(
    env: JobEnv, runs: list[Run]
) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 600)
    runs.append(a := env.run("a", env.work / "checkpoint", "--poll-interval", "3600", "-v"))
    status = env.wait_status("all 600 read", lambda s: s.state is JobState.RUNNING and env.consumed(s) == 600,
                             TIMEOUT, a)
    lease = read_lease(env.store())
    assert lease is not None and lease.door is not None and lease.door.startswith("http://127.0.0.1:")
    assert any(f"control door at {lease.door}" in ln for ln in a.ckpt_lines()), a.tail()

    saved = env.request(RequestAction.SAVEPOINT, status.epoch)  # waits for the ack (tests/support/runtimejob.py)
    assert saved.outcome is Outcome.COMPLETED, saved
    manifest = load_manifest(env.store(), str(saved.snapshot_id))
    assert (manifest.kind, manifest.trigger) == (Kind.SAVEPOINT, Trigger.MANUAL)
    stopped = env.request(RequestAction.STOP, status.epoch)
    assert stopped.outcome is Outcome.COMPLETED, stopped
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    assert env.final_counts() == expected_counts(600)
