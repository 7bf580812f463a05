"""A Spark standalone cluster from the installed pyspark: one master and N workers, on 127.0.0.1 by default.

Spark's own master and workers (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``), each a child
process with its own log, on free ports (web UIs included; the master's REST submission server is off), each bound
to its node's address (127.0.0.1, or one given per node). The workers run executors with a Python of their own that
has nothing but the standard library (a bare venv first on their PATH), like cluster nodes that never saw this
project: a job whose executors need pandas, pyarrow, confluent-kafka or this provider runs only if it ships them
(launcher/pyenv.py). The master keeps its state in a recovery directory (``spark.deploy.recoveryMode FILESYSTEM``),
so a master killed and started again recovers the running applications and workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import time
import urllib.request
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from airflow_ckpt_provider.embedded.process import (
    HOST,
    EmbeddedProcess,
    EmbeddedServiceError,
    child_env,
    free_port,
)
from airflow_ckpt_provider.launcher.submit import pyspark_home

log = logging.getLogger(__name__)

#: What a node inherits from us that a real cluster node would not have: our Python and Spark settings.
_DROP = ("PYSPARK_", "SPARK_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CKPT_", "AWS_", "KAFKA_")
#: A port taken meanwhile fails the start instead of Spark moving to the next port unseen.
_ONE_PORT = "-Dspark.port.maxRetries=0"
#: An executor of the embedded workers: small enough that two fit next to the driver on a laptop.
EXECUTOR_MEMORY = "512m"


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - our own loopback UI
        return json.loads(resp.read())


@dataclass(frozen=True)
class Executor:
    """An executor JVM the cluster's worker ``worker`` launched for application ``app_id``."""

    pid: int
    worker: int
    app_id: str
    executor_id: str


class _Node(EmbeddedProcess):
    """A master or worker JVM started with spark-class; its log is its stdout."""

    port: int  # the master's or worker's own (set by the subclass)

    def __init__(self, cluster: EmbeddedSparkCluster, name: str, host: str, workdir: Path,
                 start_timeout: float) -> None:
        self.name = name  # type: ignore[misc]  # per instance: master, worker-0, worker-1
        super().__init__(workdir, start_timeout, stop_timeout=15.0)
        self.cluster = cluster
        #: The address the node binds (RPC, UI) and is known by; its executors bind it too (SPARK_LOCAL_IP).
        self.host = host
        self.ui_port = free_port()

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def _fresh_ports(self) -> str:
        gave_up = f"{self.port} (UI {self.ui_port})"
        self.port, self.ui_port = free_port(), free_port()  # spark.port.maxRetries=0: Spark itself tries no other
        return gave_up

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        conf_dir = self.workdir / "conf"  # empty: no spark-defaults.conf of the host leaks in
        conf_dir.mkdir(exist_ok=True)
        daemon = {"SPARK_DAEMON_JAVA_OPTS": self.cluster.java_opts} if self.cluster.java_opts else {}
        return child_env(_DROP, {"SPARK_HOME": str(self.cluster.spark_home), "SPARK_LOCAL_IP": self.host,
                                 "SPARK_CONF_DIR": str(conf_dir), "SPARK_NO_DAEMONIZE": "1", **daemon, **extra})


class _Master(_Node):
    def __init__(self, cluster: EmbeddedSparkCluster, host: str, workdir: Path, start_timeout: float) -> None:
        super().__init__(cluster, "spark-master", host, workdir, start_timeout)
        self.port = free_port()

    def _command(self) -> tuple[list[str], dict[str, str]]:
        recovery = self.workdir / "recovery"
        recovery.mkdir(exist_ok=True)
        opts = (f"-Dspark.master.rest.enabled=false -Dspark.deploy.recoveryMode=FILESYSTEM "
                f"-Dspark.deploy.recoveryDirectory={recovery} {_ONE_PORT}")
        return ([str(self.cluster.spark_home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                 "--host", self.host, "--port", str(self.port), "--webui-port", str(self.ui_port)],
                self._env({"SPARK_MASTER_OPTS": opts}))

    def _ready(self) -> bool:
        try:
            return bool(_get_json(f"{self.ui_url}/json/").get("status") == "ALIVE")
        except (OSError, ValueError):  # not listening yet, or its UI not serving the JSON route yet
            return False

    def _describe(self) -> str:
        return f"spark://{self.host}:{self.port}, UI {self.ui_url}"


class _Worker(_Node):
    def __init__(self, cluster: EmbeddedSparkCluster, index: int, host: str, workdir: Path,
                 start_timeout: float) -> None:
        super().__init__(cluster, f"spark-worker-{index}", host, workdir, start_timeout)
        self.index = index
        self.port = free_port()

    def _command(self) -> tuple[list[str], dict[str, str]]:
        c = self.cluster
        path = os.pathsep.join([str(c.node_python.parent), *_java_dirs(), "/usr/bin", "/bin"])
        return ([str(c.spark_home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", c.master_url,
                 "--host", self.host, "--port", str(self.port), "--webui-port", str(self.ui_port),
                 "--cores", str(c.worker_cores), "--memory", c.worker_memory, "--work-dir", str(self.workdir / "work")],
                self._env({"PATH": path, "SPARK_WORKER_OPTS": _ONE_PORT}))

    def _ready(self) -> bool:
        return any(w["host"] == self.host and w["port"] == self.port and w["state"] == "ALIVE"
                   for w in self.cluster.state().get("workers", []))

    def _describe(self) -> str:
        return f"{self.host}:{self.port} of {self.cluster.master_url}, UI {self.ui_url}"


def _java_dirs() -> list[str]:
    """Where this host's java is: the workers start executors with it."""
    found = shutil.which("java")
    dirs = [str(Path(found).parent)] if found else []
    if os.environ.get("JAVA_HOME"):
        dirs.insert(0, str(Path(os.environ["JAVA_HOME"], "bin")))
    return dirs


class EmbeddedSparkCluster:
    """A Spark standalone master and ``workers`` workers (``worker_cores`` cores, ``worker_memory`` each).

    ``master_url`` is what ``ckpt run --master`` takes; ``job_conf()`` the settings a job needs on it
    (executors that fit the workers). Kill and start nodes to test failures: ``kill_executor``,
    ``kill_worker``/``start_worker``, ``kill_master``/``start_master``. ``java_opts``: extra options of every JVM
    of the cluster, the master's, the workers' and (through ``job_conf()``) the executors' (the tests' cheaper JIT
    and GC; default: none, as on a real cluster).

    Every node binds 127.0.0.1 unless given an address: ``master_host`` the master's, ``worker_hosts`` one per
    worker (their count is then the number of workers). ``master_url``, the UI URLs and the executors' address
    follow. A node on another address is started where that address is, e.g. inside a test host's network
    namespace (tests/support/sparkhosts.py: ``host.call(cluster.master.start)``); its ports are picked free on
    this thread's loopback, and a port found taken at the start is replaced by a fresh one. ``state()`` and a
    worker's readiness query the master's UI from the calling thread: call them where the master is reachable.
    """

    def __init__(self, *, workers: int | None = None, worker_cores: int = 1, worker_memory: str = "1g",
                 workdir: Path | None = None, start_timeout: float = 90.0, java_opts: str = "",
                 master_host: str = HOST, worker_hosts: Sequence[str] | None = None) -> None:
        if worker_hosts is not None and workers is not None and workers != len(worker_hosts):
            raise ValueError(f"Expected workers={workers} to match the {len(worker_hosts)} worker_hosts "
                             f"{list(worker_hosts)}; pass one of them")
        hosts = list(worker_hosts) if worker_hosts is not None else [HOST] * (2 if workers is None else workers)
        # Logs, the recovery directory, the workers' Python; unless given, a temp dir close() removes.
        self._tempdir = None if workdir is not None else Path(tempfile.mkdtemp(prefix="embedded-spark-"))
        self.workdir: Path = workdir or self._tempdir or Path()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.java_opts = java_opts
        self.spark_home = Path(pyspark_home())
        self.master = _Master(self, master_host, self.workdir / "master", start_timeout)
        self.workers = [_Worker(self, i, host, self.workdir / f"worker-{i}", start_timeout)
                        for i, host in enumerate(hosts)]

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.host}:{self.master.port}"

    @property
    def node_python(self) -> Path:
        """The workers' own python3: a venv of the base interpreter with nothing installed."""
        bare = self.workdir / "node-python"
        python = bare / "bin" / "python3"
        if not python.exists():
            venv.create(bare, with_pip=False, symlinks=True)
        return python

    def start(self) -> Self:
        """Start the master, then the workers; each is ready when the master lists it ALIVE."""
        try:
            self.master.start()
            for worker in self.workers:
                worker.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self) -> None:
        """Stop workers (their executors go with them), then the master; idempotent."""
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.master.close()
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- what runs --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON view (workers, active and completed applications); {} while it is down."""
        try:
            return dict(_get_json(f"{self.master.ui_url}/json/"))
        except (OSError, ValueError):  # down, or starting (its UI serves HTML before the JSON route)
            return {}

    def job_conf(self, *, cores: int | None = None) -> dict[str, str]:
        """Spark settings for a job on this cluster: executors that fit a worker's memory; with ``cores``, no more
        cores than that (``spark.cores.max``: a standalone application otherwise takes every free core, and a
        second one, such as an upgrade's restore check, waits until the first ends)."""
        conf = {"spark.executor.memory": EXECUTOR_MEMORY, "spark.executor.cores": str(self.worker_cores),
                # where a relaunched driver finds the master's UI (runtime/lostapp.py): not Spark's default 8080
                "spark.master.ui.port": str(self.master.ui_port)}
        if self.java_opts:
            conf["spark.executor.extraJavaOptions"] = self.java_opts
        return conf if cores is None else {**conf, "spark.cores.max": str(cores)}

    def executors(self, app_id: str | None = None) -> list[Executor]:
        """Executor JVMs running now under this cluster's workers (of ``app_id`` if given)."""
        found = []
        for worker in self.workers:
            if worker.pid is None:
                continue
            for pid in _descendants(worker.pid):
                args = _cmdline(pid)
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in args:
                    continue
                app, executor = _arg(args, "--app-id"), _arg(args, "--executor-id")
                if app_id is None or app == app_id:
                    found.append(Executor(pid, worker.index, app, executor))
        return found

    def wait_for_executors(self, app_id: str, count: int, timeout: float = 60.0) -> list[Executor]:
        """Wait until ``count`` executors of ``app_id`` run; raises with the master's view if they do not."""
        deadline = time.monotonic() + timeout
        while len(running := self.executors(app_id)) < count:
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"Expected {count} executors of {app_id} within {timeout:.0f} s, found {len(running)}: "
                    f"master {self.master_url} says {json.dumps(self.state().get('activeapps'))}; see the "
                    f"workers' logs ({', '.join(str(w.log_path) for w in self.workers)})")
            time.sleep(0.2)
        return running

    def kill_executor(self, app_id: str) -> Executor:
        """kill -9 one executor JVM of ``app_id`` (and its Python workers with it)."""
        running = self.executors(app_id)
        if not running:
            raise EmbeddedServiceError(f"Expected a running executor of {app_id}, found none: wait for one with "
                                       "wait_for_executors() first")
        victim = running[0]
        for pid in [*_descendants(victim.pid), victim.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.info("killed executor %s of %s (pid %d) on worker %d", victim.executor_id, app_id, victim.pid,
                 victim.worker)
        return victim

    def kill_worker(self, index: int) -> None:
        """kill -9 a worker with everything it started (its executors): a node lost."""
        self.workers[index].kill()

    def start_worker(self, index: int) -> None:
        self.workers[index].start()

    def kill_master(self) -> None:
        self.master.kill()

    def start_master(self) -> None:
        """Start the master again on its port: it recovers applications and workers from its recovery dir."""
        self.master.start()


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1] if name in args[:-1] else ""
