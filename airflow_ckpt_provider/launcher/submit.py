"""The spark-submit command that runs one job under the runtime: ``entrypoint.py`` as the primary resource.

Only combinations spark-submit accepts are built, so a bad one fails here with a clear message instead
of in the JVM. Credentials travel only through the inherited environment or the cluster's secret mechanism,
never on the command line, where ``ps`` shows them to every user of the host; ``describe`` redacts the values
of secret-looking settings as Spark's UI does.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.gate import GATE_ENV
from airflow_ckpt_provider.runtime.config import RuntimeConfig

#: The driver program spark-submit runs; it sits next to this module.
ENTRYPOINT_PY = Path(__file__).absolute().parent.parent / "runtime" / "entrypoint.py"
LOOPBACK = "127.0.0.1"
DEPLOY_MODES = ("client", "cluster")

#: Settings whose values are secrets: Spark's default spark.redaction.regex plus Azure's account keys
#: (spark.hadoop.fs.azure.account.key.<account>...). Refused on argv, redacted by ``describe``.
_SECRET_CONF = re.compile(r"secret|password|token|access[.]key|account[.]key", re.IGNORECASE)
#: Secret-looking settings that only name a secret: Kubernetes secret references, token files.
_SECRET_REFERENCE = re.compile(r"^spark\.kubernetes\.(?:driver|executor)\.(?:secrets|secretKeyRef)\.|File$")
REDACTED = "*********(redacted)"  # what Spark shows in place of a redacted value


@dataclass(frozen=True)
class SubmitSpec:
    """Where and how to run a job file: Spark's master, deploy mode, settings and extra files.

    ``env_python`` is the interpreter for PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON; unset, it is this
    interpreter where that is the one that runs (see ``build_command``).
    """

    job_file: str
    config: RuntimeConfig
    master: str = "local[2]"
    deploy_mode: str = "client"
    conf: Mapping[str, str] = field(default_factory=dict)
    py_files: Sequence[str] = ()
    files: Sequence[str] = ()
    name: str | None = None
    spark_submit: str | None = None
    env_python: str | None = None

    @property
    def app_name(self) -> str:
        return self.name or f"ckpt-{self.config.job}"


def parse_conf(entries: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` as given to ``--conf``, into a dict; the last of repeated keys wins, as in Spark."""
    conf: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"invalid --conf {entry!r}: expected KEY=VALUE (a Spark setting such as "
                "spark.sql.shuffle.partitions=4); add the '=' and the value"
            )
        conf[key.strip()] = value
    return conf


def find_spark_submit(explicit: str | None = None) -> str:
    """spark-submit: as given, else next to this Python (pyspark's), else in $SPARK_HOME/bin, else on PATH."""
    if explicit:
        return explicit if os.sep in explicit else shutil.which(explicit) or explicit
    candidates = [Path(sys.executable).parent / "spark-submit"]  # not resolved: a venv's bin is a symlink farm
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"], "bin", "spark-submit"))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("spark-submit")
    if found:
        return found
    raise ConfigError(
        f"spark-submit not found: looked in {', '.join(str(c.parent) for c in candidates)} and on PATH; "
        "install pyspark into this environment, set SPARK_HOME, or pass --spark-submit PATH"
    )


def cluster_manager(master: str) -> str:
    """``local``, ``standalone``, ``yarn`` or ``k8s``; the masters spark-submit knows."""
    if master == "yarn":
        return "yarn"
    if master.startswith("spark://"):
        return "standalone"
    if master.startswith("k8s://"):
        return "k8s"
    if master.startswith("local"):
        return "local"
    raise ConfigError(
        f"unknown Spark master {master!r}: expected local[N], spark://HOST:PORT, yarn or k8s://https://HOST:PORT"
    )


def _check(spec: SubmitSpec) -> str:
    """Refuse what spark-submit refuses; the cluster manager."""
    manager = cluster_manager(spec.master)
    if spec.deploy_mode not in DEPLOY_MODES:
        raise ConfigError(f"unknown deploy mode {spec.deploy_mode!r}: expected client or cluster")
    if spec.deploy_mode == "cluster" and manager in ("local", "standalone"):
        raise ConfigError(
            f"deploy mode cluster with master {spec.master!r}: spark-submit runs Python applications in "
            "cluster mode only on YARN and Kubernetes; use --deploy-mode client"
        )
    for key in spec.conf:
        if not key or "=" in key:
            raise ConfigError(f"invalid Spark setting name {key!r}: expected a name such as spark.executor.memory")
        if _SECRET_CONF.search(key) and not _SECRET_REFERENCE.search(key):
            raise ConfigError(
                f"refusing --conf {key}: a credential on the command line is visible to every user of the host; "
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, use the cluster's secret "
                "mechanism (Kubernetes secrets: spark.kubernetes.driver.secretKeyRef.ENV=SECRET:KEY; YARN: a "
                "Hadoop credential provider) or an instance role instead"
            )
    path = _job_path(spec.job_file)
    if path is None and spec.deploy_mode == "client":
        raise ConfigError(
            f"job file {spec.job_file}: in client mode the job file must be a local file; download it, "
            "or use --deploy-mode cluster so spark-submit ships it"
        )
    if path is not None and not path.is_file():
        raise ConfigError(f"job file {spec.job_file} not found: expected a Python file defining the job")
    return manager


def _job_path(job_file: str) -> Path | None:
    """The job file's absolute local path, or None for a remote URI (s3a://, hdfs://) spark-submit fetches."""
    parsed = urlparse(job_file)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None if parsed.scheme else Path(job_file).absolute()


#: The conf prefix that sets the environment of a driver running in the cluster.
_DRIVER_ENV_CONF = {"yarn": "spark.yarn.appMasterEnv", "k8s": "spark.kubernetes.driverEnv"}


def gate_file(config: RuntimeConfig) -> str:
    """The admission gate of this job's driver (core/gate.py): one per job and live checkpoint.

    A restore check (``check_restore``) has its own: it must never open or close the running driver's.
    """
    digest = hashlib.sha256(f"{config.job}\0{config.checkpoint}".encode()).hexdigest()[:12]
    kind = "check-" if config.check_restore else ""
    return str(Path(tempfile.gettempdir()) / f"ckpt-gate-{kind}{config.job}-{digest}")


def build_command(spec: SubmitSpec) -> tuple[list[str], dict[str, str]]:
    """The spark-submit argv, and the variables to add to the inherited environment.

    In cluster mode the job file ships with ``--files`` and entrypoint.py finds it by its base name in the
    driver's working directory. PYSPARK_PYTHON defaults to this interpreter only on local masters (on a
    cluster, executors run elsewhere); PYSPARK_DRIVER_PYTHON also in client mode, where the driver runs here.
    """
    manager = _check(spec)
    local = manager == "local"
    cluster = spec.deploy_mode == "cluster"
    conf = dict(spec.conf)
    if local:  # Spark would bind to the first non-loopback interface
        conf.setdefault("spark.driver.bindAddress", LOOPBACK)
        conf.setdefault("spark.driver.host", LOOPBACK)
    gate = gate_file(spec.config)
    if cluster and manager in _DRIVER_ENV_CONF:  # the driver runs remotely: its environment comes from conf
        conf.setdefault(f"{_DRIVER_ENV_CONF[manager]}.{GATE_ENV}", gate)
    path = _job_path(spec.job_file)
    files = list(spec.files)
    if cluster:
        files.append(str(path) if path else spec.job_file)
        job_arg = path.name if path else Path(urlparse(spec.job_file).path).name
    else:
        job_arg = str(path)
    argv = [find_spark_submit(spec.spark_submit), "--master", spec.master, "--deploy-mode", spec.deploy_mode,
            "--name", spec.app_name]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    if spec.py_files:
        argv += ["--py-files", ",".join(spec.py_files)]
    if files:
        argv += ["--files", ",".join(files)]
    argv += [str(ENTRYPOINT_PY), job_arg, *spec.config.to_args()]

    wanted: dict[str, str] = {}
    if spec.env_python or local:
        wanted["PYSPARK_PYTHON"] = spec.env_python or sys.executable
    if spec.env_python or not cluster:
        wanted["PYSPARK_DRIVER_PYTHON"] = spec.env_python or sys.executable
    if local:
        wanted["SPARK_LOCAL_IP"] = LOOPBACK  # the block manager binds to it
    if not cluster:
        wanted[GATE_ENV] = gate
    env = {k: v for k, v in wanted.items() if k not in os.environ}
    return argv, env


def redact(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every ``--conf K=V`` whose key looks secret replaced, as Spark's UI does."""
    out = list(argv)
    for i in range(1, len(out)):
        key, sep, _ = out[i].partition("=")
        if out[i - 1] == "--conf" and sep and _SECRET_CONF.search(key):
            out[i] = f"{key}={REDACTED}"
    return out


def describe(argv: Sequence[str]) -> str:
    """The command as a shell would take it, secrets redacted, for logs."""
    return shlex.join(redact(argv))
