"""The spark-submit command that runs one job under the runtime: ``entrypoint.py`` as the primary resource.

Only combinations spark-submit accepts are built, so a bad one fails here with a clear message instead
of in the JVM. Credentials travel only through the inherited environment or the cluster's secret mechanism,
never on the command line, where ``ps`` shows them to every user of the host; ``describe`` redacts the values
of secret-looking settings as Spark's UI does.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.gate import GATE_ENV
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
from airflow_ckpt_provider.core.records.supervision import DRIVER_RUN_ENV
from airflow_ckpt_provider.launcher.pyenv import ALIAS, ShippedEnv
from airflow_ckpt_provider.runtime.config import RuntimeConfig, default_checkpoint

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
    interpreter where that is the one that runs (see ``build_command``). ``shipped`` is the Python environment
    and code the executors get (launcher/pyenv.py), None where they use what the nodes have. ``supervised``: a
    supervisor (``ckpt run --supervise``) restarts the driver, so YARN must not (docs/cluster.md). ``driver_run``
    names this driver run in cluster mode (core/records/supervision.py ``DriverEnd``: the driver records how it
    ended, which spark-submit's exit code does not say there); the supervisor sets it for each driver it starts.
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
    shipped: ShippedEnv | None = None
    supervised: bool = False
    driver_run: str | None = None

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


def pyspark_home() -> str:
    """The Spark distribution inside the installed pyspark (bin/, jars/), found without importing it."""
    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        raise ConfigError("pyspark is not installed in this environment: expected it next to this provider; "
                          "pip install pyspark, or set SPARK_HOME")
    return str(Path(found.origin).parent)


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


def on_loopback(master: str) -> bool:
    """A local master, or a standalone master on this host's loopback (the embedded cluster): the driver must
    listen on 127.0.0.1 too, where executors on the same host reach it."""
    if master.startswith("local"):
        return True
    host = urlparse(master.split(",", maxsplit=1)[0]).hostname if master.startswith("spark://") else None
    return host in ("127.0.0.1", "localhost", "::1")


def check_master(master: str, timeout: float = 10.0) -> None:
    """A standalone master must accept connections before a driver is started against it: Spark itself would
    retry for a minute and then fail with "All masters are unresponsive". Other masters are not probed."""
    if cluster_manager(master) != "standalone":
        return
    errors = []
    for address in master.removeprefix("spark://").split(","):  # spark://h1:7077,h2:7077 for HA masters
        host, _, port = address.partition(":")
        try:
            with socket.create_connection((host, int(port or 7077)), timeout=timeout):
                return
        except (OSError, ValueError) as err:
            errors.append(f"{address}: {err}")
    raise ConfigError(
        f"Spark master {master} is unreachable ({'; '.join(errors)}): expected a standalone master listening "
        "there; check the host and port in --master (or the ckpt_spark connection), or start the master"
    )


def _check(spec: SubmitSpec) -> str:
    """Refuse what spark-submit refuses; the cluster manager."""
    manager = cluster_manager(spec.master)
    if spec.deploy_mode not in DEPLOY_MODES:
        raise ConfigError(f"unknown deploy mode {spec.deploy_mode!r}: expected client or cluster")
    if spec.deploy_mode == "cluster" and manager in ("local", "standalone"):
        raise ConfigError(
            f"deploy mode cluster with master {spec.master!r}: spark-submit runs Python applications in "
            "cluster mode only on YARN and Kubernetes (on a standalone master it says: Cluster deploy mode is "
            "currently not supported for python applications on standalone clusters); use --deploy-mode client"
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
    submitter(spec)  # a SparkApplication only in Kubernetes cluster mode
    _check_shared_locations(spec, manager)  # a driver in the cluster cannot use this host's disk
    _check_cluster(spec, manager)  # YARN, Kubernetes: one owner per driver restart, files the cluster can reach
    return manager


def _job_path(job_file: str) -> Path | None:
    """The job file's absolute local path, or None for a remote URI (s3a://, hdfs://) spark-submit fetches."""
    parsed = urlparse(job_file)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None if parsed.scheme else Path(job_file).absolute()


#: Where a cluster-mode driver runs, for messages.
_REMOTE_DRIVER = {"yarn": "YARN's application master container", "k8s": "a Kubernetes driver pod"}


def _check_shared_locations(spec: SubmitSpec, manager: str) -> None:
    """Refuse, in YARN or Kubernetes cluster mode, a live checkpoint or job store on this host's disk (a path, or
    ``file://``): the driver runs on another host, so it would write the checkpoint (and the lease and status) to
    its own container's disk, lost with it, while the executors' state stores write to theirs; the default
    checkpoint ($CKPT_HOME/jobs/JOB/checkpoint) is such a path. Client mode only warns
    (``shared_checkpoint_warning``): there a file system mounted at the same path on every host works."""
    if spec.deploy_mode != "cluster" or manager not in _REMOTE_DRIVER:
        return
    where = f"{'YARN' if manager == 'yarn' else 'Kubernetes'} cluster mode runs the driver in {_REMOTE_DRIVER[manager]}"
    checkpoint = spec.config.live_checkpoint
    if _job_path(checkpoint) is not None:
        default = os.path.abspath(default_checkpoint(spec.config.job))
        given = (f"{checkpoint}, the default $CKPT_HOME/jobs/JOB/checkpoint as no --checkpoint was given"
                 if checkpoint in (default, default_checkpoint(spec.config.job)) else checkpoint)
        raise ConfigError(
            f"the live checkpoint is a path on this host ({given}), but {where}, not here, and the executors' "
            "state stores write to the checkpoint too: each would write to its own disk, and a restarted driver "
            "would find no checkpoint; expected --checkpoint s3a://BUCKET/PREFIX (or s3://), a location the driver "
            "and every executor can read (docs/cluster.md, Where the live checkpoint lives)"
        )
    if _job_path(spec.config.store) is not None:
        raise ConfigError(
            f"the job store is a path on this host ({spec.config.store}), but {where}, not here: the driver would "
            "write its lease, status and snapshots to that host's disk, where no supervisor, Airflow task or "
            "ckpt command sees them; expected --store s3://BUCKET/PREFIX, a location the driver and this host "
            "both reach (docs/cluster.md, Where the job store lives)"
        )


def _check_driver_address(spec: SubmitSpec, conf: Mapping[str, str]) -> None:
    """Refuse, in client mode, a driver address that is not one of this host's (``spark.driver.bindAddress`` of the
    final settings ``conf``, or ``spark.driver.host`` which it defaults to): the driver runs here and would fail to
    bind it, once per restart until the strategy gives up. It happens when a restart or upgrade relaunches, on
    another Airflow worker, a deployment whose recorded Spark settings name the first worker's address
    (docs/reliability.md, finding 11)."""
    if spec.deploy_mode != "client":
        return
    key = next((k for k in ("spark.driver.bindAddress", "spark.driver.host") if conf.get(k)), None)
    if key is None:
        return
    address = conf[key]
    try:
        found = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
    except OSError:  # a name that does not resolve here
        found = []
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe, contextlib.suppress(OSError):
            probe.bind(sockaddr[:2])
            return
    raise ConfigError(
        f"--conf {key}={address}: in client mode the driver runs on this host ({socket.gethostname()}) and binds "
        f"that address, but it is not an address of this host; expected one of its addresses, or no {key} (set "
        "SPARK_LOCAL_IP in each worker's environment instead: a restart or upgrade on another worker relaunches "
        "the recorded deployment with its Spark settings, and a host's own address must not be one of them)"
    )


def shared_checkpoint_warning(spec: SubmitSpec) -> str | None:
    """A warning for client mode with executors on other hosts and the live checkpoint on a local path.

    The executors' state stores write to the checkpoint location, so a local path works only where it is a file
    system mounted at that same path on this host and every executor's host (NFS and the like), which this host
    cannot tell: warned, not refused. None on a local master or one on this host's loopback (all on one host), in
    cluster mode (refused there, ``_check_shared_locations``) and for a URI (s3a://).
    """
    checkpoint = spec.config.live_checkpoint
    if spec.deploy_mode != "client" or on_loopback(spec.master) or _job_path(checkpoint) is None:
        return None
    return (
        f"the live checkpoint {checkpoint} is a path on this host, and the executors run on other hosts (master "
        f"{spec.master}): their state stores write to the checkpoint too, so it must be a file system mounted at "
        "that same path on this host and on every executor's host (NFS and the like), else the state is split "
        "over the hosts' disks and lost; if it is not, pass --checkpoint s3a://BUCKET/PREFIX (docs/cluster.md, "
        "Where the live checkpoint lives)"
    )


#: The conf prefix that sets the environment of a driver running in the cluster.
_DRIVER_ENV_CONF = {"yarn": "spark.yarn.appMasterEnv", "k8s": "spark.kubernetes.driverEnv"}


def gate_name(config: RuntimeConfig) -> str:
    """The file name of this job's admission gate (core/policy/gate.py): one per job and live checkpoint.

    A restore check (``check_restore``) has its own: it must never open or close the running driver's. A driver
    in the cluster gets this bare name (core/policy/gate.py resolves it in the temporary directory of its own host)."""
    digest = hashlib.sha256(f"{config.job}\0{config.checkpoint}".encode()).hexdigest()[:12]
    kind = "check-" if config.check_restore else ""
    return f"ckpt-gate-{kind}{config.job}-{digest}"


def gate_file(config: RuntimeConfig) -> str:
    """The admission gate of a driver running on this host: ``gate_name`` in this host's temporary directory."""
    return str(Path(tempfile.gettempdir()) / gate_name(config))


def build_command(spec: SubmitSpec) -> tuple[list[str], dict[str, str]]:
    """The spark-submit argv, and the variables to add to the inherited environment.

    In cluster mode the job file ships with ``--files`` and entrypoint.py finds it by its base name in the
    driver's working directory. A shipped environment (``spec.shipped``) goes with ``--archives`` and
    ``--py-files``, its Python named by ``spark.pyspark.python``.
    """
    manager = _check(spec)
    cluster = spec.deploy_mode == "cluster"
    conf = _conf(spec, manager)
    _check_driver_address(spec, conf)  # a client-mode driver binds here: not another worker's address
    shipping = shipped_lists(spec)
    for key in LIST_CONF.values():  # on the command line instead, merged: spark-submit would ignore them
        conf.pop(key, None)
    path = _job_path(spec.job_file)
    files = shipping["files"]
    if cluster:
        files = merge_paths(files, [str(path) if path else spec.job_file])
        job_arg = path.name if path else Path(urlparse(spec.job_file).path).name
    else:
        job_arg = str(path)
    argv = [find_spark_submit(spec.spark_submit), "--master", spec.master, "--deploy-mode", spec.deploy_mode,
            "--name", spec.app_name]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    if shipping["py_files"]:
        argv += ["--py-files", ",".join(shipping["py_files"])]
    if files:
        argv += ["--files", ",".join(files)]
    if shipping["archives"]:
        argv += ["--archives", ",".join(shipping["archives"])]
    argv += [str(ENTRYPOINT_PY), job_arg, *spec.config.to_args()]
    return argv, _env(spec, manager, argv[0])


#: The settings spark-submit reads only when its option of the same list is not given (SparkSubmitArguments:
#: ``pyFiles = Option(pyFiles).orElse(sparkProperties.get("spark.submit.pyFiles"))``, the same for files and
#: archives). ``ckpt run`` gives the options itself (the provider's code zip, the job file in cluster mode, the
#: shipped environment), so a job's own entries in these settings (the ckpt_spark connection's conf, --conf)
#: would be dropped silently: they are merged into the options instead.
LIST_CONF = {"py_files": "spark.submit.pyFiles", "files": "spark.files", "archives": "spark.archives"}


def merge_paths(*lists: Iterable[str]) -> list[str]:
    """The entries of ``lists`` in order, each once (comma-separated entries split, blanks dropped)."""
    seen: dict[str, None] = {}
    for items in lists:
        for item in items:
            for part in item.split(","):
                if part.strip():
                    seen.setdefault(part.strip(), None)
    return list(seen)


def _conf_paths(conf: Mapping[str, str], key: str) -> list[str]:
    """A list setting's local paths made absolute (a client-mode driver may run in a directory of its own,
    ``driver_cwd``), URIs as they are."""
    return [p if "://" in p else os.path.abspath(p) for p in merge_paths([conf.get(key, "")])]


def shipped_lists(spec: SubmitSpec) -> dict[str, list[str]]:
    """``py_files``, ``files`` and ``archives`` as spark-submit gets them: the job's own (the spec's, then the
    ones its conf names in ``LIST_CONF``'s settings), then the provider's (its code zip, the shipped environment);
    each once. The job file, in cluster mode, is added by ``build_command``.

    The provider's entries come last on purpose. pyspark puts each py file at ``sys.path[1]`` in turn, in the driver
    (SparkContext) and in every Python worker (worker_util.add_path), so the last one listed is looked in first: a
    job whose zip bundles another copy of ``airflow_ckpt_provider`` still runs the provider's code that matches the
    launching side (entrypoint.py, the supervisor), while no name of the job's own modules is shadowed, as the
    provider's zip holds that one package only.
    """
    shipped = spec.shipped
    return {
        "py_files": merge_paths(spec.py_files, _conf_paths(spec.conf, LIST_CONF["py_files"]),
                                shipped.py_files if shipped else ()),
        "files": merge_paths(spec.files, _conf_paths(spec.conf, LIST_CONF["files"])),
        "archives": merge_paths(_conf_paths(spec.conf, LIST_CONF["archives"]),
                                [f"{shipped.archive}#{ALIAS}"] if shipped else ()),
    }


def driver_cwd(spec: SubmitSpec) -> str | None:
    """Where spark-submit runs: None (the caller's directory), except for a client-mode driver next to a
    shipped environment, which needs ``./ckpt-env`` (ShippedEnv.driver_dir). Every path on the command line
    is absolute, so the directory changes nothing else."""
    if spec.shipped is None or spec.deploy_mode == "cluster":
        return None
    return spec.shipped.driver_dir(spec.env_python or sys.executable)


def _conf(spec: SubmitSpec, manager: str) -> dict[str, str]:
    """The Spark settings: the spec's, plus loopback binding, the shipped Python and the remote driver's gate."""
    conf = dict(spec.conf)
    cluster = spec.deploy_mode == "cluster"
    if on_loopback(spec.master):  # Spark would bind to the first non-loopback interface
        conf.setdefault("spark.driver.bindAddress", LOOPBACK)
        conf.setdefault("spark.driver.host", LOOPBACK)
    if spec.shipped is not None:  # executors (and a driver in the cluster) run the Python of the archive
        conf.setdefault("spark.pyspark.python", spec.shipped.python)
        if not cluster:  # conf beats PYSPARK_DRIVER_PYTHON in spark-submit: name the driver's own
            conf.setdefault("spark.pyspark.driver.python", spec.env_python or sys.executable)
    if cluster and manager in _DRIVER_ENV_CONF:  # the driver runs remotely: its environment comes from conf
        # a bare name, in the driver host's temporary directory: this host's paths mean nothing there
        conf.setdefault(f"{_DRIVER_ENV_CONF[manager]}.{GATE_ENV}", gate_name(spec.config))
    _cluster_conf(spec, manager, conf)  # YARN, Kubernetes: who restarts the driver, spark-submit waits for its end
    return conf


def _env(spec: SubmitSpec, manager: str, spark_submit: str) -> dict[str, str]:
    """Variables to add to the inherited environment (an inherited value wins).

    PYSPARK_PYTHON defaults to this interpreter only on local masters (on a cluster, executors run elsewhere);
    PYSPARK_DRIVER_PYTHON also in client mode, where the driver runs here.
    """
    local = manager == "local"
    cluster = spec.deploy_mode == "cluster"
    wanted: dict[str, str] = {}
    if spec.env_python or local:
        wanted["PYSPARK_PYTHON"] = spec.env_python or sys.executable
    if spec.env_python or not cluster:
        wanted["PYSPARK_DRIVER_PYTHON"] = spec.env_python or sys.executable
    if on_loopback(spec.master):
        wanted["SPARK_LOCAL_IP"] = LOOPBACK  # the block manager and the UI bind to it
    if not local and Path(spark_submit).parent == Path(sys.executable).parent:
        # pyspark's spark-submit finds its Spark with PYSPARK_PYTHON, which a cluster run leaves to the nodes
        wanted["SPARK_HOME"] = pyspark_home()
    if not cluster:
        wanted[GATE_ENV] = gate_file(spec.config)
    return {k: v for k, v in wanted.items() if k not in os.environ}


# Cluster deploy mode on YARN and Kubernetes (docs/cluster.md); setting names as in Spark 4.3's
# running-on-yarn.md and running-on-kubernetes.md.
#: How many times YARN starts the application master, which in cluster mode is the driver; unset, YARN's
#: yarn.resourcemanager.am.max-attempts decides (2 unless the cluster changed it).
YARN_MAX_ATTEMPTS = "spark.yarn.maxAppAttempts"
#: An application master that ran this long resets YARN's count of failed attempts; unset, every failure
#: in the application's life counts.
YARN_ATTEMPTS_VALIDITY = "spark.yarn.am.attemptFailuresValidityInterval"
#: spark-submit stays until the application ends (true by default in Spark; spark-defaults.conf may disagree).
WAIT_CONF = {"yarn": "spark.yarn.submit.waitAppCompletion", "k8s": "spark.kubernetes.submission.waitAppCompletion"}
#: The Hadoop path a Kubernetes cluster-mode spark-submit uploads its local files to, for the driver pod.
K8S_UPLOAD_PATH = "spark.kubernetes.file.upload.path"
#: How a Kubernetes cluster-mode driver is submitted: ``spark-submit`` (a driver pod, the default) or
#: ``sparkapplication`` (a SparkApplication of the Kubeflow Spark operator, restartPolicy Never: launcher/sparkapp.py).
SUBMITTER_CONF = "spark.ckpt.submitter"
SPARKAPPLICATION = "sparkapplication"
SUBMITTERS = ("spark-submit", SPARKAPPLICATION)


def submitter(spec: SubmitSpec) -> str:
    """``spark-submit`` or ``sparkapplication`` (``SUBMITTER_CONF``); ConfigError for another value, or for a
    SparkApplication outside Kubernetes cluster mode."""
    value = spec.conf.get(SUBMITTER_CONF, "spark-submit").strip()
    if value not in SUBMITTERS:
        raise ConfigError(f"--conf {SUBMITTER_CONF}={value}: expected one of {', '.join(SUBMITTERS)}")
    if value == SPARKAPPLICATION and (spec.deploy_mode != "cluster" or not spec.master.startswith("k8s://")):
        raise ConfigError(f"--conf {SUBMITTER_CONF}={SPARKAPPLICATION} with master {spec.master} in "
                          f"{spec.deploy_mode} mode: a SparkApplication runs its driver in a Kubernetes cluster; "
                          "expected --master k8s://https://HOST:PORT --deploy-mode cluster, or drop the setting")
    return value


def _check_cluster(spec: SubmitSpec, manager: str) -> None:
    """Refuse a cluster-mode command where two components would restart the driver, where spark-submit would
    not wait for the driver a supervisor watches, or with local files a Kubernetes driver pod cannot reach."""
    if spec.deploy_mode != "cluster" or manager not in WAIT_CONF:
        return
    wait = WAIT_CONF[manager]
    if spec.supervised and spec.conf.get(wait, "true").strip().lower() != "true":
        raise ConfigError(
            f"--conf {wait}={spec.conf[wait]} with --supervise: spark-submit would return once the driver is "
            f"submitted and the supervisor would take that for the driver's end; expected {wait}=true (what "
            "ckpt run sets): drop the setting, or run without --supervise"
        )
    if manager == "yarn":
        attempts = _yarn_attempts(spec.conf)
        if spec.supervised and attempts is not None and attempts > 1:
            raise ConfigError(
                f"--conf {YARN_MAX_ATTEMPTS}={attempts} with --supervise: YARN would relaunch the driver (its "
                "application master) while the supervisor starts another, two owners of one restart; expected "
                f"{YARN_MAX_ATTEMPTS}=1 (what --supervise sets): drop the setting and the supervisor restarts the "
                f"driver, or drop --supervise and YARN does, with {YARN_ATTEMPTS_VALIDITY} (docs/cluster.md)"
            )
        restore = spec.config.restore
        if attempts is not None and attempts > 1 and restore != LATEST_STATE and not spec.config.check_restore:
            raise ConfigError(
                f"--conf {YARN_MAX_ATTEMPTS}={attempts} with --restore {restore}: every attempt YARN starts runs "
                f"the same command, so a relaunched driver would restore {restore} again instead of resuming; "
                "expected --restore latest-state (the default) when YARN restarts the driver: start from the "
                "snapshot with --supervise instead (its restarts resume with latest-state), or start it once, "
                "stop it, and relaunch with latest-state"
            )
    elif submitter(spec) == SPARKAPPLICATION:
        if local := _local_files(spec, entrypoint=False):
            raise ConfigError(
                f"--conf {SUBMITTER_CONF}={SPARKAPPLICATION} with local files ({', '.join(local)}): the Spark "
                "operator submits from its own pod and reads no file of this host; expected URIs the cluster "
                "reads (local:///path/in/the/image, s3a://BUCKET/KEY)"
            )
        if not spec.conf.get("spark.kubernetes.container.image"):
            raise ConfigError(
                f"--conf {SUBMITTER_CONF}={SPARKAPPLICATION} without spark.kubernetes.container.image: the "
                "SparkApplication names the image its driver and executors run; add --conf "
                "spark.kubernetes.container.image=REGISTRY/NAME:TAG (an image with this provider, docs/deployment.md)"
            )
    elif K8S_UPLOAD_PATH not in spec.conf and (local := _local_files(spec)):
        raise ConfigError(
            f"Kubernetes cluster mode with local files ({', '.join(local)}) and no {K8S_UPLOAD_PATH}: the driver "
            "pod cannot read this host's disk, and spark-submit uploads local files only to that path; expected "
            f"--conf {K8S_UPLOAD_PATH}=s3a://BUCKET/PREFIX (a Hadoop path the driver pod can read), or these "
            "files as URIs the cluster reads (s3a://, https://, local:// for a file in the image)"
        )


def _yarn_attempts(conf: Mapping[str, str]) -> int | None:
    value = conf.get(YARN_MAX_ATTEMPTS)
    if value is None:
        return None
    try:
        attempts = int(value.strip())
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise ConfigError(f"--conf {YARN_MAX_ATTEMPTS}={value}: expected a whole number of attempts >= 1 "
                          "(1: YARN never relaunches the driver)")
    return attempts


def _local_files(spec: SubmitSpec, *, entrypoint: bool = True) -> list[str]:
    """The names of the command's files on this host's disk (no scheme, or file://), which spark-submit uploads;
    the runtime's entrypoint.py among them unless ``entrypoint`` is False (an image holds it)."""
    lists = shipped_lists(spec)
    files = [*([str(ENTRYPOINT_PY)] if entrypoint else []), spec.job_file, *lists["files"], *lists["py_files"],
             *(a.partition("#")[0] for a in lists["archives"])]
    return [Path(f).name for f in files if _job_path(f) is not None]


def _cluster_conf(spec: SubmitSpec, manager: str, conf: dict[str, str]) -> None:
    """A driver in a YARN or Kubernetes cluster: YARN relaunches it only when the user says so (a
    ``spark.yarn.maxAppAttempts`` of their own, never under ``--supervise``), spark-submit waits for its end, and
    it gets this launch's id (CKPT_LAUNCH_ID), as it would in client mode, so a superseded launch never takes the
    lease."""
    if spec.deploy_mode != "cluster" or manager not in WAIT_CONF:
        return
    if manager == "yarn":  # YARN's own default is the cluster's yarn.resourcemanager.am.max-attempts (2)
        conf.setdefault(YARN_MAX_ATTEMPTS, "1")
    conf.setdefault(WAIT_CONF[manager], "true")
    launch_id = os.environ.get(LAUNCH_ENV)
    if launch_id:
        conf.setdefault(f"{_DRIVER_ENV_CONF[manager]}.{LAUNCH_ENV}", launch_id)
    if spec.driver_run:  # set per driver by the supervisor, never by the user: it wins over a conf of the same name
        conf[f"{_DRIVER_ENV_CONF[manager]}.{DRIVER_RUN_ENV}"] = spec.driver_run


def redact(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every ``--conf K=V`` whose key looks secret replaced, as Spark's UI does.

    A reference to a secret is kept (``spark.kubernetes.driver.secretKeyRef.ENV=SECRET:KEY``,
    ``spark.kubernetes.executor.secrets.SECRET=/mount/path``, a ``...File`` setting naming a file): it holds no
    secret, and a command copied from ``--dry-run --json`` (into a SparkApplication) needs it as it is."""
    out = list(argv)
    for i in range(1, len(out)):
        key, sep, _ = out[i].partition("=")
        if out[i - 1] == "--conf" and sep and _SECRET_CONF.search(key) and not _SECRET_REFERENCE.search(key):
            out[i] = f"{key}={REDACTED}"
    return out


def describe(argv: Sequence[str]) -> str:
    """The command as a shell would take it, secrets redacted, for logs."""
    return shlex.join(redact(argv))
