"""`ckpt snapshot ...` as a user runs it: a subprocess against SeaweedFS, credentials from the env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ckpt_provider.embedded import EmbeddedS3
from tests.support.ckptfactory import make_checkpoint, write_batch

pytestmark = pytest.mark.integration


@pytest.fixture
def ckpt_env(s3_server: EmbeddedS3, bucket: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3_server.env())
    env["CKPT_STORE"] = f"s3://{bucket}/jobs"
    env["CKPT_JOB"] = "orders"
    return env


def ckpt(env: dict[str, str], *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "airflow_ckpt_provider.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == expect, proc.stderr
    return proc


def test_snapshot_commands_end_to_end(ckpt_env: dict[str, str], tmp_path: Path) -> None:
    ckpt_dir = make_checkpoint(tmp_path / "ckpt", 3)
    first = json.loads(ckpt(ckpt_env, "snapshot", "create", "--checkpoint", str(ckpt_dir), "--inline-bytes", "0",
                            "--json").stdout)  # every file an object
    assert (first["batch_id"], first["kind"], first["reused_files"]) == (2, "savepoint", 0)
    write_batch(ckpt_dir, 3)
    second = json.loads(ckpt(ckpt_env, "snapshot", "create", "--checkpoint", str(ckpt_dir), "--kind",
                             "checkpoint", "--trigger", "periodic", "--json").stdout)  # new small files inline
    assert second["batch_id"] == 3 and second["reused_files"] > 0
    assert second["uploaded_files"] + second["reused_files"] == second["files"]
    bad = ckpt(ckpt_env, "snapshot", "create", "--checkpoint", str(ckpt_dir), "--inline-bytes", "1MB", expect=2)
    assert "expected a number of bytes from 0 to 131072, found '1MB'" in bad.stderr

    listed = json.loads(ckpt(ckpt_env, "snapshot", "list", "--json").stdout)
    assert [s["snapshot_id"] for s in listed] == [first["snapshot_id"], second["snapshot_id"]]
    human = ckpt(ckpt_env, "snapshot", "list").stdout
    assert human.splitlines()[0].split() == ["ID", "KIND", "TRIGGER", "BATCH", "CREATED", "FILES", "SIZE"]
    assert first["snapshot_id"] in human

    shown = json.loads(ckpt(ckpt_env, "snapshot", "show", second["snapshot_id"], "--json", "--files").stdout)
    assert shown["batch_id"] == 3 and shown["uri"].endswith(second["snapshot_id"])
    content = {f["path"]: f["content"] for f in shown["files"]}
    assert content["offsets/3"] == "inline" and content["metadata"].startswith("objects/")
    assert content["commits/3"].startswith("objects/")  # the same bytes as commits/2, stored by the first: reused
    assert shown["inline_files"] == second["uploaded_files"] == sum(c == "inline" for c in content.values())
    assert ckpt(ckpt_env, "snapshot", "verify", second["snapshot_id"]).stdout.startswith(
        f"snapshot {second['snapshot_id']}: OK")

    target = tmp_path / "restored"
    restored = json.loads(ckpt(ckpt_env, "snapshot", "restore", first["snapshot_id"], "--target", str(target),
                               "--json").stdout)
    assert restored["resume_batch"] == 3 and (target / "commits" / "2").exists()
    foreign = ckpt(ckpt_env, "snapshot", "restore", "--job", "billing", first["uri"], "--target",
                   str(tmp_path / "other"), expect=1)
    assert "belongs to job 'orders', not to job 'billing'" in foreign.stderr
    assert not (tmp_path / "other").exists()
    by_uri = json.loads(ckpt(ckpt_env, "snapshot", "show", first["uri"], "--json").stdout)
    assert by_uri["snapshot_id"] == first["snapshot_id"]
    refused = ckpt(ckpt_env, "snapshot", "restore", first["snapshot_id"], "--target", str(target), expect=1)
    assert "already holds a Spark checkpoint" in refused.stderr and "replace" in refused.stderr

    kept = ckpt(ckpt_env, "snapshot", "dispose", first["snapshot_id"], expect=1)
    assert "newest completed savepoint" in kept.stderr
    gone = ckpt(ckpt_env, "snapshot", "dispose", first["snapshot_id"], "--force").stdout
    assert gone.startswith(f"disposed savepoint {first['snapshot_id']}")
    gc = json.loads(ckpt(ckpt_env, "snapshot", "gc", "--min-age", "0", "--json").stdout)
    assert gc["deferred"] is None and gc["cleared_pending"] == []
    assert json.loads(ckpt(ckpt_env, "snapshot", "verify", second["snapshot_id"], "--json").stdout)["ok"]


def test_errors_are_clear_and_secrets_never_printed(ckpt_env: dict[str, str], tmp_path: Path) -> None:
    missing = ckpt(ckpt_env, "snapshot", "show", "savepoint-1-20261122T000000Z-abcdef", expect=1)
    assert "not found in job store" in missing.stderr
    bad_id = ckpt(ckpt_env, "snapshot", "show", "latest", expect=1)
    assert "invalid snapshot id" in bad_id.stderr
    not_ckpt = ckpt(ckpt_env, "snapshot", "create", "--checkpoint", str(tmp_path), expect=1)
    assert "error:" in not_ckpt.stderr and "Traceback" not in not_ckpt.stderr
    wrong = dict(ckpt_env, AWS_SECRET_ACCESS_KEY="definitely-wrong")
    denied = ckpt(wrong, "snapshot", "list", expect=1)
    assert "refused the credentials" in denied.stderr
    assert "definitely-wrong" not in denied.stderr + denied.stdout
    assert ckpt_env["AWS_SECRET_ACCESS_KEY"] not in denied.stderr
    nobucket = dict(ckpt_env, CKPT_STORE="s3://no-such-bucket-x/jobs")
    assert "does not exist" in ckpt(nobucket, "snapshot", "list", expect=1).stderr
    nostore = {k: v for k, v in ckpt_env.items() if k != "CKPT_STORE"}
    assert "no job store given" in ckpt(nostore, "snapshot", "list", expect=1).stderr


def test_a_supervisor_refused_by_the_store_starts_no_driver(ckpt_env: dict[str, str], tmp_path: Path,
                                                           s3_server: EmbeddedS3, bucket: str) -> None:
    """Issue 39 (7): a wrong S3 secret is a refusal, not an outage; exit 6 at once, no driver, nothing written."""
    started = tmp_path / "spark-submit-started"
    spark_submit = tmp_path / "spark-submit"
    spark_submit.write_text(f"#!/bin/sh\ntouch {started}\n")
    spark_submit.chmod(0o755)
    job = tmp_path / "job.py"
    job.write_text("# never run\n")
    wrong = dict(ckpt_env, AWS_SECRET_ACCESS_KEY="definitely-wrong")
    run = ckpt(wrong, "run", str(job), "--checkpoint", str(tmp_path / "ckpt"), "--supervise",
               "--spark-submit", str(spark_submit), expect=6)
    assert "the job store refused the supervisor's credentials" in run.stderr, run.stderr
    assert "unreachable" not in run.stderr
    assert "definitely-wrong" not in run.stderr + run.stdout
    assert ckpt_env["AWS_SECRET_ACCESS_KEY"] not in run.stderr + run.stdout
    assert "credentials-refused after 0 attempts (0 restarts), no driver started" in run.stdout
    assert not started.exists()  # no driver started
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="jobs/")
    assert listed.get("Contents", []) == []  # no status.json, no supervisor record, no deployment
