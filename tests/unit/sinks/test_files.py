"""ckpt-files layout logic on LocalStorage, without Spark: identity, commit race, reader, verify, gc."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from pathlib import Path

import msgspec
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)
import pytest

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.sinks.filecommit import commit_batch
from airflow_ckpt_provider.sinks.filelayout import (
    FENCE,
    BatchManifest,
    DataFile,
    committed_batches,
    data_key,
    manifest_key,
    open_sink,
    raise_fence,
    read_committed,
    read_pandas,
    read_timelines,
    sink_view,
)
from airflow_ckpt_provider.sinks.filemaintenance import gc_sink, verify_sink

Q = "5f0c1e2a-0000-4000-8000-000000000001"


@pytest.fixture
def sink(tmp_path: Path) -> LocalStorage:
    storage = LocalStorage(tmp_path / "sink")
    open_sink(storage, "orders")
    return storage


def _file(storage: LocalStorage, batch: int, part: int, values: list[int], attempt: str = "a1",
          query: str = Q) -> DataFile:
    """Write one Parquet file as a task would and describe it."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"v": pa.array(values, pa.int64())}), buf)
    data = buf.getvalue()
    key = data_key(query, batch, part, attempt, 0)
    storage.write(key, data)
    return DataFile(key, len(data), hashlib.sha256(data).hexdigest(), len(values), part)


def _digest(query: str, batch: int, timeline: int = 0) -> str:
    """A stand-in for the digest of the offsets log entry of ``batch`` on ``timeline``."""
    return hashlib.sha256(f"{query}/{batch}/{timeline}".encode()).hexdigest()


def _coverage(batch: int, query: str = Q, timeline: int = 0, previous_timeline: int | None = None) -> Coverage:
    before = previous_timeline if previous_timeline is not None else timeline
    return Coverage(batch, _digest(query, batch, timeline), _digest(query, batch - 1, before) if batch else None)


def _manifest(batch: int, *files: DataFile, query: str = Q, coverage: Coverage | None = None) -> BatchManifest:
    return BatchManifest(job="orders", query_id=query, batch_id=batch, files=tuple(files)).covering(
        coverage or _coverage(batch, query))


def test_identity_claims_empty_path_and_refuses_others(tmp_path: Path, sink: LocalStorage) -> None:
    ident = json.loads(sink.read("_ckpt_sink.json"))
    assert (ident["format"], ident["version"], ident["job"]) == ("ckpt-files", 2, "orders")
    assert open_sink(sink, "orders")["created_at"] == ident["created_at"]  # idempotent
    with pytest.raises(ConflictError, match="belongs to job 'orders', not to job 'billing'"):
        open_sink(sink, "billing")
    foreign = LocalStorage(tmp_path / "foreign")
    foreign.write("part-0000.parquet", b"x")
    with pytest.raises(ConflictError, match=r"has no _ckpt_sink.json.*part-0000.parquet"):
        open_sink(foreign, "orders")
    assert not foreign.exists("_ckpt_sink.json")
    with pytest.raises(ConfigError, match="is missing"):
        open_sink(LocalStorage(tmp_path / "none"), "orders", create=False)


def test_concurrent_commits_of_one_batch_have_one_winner(sink: LocalStorage) -> None:
    a = _manifest(0, _file(sink, 0, 0, [1, 2], attempt="a"))
    b = _manifest(0, _file(sink, 0, 0, [1, 2], attempt="b"))
    outcomes = {}
    barrier = threading.Barrier(2)

    def run(name: str, m: BatchManifest) -> None:
        barrier.wait()
        outcomes[name] = commit_batch(sink, m)

    threads = [threading.Thread(target=run, args=x) for x in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    winners = [n for n, o in outcomes.items() if o.committed]
    assert len(winners) == 1
    loser = "b" if winners == ["a"] else "a"
    lost = {"a": a, "b": b}[loser]
    assert outcomes[loser].deleted == (lost.files[0].key,)
    assert not sink.exists(lost.files[0].key)
    assert read_committed(sink).column("v").to_pylist() == [1, 2]
    report = verify_sink(sink)
    assert report.ok and report.orphans == [], report


def test_replay_keeps_earlier_output_and_crash_points_bracket_only_a_commit(sink: LocalStorage) -> None:
    points: list[str] = []
    first = commit_batch(sink, _manifest(0, _file(sink, 0, 0, [1])), points.append)
    assert points == ["files.commit.before-manifest", "files.commit.after-manifest"]
    replay = commit_batch(sink, _manifest(0, _file(sink, 0, 0, [99], attempt="a2")), points.append)
    assert first.committed and not replay.committed
    assert len(points) == 2  # a replay is told by its recorded coverage: it creates nothing
    assert replay.manifest == first.manifest
    assert read_committed(sink).column("v").to_pylist() == [1]


def test_reader_returns_only_committed_batches_in_order(sink: LocalStorage) -> None:
    q2 = "5f0c1e2a-0000-4000-8000-000000000002"
    commit_batch(sink, _manifest(1, _file(sink, 1, 0, [3]), _file(sink, 1, 1, [4])))
    commit_batch(sink, _manifest(0, _file(sink, 0, 0, [1, 2])))
    _file(sink, 2, 0, [666])  # written, never committed (in flight or crashed)
    commit_batch(sink, _manifest(0, _file(sink, 0, 0, [5], query=q2), query=q2))
    assert [(m.query_id[-1], m.batch_id) for m in committed_batches(sink)] == [("1", 0), ("1", 1), ("2", 0)]
    table = read_committed(sink, batch_id_column="batch", query_id_column="query")
    assert table.column("v").to_pylist() == [1, 2, 3, 4, 5]
    assert table.column("batch").to_pylist() == [0, 0, 1, 1, 0]
    assert list(read_pandas(sink)["v"]) == [1, 2, 3, 4, 5]


def test_empty_sink_reads_an_empty_table_with_the_committed_schema(sink: LocalStorage) -> None:
    assert read_committed(sink).num_rows == 0
    schema = pa.schema([pa.field("v", pa.int64())])
    m = BatchManifest(job="orders", query_id=Q, batch_id=0, files=(),
                      arrow_schema=schema.serialize().to_pybytes().hex())
    commit_batch(sink, m.covering(_coverage(0)))
    table = read_committed(sink, batch_id_column="batch")
    assert table.num_rows == 0 and table.schema.names == ["v", "batch"]


def test_verify_finds_missing_resized_corrupt_orphan_and_foreign(sink: LocalStorage) -> None:
    f0, f1, f2 = _file(sink, 0, 0, [1]), _file(sink, 0, 1, [2]), _file(sink, 0, 2, [3])
    commit_batch(sink, _manifest(0, f0, f1, f2))
    orphan = _file(sink, 1, 0, [4])
    assert verify_sink(sink, checksums=True).ok
    sink.delete([f0.key])
    sink.write(f1.key, b"short")
    path = sink.local_path(f2.key)
    assert path is not None
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    sink.write("notes.txt", b"hello")
    quick = verify_sink(sink)
    assert not quick.ok
    assert quick.orphans == [orphan.key]
    assert quick.batches == {Q: [0]}
    assert any(p.startswith(f"{f0.key}: missing") for p in quick.problems)
    assert any(p.startswith(f"{f1.key}: size 5, expected {f1.size}") for p in quick.problems)
    assert any(p.startswith("notes.txt: not part of") for p in quick.problems)
    assert len(quick.problems) == 3
    deep = verify_sink(sink, checksums=True)
    assert any(p.startswith(f"{f2.key}: SHA-256 differs") for p in deep.problems)


def test_verify_flags_a_file_in_two_manifests_and_a_misplaced_manifest(sink: LocalStorage) -> None:
    f = _file(sink, 0, 0, [1])
    commit_batch(sink, _manifest(0, f))
    sink.write(manifest_key(Q, 1), _manifest(0, f).to_bytes())
    problems = verify_sink(sink).problems
    assert any("listed by two manifests" in p for p in problems)
    assert any("expected at _commits" in p for p in problems)


def test_gc_deletes_only_old_unreferenced_data_files(sink: LocalStorage) -> None:
    kept = _file(sink, 0, 0, [1])
    commit_batch(sink, _manifest(0, kept))
    old, young = _file(sink, 1, 0, [2]), _file(sink, 2, 0, [3])
    mtimes = {o.key: o.mtime for o in sink.list()}
    path = sink.local_path(old.key)
    assert path is not None
    import os

    os.utime(path, (mtimes[old.key] - 1000, mtimes[old.key] - 1000))
    clock = lambda: mtimes[young.key] + 10  # noqa: E731 - an injected clock
    dry = gc_sink(sink, older_than_s=600, dry_run=True, clock=clock)
    assert (dry.deleted, dry.kept_young) == ([old.key], 1)
    assert sink.exists(old.key)
    done = gc_sink(sink, older_than_s=600, clock=clock)
    assert done.deleted == [old.key] and done.deleted_bytes == old.size
    assert not sink.exists(old.key) and sink.exists(young.key) and sink.exists(kept.key)
    assert sink.exists(manifest_key(Q, 0))
    everything = gc_sink(sink, older_than_s=0, clock=clock)
    assert everything.deleted == [young.key]
    assert read_committed(sink).column("v").to_pylist() == [1]


def test_gc_refuses_a_path_that_is_not_a_sink(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "x")
    storage.write("data/a.parquet", b"x")
    with pytest.raises(ConfigError, match="not a ckpt-files sink"):
        gc_sink(storage, older_than_s=0)
    assert storage.exists("data/a.parquet")


def test_sink_options_are_validated() -> None:
    from airflow_ckpt_provider.sinks.files import SinkOptions

    opts = SinkOptions.parse({"path": "/x", "job": "j", "checkpointLocation": "/c", "Compression": "ZSTD",
                              "maxRecordsPerFile": "10", "s3.endpoint": "http://127.0.0.1:1"})
    assert (opts.compression, opts.max_records_per_file, opts.endpoint) == ("zstd", 10, "http://127.0.0.1:1")
    for bad, message in [({"job": "j"}, "no path given"), ({"path": "/x"}, "no job given"),
                         ({"path": "/x", "job": "j", "compression": "lzo"}, "unsupported compression 'lzo'"),
                         ({"path": "/x", "job": "j", "maxRecordsPerFile": "-1"}, "maxRecordsPerFile must be"),
                         ({"path": "/x", "job": "j", "mode": "x"}, "unsupported option")]:
        with pytest.raises(ConfigError, match=message):
            SinkOptions.parse(bad)


def test_task_writes_rolled_files_and_nothing_for_an_empty_partition(sink: LocalStorage) -> None:
    from airflow_ckpt_provider.sinks.files import SinkOptions, _write_files

    opts = SinkOptions(path=str(sink.root), job="orders", max_records_per_file=4)
    batches = [pa.record_batch({"v": pa.array(range(i * 3, i * 3 + 3), pa.int64())}) for i in range(3)]
    files = _write_files(sink, iter(batches), opts, query_id=Q, batch_id=7, partition=1)
    assert [f.rows for f in files] == [4, 4, 1]
    assert all(f.key.startswith(f"data/{Q}/00000000000000000007/part-00001-") for f in files)
    assert len({f.key.split("-")[-2] for f in files}) == 1  # one attempt id
    for f in files:
        info = sink.stat(f.key)
        assert info is not None and info.size == f.size
    assert _write_files(sink, iter([]), opts, query_id=Q, batch_id=7, partition=2) == []
    commit_batch(sink, _manifest(7, *files))
    assert read_committed(sink).column("v").to_pylist() == list(range(9))


def test_cli_sink_verify_ls_gc(sink: LocalStorage, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ckpt_provider.cli.main import EXIT_VERIFY_FAILED, main

    f = _file(sink, 0, 0, [1, 2])
    commit_batch(sink, _manifest(0, f))
    orphan = _file(sink, 1, 0, [3])
    assert main(["sink", "verify", str(sink.root), "--checksums"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sink {sink.url}: OK, job orders, 1 query, 1 batch shown, 1 file, 2 rows")
    assert "; 1 uncommitted file (gc deletes them)" in out
    assert main(["sink", "ls", str(sink.root), "--json"]) == 0
    assert [(b["batch_id"], b["rows"]) for b in json.loads(capsys.readouterr().out)] == [(0, 2)]
    sink.delete([f.key])
    assert main(["sink", "verify", str(sink.root)]) == EXIT_VERIFY_FAILED
    assert capsys.readouterr().out.splitlines() == [
        f"sink {sink.url}: 1 problem", f"{f.key}: missing (committed in {manifest_key(Q, 0)})"]
    assert main(["sink", "gc", str(sink.root), "--older-than", "0"]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 uncommitted or abandoned file (")
    assert not sink.exists(orphan.key)
    assert main(["sink", "gc", str(sink.root / "nope"), "--older-than", "0"]) == 1
    assert "not a ckpt-files sink" in capsys.readouterr().err


def test_abort_after_the_manifest_was_created_keeps_the_committed_files(sink: LocalStorage) -> None:
    """Spark aborts also when commit() raised after creating the manifest: the batch must stay readable."""
    from pyspark.sql.types import LongType, StructField, StructType

    from airflow_ckpt_provider.sinks.files import CkptFilesWriter, FilesCommitMessage, SinkOptions

    writer = CkptFilesWriter(SinkOptions(str(sink.root), "orders", checkpoint="/c"),
                             StructType([StructField("v", LongType())]))
    committed, stray = _file(sink, 0, 0, [1, 2]), _file(sink, 0, 1, [3], attempt="a2")
    commit_batch(sink, _manifest(0, committed))
    writer.abort([FilesCommitMessage(Q, 0, 0, [committed]), FilesCommitMessage(Q, 0, 1, [stray]), None], 0)
    assert sink.exists(committed.key) and not sink.exists(stray.key)
    assert verify_sink(sink).ok
    assert read_committed(sink).column("v").to_pylist() == [1, 2]


def test_commit_refuses_a_batch_whose_files_are_gone(sink: LocalStorage) -> None:
    """A file deleted before the commit (gc with too short a grace) fails the batch instead of publishing it."""
    kept, gone = _file(sink, 0, 0, [1]), _file(sink, 0, 1, [2])
    sink.delete([gone.key])
    with pytest.raises(ConflictError, match=r"1 files its tasks wrote are gone before the commit"):
        commit_batch(sink, _manifest(0, kept, gone))
    assert not sink.exists(manifest_key(Q, 0))
    assert committed_batches(sink) == []


# -- timelines: a restore that went back in time ----------------------------------------------


def _timeline0(sink: LocalStorage, batches: int = 4) -> None:
    for b in range(batches):
        commit_batch(sink, _manifest(b, _file(sink, b, 0, [b])))


def test_batch_planned_again_forks_and_readers_show_the_restored_timeline(sink: LocalStorage) -> None:
    _timeline0(sink)  # values 0, 1, 2, 3
    # Restored at batch 1: batch 2 is planned again with other offsets (its previous is timeline 0's batch 1).
    fork = commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1"),
                                        coverage=_coverage(2, timeline=1, previous_timeline=0)))
    assert fork.committed and fork.forked is not None
    forked = fork.forked
    assert (forked.timeline, forked.parent, forked.fork_batch, forked.abandoned) == (1, 0, 2, (2, 3))
    assert fork.manifest.key == manifest_key(Q, 2, 1)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]
    commit_batch(sink, _manifest(3, _file(sink, 3, 0, [30], attempt="t1"), coverage=_coverage(3, timeline=1)))
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20, 30]
    # A replay of timeline 1's batch 3 is still a replay.
    replay = commit_batch(sink, _manifest(3, _file(sink, 3, 0, [99], attempt="r"), coverage=_coverage(3, timeline=1)))
    assert not replay.committed and replay.manifest.timeline == 1
    view = sink_view(sink)
    assert [(m.batch_id, m.timeline) for m in view.abandoned] == [(2, 0), (3, 0)]
    report = verify_sink(sink)
    assert report.ok and report.batches == {Q: [0, 1, 2, 3]} and report.rows == 4
    assert [(f["timeline"], f["fork_batch"], f["took_effect"]) for f in report.forks[Q]] == [(1, 2, True)]



def test_cli_sink_ls_shows_timelines_and_verify_reports_the_fork(sink: LocalStorage,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ckpt_provider.cli.main import main

    _timeline0(sink, 3)
    commit_batch(sink, _manifest(1, _file(sink, 1, 0, [10], attempt="t1"),
                                 coverage=_coverage(1, timeline=1, previous_timeline=0)))
    assert main(["sink", "ls", str(sink.root), "--json"]) == 0
    assert [(b["batch_id"], b["timeline"], b["status"]) for b in json.loads(capsys.readouterr().out)] == [
        (0, 0, "shown"), (1, 1, "shown")]
    assert main(["sink", "ls", str(sink.root), "--all", "--json"]) == 0
    assert [(b["batch_id"], b["timeline"], b["status"]) for b in json.loads(capsys.readouterr().out)] == [
        (0, 0, "shown"), (1, 1, "shown"), (1, 0, "abandoned"), (2, 0, "abandoned")]
    assert main(["sink", "ls", str(sink.root)]) == 0
    table = capsys.readouterr().out
    assert "TIMELINE" in table and "2 batches of abandoned timelines not listed (--all lists them)" in table
    assert main(["sink", "verify", str(sink.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"sink {sink.url}: OK, job orders, 1 query, 2 batches shown, 2 files, 2 rows")
    assert out[1:] == ["1 fork (restores that went back in time):",
                       f"  query {Q}: timeline 1 from batch 1 (fork of timeline 0 at {out[2].split(' at ')[1]}",
                       f"  query {Q}: abandoned batches 1@t0, 2@t0 (2 rows, hidden from readers, deleted by gc)"]


def test_a_second_fork_from_the_new_timeline(sink: LocalStorage) -> None:
    _timeline0(sink)
    commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1"),
                                 coverage=_coverage(2, timeline=1, previous_timeline=0)))
    commit_batch(sink, _manifest(3, _file(sink, 3, 0, [30], attempt="t1"), coverage=_coverage(3, timeline=1)))
    # Restored at timeline 1's batch 2: batch 3 planned again.
    second = commit_batch(sink, _manifest(3, _file(sink, 3, 0, [31], attempt="t2"),
                                          coverage=_coverage(3, timeline=2, previous_timeline=1)))
    assert second.forked is not None and (second.forked.timeline, second.forked.parent) == (2, 1)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20, 31]
    # A fork further back than both: restored at batch 0 of timeline 0.
    third = commit_batch(sink, _manifest(1, _file(sink, 1, 0, [11], attempt="t3"),
                                         coverage=_coverage(1, timeline=3, previous_timeline=0)))
    assert third.forked is not None and third.forked.abandoned == (1, 2, 3)
    assert read_committed(sink).column("v").to_pylist() == [0, 11]


def test_a_fork_whose_first_batch_did_not_commit_stays_invisible_and_is_finished_by_the_retry(
        sink: LocalStorage) -> None:
    _timeline0(sink)
    cov = _coverage(2, timeline=1, previous_timeline=0)

    def crash(point: str) -> None:
        if point == "files.commit.after-fork-record":
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1"), coverage=cov), crash)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 2, 3]  # the fork did not take effect yet
    retry = commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1b"), coverage=cov))
    assert retry.committed and retry.manifest.timeline == 1
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]


def test_a_batch_following_an_abandoned_batch_is_refused(sink: LocalStorage) -> None:
    _timeline0(sink)
    commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1"),
                                 coverage=_coverage(2, timeline=1, previous_timeline=0)))
    zombie = _file(sink, 4, 0, [40], attempt="z")  # batch 4 after timeline 0's batch 3
    with pytest.raises(ConflictError, match="follows batch 3 of a timeline this sink abandoned"):
        commit_batch(sink, _manifest(4, zombie, coverage=_coverage(4, timeline=0)))
    assert not sink.exists(zombie.key)
    stray = _file(sink, 3, 0, [35], attempt="z2")  # batch 3 after timeline 0's batch 2, shown is timeline 1's
    with pytest.raises(ConflictError, match="is not the one the sink shows"):
        commit_batch(sink, _manifest(3, stray, coverage=_coverage(3, timeline=5, previous_timeline=0)))
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]


def test_gc_deletes_abandoned_batches_only_once_their_fork_is_older_than_the_grace(sink: LocalStorage) -> None:
    _timeline0(sink)
    commit_batch(sink, _manifest(2, _file(sink, 2, 0, [20], attempt="t1"),
                                 coverage=_coverage(2, timeline=1, previous_timeline=0)))
    kept = gc_sink(sink, older_than_s=3600)
    assert kept.abandoned_batches == [] and kept.deleted == []
    assert len(sink_view(sink).abandoned) == 2
    done = gc_sink(sink, older_than_s=0)
    assert sorted(done.abandoned_batches) == [manifest_key(Q, 2), manifest_key(Q, 3)]
    assert len(done.deleted) == 2 and sink_view(sink).abandoned == []
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]
    assert verify_sink(sink, checksums=True).ok


def test_manifests_of_version_1_without_coverage_are_still_skipped_as_replays(sink: LocalStorage) -> None:
    old = BatchManifest(job="orders", query_id=Q, batch_id=0, files=(_file(sink, 0, 0, [1]),))
    sink.write(old.key, old.to_bytes())  # as written by the previous release: no coverage
    again = commit_batch(sink, _manifest(0, _file(sink, 0, 0, [9], attempt="a2")))
    assert not again.committed and read_committed(sink).column("v").to_pylist() == [1]


def _epoch(manifest: BatchManifest, epoch: int) -> BatchManifest:
    return msgspec.structs.replace(manifest, epoch=epoch)


def test_a_resumed_older_driver_never_forks_over_a_newer_drivers_batch(sink: LocalStorage) -> None:
    """Issue 41, finding 3: a driver paused inside its commit resumes after a newer one (higher lease epoch) committed
    the same batch with other offsets. Its commit would fork the timeline and hide the newer batch; it is refused as
    fenced instead: nothing committed, its files deleted, the newer batch shown."""
    for batch in (0, 1):
        commit_batch(sink, _epoch(_manifest(batch, _file(sink, batch, 0, [batch])), 1))
    newer = commit_batch(sink, _epoch(_manifest(2, _file(sink, 2, 0, [20], attempt="e2"),
                                                coverage=_coverage(2, timeline=1, previous_timeline=0)), 2))
    assert newer.committed
    late = _epoch(_manifest(2, _file(sink, 2, 0, [2], attempt="e1")), 1)  # what the paused driver planned
    with pytest.raises(ConflictError, match=r"expected this driver \(epoch 1\) to hold the job, found the sink "
                                            r"fenced at epoch 2 .*this one is fenced and commits nothing"):
        commit_batch(sink, late)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]
    assert read_timelines(sink, Q) == [] and not sink.exists(late.files[0].key)
    assert json.loads(sink.read(manifest_key(Q, 2)))["epoch"] == 2

    # A sink written before the fence existed (no _fence.json): the fork itself still refuses to hide the newer batch.
    sink.delete([FENCE])
    late = _epoch(_manifest(2, _file(sink, 2, 0, [2], attempt="e1b")), 1)
    with pytest.raises(ConflictError, match=r"expected this driver \(epoch 1\) to hold the job, found batch 2 "
                                            r"committed by a newer driver \(epoch 2\): this driver is fenced"):
        commit_batch(sink, late)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20] and not sink.exists(late.files[0].key)


def test_a_resumed_older_driver_commits_nothing_once_a_newer_driver_opened_the_sink(sink: LocalStorage) -> None:
    """Issue 41, finding 6: a driver paused inside its commit of batch 2 resumes after a newer driver (higher lease
    epoch) started its query on the sink but before the newer one reached batch 2. Without the fence the late commit
    was a plain one (nothing of the newer driver's to fork over) and made batch 2 visible; the newer driver's query
    start raised the fence, so the late commit is refused: nothing committed, its files deleted; the newer driver then
    commits batch 2 itself."""
    for batch in (0, 1):
        commit_batch(sink, _epoch(_manifest(batch, _file(sink, batch, 0, [batch])), 1))
    assert raise_fence(sink, "orders", 2).epoch == 2  # the newer driver's query starts (its streamWriter)
    late = _epoch(_manifest(2, _file(sink, 2, 0, [2], attempt="e1")), 1)
    with pytest.raises(ConflictError, match=r"expected this driver \(epoch 1\) to hold the job, found the sink "
                                            r"fenced at epoch 2 since .*_fence.json\): a newer driver runs the job"):
        commit_batch(sink, late)
    assert [m.batch_id for m in committed_batches(sink)] == [0, 1] and not sink.exists(late.files[0].key)
    newer = commit_batch(sink, _epoch(_manifest(2, _file(sink, 2, 0, [2], attempt="e2")), 2))
    assert newer.committed and newer.forked is None
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 2]
    assert verify_sink(sink).problems == []  # _fence.json is part of the layout


def test_the_fence_only_rises_and_a_commit_without_an_epoch_is_not_fenced(sink: LocalStorage) -> None:
    assert not sink.exists(FENCE)
    commit_batch(sink, _manifest(0, _file(sink, 0, 0, [0])))  # no ckpt runtime: no epoch, no fence
    assert not sink.exists(FENCE)
    commit_batch(sink, _epoch(_manifest(1, _file(sink, 1, 0, [1])), 3))  # a commit raises the fence to its epoch
    assert json.loads(sink.read(FENCE))["epoch"] == 3
    assert raise_fence(sink, "orders", 2).epoch == 3  # never lowered
    commit_batch(sink, _manifest(2, _file(sink, 2, 0, [2])))  # still not fenced without an epoch
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 2]


def test_a_newer_driver_still_forks_over_an_older_drivers_batch(sink: LocalStorage) -> None:
    """The other way round is time travel (a restore of an older snapshot by the newer driver): allowed, the fork
    records the newer epoch."""
    for batch in (0, 1, 2):
        commit_batch(sink, _epoch(_manifest(batch, _file(sink, batch, 0, [batch])), 1))
    fork = commit_batch(sink, _epoch(_manifest(2, _file(sink, 2, 0, [20], attempt="e2"),
                                               coverage=_coverage(2, timeline=1, previous_timeline=0)), 2))
    assert fork.forked is not None and fork.forked.epoch == 2 and fork.forked.abandoned == (2,)
    assert read_committed(sink).column("v").to_pylist() == [0, 1, 20]


def test_the_runtime_s_epoch_option_is_read_case_insensitively_and_absent_without_the_runtime() -> None:
    from airflow_ckpt_provider.sinks.files import SinkOptions  # pyspark's DataSource classes: imported lazily

    assert SinkOptions.parse({"path": "/x", "job": "j", "ckpt.Epoch": "7"}).epoch == 7
    assert SinkOptions.parse({"path": "/x", "job": "j"}).epoch is None
