"""core/policy/settings.py: settings declared once, one serializer; the round trips flags <-> settings <-> JSON, records
of the previous version, and a setting's way from the operator to the driver (docs/development.md#settings)."""

from __future__ import annotations

import argparse
import json
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.cli.main import build_parser
from airflow_ckpt_provider.cli.run import spec_from_args
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestartStrategyName, RestoreSpec, TimeTravel
from airflow_ckpt_provider.core.policy.settings import (
    JobSettings,
    RestartSettings,
    RuntimeSettings,
    Settings,
    flag_of,
    setting_fields,
)
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.launcher.deploy import run_argv
from airflow_ckpt_provider.launcher.submit import ENTRYPOINT_PY, build_command
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from tests.support.settingvalues import non_defaults

SUBMIT = "/opt/spark/bin/spark-submit"


def test_every_setting_has_help_a_flag_and_a_value_other_than_its_default() -> None:
    settings = JobSettings(**non_defaults(JobSettings))
    for f, m in setting_fields(JobSettings):
        assert m.help and getattr(settings, f.name) != f.default, f.name
    flags = [flag_of(f.name) for f, _ in setting_fields(RuntimeConfig)]
    assert len(flags) == len(set(flags))


def test_job_settings_are_the_runtime_and_the_restart_settings() -> None:
    assert {f.name for f in fields(JobSettings)} == {f.name for f in fields(RuntimeSettings)} | {
        f.name for f in fields(RestartSettings)}
    assert {f.name for f in fields(JobSettings)} <= {f.name for f in fields(Deployment)}
    assert {f.name for f in fields(JobSettings)} <= {f.name for f in fields(RuntimeConfig)}  # the driver restarts too


def test_values_are_parsed_on_construction_whatever_their_source() -> None:
    # ignore[arg-type] on the next 2 lines: the values are text on purpose (parsed on construction)
    settings = JobSettings(savepoint_interval="30", keep_checkpoints="4", time_travel="refuse",  # type: ignore[arg-type]
                           restart_strategy="fixed-delay", checkpoint_interval="none")  # type: ignore[arg-type]
    assert (settings.savepoint_interval, settings.keep_checkpoints, settings.checkpoint_interval) == (30.0, 4, None)
    assert settings.time_travel is TimeTravel.REFUSE and settings.restart_strategy is RestartStrategyName.FIXED_DELAY


@pytest.mark.parametrize(("values", "message"), [
    ({"keep_checkpoints": "many"}, "keep_checkpoints: expected a whole number, found 'many'"),
    ({"keep_checkpoints": None}, "keep_checkpoints: expected a whole number, found None"),
    ({"savepoint_interval": "hourly"}, "savepoint_interval: expected seconds or 'none', found 'hourly'"),
    ({"heartbeat_interval": True}, "heartbeat_interval: expected seconds, found True"),
    ({"time_travel": "maybe"}, "invalid time-travel policy: expected one of fork, refuse, found 'maybe'"),
    ({"restart_strategy": "fixed-delay", "restart_interval": 5}, "--restart-interval applies to failure-rate only"),
    ({"lease_interval": 6.0}, r"fence_grace \(10.0 s\) must be at least twice lease_interval \(6.0 s\)"),
    ({"keep_savepoints": -1}, "keep_savepoints must be >= 0 or unset, found -1"),
    ({"snapshot_nice": 20},
     r"snapshot_nice must be a nice value from 0 \(the driver's priority\) to 19 \(the lowest\), found 20"),
])
def test_bad_values_are_refused_naming_the_setting(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JobSettings(**values)


def parse_flags(cls: type[Settings], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cls.add_flags(parser)
    return parser.parse_args(argv)


def test_flags_round_trip() -> None:
    settings = JobSettings(**non_defaults(JobSettings))
    argv = settings.to_argv()
    assert JobSettings.from_namespace(parse_flags(JobSettings, argv)) == settings
    assert JobSettings().to_argv(RestartSettings) == ["--restart-strategy", "exponential-delay"]  # unset: left out
    assert JobSettings.from_namespace(parse_flags(JobSettings, [])) == JobSettings()  # not given: the defaults


def test_flags_errors_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--keep-checkpoints: expected a whole number, found '2.5'$"):
        JobSettings.from_namespace(parse_flags(JobSettings, ["--keep-checkpoints", "2.5"]))


def test_json_round_trip_ignores_newer_keys_and_defaults_missing_ones() -> None:
    settings = JobSettings(**non_defaults(JobSettings))
    body = json.loads(json.dumps(settings.to_json()))
    assert body["time_travel"] == "refuse" and body["restart_strategy"] == "failure-rate"  # spellings, not reprs
    assert JobSettings.from_json(body) == settings
    assert JobSettings.from_json(body | {"a_setting_of_a_newer_version": 1}) == settings
    assert JobSettings.from_json({"savepoint_interval": 60}) == JobSettings(savepoint_interval=60.0)


#: spec/last.json's deployment as the previous version wrote it (asdict of the old Deployment).
OLD_DEPLOYMENT = {
    "job_file": "/jobs/orders.py", "code_version": "v1", "master": "local[2]", "deploy_mode": "client",
    "conf": {"spark.sql.shuffle.partitions": "4"}, "py_files": ["lib.zip"], "files": [], "spark_submit": None,
    "env": {"TOPIC": "orders"}, "checkpoint": None, "checkpoint_interval": None, "savepoint_interval": 600.0,
    "keep_checkpoints": 3, "keep_savepoints": None, "heartbeat_interval": 5.0, "poll_interval": 1.0,
    "restart_strategy": "fixed-delay", "restart_attempts": 4, "restart_delay": None, "restart_interval": None,
    "max_restarts_in_window": None, "health_window": 900.0, "progress_timeout": None, "time_travel": "refuse",
}


def test_a_deployment_record_of_the_previous_version_reads_and_round_trips() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its spellings are today's
        d = Deployment.from_dict(OLD_DEPLOYMENT)
    assert (d.job_file, d.code_version, d.py_files, d.files, d.env) == ("/jobs/orders.py", "v1", ("lib.zip",), (),
                                                                         {"TOPIC": "orders"})
    assert (d.checkpoint_interval, d.savepoint_interval, d.restart_attempts, d.health_window) == (None, 600.0, 4, 900.0)
    assert d.restart_strategy is RestartStrategyName.FIXED_DELAY and d.time_travel is TimeTravel.REFUSE
    newer = {k: v for k, v in JobSettings().to_json().items() if k not in OLD_DEPLOYMENT}
    assert "fence_grace" in newer and d.fence_grace == 10.0  # settings it did not record: their defaults
    assert d.python_env == "auto"  # a field it did not record: its default
    assert d.to_dict() == OLD_DEPLOYMENT | newer | {"python_env": "auto"}  # the same flat shape, newer keys added
    old_launch = {"job": "orders", "deployment": OLD_DEPLOYMENT, "restore": "latest-state", "launched_at": 1.7e9,
                  "launched_by": "airflow:dag.submit", "launch_id": "L1", "pid": 7}
    launch = Launch.from_bytes(json.dumps(old_launch).encode(), "spec/last.json")
    assert launch.restore == LATEST_STATE and launch.deployment == d
    assert json.loads(launch.to_bytes())["restore"] == "latest-state"


def driver_config(deployment: Deployment, tmp_path: Path, restore: RestoreSpec = LATEST_STATE) -> RuntimeConfig:
    """The way a deployment's settings take to the driver: ``ckpt run`` argv (launcher/deploy.py), parsed by
    ``ckpt run`` (cli/run.py), the spark-submit argv it builds (launcher/submit.py), parsed by entrypoint.py."""
    argv = run_argv(deployment, "orders", str(tmp_path / "store"), restore)
    run_args = build_parser().parse_args(argv[3:])  # after "python -m airflow_ckpt_provider.cli"
    assert RestartSettings.from_namespace(run_args) == RestartSettings(**deployment.values(RestartSettings))
    submit_argv, _ = build_command(spec_from_args(run_args))
    return RuntimeConfig.from_args(submit_argv[submit_argv.index(str(ENTRYPOINT_PY)) + 2:])


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "orders.py"
    path.write_text("")
    return str(path)


def test_every_runtime_setting_of_a_deployment_reaches_the_driver(job_file: str, tmp_path: Path) -> None:
    values = non_defaults(JobSettings)
    deployment = Deployment(job_file, code_version="v2", spark_submit=SUBMIT, **values)
    config = driver_config(Deployment.from_dict(json.loads(json.dumps(deployment.to_dict()))), tmp_path)
    assert config.values(RuntimeSettings) == RuntimeSettings(**{k: values[k] for k in config.values(RuntimeSettings)}
                                                             ).values(RuntimeSettings)
    assert (config.job, config.code_version, config.restore) == ("orders", "v2", LATEST_STATE)


def test_unset_settings_reach_the_driver_as_their_defaults(job_file: str, tmp_path: Path) -> None:
    config = driver_config(Deployment(job_file, spark_submit=SUBMIT), tmp_path,
                           RestoreSpec.parse("savepoint-7-20261122T101500Z-abc123"))
    assert config.values(RuntimeSettings) | {"checkpoint": None} == RuntimeSettings().values(RuntimeSettings)
    assert str(config.restore) == "savepoint-7-20261122T101500Z-abc123"
