"""Deployment records: their JSON, the launch that records them and the command line ``ckpt run`` gets."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException
from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV, Deployment, Launch, read_launch, record_end
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import deploy
from airflow_ckpt_provider.launcher.deploy import credentials_env, run_argv
from tests.support.operatorfakes import (
    ORDERS_V1,
    SID,
    PopenCall,
    context,
    old_deployment,
    submit_op,
)

# -- deployments ------------------------------------------------------------------------------------------------------


def full_deployment() -> Deployment:
    return Deployment(job_file="s3://code/orders_v2.py", code_version="v2", master="yarn", deploy_mode="cluster",
                      conf={"spark.executor.memory": "2g", "spark.sql.shuffle.partitions": "8"},
                      py_files=("lib.zip", "util.py"), files=("schema.json",),
                      spark_submit="/opt/spark/bin/spark-submit",
                      env={"TOPIC": "orders", "KEYSPACE": "ks"}, checkpoint="/ckpt/orders", checkpoint_interval=None,
                      savepoint_interval=None, keep_checkpoints=4, keep_savepoints=None, heartbeat_interval=2.5,
                      restart_strategy="failure-rate", restart_attempts=None, restart_delay=1.5,
                      restart_interval=60.0, max_restarts_in_window=3, health_window=120.0, progress_timeout=None)


def test_deployment_round_trips_through_json() -> None:
    d = full_deployment()
    assert Deployment.from_dict(d.to_dict()) == d
    again = Deployment.from_dict(json.loads(json.dumps(d.to_dict())) | {"a_field_of_a_newer_version": 1})
    assert again == d and again.py_files == ("lib.zip", "util.py")  # lists back to tuples, unknown keys dropped
    record = Launch("orders", d, SID, 1.7e9, "airflow:dag.task", "launch-1", pid=7, host="h", log_file="/l")
    assert Launch.from_bytes(record.to_bytes(), "x") == record
    with pytest.raises(StorageError, match=r"^deployment record x is not valid: Object missing required field "
                                           r"`deployment`$"):
        Launch.from_bytes(b'{"job": "orders"}', "x")


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_run_argv_supervises_and_carries_every_setting() -> None:
    s3 = S3Options(endpoint_url="http://s3:8333", region="eu-west-1", access_key_id="AKIAEXAMPLE",
                   secret_access_key="wJalrXUtnFEMI-secret", session_token="FwoGZX-token")
    argv = run_argv(full_deployment(), "orders", "s3://bucket/jobs", SID, s3)
    assert argv[1:5] == ["-m", "airflow_ckpt_provider.cli", "run", "s3://code/orders_v2.py"]
    assert "--supervise" in argv
    expected = {"--job": ["orders"], "--store": ["s3://bucket/jobs"], "--restore": [SID], "--master": ["yarn"],
                "--deploy-mode": ["cluster"], "--restart-strategy": ["failure-rate"], "--code-version": ["v2"],
                "--checkpoint": ["/ckpt/orders"], "--keep-checkpoints": ["4"], "--heartbeat-interval": ["2.5"],
                "--restart-delay": ["1.5"], "--restart-interval": ["60"], "--max-restarts-in-window": ["3"],
                "--health-window": ["120"], "--checkpoint-interval": ["none"], "--savepoint-interval": [],
                "--keep-savepoints": [], "--endpoint-url": ["http://s3:8333"], "--region": ["eu-west-1"],
                "--conf": ["spark.executor.memory=2g", "spark.sql.shuffle.partitions=8"],
                "--py-files": ["lib.zip,util.py"], "--files": ["schema.json"],
                "--spark-submit": ["/opt/spark/bin/spark-submit"]}
    assert {flag: flag_values(argv, flag) for flag in expected} == expected
    assert flag_values(argv, "--restart-attempts") == flag_values(argv, "--progress-timeout") == []  # unset: defaults
    # credentials go to the environment, never to argv (ps shows it)
    assert not any(secret in arg for arg in argv for secret in ("AKIAEXAMPLE", "wJalrXUtnFEMI", "FwoGZX"))
    assert credentials_env(s3) == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-secret",
                                   "AWS_SESSION_TOKEN": "FwoGZX-token"}


def test_run_argv_intervals_of_zero_are_not_none() -> None:
    argv = run_argv(Deployment(job_file="j.py", checkpoint_interval=0.0, savepoint_interval=600.0, keep_savepoints=2),
                    "orders", "/s", "none")
    assert (flag_values(argv, "--checkpoint-interval"), flag_values(argv, "--savepoint-interval"),
            flag_values(argv, "--keep-savepoints")) == (["0"], ["600"], ["2"])
    assert flag_values(argv, "--endpoint-url") == flag_values(argv, "--code-version") == []


@pytest.mark.parametrize("name", ["AWS_SECRET", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN", "API_KEY",
                                  "KEY", "SSH_PRIVATE", "GCP_CREDENTIALS", "passwd", "KAFKA_SASL_JAAS_CONFIG",
                                  "DB_PASS", "APIKEY", "X_AUTH", "SERVICE_API_KEY", "PGPASS", "MYSQL_PWD",
                                  "AUTH_HEADER", "sasl_jaas_config"])
def test_secret_looking_env_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"refusing env {name}: a deployment's env is stored in the job store"):
        Deployment(job_file="j.py", env={name: "x"})


def test_ordinary_env_names_are_kept() -> None:
    env = {"TOPIC": "orders", "KEYSPACE": "ks", "MONKEY": "1", "OUTPUT_PATH": "/out", "TOPIC_KEYS": "id"}
    assert Deployment(job_file="j.py", env=env).env == env


def test_an_openlineage_transport_with_credentials_is_refused_in_env() -> None:
    transport = '{"type": "http", "url": "http://marquez:5000", "auth": {"type": "api_key", "apiKey": "k"}}'
    with pytest.raises(ConfigError, match=r"refusing env OPENLINEAGE__TRANSPORT \(its value holds credentials\): "
                       "a deployment's env is stored in the job store"):
        Deployment(job_file="j.py", env={"OPENLINEAGE__TRANSPORT": transport})
    plain = {"OPENLINEAGE__TRANSPORT": '{"type": "http", "url": "http://marquez:5000"}', "OPENLINEAGE_NAMESPACE": "p"}
    assert Deployment(job_file="j.py", env=plain).env == plain


def test_unrecorded_env_reaches_the_driver_only(store: JobStore, popen_calls: list[PopenCall]) -> None:
    """The operators pass OpenLineage's transport (it may hold an API key) this way: not in spec/last.json."""
    transport = '{"type": "http", "url": "http://marquez:5000", "auth": {"type": "api_key", "apiKey": "k-s3cr3t"}}'
    deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores",
                  unrecorded_env={"OPENLINEAGE__TRANSPORT": transport, "TOPIC": "ignored"})
    [(argv, env, _)] = popen_calls
    assert (env["OPENLINEAGE__TRANSPORT"], env["TOPIC"]) == (transport, "orders")  # the deployment's env wins
    assert b"k-s3cr3t" not in store.storage.read(SPEC_LAST)
    assert not any("k-s3cr3t" in arg for arg in argv)




def test_launch_records_the_deployment_first_and_passes_credentials_in_the_env(
        store: JobStore, popen_calls: list[PopenCall], tmp_path: Path) -> None:
    s3 = S3Options(endpoint_url="http://s3:8333", access_key_id="AKIAEXAMPLE", secret_access_key="wJalr-secret")
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore=SID, store_url="/stores", s3=s3,
                           launched_by="me")
    [(argv, env, recorded_before)] = popen_calls
    assert recorded_before is not None and recorded_before.launch_id == record.launch_id  # target recorded first
    assert recorded_before.pid is None and record.pid == 4242 and read_launch(store) == record
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIAEXAMPLE", "wJalr-secret")
    assert (env[LAUNCH_ENV], env["TOPIC"]) == (record.launch_id, "orders")
    assert not any("wJalr" in arg or "AKIAEXAMPLE" in arg for arg in argv)
    assert b"wJalr" not in store.storage.read(SPEC_LAST)
    assert (str(record.restore), record.launched_by, record.host) == (SID, "me", socket.gethostname())
    assert record.log_file == str(tmp_path / "home" / "jobs" / "orders" / "logs" / f"{record.launch_id}.log")


def test_launch_keeps_airflow_settings_out_of_the_job_s_env(store: JobStore, popen_calls: list[PopenCall],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_X", "postgres://airflow:hunter2@db/airflow")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:hunter2@db/airflow")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/scratch")
    deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    [(_, env, _)] = popen_calls
    assert [name for name in env if name.startswith("AIRFLOW")] == []  # the store fixture's connection too
    assert "hunter2" not in json.dumps(env)
    assert (env["SPARK_LOCAL_DIRS"], env["TOPIC"]) == ("/scratch", "orders")  # the rest is inherited, env on top


@pytest.mark.parametrize(("changes", "message"), [
    ({"job_file": "no_such_job.py"}, r"job file no_such_job\.py not found"),
    ({"job_file": ORDERS_V1, "deploy_mode": "cluster"}, "deploy mode cluster with master 'local\\[2\\]'"),
])
def test_launch_refuses_bad_input_before_recording_anything(store: JobStore, popen_calls: list[PopenCall],
                                                            changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        deploy.launch(store, old_deployment(**changes), restore="latest-state", store_url="/stores")
    assert popen_calls == [] and read_launch(store) is None  # spec/last.json not written: nothing was meant to run


def test_submit_of_a_missing_job_file_fails_before_recording_a_launch(store: JobStore,
                                                                      popen_calls: list[PopenCall]) -> None:
    with pytest.raises(AirflowException, match=r"cannot launch job orders: job file no_such_job\.py not found"):
        submit_op(job_file="no_such_job.py").execute(context())  # the real launch: its check refuses it
    assert popen_calls == [] and read_launch(store) is None


def test_launch_does_not_overwrite_an_end_recorded_meanwhile(store: JobStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    class EndsAtOnce:
        """Its supervisor fails at once and records its end before launch() records the pid."""

        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            assert record_end(store, env[LAUNCH_ENV], ending="config-error", exit_code=2, reason="bad input")
            self.pid = 4242

        def wait(self) -> int:
            return 2

    monkeypatch.setattr(deploy.subprocess, "Popen", EndsAtOnce)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242
    stored = read_launch(store)
    assert stored is not None and stored.launch_id == record.launch_id
    assert stored.ended_at is not None and (stored.ending, stored.exit_code, stored.end_reason) == (
        "config-error", 2, "bad input")  # the end survives: waiters stop waiting for a driver
    assert stored.pid is None


def test_launch_does_not_overwrite_a_newer_launch(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    newer = Launch("orders", old_deployment(job_file=ORDERS_V1, code_version="v0"), SID, time.time() + 1,
                   "airflow:other.restart", "newer-launch", pid=5151)

    class Superseded:
        """Another task launches the job before this launch() records its pid."""

        def __init__(self, argv: list[str], *, env: dict[str, str], **kwargs: Any) -> None:
            store.storage.write(SPEC_LAST, newer.to_bytes())
            self.pid = 4242

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(deploy.subprocess, "Popen", Superseded)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242 and record.launch_id != newer.launch_id
    assert read_launch(store) == newer


def test_launch_whose_pid_cannot_be_recorded_still_returns_it(store: JobStore, popen_calls: list[PopenCall],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(key: str) -> Any:
        raise StorageError(f"cannot read {key}: connection reset")

    monkeypatch.setattr(store.storage, "read_versioned", unreachable)
    record = deploy.launch(store, old_deployment(job_file=ORDERS_V1), restore="latest-state", store_url="/stores")
    assert record.pid == 4242 and len(popen_calls) == 1  # it runs; the warning says its pid was not recorded
    stored = read_launch(store)
    assert stored == replace(record, pid=None)  # the record written before the start stays


def test_the_task_s_py_files_reach_the_recorded_deployment_and_one_spark_submit_list_with_the_provider_s_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SubmitStreamingJobOperator(py_files=..., files=...) on a cluster: the deployment records them (restarts and
    upgrades relaunch it), and the spark-submit command ``ckpt run`` builds from it ships them, the connection's
    spark.submit.pyFiles too, beside the provider's code zip on one --py-files."""
    from airflow_ckpt_provider.cli import main as cli

    monkeypatch.setenv("CKPT_ENV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", json.dumps({
        "conn_type": "ckpt_spark", "host": "yarn",
        "extra": {"deploy_mode": "cluster", "conf": {"spark.submit.pyFiles": "hdfs:///shared/common.zip"}}}))
    op = submit_op(job_file="s3a://code/orders.py", py_files=["s3a://code/job_common.py", "s3a://code/deps.zip"],
                   files="s3a://code/schema.json")
    d = op.deployment()
    assert (d.py_files, d.files) == (("s3a://code/job_common.py", "s3a://code/deps.zip"), ("s3a://code/schema.json",))
    assert Deployment.from_dict(json.loads(json.dumps(d.to_dict()))).py_files == d.py_files  # in spec/last.json

    argv = run_argv(d, "orders", "s3://bucket/jobs", "latest-state")
    assert cli.main([*argv[3:], "--checkpoint", "s3a://bucket/ckpt/orders", "--dry-run", "--json"]) == 0
    submit = json.loads(capsys.readouterr().out)
    (code_zip,) = submit["python_env"]["py_files"]
    spark_submit = submit["argv"]
    assert spark_submit.count("--py-files") == 1
    assert spark_submit[spark_submit.index("--py-files") + 1].split(",") == [
        "s3a://code/job_common.py", "s3a://code/deps.zip", "hdfs:///shared/common.zip", code_zip]
    assert spark_submit[spark_submit.index("--files") + 1].split(",") == ["s3a://code/schema.json",
                                                                          "s3a://code/orders.py"]


@pytest.mark.parametrize(("value", "expected"), [
    (None, ()), ("a.py, s3a://b/c.zip", ("a.py", "s3a://b/c.zip")),
    (["a.py", "b.zip,c.egg"], ("a.py", "b.zip", "c.egg")),
])
def test_py_files_arguments_are_lists_or_comma_separated_text(value: Any, expected: tuple[str, ...]) -> None:
    assert submit_op(py_files=value).deployment().py_files == expected


def test_a_py_files_argument_of_another_type_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="py_files must be a list of paths or URIs"):
        submit_op(py_files={"a": 1}).deployment()
