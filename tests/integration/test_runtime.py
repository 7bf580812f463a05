"""The job runtime end to end: ``ckpt run`` drivers (spark-submit, local[2]) on tansu and SeaweedFS.

Every driver runs tests/jobs/kafka_count.py: a stateful count per key over a 3-partition topic,
200 records per batch, one output file per batch id (see tests/support/runtimejob.py).
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.policy import lineagenames
from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET
from airflow_ckpt_provider.core.records.control import BELL, Bell, Outcome, RequestAction, knock, wait_ack
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.records.supervision import DRIVER_RUN_ENV, take_driver_end
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, load_manifest
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_FENCED, EXIT_STOPPED
from tests.support.manifests import labels_timed
from tests.support.runtimejob import JobEnv, Run, expected_counts, produce

pytestmark = pytest.mark.integration

TIMEOUT = 180.0


def last_entries(checkpoint: Path) -> tuple[int | None, int | None]:
    def last(d: str) -> int | None:
        return max((int(p.name) for p in (checkpoint / d).iterdir() if p.name.isdigit()), default=None)

    return last("offsets"), last("commits")


def ring_bell(store: JobStore, request_id: str) -> None:
    """What an asker does after writing ``control/<request_id>.json``: ring the bell, knock at the driver's door."""
    store.storage.write(BELL, Bell(request_id=request_id, at=time.time()).to_bytes())
    knock(store)


def batches_committed(env: JobEnv) -> list[int]:
    return sorted(b for entries in env.commits().values() for b, _t in entries)


@pytest.mark.full(proven_by="integration/test_cluster.py::test_exactly_once_on_the_cluster_... (stop with savepoint, "
                            "restore elsewhere, every id exactly once) and integration/test_exactly_once.py (a "
                            "savepoint restore of each sink, exact)")
def test_stop_with_savepoint_then_restore_elsewhere_continues_exactly(env: JobEnv, runs: list[Run]) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 1200)
    first = env.work / "machine-a" / "checkpoint"
    runs.append(a := env.run("a", first, "--checkpoint-interval", "0"))
    status = env.wait_status("batch 2 completed", lambda s: (s.batch_id or 0) >= 2, TIMEOUT, a)
    assert status.state is JobState.RUNNING

    ack = env.request(RequestAction.STOP, status.epoch)
    assert ack.outcome is Outcome.COMPLETED, ack
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    stopped = env.status()
    assert stopped is not None
    assert stopped.state is JobState.STOPPED
    assert stopped.reason == f"stopped with savepoint {ack.snapshot_id}"
    # No half-processed batch: the last offsets entry has its commit, and the savepoint is at it.
    offsets, commits = last_entries(first)
    assert offsets == commits == ack.batch_id
    savepoint = load_manifest(env.store(), str(ack.snapshot_id))
    assert (savepoint.kind, savepoint.trigger, savepoint.batch_id) == (Kind.SAVEPOINT, Trigger.STOP, ack.batch_id)
    assert savepoint.next_offsets is None
    record = read_lease(env.store())
    assert record is not None and record.released

    # Another machine: a fresh checkpoint location, restored from that savepoint, 600 more records.
    produce(env.kafka.bootstrap_servers, env.topic, 1200, 600)
    second = env.work / "machine-b" / "checkpoint"
    runs.append(b := env.run("b", second, "--restore", str(ack.snapshot_uri)))
    status = env.wait_status("all 1800 records counted", lambda s: env.consumed(s) == 1800, TIMEOUT, b)
    assert status.restored_from == ack.snapshot_id
    assert status.epoch == stopped.epoch + 1
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert b.wait(TIMEOUT) == EXIT_STOPPED

    assert env.final_counts() == expected_counts(1800)
    committed = batches_committed(env)
    assert committed == list(range(len(committed))), "every batch committed exactly once, none replayed"
    epochs = env.commits()
    assert max(batch for batch, _ in epochs[1]) == ack.batch_id
    assert min(batch for batch, _ in epochs[2]) == int(ack.batch_id or 0) + 1


def lineage_events(path: Path, ok: Callable[[list[dict[str, Any]]], bool], run: Run) -> list[dict[str, Any]]:
    """The OpenLineage events a driver wrote to its file transport (JSON lines), polled until ``ok``."""
    deadline = time.monotonic() + 60
    while True:
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if ok(events):
            return events
        assert time.monotonic() < deadline, f"lineage events so far: {events}\n{run.tail()}"
        time.sleep(0.2)


def test_savepoint_and_cancel_requests_and_a_request_for_another_epoch(env: JobEnv, runs: list[Run]) -> None:
    """Also: the driver's OpenLineage RUNNING events (runtime/lineage.py) to a real file transport."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, 1000)
    checkpoint = env.work / "checkpoint"
    events_file, launch_id, parent_run = env.work / "lineage.jsonl", "20261126T080000Z-0a1b2c", str(uuid.uuid4())
    lineage_env = {"OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(events_file),
                   "OPENLINEAGE__TRANSPORT__APPEND": "true", "CKPT_LAUNCH_ID": launch_id,
                   "OPENLINEAGE_PARENT_ID": f"airflow/orders_dag.submit/{parent_run}",
                   "CKPT_TEST_COMMIT_GROUP": f"group-{env.job}"}  # its brokers are named in status.json
    runs.append(a := env.run("a", checkpoint, "--checkpoint-interval", "none", "--lineage-interval", "2",
                             extra_env=lineage_env))
    status = env.wait_status("batch 1 completed", lambda s: (s.batch_id or 0) >= 1, TIMEOUT, a)
    assert "idle sources polled every 100ms" in a.log.read_text(), a.tail()  # not Spark's 10 ms (IDLE_POLL)

    ack = env.request(RequestAction.SAVEPOINT, status.epoch)
    assert ack.outcome is Outcome.COMPLETED, ack
    manifest = load_manifest(env.store(), str(ack.snapshot_id))
    assert (manifest.kind, manifest.trigger) == (Kind.SAVEPOINT, Trigger.MANUAL)
    assert manifest.batch_id >= 1
    assert labels_timed(manifest) == {"epoch": str(status.epoch)}

    stale = env.request(RequestAction.CANCEL, status.epoch + 7)
    assert stale.outcome is Outcome.REJECTED
    assert f"for the driver of epoch {status.epoch + 7}, this driver runs epoch {status.epoch}" in stale.message
    # A file in control/ that is not a request is answered, and blocks no later request.
    env.store().storage.write("control/garbage.json", b"{not json")
    ring_bell(env.store(), "garbage")  # and rings the bell, as an asker would
    garbage = wait_ack(env.store(), "garbage", TIMEOUT, poll=0.2)
    assert garbage is not None
    assert (garbage.outcome, garbage.action) == (Outcome.REJECTED, None)
    assert "expected a request written by `ckpt job`" in garbage.message
    beat = env.wait_status("a heartbeat after the rejections", lambda s: s.updated_at > garbage.finished_at, TIMEOUT, a)
    assert beat.state is JobState.RUNNING, "a rejected request must not stop the job"
    # --checkpoint-interval none: the only snapshot is the requested savepoint.
    assert [m.snapshot_id for m in list_snapshots(env.store())] == [ack.snapshot_id]

    # RUNNING events: one at the query's start, then every 2 s, all in the launch's run
    events = lineage_events(events_file, lambda evs: len(evs) >= 3 and evs[-1]["run"]["facets"][RUN_FACET][
        "batchId"] is not None, a)
    assert {e["eventType"] for e in events} == {"RUNNING"}
    assert {e["run"]["runId"] for e in events} == {str(uuid.uuid5(lineagenames.RUN_ID_NAMESPACE, launch_id))}
    assert {(e["job"]["namespace"], e["job"]["name"]) for e in events} == {("default", f"ckpt.{env.job}")}
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in events} == {parent_run}
    last = events[-1]
    assert [(d["namespace"], d["name"]) for d in last["inputs"]] == [
        (f"kafka://{env.kafka.bootstrap_servers.split(',')[0]}", env.topic)]
    facet = last["run"]["facets"][RUN_FACET]
    assert (facet["job"], facet["epoch"], facet["launchId"], facet["restarts"]) == (env.job, status.epoch, launch_id, 0)
    assert facet["batchId"] >= 1
    times = [datetime.fromisoformat(e["eventTime"]).timestamp() for e in events]
    assert all(later - earlier >= 1.9 for earlier, later in itertools.pairwise(times)), times

    cancel = env.request(RequestAction.CANCEL, status.epoch)
    assert cancel.outcome is Outcome.COMPLETED
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    final = env.status()
    assert final is not None
    assert (final.state, final.reason) == (JobState.STOPPED, "canceled on request")
    # The latest completed checkpoint stays valid: Spark resumes from it.
    assert SparkCheckpoint(LocalStorage(checkpoint)).validate() == []
    assert cancel.batch_id == SparkCheckpoint(LocalStorage(checkpoint)).latest_completed_batch()


def test_periodic_savepoints_appear_at_the_interval_and_only_after_new_batches(env: JobEnv, runs: list[Run]) -> None:
    """--savepoint-interval: savepoints triggered by time appear while the job runs (kind savepoint, trigger
    periodic, at a completed batch), a later one after new input covers a later batch, and none is taken twice
    at one batch (an interval with no new batch is skipped)."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, 400)
    runs.append(a := env.run("a", env.work / "checkpoint", "--checkpoint-interval", "none", "--savepoint-interval", "2",
                             max_offsets=100))

    def periodic() -> list[Any]:
        return [m for m in list_snapshots(env.store()) if m.trigger is Trigger.PERIODIC]

    def wait_periodic(what: str, ok: Callable[[list[Any]], bool]) -> list[Any]:
        deadline = time.monotonic() + TIMEOUT
        while not ok(found := periodic()):
            assert a.proc.poll() is None and time.monotonic() < deadline, f"waiting for {what}: {found}\n{a.tail()}"
            time.sleep(0.5)
        return found

    first = wait_periodic("a periodic savepoint", bool)[0]
    assert (first.kind, first.trigger) == (Kind.SAVEPOINT, Trigger.PERIODIC)
    assert first.batch_id is not None and first.batch_id >= 0
    done = env.wait_status("every record counted", lambda s: env.consumed(s) >= 400, TIMEOUT, a)
    produce(env.kafka.bootstrap_servers, env.topic, 400, 400)
    env.wait_status("the new records counted", lambda s: env.consumed(s) >= 800, TIMEOUT, a)
    later = wait_periodic("a periodic savepoint of a batch after the new input",
                          lambda found: any(m.batch_id > (done.batch_id or 0) for m in found))
    batches = [m.batch_id for m in later]
    assert len(batches) == len(set(batches)), f"two periodic savepoints at one batch: {batches}"
    assert all(m.kind is Kind.SAVEPOINT for m in later)
    cancel = env.request(RequestAction.CANCEL, done.epoch)
    assert cancel.outcome is Outcome.COMPLETED
    assert a.wait(TIMEOUT) == EXIT_STOPPED


def test_broken_or_deleted_live_checkpoint_falls_back_to_the_newest_snapshot(env: JobEnv, runs: list[Run]) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 2000)
    checkpoint = env.work / "checkpoint"
    runs.append(a := env.run("a", checkpoint))
    status = env.wait_status("batch 3 snapshotted", lambda s: (s.last_snapshot or {}).get("batch_id", 0) >= 3,
                             TIMEOUT, a)
    assert env.request(RequestAction.CANCEL, status.epoch).outcome is Outcome.COMPLETED
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    newest = max(list_snapshots(env.store()), key=lambda m: m.batch_id)

    # Truncate the state file the latest completed batch committed: the live checkpoint is broken.
    latest = SparkCheckpoint(LocalStorage(checkpoint)).latest_completed_batch()
    assert latest is not None
    delta = checkpoint / "state" / "0" / "0" / f"{latest + 1}.delta"
    delta.write_bytes(delta.read_bytes()[:10])
    runs.append(b := env.run("b", checkpoint))
    status = env.wait_status("restarted after the fallback", lambda s: s.epoch == 2 and s.state is JobState.RUNNING,
                             TIMEOUT, b)
    assert status.restored_from == newest.snapshot_id
    fallback = [ln for ln in b.ckpt_lines() if "FALLBACK" in ln]
    assert len(fallback) == 1, b.tail()
    assert f"the live checkpoint {checkpoint.as_uri()} is broken" in fallback[0]
    assert f"{latest + 1}.delta" in fallback[0]
    assert "WARNING" in fallback[0]
    # More input, so a batch follows the restore whatever "a" consumed before its cancel (status.json reports
    # batches with its heartbeats: "a" may well have read all 2000 records by the time the test saw batch 3).
    produce(env.kafka.bootstrap_servers, env.topic, 2000, 100)
    env.wait_status("batch after the restore", lambda s: (s.batch_id or 0) > newest.batch_id, TIMEOUT, b)
    assert env.request(RequestAction.CANCEL, 2).outcome is Outcome.COMPLETED
    assert b.wait(TIMEOUT) == EXIT_STOPPED

    # Deleted entirely: the newest snapshot again, then all 2200 records exactly (100 more, so "c" runs a batch of
    # its own after the restore).
    newest = max(list_snapshots(env.store()), key=lambda m: m.batch_id)
    shutil.rmtree(checkpoint)
    produce(env.kafka.bootstrap_servers, env.topic, 2100, 100)
    runs.append(c := env.run("c", checkpoint, conf={"spark.sql.streaming.pollingDelay": "50ms"}))
    status = env.wait_status("all 2200 records counted by c", lambda s: s.epoch == 3 and env.consumed(s) == 2200,
                             TIMEOUT, c)
    assert "idle sources polled every 50ms" in c.log.read_text(), c.tail()  # the job's own value wins
    assert status.restored_from == newest.snapshot_id
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert c.wait(TIMEOUT) == EXIT_STOPPED
    assert env.final_counts() == expected_counts(2200)


@pytest.mark.full(proven_by="test_two_drivers_started_at_once_exactly_one_runs (the driver of the older epoch exits "
                            "fenced, only the newest epoch commits) and test_lease_control.py::"
                            "test_newer_driver_fences_the_older")
def test_a_newer_driver_fences_the_running_one(env: JobEnv, runs: list[Run]) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 3000)
    runs.append(a := env.run("a", env.work / "a" / "checkpoint", max_offsets=100))
    env.wait_status("batch 2 completed", lambda s: (s.batch_id or 0) >= 2, TIMEOUT, a)

    runs.append(b := env.run("b", env.work / "b" / "checkpoint", max_offsets=100))
    assert a.wait(TIMEOUT) == EXIT_FENCED, a.tail()
    assert any("was fenced" in ln for ln in a.ckpt_lines()), a.tail()
    # The first driver may have read all 3000 before the second took over (a slow spark-submit start):
    # more records make sure the second one runs batches of its own.
    produce(env.kafka.bootstrap_servers, env.topic, 3000, 600)
    status = env.wait_status("all 3600 records counted", lambda s: env.consumed(s) == 3600, TIMEOUT * 2, b)
    assert status.epoch == 2
    assert env.request(RequestAction.STOP, 2).outcome is Outcome.COMPLETED
    assert b.wait(TIMEOUT) == EXIT_STOPPED

    commits = env.commits()
    assert commits[1], "the first driver committed batches before it was fenced"
    assert max(t for _b, t in commits[1]) < min(t for _b, t in commits[2]), "epoch windows overlap"
    assert env.final_counts() == expected_counts(3600)


def test_two_drivers_started_at_once_exactly_one_runs(env: JobEnv, runs: list[Run]) -> None:
    produce(env.kafka.bootstrap_servers, env.topic, 0, 600)
    barrier = threading.Barrier(2)
    started: list[Run] = []

    def start(name: str) -> None:
        barrier.wait()
        started.append(env.run(name, env.work / name / "checkpoint"))

    threads = [threading.Thread(target=start, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs.extend(started)
    status = env.wait_status("all 600 records counted", lambda s: env.consumed(s) == 600, TIMEOUT * 2)
    exited = [r for r in started if r.proc.poll() is not None]
    assert len(exited) == 1, "\n".join(r.tail() for r in started)
    (loser,) = exited
    winner = next(r for r in started if r is not loser)
    assert loser.proc.returncode == EXIT_FENCED, loser.tail()
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert winner.wait(TIMEOUT) == EXIT_STOPPED
    assert list(env.commits()) == [2], "only the driver holding the newest epoch committed batches"
    assert env.final_counts() == expected_counts(600)


def test_bad_input_changes_nothing(env: JobEnv, runs: list[Run], tmp_path: Path) -> None:
    """Also: each driver whose run is named (CKPT_DRIVER_RUN, as a supervisor names a cluster-mode driver) records
    its exit code in the job store as it exits: 2 for each refusal, 0 for the stop."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, 600)
    checkpoint = env.work / "checkpoint"
    runs.append(a := env.run("a", checkpoint, extra_env={DRIVER_RUN_ENV: "run-a"}))
    status = env.wait_status("batch 1 completed", lambda s: (s.batch_id or 0) >= 1, TIMEOUT, a)

    # Another job's snapshot, a snapshot that does not exist, latest-savepoint with none: refused
    # before the lease is taken, so the running driver is not fenced.
    other = f"{env.store_url}/other-job/snapshots/savepoint-1-20261122T100000Z-abcdef"
    # --restore none on the running driver's own live checkpoint: refused, not discarded.
    cases = [
        ("foreign", tmp_path / "foreign", other, "belongs to job 'other-job'"),
        ("missing", tmp_path / "missing", "savepoint-1-20261122T100000Z-abcdef", "savepoint-1-20261122T100000Z-abcdef"),
        ("no-savepoint", tmp_path / "no-savepoint", "latest-savepoint", "no restorable savepoint (none exists)"),
        ("none-on-live", checkpoint, "none", "is not empty: delete it, choose another --checkpoint"),
    ]
    started = []  # all four at once: each is refused before it takes the lease, so they cannot interfere
    for name, target, restore, message in cases:
        runs.append(bad := env.run(name, target, "--restore", restore, extra_env={DRIVER_RUN_ENV: f"run-{name}"}))
        started.append((bad, target, message))
    for bad, target, message in started:
        assert bad.wait(TIMEOUT) == EXIT_CONFIG, bad.tail()
        assert any(message in ln for ln in bad.ckpt_lines()), bad.tail()
        assert target == checkpoint or not target.exists()
    lease = read_lease(env.store())
    assert lease is not None
    assert lease.epoch == status.epoch
    assert a.proc.poll() is None
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert a.wait(TIMEOUT) == EXIT_STOPPED
    ends = {name: take_driver_end(env.store(), f"run-{name}") for name in ["a", *(c[0] for c in cases)]}
    assert {name: end.code if end else None for name, end in ends.items()} == {
        "a": EXIT_STOPPED, "foreign": EXIT_CONFIG, "missing": EXIT_CONFIG, "no-savepoint": EXIT_CONFIG,
        "none-on-live": EXIT_CONFIG}
