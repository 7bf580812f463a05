"""Small checkpoint files inline in the manifest (core/snapshots/manifest.py INLINE_MAX): no object of their own,
never taken for a stored object by a later snapshot or gc, restored and verified byte for byte."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError
from airflow_ckpt_provider.core.policy.settings import INLINE_MAX, INLINE_TOTAL_MAX, RuntimeSettings
from airflow_ckpt_provider.core.records.generation import Generation, write_generation
from airflow_ckpt_provider.core.snapshots import snapshotwrite
from airflow_ckpt_provider.core.snapshots.catalog import (
    create_snapshot,
    dispose_snapshot,
    load_manifest,
    verify_snapshot,
)
from airflow_ckpt_provider.core.snapshots.checkpoint import CheckpointFile
from airflow_ckpt_provider.core.snapshots.gc import collect_garbage
from airflow_ckpt_provider.core.snapshots.manifest import Manifest, _checksum
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots.snapshotwrite import _inline_candidates, forget_objects
from airflow_ckpt_provider.core.store.jobstore import OBJECTS, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support.ckptfactory import make_checkpoint, write_batch


@pytest.fixture(autouse=True)
def _no_cached_lists() -> None:
    forget_objects()


def objects(store: JobStore) -> set[str]:
    return {o.key[len(OBJECTS):] for o in store.storage.list(OBJECTS)}


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_small_files_go_into_the_manifest_and_a_large_one_is_an_object(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    write_batch(ckpt, 2, payload=INLINE_MAX + 1000)  # offsets/2 above the threshold
    result = create_snapshot(store, LocalStorage(ckpt))
    m = result.manifest
    inline = sorted(f.path for f in m.files if f.inline)
    stored = sorted(f.path for f in m.stored_files)
    assert stored == ["offsets/2"] and inline and "offsets/2" not in inline, (inline, stored)
    assert objects(store) == {f.sha256 for f in m.stored_files}  # one object: the inline files have none
    assert (result.stats.files, result.stats.bytes) == (len(m.files), m.total_bytes)  # inline content is sent too
    raw = json.loads(store.storage.read(store.manifest_key(m.snapshot_id)))
    assert raw["format"] == 2 and sum(len(e) == 4 for e in raw["files"]) == len(inline)
    assert m.summary()["inline_files"] == len(inline) and m.summary()["inline_bytes"] == m.inline_bytes

    restored = tmp_path / "restored"
    restore_snapshot(store, m.snapshot_id, LocalStorage(restored))
    assert tree(restored) == {k: v for k, v in tree(ckpt).items() if k in {f.path for f in m.files}}
    report = verify_snapshot(store, m.snapshot_id)
    assert report.ok and report.files == len(m.files) and report.bytes_checked == m.total_bytes


def test_an_inline_file_is_never_taken_for_a_stored_object_by_a_later_snapshot(store: JobStore,
                                                                               tmp_path: Path) -> None:
    """The data-loss guard: the same content snapshotted again without inlining must be uploaded, since the first
    snapshot stored no object for it; gc after the first snapshot is disposed keeps what the second references."""
    ckpt = make_checkpoint(tmp_path / "ckpt", 3)
    first = create_snapshot(store, LocalStorage(ckpt)).manifest
    assert first.files and all(f.inline for f in first.files) and objects(store) == set()
    second = create_snapshot(store, LocalStorage(ckpt), inline_max=0)  # same process: its known list is kept
    assert second.stats.skipped_files == 0 and second.stats.files == len(second.manifest.files)
    assert objects(store) == {f.sha256 for f in second.manifest.files}
    dispose_snapshot(store, first.snapshot_id, force=True)
    assert collect_garbage(store, min_age_s=0).deleted_objects == 0
    assert verify_snapshot(store, second.manifest.snapshot_id).ok


def test_a_gc_that_deleted_objects_during_the_uploads_makes_the_writer_store_objects_again_but_no_inline_file(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The writer's repair after gc renewed the generation token mid-snapshot (_store_again) stores what is missing as
    objects: the large file, never an inline one (which has no object), and counts each file once."""
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    write_batch(ckpt, 2, payload=INLINE_MAX + 1)
    reads, uploaded = [], threading.Event()
    real_read = snapshotwrite.read_generation

    def gc_renews_between_the_reads(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        if len(reads) == 2:  # the handshake's read, once the uploads are done: a gc deleted them meanwhile
            assert uploaded.wait(30)
            store.storage.delete([o.key for o in store.storage.list(OBJECTS)])
            write_generation(store, Generation.new(held=False))
        return real_read(*args, **kwargs)

    monkeypatch.setattr(snapshotwrite, "read_generation", gc_renews_between_the_reads)
    caplog.set_level(logging.INFO, logger=snapshotwrite.__name__)
    result = create_snapshot(store, LocalStorage(ckpt), on_step=lambda step: step == "uploaded" and uploaded.set())
    assert len(reads) == 2 and "listed the objects again: 1 of 1 objects missing" in caplog.text
    m = result.manifest
    assert [f.path for f in m.stored_files] == ["offsets/2"] and len(m.files) > 1
    assert objects(store) == {f.sha256 for f in m.stored_files}
    resent = m.stored_files[0].size  # the large file went twice; its bytes count twice, the file once
    assert (result.stats.files, result.stats.bytes, result.stats.skipped_files) == (
        len(m.files), m.total_bytes + resent, 0)
    assert verify_snapshot(store, m.snapshot_id).ok


def test_gc_deletes_nothing_for_inline_files_and_keeps_no_object_for_them(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    write_batch(ckpt, 2, payload=INLINE_MAX + 1)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest
    store.storage.write(store.object_key("e" * 64), b"orphan")
    result = collect_garbage(store, min_age_s=0)
    assert (result.deleted_objects, result.kept_objects) == (1, 1)
    assert objects(store) == {f.sha256 for f in m.stored_files}
    restore_snapshot(store, m.snapshot_id, LocalStorage(tmp_path / "restored"))
    assert (tmp_path / "restored" / "metadata").read_bytes() == (ckpt / "metadata").read_bytes()


def test_a_manifest_without_inline_files_is_format_1_and_either_format_reads(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt), inline_max=0).manifest
    raw = store.storage.read(store.manifest_key(m.snapshot_id))
    assert json.loads(raw)["format"] == 1  # readable by the versions before inline files
    assert Manifest.from_bytes(raw, "here") == m


def _tampered(store: JobStore, snapshot_id: str, edit: Callable[[dict[str, Any]], object]) -> bytes:
    body = json.loads(store.storage.read(store.manifest_key(snapshot_id)))
    body.pop("checksum")
    edit(body)
    body["checksum"] = _checksum(body)  # a consistent checksum: only the entry's own check can tell
    return json.dumps(body).encode()


def test_inline_content_that_does_not_match_its_digest_or_a_format_1_inline_entry_is_corrupt(
        store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    m = create_snapshot(store, LocalStorage(ckpt)).manifest

    def flip(body: dict[str, Any]) -> None:
        entry = body["files"][0]
        data = bytearray(base64.b64decode(entry[3]))
        data[0] ^= 1
        entry[3] = base64.b64encode(bytes(data)).decode()

    with pytest.raises(SnapshotError, match=r"corrupt .*inline content of .* has \d+ bytes and SHA-256 [0-9a-f]{64}, "
                       r"its entry says \d+ bytes and [0-9a-f]{64}"):
        Manifest.from_bytes(_tampered(store, m.snapshot_id, flip), "tampered")
    with pytest.raises(SnapshotError, match=r"corrupt .*inline content of .* is not base64"):
        Manifest.from_bytes(_tampered(store, m.snapshot_id, lambda b: b["files"][0].__setitem__(3, "!!")), "bad")
    with pytest.raises(SnapshotError, match=r"corrupt .*has inline content, which needs format 2"):
        Manifest.from_bytes(_tampered(store, m.snapshot_id, lambda b: b.__setitem__("format", 1)), "format 1")
    with pytest.raises(SnapshotError, match=r"has format 3, this version reads formats 1, 2; upgrade"):
        Manifest.from_bytes(_tampered(store, m.snapshot_id, lambda b: b.__setitem__("format", 3)), "future")
    assert load_manifest(store, m.snapshot_id) == m


def test_inline_candidates_are_the_smallest_files_within_the_threshold_and_the_manifest_total() -> None:
    files = [CheckpointFile(f"state/0/{i}/{i}.zip", size) for i, size in enumerate([
        INLINE_MAX, INLINE_MAX + 1, 10, 0, 5000] + [INLINE_MAX] * 10)]
    chosen = _inline_candidates(files, INLINE_MAX)
    sizes = sorted(f.size for f in files if f.path in chosen)
    assert INLINE_MAX + 1 not in sizes and sizes[:3] == [0, 10, 5000]
    assert sum(sizes) <= INLINE_TOTAL_MAX < sum(sizes) + INLINE_MAX  # filled up to the total, smallest first
    assert _inline_candidates(files, 0) == set()
    assert _inline_candidates(files, 100) == {files[2].path, files[3].path}


@pytest.mark.parametrize("value", [-1, INLINE_TOTAL_MAX + 1])
def test_an_inline_threshold_outside_0_to_the_manifest_total_is_refused(value: int) -> None:
    with pytest.raises(ConfigError, match=rf"snapshot_inline_bytes must be from 0 .* found {value}"):
        RuntimeSettings(snapshot_inline_bytes=value)


def test_a_restore_of_the_latest_is_refused_when_a_newer_version_wrote_the_newest_snapshot(
        store: JobStore, tmp_path: Path) -> None:
    """After a downgrade, a manifest of a format this version cannot read must not make "the latest" an older
    snapshot: listings skip it with a warning, gc defers, a restore of latest-* is refused, a named one works unless
    going back in time is refused (--time-travel refuse)."""
    from airflow_ckpt_provider.core.policy.modes import RestoreSpec
    from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
    from airflow_ckpt_provider.core.snapshots.manifest import NewerFormatError
    from airflow_ckpt_provider.runtime.startup import StartAction, TimeTravel, check_named_restore, plan_start

    older = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "a", 2))).manifest
    newer = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "b", 3))).manifest
    store.storage.write(store.manifest_key(newer.snapshot_id),
                        _tampered(store, newer.snapshot_id, lambda b: b.__setitem__("format", 3)))
    assert list_snapshots(store) == [older]  # a listing for people: the newer one skipped, with a warning
    with pytest.raises(NewerFormatError, match=r"has format 3, this version reads formats 1, 2"):
        list_snapshots(store, refuse_newer=True)
    with pytest.raises(SnapshotError, match=r"has format 3"):
        list_snapshots(store, strict=True)  # gc defers
    live = LocalStorage(tmp_path / "live")
    for latest in ("latest-state", "latest-savepoint"):
        with pytest.raises(SnapshotError, match=rf"job orders: restore {latest} refused: manifest .* has format 3, .*"
                                                r"silently go back in time: upgrade airflow-ckpt-provider"):
            plan_start(store, live, RestoreSpec.parse(latest))
    plan, _ = plan_start(store, live, RestoreSpec.parse(older.snapshot_id))  # named: the user chose it
    assert plan.action is StartAction.RESTORE and plan.snapshot == older
    # ... unless going back in time is refused: the newer snapshot's batch cannot be read, so it cannot be ruled out
    for refused in (lambda: plan_start(store, live, RestoreSpec.parse(older.snapshot_id), TimeTravel.REFUSE),
                    lambda: check_named_restore(store, RestoreSpec.parse(older.snapshot_id), TimeTravel.REFUSE)):
        with pytest.raises(ConfigError, match=rf"restoring {older.snapshot_id} under --time-travel refuse: expected "
                                              r"every snapshot of job orders readable, .* found manifest .* has format "
                                              r"3, .*Nothing was changed .* or allow going back in time with "
                                              r"--time-travel fork"):
            refused()
    assert not (tmp_path / "live").exists()
    # Not a number above the formats read: corrupt, not newer; skipped as before.
    store.storage.write(store.manifest_key(newer.snapshot_id),
                        _tampered(store, newer.snapshot_id, lambda b: b.__setitem__("format", "3")))
    assert list_snapshots(store, refuse_newer=True) == [older]
