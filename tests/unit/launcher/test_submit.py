"""The spark-submit command of `ckpt run`: argv and environment per cluster manager, refusals, no secrets."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import airflow_ckpt_provider.runtime
from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.cli.run import run_once
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.gate import GATE_ENV
from airflow_ckpt_provider.launcher.submit import (
    SubmitSpec,
    build_command,
    describe,
    find_spark_submit,
    gate_file,
    gate_name,
    parse_conf,
)
from airflow_ckpt_provider.runtime.config import RuntimeConfig

SUBMIT = "/opt/spark/bin/spark-submit"
LAUNCH = str(Path(airflow_ckpt_provider.runtime.__file__).parent / "entrypoint.py")
PY = sys.executable
ENV_KEYS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def config(tmp_path: Path) -> RuntimeConfig:
    return RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "ckpt"))


@pytest.fixture
def shared() -> RuntimeConfig:
    """A job store and a live checkpoint a cluster-mode driver can reach."""
    return RuntimeConfig(job="orders", store="s3://bucket/jobs", checkpoint="s3a://bucket/ckpt/orders")


def spec(job_file: Path | str, config: RuntimeConfig, **kw: object) -> SubmitSpec:
    # ignore[arg-type] below: kw holds SubmitSpec fields
    return SubmitSpec(job_file=str(job_file), config=config, spark_submit=SUBMIT, **kw)  # type: ignore[arg-type]


def test_local_master_binds_loopback_and_runs_this_python(job_file: Path, config: RuntimeConfig) -> None:
    argv, env = build_command(spec(job_file, config, conf={"spark.sql.shuffle.partitions": "2"}, py_files=["a.zip",
                                                                                                         "b.py"]))
    assert argv == [
        SUBMIT, "--master", "local[2]", "--deploy-mode", "client", "--name", "ckpt-orders",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
        "--py-files", "a.zip,b.py",
        LAUNCH, str(job_file), *config.to_args(),
    ]
    assert env == {"PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY, "SPARK_LOCAL_IP": "127.0.0.1",
                   GATE_ENV: gate_file(config)}
    assert not any("spark.ui.enabled" in a for a in argv)
    # entrypoint.py gets back exactly the config
    assert RuntimeConfig.from_args(argv[argv.index(str(job_file)) + 1:]) == config


def test_given_settings_and_inherited_environment_win(
    job_file: Path, config: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    argv, env = build_command(spec(job_file, config, master="local[*]", name="mine",
                                   conf={"spark.driver.host": "10.0.0.5"}))
    confs = [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"]
    assert confs == ["spark.driver.host=10.0.0.5", "spark.driver.bindAddress=127.0.0.1"]
    assert argv[argv.index("--name") + 1] == "mine"
    assert env == {"PYSPARK_DRIVER_PYTHON": PY, "SPARK_LOCAL_IP": "127.0.0.1",  # PYSPARK_PYTHON inherited
                   GATE_ENV: gate_file(config)}


def test_standalone_client_mode(job_file: Path, config: RuntimeConfig) -> None:
    argv, env = build_command(spec(job_file, config, master="spark://spark-master:7077", files=["lookup.csv"]))
    assert argv == [
        SUBMIT, "--master", "spark://spark-master:7077", "--deploy-mode", "client", "--name", "ckpt-orders",
        "--files", "lookup.csv", LAUNCH, str(job_file), *config.to_args(),
    ]
    # Executors run elsewhere: their Python is the cluster's.
    assert env == {"PYSPARK_DRIVER_PYTHON": PY, GATE_ENV: gate_file(config)}


def test_yarn_cluster_mode_ships_the_job_file(job_file: Path, shared: RuntimeConfig) -> None:
    config = shared
    argv, env = build_command(spec(job_file, config, master="yarn", deploy_mode="cluster", files=["lookup.csv"],
                                   conf={"spark.yarn.maxAppAttempts": "1"}))
    assert argv == [
        SUBMIT, "--master", "yarn", "--deploy-mode", "cluster", "--name", "ckpt-orders",
        "--conf", "spark.yarn.maxAppAttempts=1", "--conf", f"spark.yarn.appMasterEnv.{GATE_ENV}={gate_name(config)}",
        "--conf", "spark.yarn.submit.waitAppCompletion=true",
        "--files", f"lookup.csv,{job_file}", LAUNCH, "count.py", *config.to_args(),
    ]
    assert env == {}  # YARN would copy a local PYSPARK_PYTHON into the cluster


def test_k8s_cluster_mode_with_a_remote_job_file(shared: RuntimeConfig) -> None:
    config = shared
    argv, env = build_command(spec("s3a://jobs/v2/count.py", config, master="k8s://https://k8s:6443",
                                   deploy_mode="cluster", env_python="/opt/venv/bin/python",
                                   conf={"spark.kubernetes.file.upload.path": "s3a://uploads/ckpt"}))
    assert argv == [
        SUBMIT, "--master", "k8s://https://k8s:6443", "--deploy-mode", "cluster", "--name", "ckpt-orders",
        "--conf", "spark.kubernetes.file.upload.path=s3a://uploads/ckpt",
        "--conf", f"spark.kubernetes.driverEnv.{GATE_ENV}={gate_name(config)}",
        "--conf", "spark.kubernetes.submission.waitAppCompletion=true",
        "--files", "s3a://jobs/v2/count.py", LAUNCH, "count.py", *config.to_args(),
    ]
    assert env == {"PYSPARK_PYTHON": "/opt/venv/bin/python", "PYSPARK_DRIVER_PYTHON": "/opt/venv/bin/python"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"deploy_mode": "cluster"}, "deploy mode cluster with master 'local[2]'"),
        ({"master": "spark://m:7077", "deploy_mode": "cluster"}, "only on YARN and Kubernetes"),
        ({"deploy_mode": "remote"}, "unknown deploy mode 'remote': expected client or cluster"),
        ({"master": "mesos://m:5050"}, "unknown Spark master 'mesos://m:5050'"),
        ({"job_file": "missing.py"}, "job file missing.py not found"),
        ({"job_file": "s3a://jobs/count.py"}, "in client mode the job file must be a local file"),
        ({"conf": {"spark.hadoop.fs.s3a.secret.key": "x"}}, "refusing --conf spark.hadoop.fs.s3a.secret.key"),
        ({"conf": {"spark.hadoop.fs.s3a.bucket.b.access.key": "x"}}, "credential on the command line"),
        # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this host
        ({"conf": {"spark.driver.bindAddress": "192.0.2.1"}},
         "--conf spark.driver.bindAddress=192.0.2.1: in client mode the driver runs on this host"),
        ({"master": "spark://m:7077", "conf": {"spark.driver.host": "192.0.2.1"}},
         "but it is not an address of this host; expected one of its"),
        ({"master": "spark://m:7077", "conf": {"spark.driver.host": "no-such-host.invalid"}},
         "set SPARK_LOCAL_IP in each worker's environment"),
    ],
)
def test_refuses_what_spark_refuses(
    job_file: Path, config: RuntimeConfig, changes: dict[str, object], message: str
) -> None:
    kw: dict[str, object] = {"job_file": str(job_file), **changes}
    with pytest.raises(ConfigError, match=re.escape(message)):
        # ignore[arg-type] below: kw holds SubmitSpec fields
        build_command(SubmitSpec(config=config, spark_submit=SUBMIT, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("conf", [
    {"spark.driver.bindAddress": "127.0.0.1"},
    {"spark.driver.host": "127.0.0.1"},
    {"spark.driver.host": "192.0.2.1", "spark.driver.bindAddress": "0.0.0.0"},  # advertised elsewhere, bound here
])
def test_a_client_mode_driver_address_of_this_host_passes(job_file: Path, config: RuntimeConfig,
                                                          conf: dict[str, str]) -> None:
    argv, _ = build_command(spec(job_file, config, master="spark://m:7077", conf=conf))
    assert all(f"{k}={v}" in argv for k, v in conf.items()), argv


@pytest.mark.parametrize(
    "key",
    [
        "spark.yarn.appMasterEnv.AWS_SECRET_ACCESS_KEY",
        "spark.kubernetes.driverEnv.AWS_SESSION_TOKEN",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.ssl.keyStorePassword",
        "spark.authenticate.secret",
        "spark.kubernetes.authenticate.submission.oauthToken",
    ],
)
def test_refuses_secrets_in_conf(job_file: Path, config: RuntimeConfig, key: str) -> None:
    message = (f"refusing --conf {key}: a credential on the command line is visible to every user of the host; "
               "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, use the cluster's secret mechanism "
               "(Kubernetes secrets: spark.kubernetes.driver.secretKeyRef.ENV=SECRET:KEY; YARN: a Hadoop credential "
               "provider) or an instance role instead")
    with pytest.raises(ConfigError) as err:
        build_command(spec(job_file, config, master="yarn", conf={key: "s3cr3t"}))
    assert str(err.value) == message


def test_secret_references_pass_and_are_kept_in_the_description(job_file: Path, config: RuntimeConfig) -> None:
    """A reference names a secret (SECRET:KEY, a mount path, a token file): it holds none, and the printed command
    is copied into a SparkApplication, which needs it whole."""
    conf = {"spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY": "aws-creds:secret",
            "spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID": "aws-creds:id",
            "spark.kubernetes.executor.secrets.aws-creds": "/etc/aws",
            "spark.kubernetes.driver.secrets.tls": "/etc/tls",
            "spark.kubernetes.authenticate.driver.oauthTokenFile": "/var/run/token",
            "spark.executor.memory": "2g"}
    argv, _ = build_command(spec(job_file, config, master="k8s://https://k8s:6443", conf=conf))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"] == [f"{k}={v}" for k, v in conf.items()]
    described = shlex.split(describe(argv))
    assert [described[i + 1] for i, a in enumerate(described) if a == "--conf"] == [f"{k}={v}" for k, v in
                                                                                    conf.items()]
    assert len(described) == len(argv)


def test_describe_redacts_only_secret_conf_values() -> None:
    argv = ["spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=abc=def", "--conf", "spark.x.Password=p",
            "--name", "token=kept", "--conf", "spark.sql.shuffle.partitions=4", "job.py", "--conf"]
    assert shlex.split(describe(argv)) == [
        "spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=*********(redacted)",
        "--conf", "spark.x.Password=*********(redacted)", "--name", "token=kept",
        "--conf", "spark.sql.shuffle.partitions=4", "job.py", "--conf"]


def test_parse_conf() -> None:
    assert parse_conf(["a.b=1", "c=x=y", "a.b=2", "e="]) == {"a.b": "2", "c": "x=y", "e": ""}
    for bad in ("spark.ui.enabled", "=1", " =1"):
        with pytest.raises(ConfigError, match="expected KEY=VALUE"):
            parse_conf([bad])


def test_no_credentials_on_the_command_line(
    job_file: Path, config: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t0ken-value")
    s3 = RuntimeConfig(job="orders", store="s3://bucket/jobs", checkpoint="s3a://bucket/ckpt/orders",
                       endpoint_url="http://127.0.0.1:8333", region="eu-1")
    for s in (spec(job_file, s3), spec(job_file, s3, master="yarn", deploy_mode="cluster")):
        argv, env = build_command(s)
        text = " ".join(argv) + " ".join(env.values())
        for secret in ("AKIAEXAMPLEKEYID", "s3cr3t-value", "t0ken-value", "AWS_"):
            assert secret not in text
        assert not [k for k in env if k.startswith("AWS_")]
        assert argv[argv.index("--endpoint-url") + 1] == "http://127.0.0.1:8333"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_spark_submit_next_to_python_then_spark_home_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _executable(tmp_path / "venv" / "bin" / "spark-submit")
    home = _executable(tmp_path / "spark" / "bin" / "spark-submit")
    on_path = _executable(tmp_path / "path" / "spark-submit")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_spark_submit() == str(venv)
    venv.unlink()
    assert find_spark_submit() == str(home)
    home.unlink()
    assert find_spark_submit() == str(on_path)
    assert find_spark_submit("/x/spark-submit") == "/x/spark-submit"
    on_path.unlink()
    with pytest.raises(ConfigError, match=r"spark-submit not found: looked in .*venv/bin, .*spark/bin and on PATH"):
        find_spark_submit()


def _run_dry(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = cli.main(["run", *extra, "--spark-submit", SUBMIT, "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_command_and_added_environment(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    store = str(tmp_path / "store")
    code, out, err = _run_dry(capsys, str(job_file), "--job", "orders", "--store", store, "--restore", "none",
                              "--conf", "spark.sql.shuffle.partitions=2", "--checkpoint-interval", "30",
                              "--supervise", "--restart-strategy", "fixed-delay", "--restart-attempts", "4")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    argv = shlex.split(lines[0])
    assert argv[:4] == [SUBMIT, "--master", "local[2]", "--deploy-mode"]
    config = RuntimeConfig.from_args(argv[argv.index(str(job_file)) + 1:])
    assert (config.job, config.store, str(config.restore), config.checkpoint_interval) == (
        "orders", store, "none", 30.0)
    assert lines[1:5] == [f"env: {GATE_ENV}={gate_file(config)}", f"env: PYSPARK_DRIVER_PYTHON={PY}",
                          f"env: PYSPARK_PYTHON={PY}", "env: SPARK_LOCAL_IP=127.0.0.1"]
    assert lines[5] == "supervised: restart strategy fixed-delay: 4 attempts, 1 s apart; no health rule"
    assert "s3cr3t-value" not in out


@pytest.mark.parametrize("as_json", [False, True])
def test_dry_run_shows_a_secret_reference_whole(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    code, out, _ = _run_dry(capsys, str(job_file), "--job", "orders", "--store", str(tmp_path / "store"),
                            "--master", "k8s://https://k8s:6443", "--conf",
                            "spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY=aws-creds:secret",
                            *(["--json"] if as_json else []))
    assert code == 0
    assert "spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY=aws-creds:secret" in out
    assert "redacted" not in out


def test_dry_run_json_and_env_defaults(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_STORE", "s3://bucket/jobs")
    monkeypatch.setenv("CKPT_JOB", "orders")
    code, out, _ = _run_dry(capsys, str(job_file), "--master", "yarn", "--deploy-mode", "cluster", "--checkpoint",
                            "s3a://bucket/ckpt/orders", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["env"] == {} and data["supervise"] is None
    assert data["command"] == describe(data["argv"])
    assert data["argv"][data["argv"].index(LAUNCH) + 1:][:5] == ["count.py", "--job", "orders", "--store",
                                                                  "s3://bucket/jobs"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--master", "local[2]", "--deploy-mode", "cluster"], "error: deploy mode cluster with master 'local[2]'"),
        (["--conf", "spark.ui.enabled"], "error: invalid --conf 'spark.ui.enabled': expected KEY=VALUE"),
        (["--checkpoint-interval", "soon"], "error: --checkpoint-interval: expected seconds or 'none'"),
        (["--supervise", "--restart-strategy", "fixed-delay", "--restart-interval", "5"],
         "error: --restart-interval applies to failure-rate only"),
        (["--supervise", "--restart-delay", "-1", "--restart-strategy", "failure-rate"],
         "error: failure-rate delay must be >= 0, found -1.0"),
        (["--max-restarts-in-window", "0"], "error: health rule max restarts must be > 0, found 0"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code, out, err = _run_dry(capsys, str(job_file), "--job", "orders", "--store", str(tmp_path), *extra)
    assert (code, out) == (2, "")
    assert err.startswith(message)


def test_missing_store_or_job_exits_2(job_file: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_STORE", raising=False)
    monkeypatch.delenv("CKPT_JOB", raising=False)
    code, _, err = _run_dry(capsys, str(job_file), "--job", "orders")
    assert code == 2 and err.startswith("error: no job store given")


def _fake_spark_submit(tmp_path: Path, codes: list[int]) -> str:
    """An executable standing in for spark-submit: exits with ``codes`` in turn, one per run."""
    path = tmp_path / "spark-submit"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys\n"
        f"log = {str(tmp_path / 'runs.log')!r}\n"
        "with open(log, 'a') as fh: fh.write('run\\n')\n"
        f"code = {codes!r}[len(open(log).read().split()) - 1]\n"
        "os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (3, 3), (-15, 143)])
def test_run_once_returns_the_driver_exit_code(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], code: int, expected: int
) -> None:
    submit = _fake_spark_submit(tmp_path, [code])
    args = ["run", str(job_file), "--job", "orders", "--store", str(tmp_path / "store"), "--spark-submit", submit]
    assert cli.main(args) == expected
    assert (tmp_path / "runs.log").read_text() == "run\n"


def test_run_supervised_restarts_and_reports_the_outcome(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit = _fake_spark_submit(tmp_path, [1, -9, 3])
    code = cli.main(["run", str(job_file), "--job", "orders", "--store", str(tmp_path / "store"), "--spark-submit",
                     submit, "--supervise", "--restart-strategy", "fixed-delay", "--restart-attempts", "5",
                     "--restart-delay", "0", "--json"])
    assert code == 3
    assert json.loads(capsys.readouterr().out) == {
        "final": "fenced", "attempts": 3, "restarts": 2, "exit_code": 3,
        "reason": "a newer driver took the job's lease and runs the job: not restarting",
    }


class _IgnoresSigterm:
    """A driver that ignores SIGTERM; its first wait delivers the user's SIGTERM to this process."""

    pid = 4242

    def __init__(self) -> None:
        self.now = 0.0
        self.signals: list[tuple[int, float]] = []
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        if self.code is not None:
            return self.code
        if not self.signals:
            signal.raise_signal(signal.SIGTERM)  # run_once's handler forwards it
        if timeout is None:
            raise AssertionError("wait() without timeout on a driver that never exits")
        self.now += timeout
        raise subprocess.TimeoutExpired("spark-submit", timeout)

    def send_signal(self, sig: int) -> None:
        self.signals.append((sig, self.now))
        if sig == signal.SIGKILL:
            self.code = -signal.SIGKILL


def test_run_once_kills_a_driver_still_running_a_grace_period_after_sigterm() -> None:
    proc = _IgnoresSigterm()
    code = run_once(["spark-submit"], {}, grace=60.0, spawn=lambda _argv, _env, _cwd=None: proc, clock=lambda: proc.now)
    assert code == 128 + signal.SIGKILL
    assert proc.signals == [(signal.SIGTERM, 0.0), (signal.SIGKILL, 60.0)]


def test_run_once_kills_a_real_process_group_ignoring_sigterm(tmp_path: Path) -> None:
    ready, child_pid = tmp_path / "ready", tmp_path / "child.pid"
    submit = tmp_path / "spark-submit"
    submit.write_text(
        f"#!{sys.executable}\n"
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        f"open({str(ready)!r}, 'w').write('ready')\n"
        "time.sleep(60)\n"
    )
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)

    def interrupt() -> None:  # the user's kill, once the driver ignores SIGTERM
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda _s, _f: None)  # a SIGTERM outside run_once is harmless
    thread = threading.Thread(target=interrupt)
    started = time.monotonic()
    try:
        thread.start()
        code = run_once([str(submit)], {}, grace=0.5)
    finally:
        thread.join()
        signal.signal(signal.SIGTERM, previous)
    assert code == 128 + signal.SIGKILL
    assert time.monotonic() - started < 15.0
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the driver's child was killed with its group


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("deploy", [[], ["--master", "yarn", "--deploy-mode", "cluster", "--checkpoint", "s3a://b/c"]])
def test_dry_run_shows_the_endpoint_the_driver_uses_never_none(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    deploy: list[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    code, out, _ = _run_dry(capsys, str(job_file), "--job", "orders", "--store", "s3://bucket/jobs", *deploy)
    assert code == 0
    argv = shlex.split(out.splitlines()[0])
    assert "none" not in [a.lower() for a in argv]
    assert "--region" not in argv
    if deploy:  # the driver runs in the cluster: its own environment decides, nothing is claimed here
        assert "--endpoint-url" not in argv
    else:  # the driver inherits this environment: the command names the endpoint it will use
        assert argv[argv.index("--endpoint-url") + 1] == "http://127.0.0.1:8333"
