"""The Streaming jobs page's data (core/views/jobreport.py) from real records in a local job store: the bytes each
snapshot added, which starts were restarts, restarts counted in the health window, restore lineage with a
disposed snapshot, the status history, and manifests read once."""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile, Trigger, new_snapshot_id
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.core.views.jobreport import ManifestCache, job_report, job_summary
from tests.support.manifests import T0 as M0

NOW = M0.timestamp() + 3600


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


def put_manifest(store: JobStore, kind: Kind, batch: int, minutes: int, files: dict[str, int],
                 trigger: Trigger = Trigger.PERIODIC) -> Manifest:
    """A completed snapshot whose files are ``{sha: size}`` (the same sha in two snapshots is one object)."""
    created = M0 + timedelta(minutes=minutes)
    m = Manifest(job="orders", snapshot_id=new_snapshot_id(kind, batch, created), kind=kind, trigger=trigger,
                 batch_id=batch, created_at=created.isoformat(timespec="milliseconds"), query_id="q",
                 checkpoint="file:///c", files=tuple(ManifestFile(f"f{i}", size, sha * 32)
                                                    for i, (sha, size) in enumerate(files.items())),
                 code_version="v1")
    store.storage.write(store.manifest_key(m.snapshot_id), m.to_bytes())
    return m


def put_start(store: JobStore, epoch: int, minutes: float, launch_id: str, **body: Any) -> None:
    record = {"epoch": epoch, "at": M0.timestamp() + minutes * 60, "restore": "latest-state", "action": "fresh",
              "snapshot": None, "launch_id": launch_id, "code_version": "v1", "timeline": 0, **body}
    store.storage.write(f"deployments/{epoch:010d}.json", json.dumps(record).encode())


def put_status(store: JobStore, **changes: Any) -> JobStatus:
    body: dict[str, Any] = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": NOW - 2,
                            "started_at": NOW - 600, "batch_id": 9, "batch_at": NOW - 7, "lag": 120,
                            "pid": os.getpid(), "host": socket.gethostname(), "code_version": "v2"}
    status = JobStatus(**body | changes)
    write_status(store, status)
    return status


def test_each_snapshot_shows_the_bytes_no_earlier_snapshot_had(store: JobStore) -> None:
    put_manifest(store, Kind.CHECKPOINT, 1, 1, {"aa": 100, "bb": 50})
    put_manifest(store, Kind.CHECKPOINT, 2, 2, {"aa": 100, "bb": 50, "cc": 30})
    put_manifest(store, Kind.SAVEPOINT, 2, 3, {"aa": 100, "cc": 30, "dd": 7}, Trigger.MANUAL)
    put_status(store)
    rows = {(r.kind, r.batch_id): r for r in job_report(store, now=NOW, cache=ManifestCache()).snapshots}
    assert {k: (r.size, r.new_bytes, r.files) for k, r in rows.items()} == {
        ("checkpoint", 1): (150, 150, 2), ("checkpoint", 2): (180, 30, 3), ("savepoint", 2): (137, 7, 3)}
    assert rows["savepoint", 2].trigger == "manual" and rows["savepoint", 2].retained


def test_lineage_names_the_snapshot_each_start_restored_from_and_marks_a_disposed_one(store: JobStore) -> None:
    kept = put_manifest(store, Kind.SAVEPOINT, 4, 10, {"aa": 10})
    gone = new_snapshot_id(Kind.SAVEPOINT, 2, M0)  # restored from, then disposed: its manifest is gone
    put_start(store, 1, 1, "L1")
    put_start(store, 2, 20, "L2", action="restore", restore=f"snapshot:{gone}", snapshot=gone, code_version="v2")
    put_start(store, 3, 40, "L3", action="restore", restore=f"snapshot:{kept.snapshot_id}",
              snapshot=kept.snapshot_id, code_version="v3")
    put_status(store)
    report = job_report(store, now=NOW, cache=ManifestCache())
    assert [(s.epoch, s.snapshot, s.snapshot_retained, s.code_version, s.restart) for s in report.starts] == [
        (3, kept.snapshot_id, True, "v3", False), (2, gone, False, "v2", False), (1, None, None, "v1", False)]
    rows = {r.snapshot_id: r for r in report.snapshots}
    assert rows[kept.snapshot_id].restored_by == (3,) and rows[kept.snapshot_id].retained
    assert (rows[gone].retained, rows[gone].restored_by, rows[gone].kind, rows[gone].batch_id) == (
        False, (2,), "savepoint", 2)


def test_restarts_count_supervisor_starts_and_in_driver_restarts_within_the_health_window(store: JobStore) -> None:
    put_start(store, 1, 0, "L1")  # the launch
    put_start(store, 2, 5, "L1")  # its supervisor restarted it 55 min before NOW: outside the window
    put_start(store, 3, 55, "L1")  # ... and 5 min before NOW: inside
    put_start(store, 4, 56, "L2")  # a new launch (an upgrade) is no restart
    restarts = [{"by": "driver", "attempt": 1, "cause": "x", "delay": 1, "at": NOW - 60, "expected_by": NOW - 59,
                 "from_batch": 8, "resumed_at": NOW - 58, "resumed_batch": 9},
                {"by": "driver", "attempt": 1, "cause": "old", "delay": 1, "at": NOW - 3000, "expected_by": NOW}]
    put_status(store, epoch=4, restarts=restarts, restart_count=2)
    summary = job_summary(store, now=NOW, cache=ManifestCache())
    assert (summary.process_restarts, summary.driver_restarts, summary.restarts) == (1, 1, 2)
    report = job_report(store, now=NOW, cache=ManifestCache())
    assert [s.restart for s in report.starts] == [False, True, True, False]
    events = [e["event"] for e in reversed(report.history)]
    assert events[0] == "started (epoch 1): fresh, code v1"
    assert "restarted by its supervisor (epoch 3): fresh, code v1" in events
    assert "query failed at batch 8 (x): restarted in its driver, attempt 1" in events
    assert "resumed at batch 9" in events and events[-1] == "RUNNING"


def test_the_summary_of_a_live_job(store: JobStore) -> None:
    cp = put_manifest(store, Kind.CHECKPOINT, 8, 50, {"aa": 1})
    sp = put_manifest(store, Kind.SAVEPOINT, 6, 40, {"aa": 1})
    put_status(store)
    s = job_summary(store, now=NOW, cache=ManifestCache())
    assert (s.state, s.live, s.epoch, s.code_version, s.batch_id, s.lag) == ("RUNNING", True, 3, "v2", 9, 120)
    assert (s.batch_age, s.heartbeat_age) == pytest.approx((7, 2))
    assert s.latest_checkpoint is not None and s.latest_checkpoint["id"] == cp.snapshot_id
    assert s.latest_savepoint is not None and s.latest_savepoint["id"] == sp.snapshot_id
    assert s.latest_savepoint["age"] == pytest.approx(20 * 60)


def test_a_dead_drivers_lag_is_not_shown_and_its_state_says_stale(store: JobStore) -> None:
    put_status(store, host=f"not-{socket.gethostname()}", updated_at=NOW - 300)
    s = job_summary(store, now=NOW, cache=ManifestCache())
    assert not s.live and s.lag is None and "stale: no heartbeat for 300 s" in s.state_text


def test_manifests_are_read_once_per_process(store: JobStore) -> None:
    m = put_manifest(store, Kind.CHECKPOINT, 1, 1, {"aa": 1})
    put_status(store)
    cache = ManifestCache()
    assert [x.snapshot_id for x in cache.manifests(store)] == [m.snapshot_id]
    store.storage.write(store.manifest_key(m.snapshot_id), b"not json")  # a second read would fail
    assert [x.snapshot_id for x in cache.manifests(store)] == [m.snapshot_id]
    assert cache.manifests(JobStore(store.root, "other")) == []


def test_a_job_never_run_in_the_store_is_refused_naming_the_jobs_there(store: JobStore) -> None:
    put_status(store)
    with pytest.raises(ConfigError, match=r"job .nope. not found .* jobs in this store: orders"):
        job_report(JobStore(store.root, "nope"), now=NOW)


def test_the_job_page_names_the_supervisor_of_a_live_driver(store: JobStore) -> None:
    from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, write_supervisor

    put_status(store)
    write_supervisor(store, SupervisorRecord(job="orders", launch_id="L7", pid=os.getpid(), host=socket.gethostname(),
                                             state=SupervisorState.WATCHING, started_at=NOW - 600, updated_at=NOW - 1,
                                             interval=5.0, standalone=True))
    report = job_report(store, now=NOW, cache=ManifestCache())
    assert report.summary.live
    assert report.supervisor == f"supervisor (pid {os.getpid()} on {socket.gethostname()}, launch L7)"
