"""`ckpt snapshot verify|restore|show` against a local job store: exit codes and snapshot references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Manifest
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support.ckptfactory import make_checkpoint


@pytest.fixture
def snapshot(tmp_path: Path) -> tuple[Path, Manifest]:
    """A local job store root ``tmp/jobs`` holding one savepoint of job ``orders`` at batch 2."""
    root = tmp_path / "jobs"
    store = JobStore(LocalStorage(root), "orders")
    return root, create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "ckpt", 3))).manifest


def test_snapshot_verify_exits_3_on_a_corrupt_manifest_as_documented(
    snapshot: tuple[Path, Manifest], capsys: pytest.CaptureFixture[str]
) -> None:
    root, m = snapshot
    base = ["snapshot", "verify", "--store", str(root), "--job", "orders"]
    assert cli.main([*base, m.snapshot_id]) == 0
    manifest = root / "orders" / "snapshots" / m.snapshot_id / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"batch_id":2', b'"batch_id":1'))
    capsys.readouterr()
    assert cli.main([*base, m.snapshot_id]) == cli.EXIT_VERIFY_FAILED == 3
    out = capsys.readouterr().out
    assert out.startswith(f"snapshot {m.snapshot_id}: 1 problem\nmanifest {manifest.as_uri()} is corrupt "
                          "(its checksum does not match its content)")
    assert cli.main([*base, m.snapshot_id, "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert (data["ok"], data["files"], len(data["problems"])) == (False, 0, 1)
    # a snapshot that does not exist is an error (1), not a problem found
    assert cli.main([*base, "savepoint-9-20261122T000000Z-abcdef"]) == 1
    assert "not found in job store" in capsys.readouterr().err


def _restore(root_or_ref: str, target: Path, *extra: str) -> int:
    return cli.main(["snapshot", "restore", root_or_ref, "--target", str(target), "--json", *extra])


@pytest.mark.parametrize("form", ["relative", "dot-segments", "trailing-manifest", "file-uri", "bare-relative"])
def test_snapshot_restore_normalises_paths_and_uris_naming_job_snapshots_id(
    snapshot: tuple[Path, Manifest], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    root, m = snapshot
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work if form != "bare-relative" else root)
    monkeypatch.delenv("CKPT_STORE", raising=False)
    monkeypatch.delenv("CKPT_JOB", raising=False)
    ref = {
        "relative": f"../../jobs/orders/snapshots/{m.snapshot_id}",
        "dot-segments": f"./../../jobs/./x/../orders/snapshots/{m.snapshot_id}/",
        "trailing-manifest": f"../../jobs/orders/snapshots/{m.snapshot_id}/manifest.json",
        "file-uri": f"file://{root}/../jobs/orders/snapshots/{m.snapshot_id}",
        "bare-relative": f"orders/snapshots/{m.snapshot_id}",
    }[form]
    target = tmp_path / "restored"
    assert _restore(ref, target) == 0, capsys.readouterr().err
    d = json.loads(capsys.readouterr().out)
    assert (d["snapshot_id"], d["resume_batch"]) == (m.snapshot_id, 3)
    assert (target / "commits" / "2").is_file()
    assert os.path.isdir(target / "offsets")


def test_snapshot_reference_that_names_no_job_store_fails_with_expected_found_and_what_to_do(
    snapshot: tuple[Path, Manifest], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, m = snapshot
    missing = tmp_path / "nowhere" / "orders" / "snapshots" / m.snapshot_id
    assert _restore(str(missing), tmp_path / "t") == 1  # --json: the error as JSON on stdout
    assert json.loads(capsys.readouterr().out) == {"error": {"type": "ConfigError", "exit_code": 1, "message": (
        f"snapshot reference {missing} is a local path, and the job store directory it names, "
        f"{tmp_path / 'nowhere' / 'orders'}, does not exist: expected ROOT/JOB/snapshots/ID with ROOT/JOB a job "
        "store directory; pass the URI `ckpt snapshot create` printed (e.g. s3://BUCKET/PREFIX/JOB/snapshots/ID), "
        "or the id with --store and --job")}}
    assert cli.main(["snapshot", "show", f"s3://orders/snapshots/{m.snapshot_id}"]) == 1
    assert capsys.readouterr().err == (
        f"error: snapshot reference s3://orders/snapshots/{m.snapshot_id} names no job store: expected "
        f"ROOT/JOB/snapshots/ID (e.g. s3://BUCKET/PREFIX/JOB/snapshots/ID or a directory), found no ROOT before "
        "job 'orders'; pass the full URI `ckpt snapshot create` printed, or the id with --store and --job\n")
    assert not (tmp_path / "t").exists()


def test_gc_summary_counts_in_the_singular_and_plural_and_names_each_cleared_marker() -> None:
    from airflow_ckpt_provider.cli.snapshot import gc_summary
    from airflow_ckpt_provider.core.snapshots.gc import ClearedMarker, GcResult

    assert gc_summary(GcResult(1, 2048, 3), dry_run=False) == "deleted 1 object (2.0 KiB), kept 3"
    assert gc_summary(GcResult(0, 0, 1), dry_run=True) == "would delete 0 objects (0 B), kept 1"
    assert gc_summary(GcResult(0, 0, 0, deferred="another gc holds it"), dry_run=False) == (
        "gc deferred: another gc holds it")
    one = ClearedMarker("savepoint-1-x", "pid 7 on host h", "the marker is 6 h 0 min old (older than 6 h 0 min)")
    two = ClearedMarker("checkpoint-2-y", "pid 8 on host h (lease epoch 3)", "cleared on request (--clear-pending)")
    assert gc_summary(GcResult(2, 10, 0, cleared_pending=(one,)), dry_run=False) == (
        "deleted 2 objects (10 B), kept 0; cleared 1 pending marker:\n"
        "  savepoint-1-x, written by pid 7 on host h: the marker is 6 h 0 min old (older than 6 h 0 min)")
    assert gc_summary(GcResult(0, 0, 0, cleared_pending=(one, two)), dry_run=True).splitlines() == [
        "would delete 0 objects (0 B), kept 0; would clear 2 pending markers:",
        "  savepoint-1-x, written by pid 7 on host h: the marker is 6 h 0 min old (older than 6 h 0 min)",
        "  checkpoint-2-y, written by pid 8 on host h (lease epoch 3): cleared on request (--clear-pending)"]
    assert GcResult(0, 0, 0, cleared_pending=(one,)).to_dict()["cleared_pending"] == [
        {"snapshot_id": "savepoint-1-x", "owner": "pid 7 on host h",
         "reason": "the marker is 6 h 0 min old (older than 6 h 0 min)"}]


@pytest.mark.parametrize(("n", "noun", "nouns", "text"), [
    (0, "problem", None, "0 problems"), (1, "problem", None, "1 problem"), (2, "problem", None, "2 problems"),
    (1, "query", "queries", "1 query"), (3, "query", "queries", "3 queries"), (1, "batch", "batches", "1 batch")])
def test_human_count(n: int, noun: str, nouns: str | None, text: str) -> None:
    from airflow_ckpt_provider.core.store.progress import human_count

    assert human_count(n, noun, nouns) == text
