"""`ckpt snapshot verify|restore|show` against a local job store: exit codes and snapshot references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.manifest import Manifest
from airflow_ckpt_provider.core.snapshots import create_snapshot
from airflow_ckpt_provider.core.storage import LocalStorage
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
    manifest.write_bytes(manifest.read_bytes().replace(b'"batch_id": 2', b'"batch_id": 1'))
    capsys.readouterr()
    assert cli.main([*base, m.snapshot_id]) == cli.EXIT_VERIFY_FAILED == 3
    out = capsys.readouterr().out
    assert out.startswith(f"snapshot {m.snapshot_id}: 1 problems\nmanifest {manifest.as_uri()} is corrupt "
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
