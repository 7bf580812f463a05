"""``ckpt job restart``: the restart operation acted on in the command's process (launcher/upgrade.py), its options
RestartStepSettings' flags; the driver's answers, the launch and its health played (tests/support/upgradefakes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli.main import main
from airflow_ckpt_provider.core.records.control import RequestAction, open_requests
from airflow_ckpt_provider.core.records.operations import OPERATION, read_operation
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support.operatorfakes import SID, record_deployment, report
from tests.support.upgradefakes import World


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    return World(JobStore(LocalStorage(tmp_path / "store"), "orders"), monkeypatch)


def test_restart_stops_the_running_driver_with_a_savepoint_launches_and_prints_where_the_job_is(
        world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = record_deployment(world.store)
    report(world.store, epoch=3)
    code = main(["job", "restart", "--store", str(tmp_path / "store"), "--job", "orders", "--stop-mode", "savepoint",
                 "--stop-timeout", "1", "--start-timeout", "5", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    [request] = open_requests(world.store)
    assert (request.action, request.epoch) == (RequestAction.STOP, 3)
    [launch] = world.launches.calls
    assert (launch.deployment, str(launch.restore)) == (old.deployment, "latest-state")
    assert json.loads(out) == {"job": "orders", "restore": "latest-state", "restarted_by": "operation",
                               "snapshot_id": SID, "epoch": 4, "batch_id": 9, "launch_id": launch.launch_id}
    assert "1/3 stopping the driver of epoch 3 with a savepoint" in err and "3/3 running: epoch 4 at batch 9" in err
    found = read_operation(world.store)
    assert found is not None and found.operation.requested_by.endswith("(ckpt job restart)")


def test_restart_refuses_a_bad_flag_and_a_job_without_a_deployment_with_nothing_written(
        world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(tmp_path / "store"), "--job", "orders"]
    assert main(["job", "restart", *store, "--stop-mode", "kill"]) == 1
    assert "invalid stop mode: expected one of savepoint, cancel, found 'kill'" in capsys.readouterr().err
    assert not world.store.storage.exists(OPERATION)
    report(world.store)
    assert main(["job", "restart", *store]) == 1
    assert "job orders has no recorded deployment (spec/last.json)" in capsys.readouterr().err
    assert world.launches.calls == [] and open_requests(world.store) == []
