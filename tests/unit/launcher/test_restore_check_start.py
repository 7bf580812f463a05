"""start_check: the restore check's record is written before its process starts, the process is ``ckpt run
--check-restore --check-id`` detached with the job's settings and no Airflow settings, and a second check of the
job is refused while one runs."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.deployments import Deployment
from airflow_ckpt_provider.core.records.restore_check import CHECK_ENV, CheckEnded, CheckStarted, read_start, record_end
from airflow_ckpt_provider.core.store.jobstore import CHECKS, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import restore_check

T0 = 1_800_000_000.0


class Spawned:
    """What the fake subprocess.Popen saw: argv, env, and the check's record at the call."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.calls: list[tuple[list[str], dict[str, str], dict[str, Any]]] = []

    def popen(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> Any:
        check_id = argv[argv.index("--check-id") + 1]
        self.calls.append((argv, env, {"record": read_start(self.store, check_id), **kwargs}))
        return type("Proc", (), {"pid": 4242, "wait": lambda self: 0})()


@pytest.fixture
def spawned(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> Spawned:
    fake = Spawned(store)
    monkeypatch.setattr(restore_check.subprocess, "Popen", fake.popen)
    return fake


def start(store: JobStore, job_file: Path, **kwargs: Any) -> CheckStarted:
    deployment = Deployment(str(job_file), code_version="v2", env={"TOPIC": "orders"})
    return restore_check.start_check(store, deployment, store_url="s3://bucket/jobs", timeout=240,
                                    s3=S3Options(endpoint_url="http://s3:8333", access_key_id="AK",
                                                 secret_access_key="SK"), **kwargs)


def test_the_record_is_written_before_the_detached_check_starts(store: JobStore, spawned: Spawned, job_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__SQL_ALCHEMY_CONN", "postgresql://secret")
    started = start(store, job_file, allow_non_restored_state=True, started_by="airflow:upgrade.upgrade", now=T0)
    [(argv, env, seen)] = spawned.calls
    assert seen["record"] == CheckStarted(  # recorded before the process, without its pid
        "orders", started.check_id, str(job_file), "v2", T0, 240.0, socket.gethostname(), "airflow:upgrade.upgrade",
        log_file=str(Path(os.environ["CKPT_HOME"], "jobs", "orders", "logs", f"check-{started.check_id}.log")),
        schema=CheckStarted.SCHEMA)
    assert started.check_id.startswith("20270115T080000Z-")
    assert started == read_start(store, started.check_id) and started.pid == 4242  # then its pid
    assert argv[1:6] == ["-m", "airflow_ckpt_provider.cli", "run", str(job_file), "--job"]
    assert "--supervise" not in argv
    assert argv[-6:] == ["--check-restore", "--check-timeout", "240", "--check-id", started.check_id,
                         "--allow-non-restored-state"]
    assert argv[argv.index("--restore") + 1] == "latest-state"
    assert argv[argv.index("--endpoint-url") + 1] == "http://s3:8333"
    assert (env[CHECK_ENV], env["TOPIC"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        started.check_id, "orders", "AK", "SK")
    assert not [k for k in env if k.startswith("AIRFLOW")]
    assert (seen["start_new_session"], seen["close_fds"]) == (True, True)


def test_a_second_check_of_the_job_is_refused_while_one_runs(store: JobStore, spawned: Spawned,
                                                             job_file: Path) -> None:
    first = start(store, job_file)  # pid 4242: not a process of this host, so take ours, which runs
    store.storage.write(first.key, first.with_pid(os.getpid()).to_bytes())
    with pytest.raises(ConfigError) as info:
        start(store, job_file)
    assert str(info.value).startswith(f"expected no restore check of job orders running, found restore check "
                                      f"{first.check_id} of {job_file} (pid {os.getpid()} on ")
    assert str(info.value).endswith("wait for it to end, or kill its process, then run the upgrade again")
    assert len(spawned.calls) == 1 and len(store.storage.list(CHECKS)) == 1  # nothing written, nothing started
    record_end(store, CheckEnded(first.check_id, CheckOutcome.COMPATIBLE, "ok", first.started_at + 30))
    second = start(store, job_file)  # once it recorded its verdict, a new check starts
    assert second.check_id != first.check_id and len(spawned.calls) == 2


def test_bad_input_is_refused_before_anything_is_recorded(store: JobStore, spawned: Spawned, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"job file .*missing\.py not found"):
        start(store, tmp_path / "missing.py")
    assert spawned.calls == [] and store.storage.list(CHECKS) == []
