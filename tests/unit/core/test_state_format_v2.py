"""core/snapshots/ckptfiles.py: reading state checkpoint format v2 (issue 45) from files Spark 4.3 wrote
(tests/fixtures/state-v2: a RocksDB aggregation with changelog checkpointing and checkpointFormatVersion=2, 2
partitions, 9 batches: ``commit-5`` is its commits/5, the changelog is partition 0's version 6)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.snapshots.ckptfiles import changelog_lineage, lz4_stream_head

FIXTURES = Path(__file__).parents[2] / "fixtures" / "state-v2"
CHANGELOG = FIXTURES / "6_b6e3ba96-a66a-419e-bef4-1493c2479095.changelog"


def block(method: int, body: bytes, original: int) -> bytes:
    """One lz4-java LZ4Block block (its checksum is not checked here)."""
    return b"LZ4Block" + bytes([method | 0x05]) + struct.pack("<iii", len(body), original, 0) + body


END = b"LZ4Block" + bytes([0x15]) + struct.pack("<iii", 0, 0, 0)


def test_the_commit_of_batch_n_names_the_unique_ids_of_state_version_n_plus_1() -> None:
    version, body = (FIXTURES / "commit-5").read_text().split("\n", 1)
    ids = json.loads(body)["stateUniqueIds"]
    assert version == "v2" and list(ids) == ["0"] and [len(p) for p in ids["0"]] == [1, 1]
    assert ids["0"][0] == [CHANGELOG.name.split("_", 1)[1].removesuffix(".changelog")]  # 6_<id>: version 5 + 1


def test_a_v2_changelog_starts_with_its_lineage_back_to_the_first_version() -> None:
    assert changelog_lineage(CHANGELOG.read_bytes()) == [
        (1, "c723370b-5edf-40f3-a192-2086786c6b59"), (2, "89d2b06a-58d2-4f09-9bff-dfd35415dd58"),
        (3, "01c8c3b1-6808-4703-8290-1bff8b63aab1"), (4, "7dce31b5-bec3-48bf-9411-0b42ae398b98"),
        (5, "e6438e62-dcbd-4773-b391-16a062decc8b")]


def test_lz4_blocks_raw_and_compressed_decode_with_overlapping_matches() -> None:
    # "ab" then a match 2 back of 6 bytes (it overlaps what it writes): "abababab"; then a raw block.
    stream = block(0x20, b"\x22ab\x02\x00", 8) + block(0x10, b"xyz", 3) + END
    assert lz4_stream_head(stream, 100) == b"abababab" + b"xyz"
    assert lz4_stream_head(stream, 5) == b"ababa"
    # Lengths of 15 and more go on in the bytes after the token: 20 literals, then a match of 4 + 15 + 1 = 20.
    long = block(0x20, b"\xff\x05" + bytes(range(20)) + b"\x14\x00\x01", 40)
    assert lz4_stream_head(long + END, 100) == bytes(range(20)) * 2


def test_a_changelog_without_a_lineage_is_format_v1() -> None:
    record = struct.pack(">i", 5) + b"key01" + struct.pack(">i", 3) + b"val"  # a v1 changelog's first record
    assert changelog_lineage(block(0x10, record, len(record)) + END) is None


@pytest.mark.parametrize(("data", "found"), [
    (b"NOTLZ4" + bytes(30), "no LZ4Block header at byte 0"),
    (block(0x20, b"\x22ab\x05\x00", 8) + END, "an LZ4 match reaches 5 bytes back from byte 2"),
    (block(0x20, b"\x22ab\x02\x00", 9) + END, "an LZ4 block decoded to 8 bytes, its header says 9"),
    (block(0x10, b"\x00\x02v3\x00\x10[{\"version\":", 17) + END, "the changelog's header string at byte 4 is cut"),
])
def test_a_broken_stream_or_header_is_refused_saying_where(data: bytes, found: str) -> None:
    with pytest.raises(ValueError, match=found):
        changelog_lineage(data)
