"""The Spark checkpoint model on synthetic checkpoints written in Spark 4.3's file formats."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import CheckpointError
from airflow_ckpt_provider.core.snapshots.checkpoint import BatchView, SparkCheckpoint, is_spark_checkpoint
from airflow_ckpt_provider.core.snapshots.ckptfiles import (
    lz4_stream_problem,
    parse_log_entry,
    relocate,
    schema_key,
    sst_problem,
    verify_file,
    zip_problem,
)
from airflow_ckpt_provider.core.snapshots.statestore import StateOperator
from airflow_ckpt_provider.core.store.storage import LocalStorage

HDFS_CLASS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SST_MAGIC = struct.pack("<Q", 0x88E241B785F4CFF7)


def lz4_stream(payload: bytes = b"\x00\x00\x00\x01k\xff\xff\xff\xff") -> bytes:
    """An lz4-java LZ4BlockOutputStream with one raw block and the end mark."""
    token = 0x10 | 5  # COMPRESSION_METHOD_RAW | level for 32 KB blocks
    block = b"LZ4Block" + bytes([token]) + struct.pack("<iii", len(payload), len(payload), 0) + payload
    return block + b"LZ4Block" + bytes([token]) + struct.pack("<iii", 0, 0, 0)


def sst(size: int = 64) -> bytes:
    return b"\x01" * (size - 8) + SST_MAGIC


class Ckpt:
    """Writes checkpoint files the way Spark 4.3 lays them out."""

    def __init__(self, root: Path, provider: str = HDFS_CLASS, partitions: int = 2) -> None:
        self.root = root
        self.provider = provider
        self.partitions = partitions  # spark.sql.shuffle.partitions in the offsets log
        self.put("metadata", json.dumps({"id": "0b7c-query"}))

    def put(self, key: str, data: bytes | str) -> Ckpt:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return self

    def offsets(self, batch: int, *sources: str | None) -> Ckpt:
        conf = {"spark.sql.streaming.stateStore.providerClass": self.provider,
                "spark.sql.shuffle.partitions": str(self.partitions)}
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": conf}
        lines = [s if s is not None else "-" for s in (sources or (json.dumps({"logOffset": batch}),))]
        return self.put(f"offsets/{batch}", "\n".join(["v1", json.dumps(meta), *lines]))

    def commit(self, batch: int, **meta: Any) -> Ckpt:
        version = "v2" if "stateUniqueIds" in meta else "v1"
        return self.put(f"commits/{batch}", f"{version}\n" + json.dumps({"nextBatchWatermarkMs": 0, **meta}))

    def batches(self, n: int, *, file_source: bool = True) -> Ckpt:
        for b in range(n):
            self.offsets(b).commit(b)
            if file_source:
                self.put(f"sources/0/{b}", f'v1\n{{"path":"file:///in/part-{b}.json","batchId":{b}}}')
        return self

    def operator_v1(self, op: int = 0, stores: tuple[str, ...] = ("default",), partitions: int = 2) -> Ckpt:
        """Operator metadata v1 with ``partitions`` (the offsets log says ``self.partitions``; set both)."""
        info = [{"storeName": s, "numColsPrefixKey": 0, "numPartitions": partitions} for s in stores]
        meta = {"operatorInfo": {"operatorId": op, "operatorName": "stateStoreSave"}, "stateStoreInfo": info}
        return self.put(f"state/{op}/_metadata/metadata", "v1\n" + json.dumps(meta))

    def hdfs(self, versions: range, *, op: int = 0, partitions: int = 2, snapshots: tuple[int, ...] = ()) -> Ckpt:
        for p in range(partitions):
            for v in versions:
                self.put(f"state/{op}/{p}/{v}.delta", lz4_stream())
            for v in snapshots:
                self.put(f"state/{op}/{p}/{v}.snapshot", lz4_stream())
        return self

    def rocksdb_zip(self, version: int, *, op: int = 0, partition: int = 0, ssts: int = 2,
                    unique_id: str | None = None) -> list[str]:
        """``<version>.zip`` (format v2: ``<version>_<unique_id>.zip``) and the SST files its metadata lists; returns
        the SST keys."""
        names = [f"{version:06d}{i}-uuid{version}x{i}.sst" for i in range(ssts)]
        meta = {
            "sstFiles": [{"localFileName": f"{n[:7]}.sst", "dfsSstFileName": n, "sizeBytes": 64} for n in names],
            "numKeys": 3,
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("CURRENT", "MANIFEST-000005\n")
            zf.writestr("metadata", "v1\n" + json.dumps(meta))
        base = f"state/{op}/{partition}"
        self.put(f"{base}/{version}{'_' + unique_id if unique_id else ''}.zip", buf.getvalue())
        for n in names:
            self.put(f"{base}/SSTs/{n}", sst())
        return [f"{base}/SSTs/{n}" for n in names]

    def changelogs(self, versions: range, *, op: int = 0, partition: int = 0) -> Ckpt:
        for v in versions:
            self.put(f"state/{op}/{partition}/{v}.changelog", lz4_stream())
        return self

    @property
    def checkpoint(self) -> SparkCheckpoint:
        return SparkCheckpoint(LocalStorage(self.root))

    def view(self, batch: int | None = None, **kwargs: Any) -> BatchView:
        return self.checkpoint.view(batch, **kwargs)

    def files(self, batch: int | None = None, **kwargs: Any) -> set[str]:
        return {f.path for f in self.view(batch, **kwargs).files}


@pytest.fixture
def ckpt(tmp_path: Path) -> Ckpt:
    return Ckpt(tmp_path / "ckpt")


@pytest.fixture
def rocks(tmp_path: Path) -> Ckpt:
    return Ckpt(tmp_path / "ckpt", ROCKSDB_CLASS, partitions=1)


def error_of(ckpt: Ckpt, batch: int | None = None, **kwargs: Any) -> str:
    with pytest.raises(CheckpointError) as err:
        ckpt.view(batch, **kwargs)
    return str(err.value)


# ---- batches -------------------------------------------------------------------------------


def test_latest_completed_batch_is_the_newest_commit(ckpt: Ckpt) -> None:
    ckpt.batches(3).put("sources/0/3", "v1\n{}").offsets(3)  # batch 3 is planned, not committed
    assert ckpt.checkpoint.completed_batches() == [0, 1, 2]
    assert ckpt.checkpoint.latest_completed_batch() == 2
    assert ckpt.view().batch_id == 2


def test_no_completed_batch_yet(ckpt: Ckpt) -> None:
    ckpt.offsets(0)
    assert ckpt.checkpoint.latest_completed_batch() is None
    assert "no batch has completed yet: commits/ is empty" in error_of(ckpt)


def test_gaps_in_commits_name_the_completed_batches(ckpt: Ckpt) -> None:
    ckpt.batches(5)
    (ckpt.root / "commits" / "2").unlink()
    assert ckpt.checkpoint.completed_batches() == [0, 1, 3, 4]
    assert "batch 2 is not completed: commits/2 is missing; completed batches still in the checkpoint: 0-1, 3-4" in (
        error_of(ckpt, 2)
    )
    assert ckpt.view(3).batch_id == 3


def test_missing_offsets_for_a_committed_batch(ckpt: Ckpt) -> None:
    ckpt.batches(3)
    (ckpt.root / "offsets" / "2").unlink()
    message = error_of(ckpt)
    assert "at batch 2" in message
    assert "offsets/2 is missing: the offsets of completed batch 2; Spark cannot resume without it" in message


def test_offsets_before_the_latest_are_required_without_write_ahead(ckpt: Ckpt) -> None:
    ckpt.batches(3)
    (ckpt.root / "offsets" / "1").unlink()
    assert "offsets/1 is missing: Spark reads the entry before the latest" in error_of(ckpt)


def test_write_ahead_offsets_replace_the_previous_entry(ckpt: Ckpt) -> None:
    ckpt.batches(3).offsets(3, '{"logOffset":3}').put("sources/0/3", "v1\n{}")
    view = ckpt.view()
    assert view.next_offsets == ['{"logOffset":3}']
    assert {"commits/2", "offsets/2", "offsets/3", "sources/0/3"} <= {f.path for f in view.files}
    assert "offsets/1" not in {f.path for f in view.files}
    no_wal = ckpt.view(write_ahead=False)
    assert no_wal.next_offsets is None
    assert {f.path for f in no_wal.files} >= {"offsets/1", "offsets/2"}
    assert not {"offsets/3", "sources/0/3"} & {f.path for f in no_wal.files}


def test_view_facts(ckpt: Ckpt) -> None:
    ckpt.batches(2)
    view = ckpt.view()
    assert view.query_id == "0b7c-query"
    assert view.offsets == ['{"logOffset": 1}']
    assert view.conf["spark.sql.shuffle.partitions"] == "2"
    assert view.batch_timestamp_ms == 1_700_000_000_001
    assert view.state_version == 2
    assert view.operators == ()
    assert {f.path for f in view.files} == {
        "metadata",
        "offsets/0",
        "offsets/1",
        "commits/1",
        "sources/0/0",
        "sources/0/1",
    }
    assert all(f.size == (ckpt.root / f.path).stat().st_size for f in view.files)


def test_hidden_crc_and_temp_files_are_ignored(ckpt: Ckpt) -> None:
    ckpt.batches(2)
    ckpt.put("offsets/.1.crc", b"crc").put("commits/.2.0f3a.tmp", "v1\n{}").put(".metadata.crc", b"x")
    assert ckpt.checkpoint.latest_completed_batch() == 1
    assert not any(p.rsplit("/", 1)[-1].startswith(".") for p in ckpt.files())


def test_truncated_offsets_file(ckpt: Ckpt) -> None:
    ckpt.batches(3)
    data = (ckpt.root / "offsets" / "2").read_bytes()
    ckpt.put("offsets/2", data[:-5])
    assert "offsets/2 is truncated or corrupt: line 3 is not valid JSON (file truncated?)" in error_of(ckpt)
    ckpt.put("offsets/2", b"v1")
    assert "offsets/2 is truncated or corrupt: the metadata line is missing" in error_of(ckpt)


def test_offsets_log_from_a_newer_spark(ckpt: Ckpt) -> None:
    ckpt.batches(2).put("commits/1", 'v9\n{"nextBatchWatermarkMs":0}')
    assert "commits/1 has log format v9; this provider reads v1 and v2 only" in error_of(ckpt)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.json").write_text("{}")
    storage = LocalStorage(tmp_path / "data")
    assert not is_spark_checkpoint(storage)
    with pytest.raises(CheckpointError, match="not a Spark checkpoint: expected a 'metadata' file with the query id"):
        SparkCheckpoint(storage).view()
    assert SparkCheckpoint(LocalStorage(tmp_path / "absent")).validate()[0].startswith("not a Spark checkpoint")


def test_is_spark_checkpoint(ckpt: Ckpt) -> None:
    assert is_spark_checkpoint(LocalStorage(ckpt.root))
    ckpt.put("metadata", "{not json")
    assert not is_spark_checkpoint(LocalStorage(ckpt.root))


# ---- sources -------------------------------------------------------------------------------


def test_file_source_log_uses_the_newest_compaction_up_to_the_offset(ckpt: Ckpt) -> None:
    ckpt.batches(7, file_source=False)
    for name in ("0", "1", "2.compact", "3", "4", "5.compact", "6", "7"):
        ckpt.put(f"sources/0/{name}", "v1\n{}")
    assert {p for p in ckpt.files(4, write_ahead=False) if p.startswith("sources/")} == {
        "sources/0/2.compact",
        "sources/0/3",
        "sources/0/4",
    }
    assert {p for p in ckpt.files(6) if p.startswith("sources/")} == {"sources/0/5.compact", "sources/0/6"}


def test_missing_file_source_log_entry(ckpt: Ckpt) -> None:
    ckpt.batches(3)
    (ckpt.root / "sources" / "0" / "1").unlink()
    assert "sources/0/1 is missing: file source log entry up to logOffset 2" in error_of(ckpt)


def test_offsets_log_v2_maps_source_ids_to_source_logs(ckpt: Ckpt) -> None:
    meta = json.dumps({"batchWatermarkMs": 0, "conf": {}})
    for b in range(3):
        ckpt.put(f"offsets/{b}", f'v2\n{meta}\n0:{{"logOffset":{b}}}').commit(b).put(f"sources/0/{b}", "v1\n{}")
    view = ckpt.view()
    assert view.offsets == ['{"logOffset":2}']
    assert {p for p in ckpt.files() if p.startswith("sources/")} == {"sources/0/0", "sources/0/1", "sources/0/2"}


def test_other_sources_keep_their_whole_log(ckpt: Ckpt) -> None:
    kafka = json.dumps({"topic": {"0": 42}})
    for b in range(2):
        ckpt.offsets(b, kafka).commit(b)
    ckpt.put("sources/0/0", b"\x00v1\n{}")
    assert "sources/0/0" in ckpt.files()
    assert ckpt.view().offsets == [kafka]


# ---- HDFS-backed state -----------------------------------------------------------------------


def test_hdfs_needs_every_delta_up_to_version(ckpt: Ckpt) -> None:
    ckpt.batches(3).operator_v1().hdfs(range(1, 5)).put("state/0/0/_metadata/schema", b"\x00\x02v2")
    view = ckpt.view()
    assert view.operators == (StateOperator(0, "stateStoreSave", 2, ("default",), "hdfs", False),)
    state = {p for p in ckpt.files() if p.startswith("state/")}
    # version 3 = batch 2 + 1; 4.delta belongs to the batch in flight
    assert state == {
        "state/0/_metadata/metadata",
        "state/0/0/_metadata/schema",
        *(f"state/0/{p}/{v}.delta" for p in (0, 1) for v in (1, 2, 3)),
    }


def test_hdfs_newest_snapshot_replaces_older_deltas(ckpt: Ckpt) -> None:
    ckpt.batches(6).operator_v1().hdfs(range(1, 7), snapshots=(2, 4))
    state = {p for p in ckpt.files() if p.startswith("state/0/0/")}
    assert state == {"state/0/0/4.snapshot", "state/0/0/5.delta", "state/0/0/6.delta"}


def test_hdfs_missing_delta(ckpt: Ckpt) -> None:
    ckpt.batches(3).operator_v1().hdfs(range(1, 4))
    (ckpt.root / "state/0/1/2.delta").unlink()
    message = error_of(ckpt)
    assert "state/0/1/2.delta is missing: HDFS-backed state version 3 needs the newest <v>.snapshot <= 3" in message
    assert "(deltas found: 1.delta, 3.delta)" in message


def test_hdfs_missing_partition(ckpt: Ckpt) -> None:
    ckpt.partitions = 3
    ckpt.batches(2).operator_v1(partitions=3).hdfs(range(1, 3), partitions=2)
    assert "state/0/2/1.delta is missing" in error_of(ckpt)


def test_hdfs_truncated_delta_is_found_when_verifying(ckpt: Ckpt) -> None:
    ckpt.batches(3).operator_v1().hdfs(range(1, 4))
    ckpt.put("state/0/1/3.delta", lz4_stream()[:-10])
    assert ckpt.view().batch_id == 2  # without verify, state files are not read
    problems = ckpt.checkpoint.validate()
    assert problems == [
        "state/0/1/3.delta is truncated: the LZ4 block header at byte 30 is incomplete (41 bytes); "
        "Spark cannot load it, restore another batch"
    ]
    assert "state/0/1/3.delta is truncated" in error_of(ckpt, verify=True)


def test_hdfs_broken_snapshot_falls_back_to_an_older_one(ckpt: Ckpt) -> None:
    ckpt.batches(6).operator_v1().hdfs(range(1, 7), snapshots=(2, 4))
    ckpt.put("state/0/0/4.snapshot", lz4_stream()[:12])
    state = {p for p in ckpt.files(verify=True) if p.startswith("state/0/0/")}
    assert state == {
        "state/0/0/2.snapshot",
        "state/0/0/3.delta",
        "state/0/0/4.delta",
        "state/0/0/5.delta",
        "state/0/0/6.delta",
    }
    warning = (
        "state/0/0/4.snapshot is truncated: the LZ4 block header at byte 0 is incomplete (12 bytes); "
        "an older snapshot is used instead"
    )
    assert ckpt.checkpoint.validate() == [warning]
    assert ckpt.view(verify=True).warnings == (warning,)


def test_stream_join_stores(ckpt: Ckpt) -> None:
    stores = ("left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues", "right-keyWithIndexToValue")
    ckpt.batches(2).operator_v1(stores=stores)
    for p in (0, 1):
        for s in stores:
            for v in (1, 2):
                ckpt.put(f"state/0/{p}/{s}/{v}.delta", lz4_stream())
    view = ckpt.view()
    assert view.operators[0].store_names == stores
    assert "state/0/1/right-keyWithIndexToValue/2.delta" in {f.path for f in view.files}
    (ckpt.root / "state/0/1/left-keyToNumValues/1.delta").unlink()
    assert "state/0/1/left-keyToNumValues/1.delta is missing" in error_of(ckpt)


def test_stores_without_operator_metadata_come_from_the_listing(ckpt: Ckpt) -> None:
    ckpt.batches(2).hdfs(range(1, 3), op=0).hdfs(range(1, 3), op=1)
    ops = ckpt.view().operators
    assert [(o.operator_id, o.name, o.partitions, o.store_names) for o in ops] == [
        (0, None, 2, ("default",)),
        (1, None, 2, ("default",)),
    ]


def test_after_a_repartition_the_partitions_come_from_the_offsets_log_not_the_stale_metadata(tmp_path: Path) -> None:
    # Spark's offline repartition 2 -> 5 at batch 2: offsets/2 copies offsets/1 with 5 shuffle partitions,
    # every new partition gets a full 4.zip (state version 4 = batch 3's), _metadata/metadata still says 2.
    rocks = Ckpt(tmp_path / "ckpt", ROCKSDB_CLASS, partitions=2).batches(2).operator_v1(partitions=2)
    for p in range(2):
        rocks.rocksdb_zip(2, partition=p)
    rocks.partitions = 5
    rocks.offsets(2, json.dumps({"logOffset": 1})).commit(2)  # no source data: batch 1's end offsets
    zips = {f"state/0/{p}/3.zip" for p in range(5)}
    for p in range(5):
        rocks.rocksdb_zip(3, partition=p)
    view = rocks.view()
    assert view.batch_id == 2 and [o.partitions for o in view.operators] == [5]
    assert {f for f in rocks.files() if f.endswith(".zip")} == zips


def test_an_unfinished_repartition_is_left_out_of_the_view(tmp_path: Path) -> None:
    # A repartition 2 -> 5 killed after offsets/2 and some state: Spark would refuse to restart on offsets/2.
    rocks = Ckpt(tmp_path / "ckpt", ROCKSDB_CLASS, partitions=2).batches(2).operator_v1(partitions=2)
    for p in range(2):
        rocks.rocksdb_zip(2, partition=p)
    rocks.partitions = 5
    rocks.offsets(2, json.dumps({"logOffset": 1}))
    rocks.rocksdb_zip(3, partition=4)
    view = rocks.view()
    assert view.batch_id == 1 and view.next_offsets is None and [o.partitions for o in view.operators] == [2]
    assert "offsets/2" not in rocks.files() and {"offsets/0", "offsets/1", "commits/1"} <= rocks.files()
    assert view.warnings == ("offsets/2 is an unfinished repartition of the state from 2 to 5 partitions "
                             "(no commits/2); left out: Spark would refuse to restart on it",)


def test_partitions_a_repartition_dropped_are_left_out(tmp_path: Path) -> None:
    # 5 -> 3 at batch 1: partitions 3 and 4 keep the zips of version 1, which no store loads any more.
    rocks = Ckpt(tmp_path / "ckpt", ROCKSDB_CLASS, partitions=5).batches(1).operator_v1(partitions=5)
    for p in range(5):
        rocks.rocksdb_zip(1, partition=p)
    rocks.partitions = 3
    rocks.offsets(1, json.dumps({"logOffset": 0})).commit(1)
    for p in range(3):
        rocks.rocksdb_zip(2, partition=p)
    view = rocks.view()
    assert [o.partitions for o in view.operators] == [3]
    assert not [f for f in rocks.files() if f.startswith(("state/0/3/", "state/0/4/"))]


# ---- RocksDB state -------------------------------------------------------------------------


def test_rocksdb_zip_and_the_ssts_it_lists(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    rocks.rocksdb_zip(2)
    ssts = rocks.rocksdb_zip(3)
    rocks.put("state/0/0/SSTs/0000099-orphan.sst", sst())
    view = rocks.view()
    assert view.operators == (StateOperator(0, "stateStoreSave", 1, ("default",), "rocksdb", False),)
    assert {p for p in rocks.files() if p.startswith("state/0/0/")} == {"state/0/0/3.zip", *ssts}


def test_rocksdb_changelog_replays_from_the_newest_zip(rocks: Ckpt) -> None:
    rocks.batches(5).operator_v1(partitions=1).changelogs(range(1, 6))
    ssts = rocks.rocksdb_zip(2)
    view = rocks.view()
    assert view.operators[0].changelog
    assert {p for p in rocks.files() if p.startswith("state/0/0/")} == {
        "state/0/0/2.zip",
        *ssts,
        "state/0/0/3.changelog",
        "state/0/0/4.changelog",
        "state/0/0/5.changelog",
    }


def test_rocksdb_missing_zip_and_changelog(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    rocks.rocksdb_zip(1)
    rocks.rocksdb_zip(2)
    message = error_of(rocks)
    assert "state/0/0/3.zip and state/0/0/3.changelog are missing: RocksDB state version 3 needs 3.zip" in message
    assert "(found: 1.zip, 2.zip)" in message


def test_rocksdb_missing_or_resized_sst(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    first, second = rocks.rocksdb_zip(3)
    Path(rocks.root / first).unlink()
    rocks.put(second, sst(70))
    message = error_of(rocks)
    assert f"state/0/0/3.zip is unusable: it lists {first} (missing), {second} (70 bytes, expected 64)" in message


def test_rocksdb_truncated_zip(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    rocks.rocksdb_zip(3)
    data = (rocks.root / "state/0/0/3.zip").read_bytes()
    rocks.put("state/0/0/3.zip", data[: len(data) - 10])
    assert "state/0/0/3.zip is unusable: not a complete zip file" in error_of(rocks)


def test_rocksdb_broken_zip_falls_back_to_older_zip_and_changelogs(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1).changelogs(range(1, 4))
    old = rocks.rocksdb_zip(1)
    rocks.rocksdb_zip(3)
    rocks.put("state/0/0/3.zip", b"PK\x03\x04broken")
    assert {p for p in rocks.files() if p.startswith("state/0/0/")} == {
        "state/0/0/1.zip",
        *old,
        "state/0/0/2.changelog",
        "state/0/0/3.changelog",
    }
    assert rocks.checkpoint.validate()[0].startswith("state/0/0/3.zip is unusable: not a complete zip file")


def test_rocksdb_truncated_sst_is_found_when_verifying(rocks: Ckpt) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    first, _ = rocks.rocksdb_zip(3)
    rocks.put(first, b"\x01" * 64)  # right size, no footer
    assert rocks.view().batch_id == 2
    assert "is truncated or corrupt: the SST footer magic number is missing" in error_of(rocks, verify=True)


def test_format_v2_files_without_the_commits_unique_ids_are_refused(rocks: Ckpt) -> None:
    rocks.batches(2).operator_v1(partitions=1)  # a v1 commit: no stateUniqueIds
    rocks.put("state/0/0/2_8e5dd7bb-7c64-4ff2.zip", b"")
    message = error_of(rocks)
    assert "state/0/: the query uses state store checkpoint format version 2" in message
    assert message.count("format version 2") == 1


def test_format_v2_chooses_the_zip_the_commit_names_not_another_attempts(rocks: Ckpt) -> None:
    rocks.batches(2).commit(1, stateUniqueIds={"0": [["aaaaaaaa-1111"]]}).operator_v1(partitions=1)
    ssts = rocks.rocksdb_zip(2, unique_id="aaaaaaaa-1111", ssts=1)
    rocks.put("state/0/0/2_aaaaaaaa-1111.zip.crc", "{}")
    rocks.put("state/0/0/2_bbbbbbbb-2222.changelog", lz4_stream())  # a failed attempt of version 2
    files = rocks.files()
    assert {f for f in files if f.startswith("state/0/0/") and "/_metadata/" not in f} == {
        "state/0/0/2_aaaaaaaa-1111.zip", "state/0/0/2_aaaaaaaa-1111.zip.crc", *ssts}


def test_the_state_format_is_read_from_the_newest_commit_and_a_newer_one_asked_is_explained(rocks: Ckpt) -> None:
    from airflow_ckpt_provider.core.snapshots.statestore import state_format_note

    assert SparkCheckpoint(LocalStorage(rocks.root)).state_format() == (None, None)
    rocks.batches(2).operator_v1(partitions=1)
    rocks.rocksdb_zip(2, ssts=1)
    assert SparkCheckpoint(LocalStorage(rocks.root)).state_format() == (1, 1)
    assert rocks.view().state_format == 1
    note = state_format_note("2", 1, 1)
    assert note is not None and "checkpoint is format v1 at batch 1" in note and "--restore none" in note
    assert state_format_note(None, 1, 1) is None and state_format_note("1", 2, 7) is None  # v2 stays v2
    assert state_format_note("2", None, None) is None  # a new checkpoint takes the asked format

    rocks.commit(1, stateUniqueIds={"0": [["aaaaaaaa-1111"]]})
    rocks.rocksdb_zip(2, unique_id="aaaaaaaa-1111", ssts=1)
    assert SparkCheckpoint(LocalStorage(rocks.root)).state_format() == (2, 1)
    assert rocks.view().state_format == 2
    assert state_format_note("2", 2, 1) is None


def test_format_v2_follows_the_lineage_in_the_changelog_back_to_version_1(rocks: Ckpt) -> None:
    from airflow_ckpt_provider.core.snapshots.ckptfiles import changelog_lineage
    from tests.unit.core.test_state_format_v2 import CHANGELOG  # version 6 of a real job, lineage 1-5

    lineage = changelog_lineage(CHANGELOG.read_bytes())
    assert lineage is not None
    own = CHANGELOG.name.split("_", 1)[1].removesuffix(".changelog")
    rocks.batches(6).commit(5, stateUniqueIds={"0": [[own]]}).operator_v1(partitions=1)
    rocks.put(f"state/0/0/{CHANGELOG.name}", CHANGELOG.read_bytes())
    for version, unique_id in lineage:
        rocks.put(f"state/0/0/{version}_{unique_id}.changelog", lz4_stream())
    rocks.put("state/0/0/3_dddddddd-4444.changelog", lz4_stream())  # another attempt's version 3: not in it
    state = {f.rsplit("/", 1)[1] for f in rocks.files() if f.startswith("state/0/0/") and "/_metadata/" not in f}
    assert state == {CHANGELOG.name, *(f"{v}_{u}.changelog" for v, u in lineage)}
    (rocks.root / f"state/0/0/3_{lineage[2][1]}.changelog").unlink()
    assert (f"state/0/0/3_{lineage[2][1]}.changelog is missing: state version 6 replays the changelogs of its "
            "lineage") in error_of(rocks)


def test_format_v2_with_the_hdfs_backed_provider_is_refused(ckpt: Ckpt) -> None:
    ckpt.batches(2).commit(1, stateUniqueIds={"0": [["aaaaaaaa-1111"], ["cccccccc-3333"]]}).operator_v1()
    ckpt.hdfs(range(1, 3))
    assert "the commit names state checkpoint format v2 unique ids, which only RocksDBStateStoreProvider writes" \
        in error_of(ckpt)


def test_format_v2_without_the_named_version_says_what_it_found(rocks: Ckpt) -> None:
    rocks.batches(2).commit(1, stateUniqueIds={"0": [["aaaaaaaa-1111"]]}).operator_v1(partitions=1)
    rocks.rocksdb_zip(2, unique_id="bbbbbbbb-2222", ssts=1)
    assert ("state/0/0/2_aaaaaaaa-1111.zip and .changelog are missing: the commit names state version 2 by that "
            "unique id (found: 2_bbbbbbbb-2222)") in error_of(rocks)


def test_unsupported_provider(tmp_path: Path) -> None:
    ckpt = Ckpt(tmp_path / "c", "com.example.MyStateStoreProvider", partitions=1).batches(2).operator_v1(partitions=1)
    ckpt.hdfs(range(1, 3), partitions=1)
    assert "state store provider com.example.MyStateStoreProvider is not supported" in error_of(ckpt)


def test_files_deleted_while_reading(rocks: Ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    rocks.batches(3).operator_v1(partitions=1)
    rocks.rocksdb_zip(3)
    checkpoint = rocks.checkpoint
    real_read = checkpoint.storage.read

    def read(key: str) -> bytes:
        if key.endswith(".zip"):
            raise FileNotFoundError(key)
        return real_read(key)

    monkeypatch.setattr(checkpoint.storage, "read", read)
    with pytest.raises(CheckpointError, match=r"state/0/0/3\.zip was deleted while the checkpoint was read"):
        checkpoint.view()


# ---- transformWithState: operator metadata v2 and absolute schema paths -----------------------


def tws_metadata(root: str, schema: str) -> str:
    info = {
        "storeName": "default",
        "numColsPrefixKey": 0,
        "numPartitions": 1,
        "stateSchemaFilePaths": [f"{root}/state/0/_stateSchema/default/{schema}"],
    }
    meta = {
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [info],
        "operatorPropertiesJson": '{"timeMode":"NoTime"}',
    }
    return "v2\n" + json.dumps(meta, separators=(",", ":"))


def test_operator_metadata_v2_and_its_schema_files(rocks: Ckpt) -> None:
    root = "file:" + str(rocks.root)
    rocks.batches(5).rocksdb_zip(5)
    rocks.rocksdb_zip(6)
    rocks.put("state/0/_metadata/v2/0", tws_metadata(root, "0_aaa")).put("state/0/_stateSchema/default/0_aaa", b"s0")
    rocks.put("state/0/_metadata/v2/3", tws_metadata(root, "3_bbb")).put("state/0/_stateSchema/default/3_bbb", b"s3")
    rocks.put("state/0/_metadata/v2/5", tws_metadata(root, "5_ccc")).put("state/0/_stateSchema/default/5_ccc", b"s5")
    files = rocks.files(4)
    assert {p for p in files if "_metadata" in p or "_stateSchema" in p} == {
        "state/0/_metadata/v2/3",
        "state/0/_stateSchema/default/3_bbb",
    }
    assert rocks.view(4).operators[0].name == "transformWithStateInPandasExec"
    assert rocks.checkpoint.validate(4) == []


def test_missing_schema_file_and_stale_absolute_path(rocks: Ckpt) -> None:
    rocks.batches(1).rocksdb_zip(1)
    rocks.put("state/0/_metadata/v2/0", tws_metadata("file:" + str(rocks.root), "0_aaa"))
    assert "names state schema file" in error_of(rocks)
    rocks.put("state/0/_stateSchema/default/0_aaa", b"s0")
    rocks.put("state/0/_metadata/v2/0", tws_metadata("file:/elsewhere/ckpt", "0_aaa"))
    assert rocks.view().batch_id == 0  # restorable: the restore relocates the path
    assert "in another location than this checkpoint" in rocks.checkpoint.validate()[0]


def test_relocate_rewrites_only_schema_paths() -> None:
    data = tws_metadata("file:/old/ckpt", "0_aaa").encode()
    moved = relocate("state/0/_metadata/v2/0", data, "s3a://bucket/jobs/x/")
    meta = json.loads(moved.decode().split("\n", 1)[1])
    assert moved.startswith(b"v2\n")
    assert meta["stateStoreInfo"][0]["stateSchemaFilePaths"] == [
        "s3a://bucket/jobs/x/state/0/_stateSchema/default/0_aaa"
    ]
    assert meta["operatorPropertiesJson"] == '{"timeMode":"NoTime"}'
    assert relocate("offsets/3", b"v1\n{}", "file:/new") == b"v1\n{}"
    assert schema_key("hdfs://nn:8020/a/b/state/12/_stateSchema/default/7_x") == "state/12/_stateSchema/default/7_x"
    assert schema_key("file:/a/b/other") is None


# ---- file formats ----------------------------------------------------------------------------


def test_lz4_stream_problems() -> None:
    good = lz4_stream()
    assert lz4_stream_problem(good) is None
    assert lz4_stream_problem(good + good) is None  # lz4-java reads concatenated streams
    assert lz4_stream_problem(b"") == "the file is empty"
    assert lz4_stream_problem(good[:-21]) == "truncated: no LZ4 end mark (the writer never closed the file)"
    assert lz4_stream_problem(good[:25]) == "truncated: the LZ4 block at byte 0 needs 9 bytes"
    assert lz4_stream_problem(b"x" * 30) == "corrupt: no valid LZ4Block header at byte 0"


def test_zip_and_sst_problems() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("metadata", "v1\n{}")
    assert zip_problem(buf.getvalue(), deep=True) is None
    assert "not a complete zip file" in (zip_problem(buf.getvalue()[:-5]) or "")
    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("CURRENT", "x")
    assert zip_problem(other.getvalue()) == "the zip has no 'metadata' entry"
    assert sst_problem(sst()) is None
    assert sst_problem(sst()[:-1]) == "truncated or corrupt: the SST footer magic number is missing"


def test_verify_file_by_kind() -> None:
    assert verify_file("state/0/1/4.delta", lz4_stream()) is None
    assert verify_file("state/0/1/4.changelog", lz4_stream()[:-1]) is not None
    assert verify_file("state/0/1/4.snapshot", b"zstd frame", codec="zstd") is None  # not checked
    assert (
        verify_file("offsets/4", b'v1\n{"conf":{}}\n{"logOffset":')
        == "corrupt: line 3 is not valid JSON (file truncated?)"
    )
    assert verify_file("commits/4", b"v1\n{}") is None
    assert verify_file("metadata", b'{"id":"x"}') is None
    assert verify_file("state/0/0/SSTs/1-u.sst", b"\x00" * 20) is not None
    assert verify_file("state/0/0/_metadata/schema", b"\x00\x02v2") is None


def test_parse_offsets_log_v2_and_void_offsets() -> None:
    entry = parse_log_entry(b'v2\n{"batchWatermarkMs":5}\n0:{"logOffset":3}\nkafka:-', kind="offsets")
    assert (entry.version, entry.source_ids, entry.offsets) == (2, ["0", "kafka"], ['{"logOffset":3}', None])
    assert parse_log_entry(b"v1", kind="commits").metadata == {}
    with pytest.raises(ValueError, match="expected a version such as 'v1'"):
        parse_log_entry(b"{}\n{}", kind="commits")


def test_state_operator_json_round_trip() -> None:
    op = StateOperator(3, "symmetricHashJoin", 4, ("left-keyToNumValues", "right-keyToNumValues"), "rocksdb", True)
    assert StateOperator.from_json(json.loads(json.dumps(op.to_json()))) == op
