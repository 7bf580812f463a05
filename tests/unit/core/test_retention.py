from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, Trigger, parse_enum
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy, plan_retention
from airflow_ckpt_provider.core.store.jobstore import check_job_name, check_snapshot_id
from airflow_ckpt_provider.core.store.progress import Progress
from tests.support.manifests import T0, manifest


def test_manifest_round_trip_and_checksum() -> None:
    m = manifest(Kind.SAVEPOINT, 7, 0)
    data = m.to_bytes()
    assert Manifest.from_bytes(data, "x") == m
    assert check_snapshot_id(m.snapshot_id) == m.snapshot_id
    tampered = json.loads(data)
    tampered["batch_id"] = 8
    with pytest.raises(SnapshotError, match="checksum does not match"):
        Manifest.from_bytes(json.dumps(tampered).encode(), "x")
    with pytest.raises(SnapshotError, match="is corrupt"):
        Manifest.from_bytes(data[: len(data) // 2], "x")
    tampered = json.loads(data)
    tampered["format"] = 99
    with pytest.raises(SnapshotError, match="upgrade airflow-ckpt-provider"):
        Manifest.from_bytes(json.dumps(tampered).encode(), "x")


def test_names_are_validated() -> None:
    with pytest.raises(ConfigError, match="invalid job name"):
        check_job_name("../etc")
    with pytest.raises(ConfigError, match="invalid snapshot id"):
        check_snapshot_id("savepoint-1")
    with pytest.raises(ConfigError, match="expected one of checkpoint, savepoint"):
        parse_enum(Kind, "snap")
    assert parse_enum(Trigger, "UPGRADE") is Trigger.UPGRADE


def test_latest_completed_is_by_creation_time_not_batch() -> None:
    old_timeline = manifest(Kind.CHECKPOINT, 50, 0)
    after_time_travel = manifest(Kind.CHECKPOINT, 11, 5)
    sp = manifest(Kind.SAVEPOINT, 10, 4)
    assert latest_completed([old_timeline, after_time_travel, sp]) is after_time_travel
    assert latest_completed([old_timeline, sp], [Kind.SAVEPOINT]) is sp
    assert latest_completed([], [Kind.SAVEPOINT]) is None


def test_retention_keeps_last_k_checkpoints_and_newest_savepoint() -> None:
    cps = [manifest(Kind.CHECKPOINT, i, i) for i in range(5)]
    sps = [manifest(Kind.SAVEPOINT, i, i) for i in range(4)]
    plan = plan_retention(cps + sps, RetentionPolicy(checkpoints_keep=2, savepoints_max_count=2), T0)
    gone = {d.snapshot_id for d in plan}
    assert gone == {cps[0].snapshot_id, cps[1].snapshot_id, cps[2].snapshot_id,
                    sps[0].snapshot_id, sps[1].snapshot_id}


def test_retention_by_age_never_deletes_newest_savepoint() -> None:
    sps = [manifest(Kind.SAVEPOINT, i, i) for i in range(3)]
    plan = plan_retention(sps, RetentionPolicy(savepoints_max_age=timedelta(seconds=1)), T0 + timedelta(days=30))
    assert {d.snapshot_id for d in plan} == {sps[0].snapshot_id, sps[1].snapshot_id}
    assert all("older than" in d.reason for d in plan)


@pytest.mark.parametrize("kwargs", [{"checkpoints_keep": 0}, {"savepoints_max_count": 0},
                                    {"savepoints_max_age": timedelta(0)}])
def test_retention_policy_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]  # kwargs holds one RetentionPolicy field


def test_progress_reports_files_bytes_rate_with_injected_clock() -> None:
    now = [0.0]
    lines: list[str] = []
    p = Progress("upload", total_files=3, total_bytes=3 * 1024 * 1024, every=1.0, report=lines.append,
                 clock=lambda: now[0])
    p.add_bytes(1024 * 1024)
    p.file_done()
    assert lines == []  # less than `every` seconds passed
    now[0] = 2.0
    p.skipped(1024 * 1024)
    assert lines == ["upload: 2/3 files, 2.0 MiB/3.0 MiB (1 file already stored), 512.0 KiB/s"]
    stats = p.finish()
    assert (stats.files, stats.bytes, stats.skipped_files, stats.seconds) == (1, 1024 * 1024, 1, 2.0)
    assert lines[-1].endswith("done in 2.00 s")
