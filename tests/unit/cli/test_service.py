"""``ckpt run --service`` hands a job over (nothing runs here), ``ckpt service status`` shows it; bad input is refused
with nothing recorded. No service instance runs in these tests (tests/integration/test_service.py runs two)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli.main import main
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.ownership import handed_key
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage


def test_run_with_service_records_the_launch_and_hands_the_job_over_starting_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "orders.py"
    job.write_text("# a job\n")
    store_dir = tmp_path / "store"
    code = main(["run", str(job), "--job", "orders", "--store", str(store_dir), "--checkpoint", str(tmp_path / "c"),
                 "--restart-attempts", "4", "--conf", "spark.ui.enabled=false", "--service", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    handed = json.loads(out)
    store = JobStore(LocalStorage(store_dir), "orders")
    last = read_launch(store)
    assert last is not None and last.launch_id == handed["launch_id"]
    assert (last.pid, last.host) == (None, None)  # an instance of the service starts it
    assert last.deployment.job_file == str(job) and last.deployment.restart_attempts == 4
    assert last.deployment.conf == {"spark.ui.enabled": "false"}
    assert store.root.exists(handed_key("orders"))

    assert main(["service", "status", "--store", str(store_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status == {"instances": [], "jobs": [{"job": "orders", "owner": None, "owner_epoch": None,
                                                 "launch_id": last.launch_id, "launched_by": last.launched_by,
                                                 "ended": None}]}


@pytest.mark.parametrize(("extra", "message"), [
    (["--supervise"], "expected it without --supervise, --check-restore and --dry-run"),
    (["--master", "spark://127.0.0.1:1"], "master"),
])
def test_run_with_service_refuses_bad_input_and_records_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    job = tmp_path / "orders.py"
    job.write_text("# a job\n")
    code = main(["run", str(job), "--job", "orders", "--store", str(tmp_path / "store"), "--service", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "store").exists()


def test_run_with_service_refuses_a_job_whose_driver_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "orders.py"
    job.write_text("# a job\n")
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    write_status(store, JobStatus(job="orders", epoch=3, state=JobState.RUNNING, pid=os.getpid(),
                                  host=socket.gethostname(), updated_at=time.time(), started_at=time.time()))
    code = main(["run", str(job), "--job", "orders", "--store", str(tmp_path / "store"), "--service"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "expected no driver running or starting" in err and "epoch 3" in err and "ckpt job stop" in err, err
    assert read_launch(store) is None and not store.root.exists(handed_key("orders"))
