"""A ckpt-files sink's records as the release before the typed records (1441567) wrote them, read and written by
this one: a commit manifest (version 2, timeline 1) and its timeline record (tests/unit/data/sink-1441567/, written
by tests/unit/data/gen_sink_1441567.py with that release's code), and a version-1 manifest (no timeline)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.sinks.filelayout import (
    BatchManifest,
    DataFile,
    manifest_key,
    read_manifest,
    read_timelines,
    timeline_key,
)
from airflow_ckpt_provider.sinks.timelines import TimelineRecord

RELEASE_SINK = Path(__file__).parents[1] / "data" / "sink-1441567"
SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}


def _release() -> LocalStorage:
    return LocalStorage(RELEASE_SINK)


def test_the_release_before_commit_manifest_is_read_with_every_field() -> None:
    m = read_manifest(_release(), manifest_key("q1", 3, 1))
    assert m is not None
    assert (m.job, m.query_id, m.batch_id, m.timeline, m.coverage, m.previous) == ("orders", "q1", 3, 1, "c3", "c2")
    assert m.files == (DataFile("data/q1/00000000000000000003/part-00000-a1-0.parquet", 812, "ab" * 32, 7, 0),)
    assert (m.rows, m.total_bytes, m.spark_schema, m.arrow_schema) == (7, 812, SCHEMA, "ff00")
    assert (m.committed_at, m.offsets) == ("2026-11-27T10:15:00.000+00:00", ['{"orders":{"0":30}}'])


def test_a_commit_manifest_is_written_in_the_release_before_shape(tmp_path: Path) -> None:
    """Readers of the release before read what this one writes: the same keys and values, and the epoch they do
    not know (their reader takes the keys it knows; ``version`` was already there)."""
    key = manifest_key("q1", 3, 1)
    m = read_manifest(_release(), key)
    assert m is not None
    written = json.loads(m.to_bytes())
    assert written == json.loads(_release().read(key)) | {"epoch": None}
    assert BatchManifest.from_bytes(m.to_bytes(), "x") == m


def test_a_version_1_manifest_is_of_timeline_0_without_coverage() -> None:
    body = json.loads(_release().read(manifest_key("q1", 3, 1)))
    for newer in ("timeline", "coverage", "previous", "offsets"):
        del body[newer]
    m = BatchManifest.from_bytes(json.dumps(body | {"version": 1}).encode(), "x")
    assert (m.timeline, m.coverage, m.previous, m.key) == (0, None, None, manifest_key("q1", 3))


def test_a_manifest_of_a_newer_version_or_broken_says_what_it_found() -> None:
    body = json.loads(_release().read(manifest_key("q1", 3, 1)))
    with pytest.raises(StorageError, match=r"ckpt-files commit manifest x was written with version 3, this release "
                                           r"reads up to 2: upgrade airflow-ckpt-provider"):
        BatchManifest.from_bytes(json.dumps(body | {"version": 3}).encode(), "x")
    with pytest.raises(StorageError, match=r"ckpt-files commit manifest x is not valid: Expected `int`, got `str` - "
                                           r"at `\$.batch_id`"):
        BatchManifest.from_bytes(json.dumps(body | {"batch_id": "third"}).encode(), "x")


def test_the_release_before_timeline_record_is_read_and_written_back(tmp_path: Path) -> None:
    records = read_timelines(_release(), "q1")
    assert records == [TimelineRecord("q1", 1, 0, 3, "c3", "2026-11-27T10:14:59.000+00:00", (3, 4),
                                      "restored savepoint-2")]
    shutil.copytree(RELEASE_SINK, tmp_path / "sink")
    sink = LocalStorage(tmp_path / "sink")
    sink.write(timeline_key("q1", 2), TimelineRecord("q1", 2, 1, 5, "c5", "2026-11-27T11:00:00.000+00:00").to_bytes())
    assert [r.timeline for r in read_timelines(sink, "q1")] == [1, 2]
    assert json.loads(sink.read(timeline_key("q1", 2)))["abandoned"] == []
