"""``ckpt job rescale|upgrade``'s driver (launcher/upgrade.py JobUpgrade): it acts on the steps
launcher/upgradesteps.py decides, in the foreground, one line per step. Spark, the driver and the launch are fakes
here (the real ones: integration/test_rescale.py, integration/test_cli_job.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli.main import main
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import UpgradeMode
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.control import RequestAction, open_requests
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import SPEC_STABLE, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher.upgrade import UpgradeFailed
from tests.support.operatorfakes import (
    ORDERS_V1,
    ORDERS_V2,
    RESCALED_SID,
    SID,
    old_deployment,
    record_deployment,
    report,
)
from tests.support.upgradefakes import World, rocksdb_savepoint


@pytest.fixture
def world(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> World:
    record_deployment(store, old_deployment(job_file=ORDERS_V1))
    report(store, epoch=3, code_version="v1")
    rocksdb_savepoint(store, SID, 7, 2)  # the latest snapshot: RocksDB state in 2 partitions
    return World(store, monkeypatch)


def test_a_rescale_checks_stops_repartitions_starts_and_verifies_saying_each_step(world: World) -> None:
    result = world.run()
    assert result == {"job": "orders", "partitions": 5, "snapshot_id": SID, "rescaled_snapshot_id": RESCALED_SID,
                      "epoch": 4, "batch_id": 9}
    assert [line[:3] for line in world.said] == ["1/5", "1/5", "2/5", "2/5", "3/5", "3/5", "4/5", "4/5"]
    assert world.said[2] == "2/5 stopping the driver of epoch 3 with a savepoint"
    assert world.checks == [("latest-state", False), (SID, True)]
    [started] = world.launches.calls
    assert str(started.restore) == RESCALED_SID and read_launch(world.store, SPEC_STABLE) == started


def test_a_failed_verification_rolls_back_to_the_stops_savepoint(world: World) -> None:
    world.healthy = [False, True]
    with pytest.raises(UpgradeFailed) as info:
        world.run()
    new, old = world.launches.calls
    assert (str(new.restore), str(old.restore), old.deployment.job_file) == (RESCALED_SID, SID, ORDERS_V1)
    assert world.said[-1].startswith(f"5/5 rolling back: starting {ORDERS_V1} from {SID} (the old partitions)")
    assert str(info.value) == (
        "rescale of job orders to 5 state partitions failed verification (job orders: expected it healthy, found "
        f"FAILED); rolled back to v1 from {SID} on its old partitions: it runs again (epoch 4)")


def test_a_failed_repartition_rolls_back_before_anything_new_starts(world: World) -> None:
    world.rescale_outcome = CheckOutcome.INCOMPATIBLE
    with pytest.raises(UpgradeFailed, match=rf"\(the rescale of savepoint {SID} to 5 partitions: incompatible: "
                                            r"repartitioned\); rolled back"):
        world.run()
    [old] = world.launches.calls
    assert str(old.restore) == SID


def test_a_stop_without_an_answer_fails_and_starts_nothing(world: World) -> None:
    world.stop_answers = False
    with pytest.raises(UpgradeFailed) as info:
        world.run()
    # The driver looks at the job after the failed stop, as the operator does: it still runs, nothing changed.
    assert str(info.value).startswith("rescale of job orders: the stop with savepoint did not complete (no answer)")
    assert str(info.value).endswith("the old job still runs (epoch 3), nothing was changed"), info.value
    assert world.launches.calls == []


def test_the_same_count_is_refused_before_anything(world: World) -> None:
    with pytest.raises(ConfigError) as info:
        world.run(2)
    assert str(info.value).startswith(f"rescale of job orders to 2 state partitions refused before anything was "
                                      f"stopped: snapshot {SID}: the state already has 2 partitions")
    assert world.checks == [] and open_requests(world.store) == [] and world.launches.calls == []


def test_a_stopped_job_is_rescaled_from_its_final_savepoint_without_a_stop(world: World) -> None:
    report(world.store, epoch=3, state=JobState.STOPPED, batch_id=7, last_snapshot={"id": SID, "kind": "savepoint",
                                                                               "batch_id": 7})
    world.run()
    assert world.said[0].endswith("rescaling it from there") and world.checks == [(SID, True)]
    assert open_requests(world.store) == []


# -- ckpt job upgrade ---------------------------------------------------------------------------------------------


def test_an_upgrade_checks_the_new_code_stops_with_savepoint_and_starts_it_from_the_savepoint(world: World) -> None:
    result = world.run(None, job_file=ORDERS_V2, code_version="v2")
    assert result == {"job": "orders", "from_version": "v1", "to_version": "v2", "upgrade_mode": "savepoint",
                      "snapshot_id": SID, "epoch": 4, "batch_id": 9, "partitions": None, "rescaled_snapshot_id": None}
    assert world.checks == [("latest-state", False)]  # no repartition
    assert [line[:3] for line in world.said] == ["1/5", "1/5", "2/5", "2/5", "4/5", "4/5"]
    assert world.said[0] == f"1/5 checking that {ORDERS_V2} (code v2) restores the latest state (on a copy)"
    assert world.said[-1] == "4/5 verified: epoch 4 at batch 9; v2 is the stable deployment"
    [started] = world.launches.calls
    assert (started.deployment.job_file, started.deployment.code_version, str(started.restore)) == (ORDERS_V2, "v2",
                                                                                                     SID)


def test_the_restore_check_gets_the_job_stores_credentials_given_to_the_actor(world: World) -> None:
    s3 = S3Options(access_key_id="AKID", secret_access_key="not-in-the-environment")
    world.run(None, s3, job_file=ORDERS_V2, code_version="v2")
    assert world.check_s3 == [s3]  # start_check passes them to the check's process (credentials_env)


def test_an_upgrade_in_last_state_mode_cancels_and_rolls_back_to_the_latest_snapshot(world: World) -> None:
    world.healthy = [False, True]
    with pytest.raises(UpgradeFailed) as info:
        world.run(None, job_file=ORDERS_V2, code_version="v2", upgrade_mode=UpgradeMode.LAST_STATE)
    assert [r.action for r in open_requests(world.store)] == [RequestAction.CANCEL]
    assert "2/5 cancelled at batch 7" in world.said
    new, old = world.launches.calls
    assert (str(new.restore), old.deployment.job_file, str(old.restore)) == ("latest-state", ORDERS_V1, SID)
    assert str(info.value) == ("upgrade of job orders to v2 failed verification (job orders: expected it healthy, "
                               f"found FAILED); rolled back to v1 from {SID}: the old code runs again (epoch 4)")


def test_ckpt_job_upgrade_prints_where_the_job_went(world: World, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "store")  # the store fixture's root
    assert main(["job", "upgrade", "--store", store, "--job", "orders", "--job-file", ORDERS_V2, "--code-version",
                 "v2", "--verify-timeout", "5"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"upgraded job orders to v2 (savepoint, from {SID}), running at epoch 4, batch 9"
    assert "2/5 stopping the driver of epoch 3 with a savepoint" in err
    assert main(["job", "status", "--store", store, "--job", "orders"]) == 0  # the operation, as it ended
    out, _ = capsys.readouterr()
    assert re.search(r"\noperation: upgrade upgrade-\S+ of job orders \(succeeded, acted on by \S+@\S+ \(ckpt job "
                     r"upgrade\) \(pid \d+\); asked by ", out), out
    assert main(["job", "status", "--store", store, "--job", "orders", "--json"]) == 0
    operation = json.loads(capsys.readouterr().out)["operation"]
    assert (operation["state"], operation["result"]["to_version"], operation["steps"]) == ("succeeded", "v2", 4)
    assert main(["job", "upgrade", "--store", store, "--job", "orders", "--job-file", ORDERS_V2, "--partitions", "3",
                 "--upgrade-mode", "last-state"]) == 1
    _, err = capsys.readouterr()
    assert "partitions=3 with upgrade_mode last-state: a rescale goes through a savepoint" in err
    assert main(["job", "upgrade", "--store", store, "--job", "orders", "--job-file", ORDERS_V2, "--verify-batches",
                 "-1"]) == 1
    _, err = capsys.readouterr()  # refused before anything: no operation recorded
    assert "verify_batches: expected a whole number >= 0 (0: no batch), found -1" in err
    assert main(["job", "upgrade", "--store", store, "--job", "orders", "--partitions", "3"]) == 1
    assert "ckpt job upgrade: expected --job-file F (the new code), found none" in capsys.readouterr().err
    assert main(["job", "rescale", "--store", store, "--job", "orders"]) == 1
    assert "ckpt job rescale: expected --partitions N" in capsys.readouterr().err
    world.store.storage.write("operation.json", b"{not json")  # a damaged record: the status still shows
    assert main(["job", "status", "--store", store, "--job", "orders"]) == 0
    out, err = capsys.readouterr()
    assert "warning: operation record" in err and "is not JSON" in err and "operation:" not in out


def test_an_upgrade_without_a_job_file_is_refused_before_anything_stops(store: JobStore) -> None:
    """An empty job file keeps the running code for a rescale only; an upgrade needs the new code's file."""
    from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings

    with pytest.raises(ConfigError, match=r"job_file: expected the new code's Python file, found an empty string"):
        UpgradeSettings(job_file=" ")
    assert [str(o.key) for o in store.storage.list("")] == []  # nothing recorded


# -- the new code's py files and files --------------------------------------------------------------------------

V1_FILES = {"py_files": ("s3a://code/v1/common.py",), "files": ("s3a://code/v1/lookup.csv",)}


def test_an_upgrade_ships_the_new_code_s_files_and_its_rollback_the_old_ones(world: World) -> None:
    record_deployment(world.store, old_deployment(job_file=ORDERS_V1, **V1_FILES))
    world.healthy = [False, True]
    with pytest.raises(UpgradeFailed):
        world.run(None, job_file=ORDERS_V2, code_version="v2", py_files=("s3a://code/v2/common.py", "s3a://code/v2/x.zip"),
                  files=())
    new, old = world.launches.calls
    assert (new.deployment.job_file, new.deployment.py_files, new.deployment.files) == (
        ORDERS_V2, ("s3a://code/v2/common.py", "s3a://code/v2/x.zip"), ())
    assert (old.deployment.job_file, old.deployment.py_files, old.deployment.files) == (
        ORDERS_V1, V1_FILES["py_files"], V1_FILES["files"])


def test_an_upgrade_without_files_keeps_the_recorded_ones(world: World) -> None:
    record_deployment(world.store, old_deployment(job_file=ORDERS_V1, **V1_FILES))
    world.run(None, job_file=ORDERS_V2, code_version="v2")
    [new] = world.launches.calls
    assert (new.deployment.job_file, new.deployment.py_files, new.deployment.files) == (
        ORDERS_V2, V1_FILES["py_files"], V1_FILES["files"])
    assert read_launch(world.store, SPEC_STABLE) == new


def test_ckpt_job_upgrade_py_files_and_files_reach_the_new_deployment(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    record_deployment(world.store, old_deployment(job_file=ORDERS_V1, **V1_FILES))
    monkeypatch.chdir(tmp_path)
    assert main(["job", "upgrade", "--store", str(tmp_path / "store"), "--job", "orders", "--job-file", ORDERS_V2,
                 "--code-version", "v2", "--verify-timeout", "5", "--py-files", "lib/common.py,s3a://code/v2/x.zip",
                 "--py-files", "lib/more.py", "--files", ""]) == 0
    capsys.readouterr()
    [new] = world.launches.calls
    assert new.deployment.py_files == (str(tmp_path / "lib/common.py"), "s3a://code/v2/x.zip",
                                       str(tmp_path / "lib/more.py"))
    assert new.deployment.files == ()  # --files '': none


def test_a_rescale_keeps_the_code_s_files_and_refuses_new_ones(world: World) -> None:
    with pytest.raises(ConfigError) as info:
        world.run(3, py_files=("s3a://code/v2/common.py",))
    assert str(info.value) == (
        "py_files/files given without job_file, but a rescale keeps the running code and the files it ships; "
        "expected none: upgrade instead (job_file with py_files/files) to change them. Nothing was changed")
    assert world.checks == [] and open_requests(world.store) == [] and world.launches.calls == []


# -- the operation record: a re-run resumes, a retry finds its end, a second ask is refused ----------------------


class Died(BaseException):
    """The actor's process dying in the middle of a step (kill -9 leaves the record as it was)."""


def test_a_rerun_after_the_actor_died_between_the_stop_and_the_repartition_resumes_without_a_second_stop(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.records import operations
    from airflow_ckpt_provider.core.records.operations import OperationState, read_operation
    from airflow_ckpt_provider.launcher import upgrade

    def die(*_: object, **__: object) -> None:
        raise Died

    with monkeypatch.context() as m:
        m.setattr(upgrade.JobUpgrade, "_rescale", die)
        with pytest.raises(Died):
            world.run()
    found = read_operation(world.store)
    assert found is not None and found.operation.state is OperationState.RUNNING
    assert (found.operation.step or {})["type"] == "Rescale" and world.launches.calls == []
    monkeypatch.setattr(operations, "pid_alive", lambda pid: False)  # the actor's process is gone
    world.said.clear()
    result = world.run(requested_by="a second run")
    assert result["rescaled_snapshot_id"] == RESCALED_SID
    assert world.said[0].startswith(f"found rescale {found.operation.id} of job orders (running, step ")
    assert [r.action for r in open_requests(world.store)] == [RequestAction.STOP]  # one stop, not two
    assert world.checks == [("latest-state", False), (SID, True)]  # the repartition ran once, when resumed
    [started] = world.launches.calls
    assert str(started.restore) == RESCALED_SID
    ended = read_operation(world.store)
    assert ended is not None and ended.operation.state is OperationState.SUCCEEDED
    assert ended.operation.result == result


def test_a_rerun_after_the_actor_died_during_the_start_does_not_launch_twice(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.records import operations
    from airflow_ckpt_provider.launcher import upgrade

    def die(*_: object, **__: object) -> None:
        raise Died

    with monkeypatch.context() as m:
        m.setattr(upgrade, "crash_point", lambda name: die() if name == "upgrade.after-start" else None)
        with pytest.raises(Died):
            world.run(None, job_file=ORDERS_V2, code_version="v2")
    [launched] = world.launches.calls
    assert launched.key.startswith("upgrade ") and launched.key.endswith(" start")  # exactly this operation's step
    monkeypatch.setattr(operations, "pid_alive", lambda pid: False)
    result = world.run(None, requested_by="a second run", job_file=ORDERS_V2, code_version="v2")
    assert result["to_version"] == "v2" and len(world.launches.calls) == 1  # found its launch: not started again


def test_a_retry_with_the_same_key_gets_the_end_without_acting_and_another_ask_waits_its_turn(world: World) -> None:
    from airflow_ckpt_provider.core.errors import ConflictError
    from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings
    from airflow_ckpt_provider.core.records.operations import Operation, ask, read_operation

    settings = UpgradeSettings(partitions=5, verify_timeout=5, stop_timeout=0.3)
    found, new = ask(world.store, "rescale", settings.to_json(), requested_by="airflow try 1", key="dag.task run 1")
    assert new
    with pytest.raises(ConflictError) as info:  # a different ask while this one is in progress
        ask(world.store, "upgrade", {"job_file": ORDERS_V2}, requested_by="someone else")
    assert f"expected no operation in progress, found rescale {found.operation.id} of job orders (pending" in str(
        info.value)
    assert read_operation(world.store) == found  # nothing changed
    from airflow_ckpt_provider.launcher.upgrade import JobUpgrade

    JobUpgrade(world.store, str(world.store.storage.url), None, say=world.said.append, actor="test",
               poll=0.01).run(found)
    again, new = ask(world.store, "rescale", settings.to_json(), requested_by="airflow try 2", key="dag.task run 1")
    assert not new and again.operation.result is not None and again.operation.result["partitions"] == 5
    assert len(world.launches.calls) == 1
    assert isinstance(again.operation, Operation)


def test_a_malformed_step_in_the_record_is_refused_with_what_was_found(world: World,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings
    from airflow_ckpt_provider.core.records import operations
    from airflow_ckpt_provider.core.records.operations import Acting, OperationState, ask, read_operation

    settings = UpgradeSettings(partitions=5, verify_timeout=5, stop_timeout=0.3)  # as World.run asks
    found, _ = ask(world.store, "rescale", settings.to_json(), requested_by="test")
    plan = {"job": "orders", "old": {"deployment": {}}, "new": {"job_file": ORDERS_V1}}
    broken = Acting(world.store, found, "a broken writer")
    broken.save(plan=plan, step={"type": "Explode"}, state=OperationState.RUNNING)
    monkeypatch.setattr(operations, "pid_alive", lambda pid: False)
    with pytest.raises(ConfigError, match=r"operation record: expected one of Check, Rescale, RollBack, Start, "
                                          r"Stop, TakeSavepoint, Verify, found type 'Explode'"):
        world.run()
    assert open_requests(world.store) == [] and world.launches.calls == []
    assert read_operation(world.store) is not None


def test_ckpt_job_operate_acts_on_an_orphaned_operation_and_refuses_what_it_cannot_act_on(
        world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings
    from airflow_ckpt_provider.core.records import operations
    from airflow_ckpt_provider.core.records.operations import OperationState, ask, read_operation
    from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key

    store = str(tmp_path / "store")
    settings = UpgradeSettings(partitions=5, verify_timeout=5, stop_timeout=0.3)
    found, _ = ask(world.store, "rescale", settings.to_json(), requested_by="an Airflow task")
    assert main(["job", "operate", "--store", store, "--job", "orders", "--operation", "rescale-unknown"]) == 1
    assert (f"error: job orders: expected operation rescale-unknown in operation.json, found rescale "
            f"{found.operation.id}") in capsys.readouterr().err
    world.store.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="t").to_bytes())
    assert main(["job", "operate", "--store", store, "--job", "orders", "--operation", found.operation.id]) == 1
    assert "is the supervision service's, whose owning instance acts on its operations" in capsys.readouterr().err
    world.store.root.delete([handed_key("orders")])
    monkeypatch.setattr(operations, "pid_alive", lambda pid: False)
    assert main(["job", "operate", "--store", store, "--job", "orders", "--operation", found.operation.id]) == 0
    assert f"rescale {found.operation.id} of job orders succeeded" in capsys.readouterr().out
    ended = read_operation(world.store)
    assert ended is not None and ended.operation.state is OperationState.SUCCEEDED
    assert [r.action for r in open_requests(world.store)] == [RequestAction.STOP] and len(world.launches.calls) == 1
    assert main(["job", "operate", "--store", store, "--job", "orders", "--operation", found.operation.id]) == 0
    assert "has ended: nothing to do" in capsys.readouterr().err and len(world.launches.calls) == 1
