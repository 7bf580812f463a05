"""The snapshot manifest on the record base: the manifests of the release before read, what this one writes read
by the rules of the release before (format, checksum, entries), checks on the whole manifest at once that refuse
what the entry-by-entry reading refuses, with its words."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import SnapshotError
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import (
    FORMAT_VERSION,
    Kind,
    Manifest,
    ManifestFile,
    NewerFormatError,
    Trigger,
    _checksum,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage

#: A job store of the release before the typed records (1441567): its manifests as its Manifest.to_bytes wrote
#: them (indented, no schema key): a format 1 checkpoint without inline files, a format 2 savepoint with two
#: inline files and a label that is not ASCII (the checksum is of json.dumps's \u escapes).
RELEASE_STORE = Path(__file__).parents[1] / "data" / "store-1441567"
OPERATORS = [{"operator_id": 0, "name": "stateStoreSave", "partitions": 4, "store_names": ["default"],
              "provider": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
              "changelog": True}]


def _file(path: str, content: bytes, inline: bool) -> ManifestFile:
    return ManifestFile(path, len(content), hashlib.sha256(content).hexdigest(), content if inline else None)


def _manifest(**changes: Any) -> Manifest:
    files = (_file("commits/7", b"v1\n{}", True), _file("state/0/0/8.zip", bytes(range(256)) * 4, False))
    fields: dict[str, Any] = {
        "job": "orders", "snapshot_id": "savepoint-7-20261127T101500Z-0a1b2c", "kind": Kind.SAVEPOINT,
        "trigger": Trigger.MANUAL, "batch_id": 7, "created_at": "2026-11-27T10:15:00.500+00:00", "query_id": "q",
        "checkpoint": "s3a://ckpt/live", "files": files, "offsets": ['{"orders":{"0":70}}'], "operators": OPERATORS,
        "labels": {"epoch": "2"}}
    return Manifest(**(fields | changes))


def _old_rules(data: bytes) -> dict[str, Any]:
    """What the release before checks before it trusts a manifest (its Manifest.from_bytes): the format by
    whether a file is inline, the checksum of json.dumps(sort_keys, compact) of every other key, the entries."""
    body: dict[str, Any] = json.loads(data)
    assert body["format"] == (2 if any(len(e) == 4 for e in body["files"]) else 1)
    assert body.pop("checksum") == _checksum(body)
    for entry in body["files"]:
        assert len(entry) in (3, 4) and len(entry[2]) == 64
        if len(entry) == 4:
            assert hashlib.sha256(base64.b64decode(entry[3], validate=True)).hexdigest() == entry[2]
    for key in ("job", "snapshot_id", "kind", "trigger", "batch_id", "created_at", "query_id", "checkpoint",
                "offsets", "next_offsets", "operators", "conf", "code_version", "spark_version", "labels"):
        assert key in body
    assert body["total_bytes"] == sum(e[1] for e in body["files"])
    return body


def test_the_manifests_of_the_release_before_typed_records_are_read() -> None:
    store = JobStore(LocalStorage(RELEASE_STORE), "orders")
    one, two = list_snapshots(store, strict=True)
    assert (one.snapshot_id, one.kind, one.trigger, one.batch_id) == (
        "checkpoint-5-20261127T080000Z-1a2b3c", Kind.CHECKPOINT, Trigger.PERIODIC, 5)
    assert one.written_schema() == 1 and not any(f.inline for f in one.files)
    assert [(f.path, f.size) for f in one.files] == [
        ("commits/5", 5), ("offsets/5", 45), ("state/0/0/6.changelog", 768)]
    assert one.files[2].sha256 == hashlib.sha256(bytes(range(256)) * 3).hexdigest()
    assert (one.offsets, one.next_offsets, one.operators) == (['{"orders":{"0":50}}'], None, OPERATORS)
    assert (one.conf, one.code_version, one.spark_version, one.labels) == (
        {"spark.sql.shuffle.partitions": "4"}, "v1", "4.0.1", {})
    assert (two.snapshot_id, two.kind, two.trigger, two.written_schema()) == (
        "savepoint-7-20261127T101500Z-0a1b2c", Kind.SAVEPOINT, Trigger.UPGRADE, 2)
    assert [(f.path, f.data) for f in two.files if f.inline] == [
        ("commits/7", b'v1\n{"nextBatchWatermarkMs":0}'), ("metadata", b'{"id":"8d916c80"}')]
    assert [f.path for f in two.stored_files] == ["state/0/0/8.zip"]
    assert (two.next_offsets, two.labels) == (['{"orders":{"0":75}}'], {"epoch": "2", "owner": "zo\u00eb"})
    assert (two.total_bytes, two.inline_bytes) == (29 + 17 + 25600, 29 + 17)
    for m in (one, two):  # written again by this release: the same manifest, the same JSON values
        assert Manifest.from_bytes(m.to_bytes(), "again") == m == load_manifest(store, m.snapshot_id)
        old = json.loads((RELEASE_STORE / "orders" / store.manifest_key(m.snapshot_id)).read_bytes())
        assert json.loads(m.to_bytes()) == old


@pytest.mark.parametrize("changes", [
    {},
    {"files": (_file("offsets/7", b"x", False),)},  # format 1
    {"labels": {"owner": "zo\u00eb", "del": "\x7f", "ctl": "\x01\n\t\""}},  # json.dumps escapes these its way
    {"operators": [{"operator_id": 0, "ratio": 1e-05, "big": 1e16, "nan": None}]},  # floats: json.dumps's repr
    {"files": ()},
])
def test_what_this_release_writes_the_release_before_reads(changes: dict[str, Any]) -> None:
    m = _manifest(**changes)
    data = m.to_bytes()
    body = _old_rules(data)
    assert body["format"] == m.written_schema() and "schema" not in body
    assert Manifest.from_bytes(data, "x") == m
    assert m.schema == FORMAT_VERSION  # in memory a manifest is of the format this release writes at most


def test_written_compact_with_sorted_keys_and_the_checksum_last() -> None:
    data = _manifest().to_bytes()
    assert b"\n" not in data and b": " not in data
    keys = list(json.loads(data))
    assert keys[-1] == "checksum" and keys[:-1] == sorted(keys[:-1])


def test_keys_of_a_newer_release_are_ignored_and_covered_by_the_checksum() -> None:
    body = json.loads(_manifest().to_bytes())
    body.pop("checksum")
    body["added_later"] = {"x": [1, 2.5]}
    body["checksum"] = _checksum(body)
    assert Manifest.from_bytes(json.dumps(body).encode(), "x") == _manifest()
    body["added_later"] = "changed"  # now the checksum does not match
    with pytest.raises(SnapshotError, match=r"manifest x is corrupt \(its checksum does not match its content\); "
                                            r"the snapshot cannot be trusted: restore another snapshot"):
        Manifest.from_bytes(json.dumps(body).encode(), "x")


def _resigned(edit: Any) -> bytes:
    body = json.loads(_manifest().to_bytes())
    body.pop("checksum")
    edit(body)
    body["checksum"] = _checksum(body)
    return json.dumps(body).encode()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b["files"][1].__setitem__(2, "G" * 64), r"'G{64}' is not a SHA-256 hex digest"),
    (lambda b: b["files"][1].__setitem__(2, "ab"), r"'ab' is not a SHA-256 hex digest"),
    (lambda b: b["files"][1].__setitem__(0, "../escape"), r"invalid storage key '../escape'"),
    (lambda b: b["files"][1].__setitem__(0, "a//b"), r"invalid storage key 'a//b'"),
    (lambda b: b["files"][0].__setitem__(1, 3), r"inline content of commits/7 has 5 bytes and SHA-256"),
    (lambda b: b["files"].append(["x"]), r"file entry \"\['x'\]\" is not \[path, size, sha256\]"),
    (lambda b: b.__setitem__("kind", "snapshot"), r"'snapshot' is not a valid Kind|Invalid enum value 'snapshot'"),
    (lambda b: b.pop("job"), r"'job'\)"),
    (lambda b: b.__setitem__("batch_id", "7"), r"Expected `int`, got `str` - at `\$.batch_id`"),
])
def test_a_manifest_checked_at_once_is_refused_for_what_the_entry_by_entry_reading_names(
        edit: Any, message: str) -> None:
    with pytest.raises(SnapshotError, match=r"manifest f is corrupt \(.*" + message):
        Manifest.from_bytes(_resigned(edit), "f")


@pytest.mark.parametrize(("data", "error", "message"), [
    (b"{not json", SnapshotError, r"manifest f is corrupt \(Expecting property name"),
    (b"[]", SnapshotError, r"manifest f is corrupt \(not a JSON object\)"),
    (b'{"job": "orders"}', SnapshotError, r"manifest f has format None, this version reads formats 1, 2; upgrade"),
    (b'{"format": 3}', NewerFormatError, r"manifest f has format 3, this version reads formats 1, 2; upgrade"),
])
def test_what_is_not_a_manifest_of_a_known_format_says_so(data: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Manifest.from_bytes(data, "f")


def test_a_file_entry_shows_no_content() -> None:
    assert repr(_file("m", b"secret", True)) == (
        f"ManifestFile(path='m', size=6, sha256='{hashlib.sha256(b'secret').hexdigest()}', inline)")
