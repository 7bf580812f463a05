"""`ckpt run --dry-run --json` on YARN and Kubernetes in cluster mode: who restarts the driver, what the cluster
must reach (docs/cluster.md). The real CLI, exact argv; nothing is built and nothing runs."""

from __future__ import annotations

import json
import socket
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

import airflow_ckpt_provider.runtime
from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.gate import GATE_ENV
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
from airflow_ckpt_provider.embedded.process import free_port
from airflow_ckpt_provider.launcher.submit import check_master, gate_file, gate_name, on_loopback
from airflow_ckpt_provider.runtime.config import RuntimeConfig

SUBMIT = "/opt/spark/bin/spark-submit"
LAUNCH = str(Path(airflow_ckpt_provider.runtime.__file__).parent / "entrypoint.py")
K8S = "k8s://https://k8s:6443"
UPLOAD = "spark.kubernetes.file.upload.path=s3a://uploads/ckpt"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment cache in tmp_path, no inherited Python or launch id (they would change the command)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("CKPT_ENV_CACHE", str(path))
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP", LAUNCH_ENV):
        monkeypatch.delenv(key, raising=False)
    return path


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """An archive the user packed (its content does not matter to a dry run)."""
    path = tmp_path / "env.tar.gz"
    path.write_bytes(b"not really a tarball")
    return path


def dry_run(capsys: pytest.CaptureFixture[str], job_file: Path | str, *extra: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main(["run", str(job_file), "--job", "orders", "--store", "s3://bucket/jobs", "--checkpoint",
                     "s3a://bucket/ckpt/orders", "--spark-submit", SUBMIT, *extra, "--dry-run", "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {}), err


def confs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]


def tail(argv: list[str]) -> RuntimeConfig:
    """The runtime config entrypoint.py gets (after the job file's name)."""
    return RuntimeConfig.from_args(argv[argv.index(LAUNCH) + 2:])


def test_yarn_cluster_supervised_leaves_restarts_to_the_supervisor_and_ships_the_python(
    capsys: pytest.CaptureFixture[str], job_file: Path, cache: Path
) -> None:
    code, data, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--supervise")
    assert (code, err) == (0, "")
    argv = data["argv"]
    shipped = data["python_env"]
    archive, (code_zip,) = shipped["archive"], shipped["py_files"]
    assert Path(archive).parent == cache and Path(archive).name.startswith("ckpt-env-")
    assert Path(code_zip).parent == cache and Path(code_zip).name.startswith("ckpt-provider-")
    assert argv == [
        SUBMIT, "--master", "yarn", "--deploy-mode", "cluster", "--name", "ckpt-orders",
        "--conf", "spark.pyspark.python=./ckpt-env/bin/python",
        "--conf", f"spark.yarn.appMasterEnv.{GATE_ENV}={gate_name(tail(argv))}",
        "--conf", "spark.yarn.maxAppAttempts=1",
        "--conf", "spark.yarn.submit.waitAppCompletion=true",
        "--py-files", code_zip,
        "--files", str(job_file),
        "--archives", f"{archive}#ckpt-env",
        LAUNCH, "count.py", *tail(argv).to_args(),
    ]
    assert tail(argv).checkpoint == "s3a://bucket/ckpt/orders"
    assert data["env"] == {}  # the driver runs in the cluster: nothing of this host's environment is meant for it
    assert data["supervise"]["strategy"].startswith("exponential-delay")
    # A dry run builds nothing: no environment, no code zip, not even the cache directory.
    assert shipped["built"] is False
    assert not cache.exists()


@pytest.mark.parametrize("attempts", ["3", " 2"])
def test_yarn_attempts_with_supervise_are_refused(
    capsys: pytest.CaptureFixture[str], job_file: Path, attempts: str
) -> None:
    code, data, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--supervise",
                              "--conf", f"spark.yarn.maxAppAttempts={attempts}")
    assert (code, data) == (2, {})
    n = attempts.strip()
    assert err == (
        f"error: --conf spark.yarn.maxAppAttempts={n} with --supervise: YARN would relaunch the driver (its "
        "application master) while the supervisor starts another, two owners of one restart; expected "
        "spark.yarn.maxAppAttempts=1 (what --supervise sets): drop the setting and the supervisor restarts the "
        "driver, or drop --supervise and YARN does, with spark.yarn.am.attemptFailuresValidityInterval "
        "(docs/cluster.md)\n"
    )


def test_yarn_unsupervised_may_let_yarn_restart_the_driver(
    capsys: pytest.CaptureFixture[str], job_file: Path
) -> None:
    code, data, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env",
                              "none", "--conf", "spark.yarn.maxAppAttempts=3",
                              "--conf", "spark.yarn.am.attemptFailuresValidityInterval=1h")
    assert (code, err) == (0, "")
    assert data["supervise"] is None and data["python_env"] is None
    assert confs(data["argv"]) == [
        "spark.yarn.maxAppAttempts=3", "spark.yarn.am.attemptFailuresValidityInterval=1h",
        f"spark.yarn.appMasterEnv.{GATE_ENV}={gate_name(tail(data['argv']))}",
        "spark.yarn.submit.waitAppCompletion=true",
    ]


def test_yarn_never_restarts_an_unsupervised_driver_unless_asked(
    capsys: pytest.CaptureFixture[str], job_file: Path
) -> None:
    """YARN's own default (yarn.resourcemanager.am.max-attempts, 2) would make it a second, silent owner."""
    code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none")
    assert code == 0
    assert confs(data["argv"])[1:] == ["spark.yarn.maxAppAttempts=1", "spark.yarn.submit.waitAppCompletion=true"]


@pytest.mark.parametrize("restore", ["latest-savepoint", "none", "savepoint-7-20260101T000000Z-abcdef"])
def test_yarn_restarts_resume_only_with_latest_state(
    capsys: pytest.CaptureFixture[str], job_file: Path, restore: str
) -> None:
    code, _, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none",
                           "--restore", restore, "--conf", "spark.yarn.maxAppAttempts=2")
    assert code == 2
    assert err == (
        f"error: --conf spark.yarn.maxAppAttempts=2 with --restore {restore}: every attempt YARN starts runs the "
        f"same command, so a relaunched driver would restore {restore} again instead of resuming; expected "
        "--restore latest-state (the default) when YARN restarts the driver: start from the snapshot with "
        "--supervise instead (its restarts resume with latest-state), or start it once, stop it, and relaunch "
        "with latest-state\n"
    )
    code, _, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none",
                           "--restore", restore)  # YARN does not restart: any restore
    assert (code, err) == (0, "")


def test_yarn_client_mode_attempts_do_not_restart_the_driver(
    capsys: pytest.CaptureFixture[str], job_file: Path
) -> None:
    """In client mode YARN's application master only launches executors; the driver is the supervisor's child."""
    code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--supervise", "--python-env", "none",
                            "--conf", "spark.yarn.maxAppAttempts=3")
    assert code == 0
    assert confs(data["argv"]) == ["spark.yarn.maxAppAttempts=3"]
    assert data["env"][GATE_ENV] == gate_file(tail(data["argv"]))


def test_a_supervisor_needs_spark_submit_to_wait_for_the_driver(
    capsys: pytest.CaptureFixture[str], job_file: Path
) -> None:
    setting = "spark.yarn.submit.waitAppCompletion"
    base = ["--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none", "--conf", f"{setting}=false"]
    code, _, err = dry_run(capsys, job_file, *base, "--supervise")
    assert code == 2
    assert err == (f"error: --conf {setting}=false with --supervise: spark-submit would return once the driver is "
                   f"submitted and the supervisor would take that for the driver's end; expected {setting}=true "
                   "(what ckpt run sets): drop the setting, or run without --supervise\n")
    code, data, _ = dry_run(capsys, job_file, *base)  # unsupervised: submit and return is the user's choice
    assert code == 0 and f"{setting}=false" in confs(data["argv"])


def test_k8s_cluster_mode_is_supervised_by_the_drivers_own_word(capsys: pytest.CaptureFixture[str],
                                                                 job_file: Path) -> None:
    """spark-submit exits 0 whatever the driver pod's end; the supervisor decides on the end record the driver
    writes (tests/unit/launcher/test_supervisor_cluster_ends.py), so a supervised cluster-mode command is built."""
    code, data, err = dry_run(capsys, job_file, "--master", K8S, "--deploy-mode", "cluster", "--supervise",
                              "--python-env", "none", "--conf", UPLOAD)
    assert (code, err) == (0, "")
    assert "spark.kubernetes.submission.waitAppCompletion=true" in confs(data["argv"])


def test_k8s_cluster_mode_as_a_sparkapplication_holds_one_resource_per_driver(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, data, err = dry_run(capsys, "local:///opt/jobs/orders.py", "--master", K8S, "--deploy-mode", "cluster",
                              "--supervise", "--python-env", "none", "--conf", "spark.ckpt.submitter=sparkapplication",
                              "--conf", "spark.kubernetes.container.image=reg/ckpt:1")
    assert (code, err) == (0, "")
    argv = data["argv"]
    assert argv[:4] == [sys.executable, "-m", "airflow_ckpt_provider.launcher.sparkapp", "--manifest"]
    resource = json.loads(argv[4])
    assert (resource["kind"], resource["spec"]["restartPolicy"], resource["spec"]["image"]) == (
        "SparkApplication", {"type": "Never"}, "reg/ckpt:1")
    assert resource["spec"]["deps"] == {"files": ["local:///opt/jobs/orders.py"]}


def test_k8s_cluster_with_an_s3a_archive(capsys: pytest.CaptureFixture[str], job_file: Path, cache: Path) -> None:
    code, data, err = dry_run(capsys, job_file, "--master", K8S, "--deploy-mode", "cluster",
                              "--python-env", "s3a://bucket/env.tar.gz", "--conf", UPLOAD)
    assert (code, err) == (0, "")
    argv = data["argv"]
    (code_zip,) = data["python_env"]["py_files"]
    assert argv == [
        SUBMIT, "--master", K8S, "--deploy-mode", "cluster", "--name", "ckpt-orders",
        "--conf", UPLOAD,
        "--conf", "spark.pyspark.python=./ckpt-env/bin/python",
        "--conf", f"spark.kubernetes.driverEnv.{GATE_ENV}={gate_name(tail(argv))}",
        "--conf", "spark.kubernetes.submission.waitAppCompletion=true",
        "--py-files", code_zip,
        "--files", str(job_file),
        "--archives", "s3a://bucket/env.tar.gz#ckpt-env",
        LAUNCH, "count.py", *tail(argv).to_args(),
    ]
    assert not any(c.startswith("spark.yarn.") for c in confs(argv))
    assert data["supervise"] is None
    assert data["python_env"]["built"] is False and not cache.exists()


def test_k8s_cluster_with_a_local_archive_and_an_upload_path(
    capsys: pytest.CaptureFixture[str], job_file: Path, archive: Path, cache: Path
) -> None:
    code, data, err = dry_run(capsys, job_file, "--master", K8S, "--deploy-mode", "cluster", "--python-env",
                              str(archive), "--conf", UPLOAD)
    assert (code, err) == (0, "")
    argv = data["argv"]
    assert argv[argv.index("--archives") + 1] == f"{archive}#ckpt-env"
    assert argv[argv.index("--py-files") + 1] == data["python_env"]["py_files"][0]
    assert confs(argv)[:2] == [UPLOAD, "spark.pyspark.python=./ckpt-env/bin/python"]
    assert not cache.exists()  # nothing built: no code zip, no environment


@pytest.mark.parametrize(
    ("python_env", "files"),
    [
        ("archive", "entrypoint.py, count.py, ckpt-provider-*.zip, env.tar.gz"),
        ("s3a://bucket/env.tar.gz", "entrypoint.py, count.py, ckpt-provider-*.zip"),
        ("none", "entrypoint.py, count.py"),  # the runtime's own entrypoint.py is always a local file
    ],
)
def test_k8s_cluster_with_local_files_and_no_upload_path_is_refused(
    capsys: pytest.CaptureFixture[str], job_file: Path, archive: Path, python_env: str, files: str
) -> None:
    env = str(archive) if python_env == "archive" else python_env
    code, data, err = dry_run(capsys, job_file, "--master", K8S, "--deploy-mode", "cluster", "--python-env", env)
    assert (code, data) == (2, {})
    prefix = "error: Kubernetes cluster mode with local files ("
    assert err.startswith(prefix)
    listed = err[len(prefix):err.index(")")]
    assert fnmatch(listed, files), listed
    assert err[len(prefix) + len(listed):] == (
        ") and no spark.kubernetes.file.upload.path: the driver pod cannot read this host's disk, and spark-submit "
        "uploads local files only to that path; expected --conf spark.kubernetes.file.upload.path=s3a://BUCKET/PREFIX"
        " (a Hadoop path the driver pod can read), or these files as URIs the cluster reads (s3a://, https://, "
        "local:// for a file in the image)\n"
    )


def test_k8s_client_mode_needs_no_upload_path(capsys: pytest.CaptureFixture[str], job_file: Path) -> None:
    """In client mode the driver runs here and serves the files to the executors itself."""
    code, data, _ = dry_run(capsys, job_file, "--master", K8S, "--python-env", "none")
    assert code == 0
    assert confs(data["argv"]) == []
    assert data["env"][GATE_ENV] == gate_file(tail(data["argv"]))


@pytest.mark.parametrize(
    ("master", "prefix"), [("yarn", "spark.yarn.appMasterEnv"), (K8S, "spark.kubernetes.driverEnv")]
)
def test_a_remote_driver_gets_its_gate_and_launch_id_through_conf(
    capsys: pytest.CaptureFixture[str], job_file: Path, monkeypatch: pytest.MonkeyPatch, master: str, prefix: str
) -> None:
    monkeypatch.setenv(LAUNCH_ENV, "20260101T000000Z-abc123")
    code, data, _ = dry_run(capsys, job_file, "--master", master, "--deploy-mode", "cluster", "--python-env", "none",
                            "--conf", UPLOAD)
    assert code == 0
    settings = confs(data["argv"])
    assert f"{prefix}.{GATE_ENV}={gate_name(tail(data['argv']))}" in settings
    assert f"{prefix}.{LAUNCH_ENV}=20260101T000000Z-abc123" in settings
    assert GATE_ENV not in data["env"] and LAUNCH_ENV not in data["env"]


def test_a_given_driver_env_wins(capsys: pytest.CaptureFixture[str], job_file: Path) -> None:
    code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none",
                            "--conf", f"spark.yarn.appMasterEnv.{GATE_ENV}=/var/run/gate",
                            "--conf", "spark.yarn.submit.waitAppCompletion=TRUE", "--supervise")
    assert code == 0
    assert confs(data["argv"]) == [f"spark.yarn.appMasterEnv.{GATE_ENV}=/var/run/gate",
                                   "spark.yarn.submit.waitAppCompletion=TRUE", "spark.yarn.maxAppAttempts=1"]


@pytest.mark.parametrize("value", ["0", "many", ""])
def test_yarn_attempts_must_be_a_count(capsys: pytest.CaptureFixture[str], job_file: Path, value: str) -> None:
    code, _, err = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env", "none",
                           "--conf", f"spark.yarn.maxAppAttempts={value}")
    assert code == 2
    assert err == (f"error: --conf spark.yarn.maxAppAttempts={value}: expected a whole number of attempts >= 1 "
                   "(1: YARN never relaunches the driver)\n")


def test_standalone_client_mode_ships_the_python_binds_a_loopback_driver_and_names_its_own_python(
        capsys: pytest.CaptureFixture[str], job_file: Path, cache: Path) -> None:
    code, out, err = dry_run(capsys, job_file, "--master", "spark://127.0.0.1:7077", "--supervise")
    assert code == 0, err
    argv, shipped = out["argv"], out["python_env"]
    assert argv[:7] == [SUBMIT, "--master", "spark://127.0.0.1:7077", "--deploy-mode", "client", "--name",
                        "ckpt-orders"]
    assert {"spark.driver.bindAddress=127.0.0.1", "spark.driver.host=127.0.0.1",
            "spark.pyspark.python=./ckpt-env/bin/python",
            f"spark.pyspark.driver.python={sys.executable}"} <= set(confs(argv))
    assert argv[argv.index("--archives") + 1] == f"{shipped['archive']}#ckpt-env"
    assert argv[argv.index("--py-files") + 1] == shipped["py_files"][0]
    assert Path(shipped["archive"]).parent == cache and shipped["built"] is False
    assert out["env"]["SPARK_LOCAL_IP"] == "127.0.0.1" and out["env"]["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert "PYSPARK_PYTHON" not in out["env"]  # executors run the archive's, not a path of this host
    assert not cache.exists()  # a dry run builds nothing


def test_a_remote_standalone_master_does_not_bind_the_driver_to_loopback() -> None:
    assert on_loopback("spark://127.0.0.1:7077") and on_loopback("spark://localhost:7077")
    assert on_loopback("local[2]")
    assert not on_loopback("spark://master.example:7077") and not on_loopback("yarn")


def test_an_unreachable_standalone_master_is_refused_with_what_to_check() -> None:
    closed = free_port()  # nothing listens there once the probe closed it
    with pytest.raises(ConfigError, match=rf"Spark master spark://127\.0\.0\.1:{closed} is unreachable \(127\.0\.0"
                                          r".*expected a standalone master listening there; check the host and port"):
        check_master(f"spark://127.0.0.1:{closed}", timeout=2)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_master(f"spark://127.0.0.1:{closed},127.0.0.1:{server.getsockname()[1]}")  # one of two HA masters
    check_master("yarn")  # not probed


def test_the_job_s_own_py_files_and_files_ship_with_the_provider_s_code_on_one_list_each(
    capsys: pytest.CaptureFixture[str], job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit ignores spark.submit.pyFiles, spark.files and spark.archives once --py-files, --files and
    --archives are given, which a cluster run always gives (the provider's code zip, the job file, the shipped
    Python): the job's entries of every source are merged into the options, each once, the job's before the
    provider's, and the settings leave the command."""
    monkeypatch.chdir(tmp_path)
    code, data, err = dry_run(
        capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster",
        "--py-files", "lib/job_common.py,hdfs:///code/deps.zip", "--files", "schema.json",
        "--conf", "spark.submit.pyFiles=hdfs:///code/deps.zip, lib/extra.zip",
        "--conf", "spark.files=s3a://conf/lookup.csv", "--conf", "spark.archives=s3a://conf/models.tgz#models")
    assert (code, err) == (0, "")
    argv = data["argv"]
    shipped = data["python_env"]
    (code_zip,) = shipped["py_files"]
    assert argv[argv.index("--py-files") + 1].split(",") == [
        str(tmp_path / "lib/job_common.py"), "hdfs:///code/deps.zip", str(tmp_path / "lib/extra.zip"), code_zip]
    assert argv[argv.index("--files") + 1].split(",") == [
        str(tmp_path / "schema.json"), "s3a://conf/lookup.csv", str(job_file)]
    assert argv[argv.index("--archives") + 1].split(",") == [
        "s3a://conf/models.tgz#models", f"{shipped['archive']}#ckpt-env"]
    assert not [c for c in confs(argv) if c.startswith(("spark.submit.pyFiles=", "spark.files=", "spark.archives="))]
    assert argv.count("--py-files") == argv.count("--files") == argv.count("--archives") == 1


def test_py_files_of_the_conf_alone_reach_a_local_run_too(capsys: pytest.CaptureFixture[str], job_file: Path) -> None:
    code, data, _ = dry_run(capsys, job_file, "--master", "local[2]", "--conf", "spark.submit.pyFiles=/code/a.py")
    argv = data["argv"]
    assert code == 0 and argv[argv.index("--py-files") + 1] == "/code/a.py"
    assert "spark.submit.pyFiles=/code/a.py" not in confs(argv)


def run_with(capsys: pytest.CaptureFixture[str], job_file: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``dry_run`` with the job store and the checkpoint left to ``extra``."""
    code = cli.main(["run", str(job_file), "--job", "orders", "--spark-submit", SUBMIT, *extra, "--dry-run", "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {}), err


CLUSTERS = [
    pytest.param(["--master", "yarn"], "YARN cluster mode runs the driver in YARN's application master container",
                 id="yarn"),
    pytest.param(["--master", K8S, "--conf", UPLOAD], "Kubernetes cluster mode runs the driver in a Kubernetes "
                 "driver pod", id="k8s"),
]


@pytest.mark.parametrize(("master", "where"), CLUSTERS)
def test_cluster_mode_without_a_checkpoint_is_refused_not_run_on_the_driver_s_disk(
    capsys: pytest.CaptureFixture[str], job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    master: list[str], where: str
) -> None:
    """The default live checkpoint ($CKPT_HOME/jobs/JOB/checkpoint) is on the launching host: a driver in the
    cluster would silently keep its checkpoint on its own container's disk."""
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    code, data, err = run_with(capsys, job_file, "--store", "s3://bucket/jobs", *master, "--deploy-mode", "cluster",
                               "--python-env", "none")
    assert (code, data) == (2, {})
    assert err == (
        f"error: the live checkpoint is a path on this host ({tmp_path}/home/jobs/orders/checkpoint, the default "
        f"$CKPT_HOME/jobs/JOB/checkpoint as no --checkpoint was given), but {where}, not here, and the executors' "
        "state stores write to the checkpoint too: each would write to its own disk, and a restarted driver would "
        "find no checkpoint; expected --checkpoint s3a://BUCKET/PREFIX (or s3://), a location the driver and every "
        "executor can read (docs/cluster.md, Where the live checkpoint lives)\n"
    )
    assert not (tmp_path / "home").exists()  # nothing written, nothing launched


@pytest.mark.parametrize(("master", "where"), CLUSTERS)
@pytest.mark.parametrize("checkpoint", ["/data/ckpt/orders", "file:///data/ckpt/orders"])
def test_cluster_mode_with_a_local_checkpoint_is_refused(
    capsys: pytest.CaptureFixture[str], job_file: Path, master: list[str], where: str, checkpoint: str
) -> None:
    code, data, err = run_with(capsys, job_file, "--store", "s3://bucket/jobs", "--checkpoint", checkpoint, *master,
                               "--deploy-mode", "cluster", "--python-env", "none")
    assert (code, data) == (2, {})
    assert err.startswith(f"error: the live checkpoint is a path on this host ({checkpoint}), but {where}, not here")
    assert "expected --checkpoint s3a://BUCKET/PREFIX (or s3://)" in err


@pytest.mark.parametrize(("master", "where"), CLUSTERS)
def test_cluster_mode_with_a_local_job_store_is_refused(
    capsys: pytest.CaptureFixture[str], job_file: Path, tmp_path: Path, master: list[str], where: str
) -> None:
    store = str(tmp_path / "store")
    code, data, err = run_with(capsys, job_file, "--store", store, "--checkpoint", "s3a://bucket/ckpt/orders",
                               *master, "--deploy-mode", "cluster", "--python-env", "none")
    assert (code, data) == (2, {})
    assert err == (
        f"error: the job store is a path on this host ({store}), but {where}, not here: the driver would write its "
        "lease, status and snapshots to that host's disk, where no supervisor, Airflow task or ckpt command sees "
        "them; expected --store s3://BUCKET/PREFIX, a location the driver and this host both reach (docs/cluster.md, "
        "Where the job store lives)\n"
    )


@pytest.mark.parametrize("master", ["yarn", K8S, "spark://master.example:7077"])
def test_client_mode_with_remote_executors_and_a_local_checkpoint_warns_with_the_reason(
    capsys: pytest.CaptureFixture[str], job_file: Path, tmp_path: Path, master: str
) -> None:
    """A file system mounted at the same path on every host (NFS) works, and this host cannot tell one: a warning,
    and the command is built."""
    code, data, err = run_with(capsys, job_file, "--store", str(tmp_path / "store"), "--checkpoint", "/shared/ckpt",
                               "--master", master, "--python-env", "none")
    assert code == 0 and data["argv"]
    assert err == (
        f"warning: the live checkpoint /shared/ckpt is a path on this host, and the executors run on other hosts "
        f"(master {master}): their state stores write to the checkpoint too, so it must be a file system mounted at "
        "that same path on this host and on every executor's host (NFS and the like), else the state is split over "
        "the hosts' disks and lost; if it is not, pass --checkpoint s3a://BUCKET/PREFIX (docs/cluster.md, Where the "
        "live checkpoint lives)\n"
    )


@pytest.mark.parametrize(("master", "checkpoint"), [
    ("local[2]", "/data/ckpt"), ("spark://127.0.0.1:7077", "/data/ckpt"), ("yarn", "s3a://bucket/ckpt/orders"),
])
def test_no_warning_where_the_checkpoint_is_shared(
    capsys: pytest.CaptureFixture[str], job_file: Path, tmp_path: Path, master: str, checkpoint: str
) -> None:
    code, _, err = run_with(capsys, job_file, "--store", str(tmp_path / "store"), "--checkpoint", checkpoint,
                            "--master", master, "--python-env", "none")
    assert (code, err) == (0, "")


def test_k8s_cluster_dry_run_json_is_what_a_spark_application_can_take_as_it_is(
    capsys: pytest.CaptureFixture[str], job_file: Path, cache: Path
) -> None:
    """docs/cluster.md says to copy this JSON into a SparkApplication: secret references stay whole (they name a
    secret, they hold none), the environment archive is said to be the user's, and the driver pod gets no path of
    this host."""
    refs = ["spark.kubernetes.driver.secretKeyRef.AWS_ACCESS_KEY_ID=aws:id",
            "spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY=aws:secret",
            "spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY=aws:secret",
            "spark.kubernetes.driver.secrets.kafka-tls=/etc/kafka-tls",
            "spark.kubernetes.executor.secrets.kafka-tls=/etc/kafka-tls"]
    code, data, err = dry_run(capsys, job_file, "--master", K8S, "--deploy-mode", "cluster",
                              "--python-env", "s3a://bucket/envs/env.tar.gz", "--conf", UPLOAD,
                              *(arg for ref in refs for arg in ("--conf", ref)))
    assert (code, err) == (0, "")
    argv = data["argv"]
    gate = gate_name(tail(argv))
    assert fnmatch(gate, "ckpt-gate-orders-????????????") and "/" not in gate
    assert confs(argv) == [UPLOAD, *refs, "spark.pyspark.python=./ckpt-env/bin/python",
                           f"spark.kubernetes.driverEnv.{GATE_ENV}={gate}",
                           "spark.kubernetes.submission.waitAppCompletion=true"]
    assert "redacted" not in data["command"] and all(ref in data["command"] for ref in refs)
    (code_zip,) = data["python_env"]["py_files"]
    assert data["python_env"] == {"archive": "s3a://bucket/envs/env.tar.gz", "py_files": [code_zip],
                                  "built": False, "given": True, "requirements": [], "requirements_file": None}
    assert data["env"] == {} and data["supervise"] is None


def test_only_an_archive_built_here_is_said_to_be_built(
    capsys: pytest.CaptureFixture[str], job_file: Path, archive: Path, cache: Path
) -> None:
    """``built``: this provider built the archive (auto, ship) and it is in the cache; ``given``: the user's."""
    code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster")
    assert code == 0 and (data["python_env"]["built"], data["python_env"]["given"]) == (False, False)
    (code_zip,) = data["python_env"]["py_files"]
    cache.mkdir()
    Path(code_zip).write_bytes(b"zip")
    Path(data["python_env"]["archive"]).write_bytes(b"env")
    code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster")
    assert code == 0 and (data["python_env"]["built"], data["python_env"]["given"]) == (True, False)
    for given in (str(archive), "s3a://bucket/envs/env.tar.gz"):  # the code zip exists: still not built here
        code, data, _ = dry_run(capsys, job_file, "--master", "yarn", "--deploy-mode", "cluster", "--python-env",
                                given)
        assert code == 0 and (data["python_env"]["built"], data["python_env"]["given"]) == (False, True)
    code = cli.main(["run", str(job_file), "--job", "orders", "--store", "s3://bucket/jobs", "--checkpoint",
                     "s3a://bucket/ckpt/orders", "--spark-submit", SUBMIT, "--master", "yarn", "--deploy-mode",
                     "cluster", "--python-env", "s3a://bucket/envs/env.tar.gz", "--dry-run"])
    assert code == 0
    assert "python env: s3a://bucket/envs/env.tar.gz (given, shipped as it is), code " in capsys.readouterr().out
