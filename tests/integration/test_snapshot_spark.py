"""Snapshots of real Spark checkpoints through SeaweedFS: restore after losing the checkpoint gives exact results."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import SnapshotError
from airflow_ckpt_provider.core.snapshots.catalog import SnapshotResult, create_snapshot, verify_snapshot
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage
from tests.support import sparkjobs
from tests.support.sparkjobs import WORKLOADS, run_to_completion, write_input

pytestmark = pytest.mark.integration

CASES = [(w, p) for w in WORKLOADS for p in WORKLOADS[w].providers]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = sparkjobs.spark_session("ckpt-snapshot-tests")
    yield session
    session.stop()


@pytest.fixture
def store(s3_root: Storage) -> JobStore:
    return JobStore(s3_root, "stateful")


@pytest.mark.parametrize(("workload", "provider"), CASES)
def test_snapshot_delete_restore_continue_is_exact(
    spark: Any, store: JobStore, tmp_path: Path, workload: str, provider: str
) -> None:
    wl = WORKLOADS[workload]
    inputs, output = tmp_path / "in", tmp_path / "out"
    ckpt = tmp_path / "ckpt"
    for i in range(3):
        write_input(inputs, i)
    run_to_completion(spark, wl, input_dir=inputs, checkpoint_dir=ckpt, output_dir=output, provider=provider)

    snap = create_snapshot(store, LocalStorage(ckpt), kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL)
    assert snap.manifest.batch_id == 2
    assert {op["provider"] for op in snap.manifest.operators} == {provider.split("-", maxsplit=1)[0]}
    shutil.rmtree(ckpt)

    # restore somewhere else, as on another machine
    moved = tmp_path / "elsewhere" / "ckpt"
    restored = restore_snapshot(store, snap.manifest.snapshot_id, LocalStorage(moved))
    assert restored.manifest.resume_batch == 3
    assert SparkCheckpoint(LocalStorage(moved)).validate() == []
    for i in range(3, 5):
        write_input(inputs, i)
    run_to_completion(spark, wl, input_dir=inputs, checkpoint_dir=moved, output_dir=output, provider=provider)
    assert SparkCheckpoint(LocalStorage(moved)).latest_completed_batch() == 4
    assert wl.read_result(output) == wl.expected(5)


def test_incremental_snapshot_uploads_only_new_files(spark: Any, store: JobStore, tmp_path: Path) -> None:
    wl, provider = WORKLOADS["aggregation"], "rocksdb"
    inputs, output, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    for i in range(3):
        write_input(inputs, i)
    run_to_completion(spark, wl, input_dir=inputs, checkpoint_dir=ckpt, output_dir=output, provider=provider)
    # Every file an object (inline_max=0): what is proven here is that stored content is not sent again.
    first = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC, inline_max=0)
    for i in range(3, 5):
        write_input(inputs, i)
    run_to_completion(spark, wl, input_dir=inputs, checkpoint_dir=ckpt, output_dir=output, provider=provider)
    second = create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC, inline_max=0)

    stored_before = {f.sha256 for f in first.manifest.files}
    new = {f.sha256: f.size for f in second.manifest.files if f.sha256 not in stored_before}
    assert second.manifest.batch_id == 4
    assert 0 < second.stats.files == len(new) < len(second.manifest.files)
    assert second.stats.bytes == sum(new.values())
    assert second.stats.skipped_files == len(second.manifest.files) - second.stats.files


def _stream_while_snapshotting(spark: Any, store: JobStore, tmp_path: Path, files: int) -> list[SnapshotResult]:
    """Run the aggregation continuously while input files arrive; snapshot it as batches commit."""
    snaps: list[SnapshotResult] = []
    ckpt = tmp_path / "ckpt"
    with sparkjobs.running_query(spark, WORKLOADS["aggregation"], input_dir=tmp_path / "in", checkpoint_dir=ckpt,
                                 output_dir=tmp_path / "out", provider="hdfs", files=files):
        for _batch in sparkjobs.new_batches(ckpt, timeout=180):
            snaps.append(create_snapshot(store, LocalStorage(ckpt), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC))
            if len(snaps) >= 4:
                break
    return snaps


def test_snapshots_taken_while_batches_commit_are_consistent(spark: Any, store: JobStore, tmp_path: Path) -> None:
    files = 12
    snaps = _stream_while_snapshotting(spark, store, tmp_path, files)
    assert len(snaps) >= 3, "the query committed fewer batches than expected"
    wl = WORKLOADS["aggregation"]
    for i in range(files):  # whatever the feeder did not write yet
        write_input(tmp_path / "in", i)
    for n, snap in enumerate(snaps):
        m = snap.manifest
        assert verify_snapshot(store, m.snapshot_id).ok
        target, output = tmp_path / f"restored-{n}", tmp_path / f"out-{n}"
        restore_snapshot(store, m.snapshot_id, LocalStorage(target))
        assert SparkCheckpoint(LocalStorage(target)).validate() == []
        # the sink output of the batches the snapshot covers, as the sink held them then
        output.mkdir()
        for b in range(m.batch_id + 1):
            shutil.copy(tmp_path / "out" / f"{b:06d}.json", output)
        run_to_completion(spark, wl, input_dir=tmp_path / "in", checkpoint_dir=target, output_dir=output,
                          provider="hdfs")
        assert wl.read_result(output) == wl.expected(files), f"snapshot {m.snapshot_id} at batch {m.batch_id}"


def test_truncated_state_file_fails_the_snapshot_and_shows_nothing(
    spark: Any, store: JobStore, tmp_path: Path
) -> None:
    wl, inputs, output, ckpt = WORKLOADS["aggregation"], tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    for i in range(2):
        write_input(inputs, i)
    run_to_completion(spark, wl, input_dir=inputs, checkpoint_dir=ckpt, output_dir=output, provider="hdfs")
    delta = next(f.path for f in SparkCheckpoint(LocalStorage(ckpt)).view().files if f.path.endswith("2.delta"))
    data = (ckpt / delta).read_bytes()
    (ckpt / delta).write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match=f"{delta} is broken: .*truncated"):
        create_snapshot(store, LocalStorage(ckpt))
    assert store.storage.list("snapshots/") == []
    assert store.storage.list("pending/") == []


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_uninterrupted_run_matches_the_expected_result(spark: Any, tmp_path: Path, workload: str) -> None:
    """The oracle the restore tests compare with is what an uninterrupted Spark run produces."""
    wl = WORKLOADS[workload]
    for i in range(5):
        write_input(tmp_path / "in", i)
    run_to_completion(spark, wl, input_dir=tmp_path / "in", checkpoint_dir=tmp_path / "ckpt",
                      output_dir=tmp_path / "out", provider="rocksdb")
    assert wl.read_result(tmp_path / "out") == wl.expected(5)


def test_local_spark_listens_on_loopback_only(spark: Any) -> None:
    """The embedded default's Spark (driver, block manager, py4j) binds 127.0.0.1 only."""
    import os

    from tests.integration.test_embedded import _listening

    spark.range(10).count()  # executors and the block manager are up
    jvm = spark.sparkContext._gateway.proc.pid
    tcp = {(addr, port) for proto, addr, port in _listening(os.getpgid(jvm)) if proto.startswith("tcp")}
    assert tcp, "found no listening socket of the Spark JVM's process group"
    assert {addr for addr, _ in tcp} <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, tcp
