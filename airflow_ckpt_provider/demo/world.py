"""What the demo runs in: one job over one topic in one bucket on the embedded services (``World``), and
a throwaway Airflow home that runs the example DAGs (``AirflowHome``). The system tests (tests/system)
drive the same two.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.start import StartRecord, read_start
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, RestartOwner, read_status
from airflow_ckpt_provider.core.records.supervision import latest_supervisor
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.embedded.seaweedfs import EmbeddedS3
from airflow_ckpt_provider.examples._orders import read_totals

DAGS = Path(__file__).absolute().parent.parent.parent / "dags"
EXAMPLES = Path(__file__).absolute().parent.parent / "examples"
CUSTOMERS = 50
TIMEOUT = 300.0
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
              "spark.ui.showConsoleProgress": "false"}


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


class World:
    """One job over one topic in one bucket: produce orders, read the job's state, kill its driver."""

    def __init__(self, services: EmbeddedServices, work: Path, *, job: str = "orders", bucket: str = "ckpt-demo",
                 topic: str = "orders", group: str = "ckpt-orders") -> None:
        self.services, self.work = services, work
        self.job, self.bucket, self.topic, self.group = job, bucket, topic, group
        self.produced = 0
        services.s3.create_bucket(bucket)
        services.kafka.create_topic(topic, partitions=3)
        s3 = services.s3
        self.s3_options = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                                    secret_access_key=s3.secret_key)
        self.store_url = f"s3://{bucket}/jobs"
        self.store = JobStore.open(self.store_url, job, self.s3_options)
        self.out = work / "out"

    def env(self) -> dict[str, str]:
        """What ``ckpt`` needs to reach this job: the S3 endpoint and keys (AWS_*), Kafka, CKPT_STORE, CKPT_JOB."""
        return {**self.services.env(), "CKPT_STORE": self.store_url, "CKPT_JOB": self.job}

    def job_env(self) -> dict[str, str]:
        """The example job's settings (the Variable ``ckpt_orders_env``)."""
        return {"ORDERS_BOOTSTRAP": self.services.kafka.bootstrap_servers, "ORDERS_TOPIC": self.topic,
                "ORDERS_OUT": str(self.out), "ORDERS_GROUP": self.group, "ORDERS_MAX_PER_BATCH": "500"}

    def produce(self, count: int) -> None:
        """Order i: customer c<i % 50>, amount (7 i) % 100. One record per request (a tansu quirk)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.services.kafka.bootstrap_servers, "acks": "all",
                             "batch.num.messages": 1, "linger.ms": 0})
        for i in range(self.produced, self.produced + count):
            producer.produce(self.topic, key=f"c{i % CUSTOMERS:03d}".encode(), value=str(7 * i % 100).encode(),
                             partition=i % 3)
        if producer.flush(30) != 0:
            raise RuntimeError("orders still queued after 30 s")
        self.produced += count

    @contextlib.contextmanager
    def flowing(self, per_second: int = 20) -> Iterator[None]:
        """Orders keep arriving while inside (as in production): ``per_second`` each second."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(1.0):
                self.produce(per_second)

        thread = threading.Thread(target=run, name="orders-producer", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)

    def expected(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for i in range(self.produced):
            orders, revenue = found.get(f"c{i % CUSTOMERS:03d}", (0, 0))
            found[f"c{i % CUSTOMERS:03d}"] = (orders + 1, revenue + 7 * i % 100)
        return found

    def totals(self) -> dict[str, tuple[int, int]]:
        return read_totals(self.out) if self.out.exists() else {}

    def status(self) -> JobStatus | None:
        return read_status(self.store)

    def consumed(self, status: JobStatus) -> int:
        """Records of the topic the status's last batch had read (the checkpointed source offsets)."""
        return sum(int(offset) for source in status.offsets.values() if isinstance(source, dict)
                   for offset in source.get(self.topic, {}).values())

    def wait(self, what: str, ok: Callable[[JobStatus], bool], timeout: float = TIMEOUT) -> JobStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and ok(status):
                return status
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; last status: {self.status()}")

    def wait_all_consumed(self, timeout: float = TIMEOUT) -> JobStatus:
        return self.wait(f"all {self.produced} orders", lambda s: self.consumed(s) == self.produced, timeout)

    def kill_driver(self, status: JobStatus) -> None:
        """kill -9 of the driver's process group (JVM, Python driver, workers): a crashed machine."""
        assert status.pid is not None
        os.killpg(os.getpgid(status.pid), signal.SIGKILL)

    def kill_host(self, status: JobStatus) -> tuple[int, int]:
        """kill -9 of the job's supervisor and of its driver's process group, supervisor first so it restarts
        nothing: the host is lost. (supervisor pid, driver pid)."""
        record = latest_supervisor(self.store)
        assert record is not None, "no supervisor record"
        assert status.pid is not None
        driver_group = os.getpgid(status.pid)
        os.killpg(os.getpgid(record.pid), signal.SIGKILL)  # its own session: the group is the supervisor
        os.killpg(driver_group, signal.SIGKILL)
        return record.pid, status.pid

    def deployment(self, epoch: int) -> StartRecord:
        """How the driver of ``epoch`` started: deployments/<epoch>.json (action, snapshot, launch id...)."""
        start = read_start(self.store, epoch)
        if start is None:
            raise AssertionError(f"job {self.store.job}: no readable start record of epoch {epoch}")
        return start

    def watch_restart(self, killed: JobStatus, killed_at: float, timeout: float = TIMEOUT) -> RestartSeen:
        """After a kill at ``killed_at`` of the driver of ``killed``: follow status.json until a driver of a newer
        epoch reports a batch (noting the RESTARTING status a supervisor writes meanwhile), then read the records
        of that start."""
        deadline = time.monotonic() + timeout
        restarting: JobStatus | None = None
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and status.epoch == killed.epoch and status.state is JobState.RESTARTING:
                restarting = restarting or status
            if status is not None and status.epoch > killed.epoch and status.batch_id is not None:
                return RestartSeen(killed, killed_at, restarting, status, time.time(), self.deployment(status.epoch),
                                   self.deployment(killed.epoch).launch_id, read_launch(self.store))
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for a batch of a driver newer than epoch "
                           f"{killed.epoch}; last status: {self.status()}")

    def stop_everything(self) -> None:
        """Kill what the job's launches left running here: the supervisor and its driver's process group."""
        status, launch = self.status(), read_launch(self.store)
        for pid in (launch.pid if launch else None, status.pid if status else None):
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


@dataclass(frozen=True)
class RestartSeen:
    """How a killed job came back, as the job store recorded it: the killed driver's last status, the RESTARTING
    status its supervisor wrote (None: nobody wrote one), the new epoch's first status with a batch, the new
    driver's start record (deployments/<epoch>.json), the killed driver's launch id and spec/last.json."""

    killed: JobStatus
    killed_at: float
    restarting: JobStatus | None
    first: JobStatus
    first_at: float
    deployment: StartRecord
    killed_launch_id: str | None
    launch: Launch | None

    @property
    def new_launch(self) -> bool:
        """The new driver belongs to another launch than the killed one: someone launched the job again."""
        return self.deployment.launch_id != self.killed_launch_id

    def summary(self) -> str:
        """One line for the demo's closing block: the kill, who restarted the job, from which batch, how fast."""
        k, f = self.killed, self.first
        restart = self.restarting.current_restart() if self.restarting is not None else None
        who = "a new launch" if self.new_launch else "its supervisor"
        since = f" from batch {restart.from_batch}" if restart is not None and restart.from_batch is not None else ""
        return (f"driver killed (kill -9) at batch {k.batch_id}; {who} restarted it{since}; epoch {f.epoch} "
                f"reported batch {f.batch_id} {self.first_at - self.killed_at:.1f} s after the kill")

    def lines(self) -> list[str]:
        """What happened, for the demo: who restarted the job, from where, how long it took, what the DAG did."""
        d, k, f = self.deployment, self.killed, self.first
        restart = self.restarting.current_restart() if self.restarting is not None else None
        if restart is not None and restart.by is RestartOwner.SUPERVISOR and not self.new_launch:
            assert self.restarting is not None
            sup = self.restarting
            who = (f"its supervisor (pid {sup.pid} on {sup.host}, launch {self.killed_launch_id}) restarted it"
                   f": status.json RESTARTING, attempt {restart.attempt}, {restart.cause}, after a "
                   f"{restart.delay:.1f} s delay, from batch {restart.from_batch}")
        elif not self.new_launch:
            who = f"the supervisor of launch {self.killed_launch_id} restarted it (its RESTARTING was not seen)"
        else:
            by = self.launch.launched_by if self.launch and self.launch.launch_id == d.launch_id else "?"
            pid = self.launch.pid if self.launch and self.launch.launch_id == d.launch_id else None
            who = (f"{by} relaunched it as launch {d.launch_id} (supervisor pid {pid}); nobody wrote "
                   f"RESTARTING: the supervisor of launch {self.killed_launch_id} was gone")
        snapshot = d.snapshot or "none: the live checkpoint"
        return [
            f"after the kill -9: {who}",
            f"epoch {k.epoch} -> {f.epoch}: deployments/{f.epoch:010d}.json says action {d.action}, "
            f"restore {d.restore}, snapshot {snapshot} ({d.reason}); the killed driver had reported "
            f"batch {k.batch_id}, the new one's first reported batch is {f.batch_id}",
            f"kill -9 -> first batch of epoch {f.epoch}: {self.first_at - self.killed_at:.1f} s",
            ("the DAG launched nothing after the kill: spec/last.json still names launch "
             f"{self.launch.launch_id if self.launch else '-'} ({self.launch.launched_by if self.launch else '-'})")
            if not self.new_launch else
            f"the DAG's restart task launched it: spec/last.json names launch {d.launch_id} "
            f"({self.launch.launched_by if self.launch else '-'})",
        ]


def _follow(proc: subprocess.Popen[str], log: Path, on_line: Callable[[str], None], timeout: float) -> None:
    """Hand each complete line ``proc`` writes to ``log`` to ``on_line`` until it exits (TimeoutExpired after
    ``timeout``)."""
    deadline = time.monotonic() + timeout
    pending = ""
    with log.open(errors="replace") as src:
        while True:
            ended = proc.poll() is not None  # before the read: what it wrote before exiting is read below
            *lines, pending = (pending + src.read()).split("\n")
            for line in lines:
                on_line(line)
            if ended:
                break
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(0.25)
    if pending:
        on_line(pending)


def deferred(task_id: str) -> Callable[[str], bool]:
    """Whether an ``airflow dags test`` output shows ``task_id`` reached and deferred: its trigger runs in that
    process (a ``DagTestProcess.wait_for_output`` condition)."""

    def ok(output: str) -> bool:
        at = output.rfind(f"task_id={task_id}")
        return at >= 0 and "running trigger in line" in output[at:]

    return ok


class DagTestProcess:
    """``airflow dags test`` running in the background, in a process group of its own (the Airflow worker)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_output(self, what: str, ok: Callable[[str], bool], timeout: float = TIMEOUT) -> None:
        """Until ``ok(output)``; RuntimeError if the process ends first or the deadline passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok(self.output()):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow dags test ended (exit {self.proc.returncode}) before {what}:\n"
                                   f"{self.output()[-4000:]}")
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """kill -9 of its whole process group: the worker dies with every task process it runs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def wait(self, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.output(), "")


class AirflowHome:
    """A throwaway Airflow home (sqlite) whose connections and variables point at a World (or, with ``for_job``, at
    any job store and job)."""

    def __init__(self, world: World, path: Path, *, watch_seconds: float = 60.0, master: str = "local[2]",
                 conf: dict[str, str] | None = None) -> None:
        """``master`` and ``conf``: where the jobs run (the ckpt_spark connection), local[2] by default."""
        self._configure(path, world.services.s3, world.store_url, world.job, world.job_env(),
                        ckpt_home=world.work / "ckpt-home", watch_seconds=watch_seconds, master=master, conf=conf)

    @classmethod
    def for_job(cls, path: Path, s3: EmbeddedS3, store_url: str, job: str, job_env: dict[str, str], *,
                ckpt_home: Path, watch_seconds: float, master: str = "local[2]", conf: dict[str, str] | None = None,
                env: dict[str, str] | None = None,
                wrap: Callable[[list[str]], list[str]] | None = None) -> AirflowHome:
        """A home for job ``job`` of the store at ``store_url`` on ``s3``: ``job_env`` is the Variable
        ``ckpt_orders_env`` (the job's settings), ``env`` more of the worker's environment, ``wrap`` what each
        ``airflow`` command line becomes (run on a test host: ``Host.wrap``)."""
        home = cls.__new__(cls)
        home._configure(path, s3, store_url, job, job_env, ckpt_home=ckpt_home, watch_seconds=watch_seconds,
                        master=master, conf=conf)
        home.env.update(env or {})
        home.wrap = wrap or list
        return home

    def _configure(self, path: Path, s3: EmbeddedS3, store_url: str, job: str, job_env: dict[str, str], *,
                   ckpt_home: Path, watch_seconds: float, master: str, conf: dict[str, str] | None) -> None:
        self.path = path
        self.wrap: Callable[[list[str]], list[str]] = list
        store = {"conn_type": "ckpt_store", "host": s3.endpoint_url, "login": s3.access_key,
                 "password": s3.secret_key, "extra": {"store_url": store_url, "region_name": s3.region}}
        spark = {"conn_type": "ckpt_spark", "host": master, "extra": {"conf": {**SPARK_CONF, **(conf or {})}}}
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(path),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_CKPT_STORE_DEFAULT": json.dumps(store),
            "AIRFLOW_CONN_CKPT_SPARK_DEFAULT": json.dumps(spark),
            "AIRFLOW_VAR_CKPT_ORDERS_ENV": json.dumps(job_env),
            "CKPT_HOME": str(ckpt_home),
            "CKPT_EXAMPLE_JOB": job,
            "CKPT_EXAMPLE_WATCH_SECONDS": str(watch_seconds),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def airflow(self, *args: str, log_name: str, timeout: float = 900.0, env: dict[str, str] | None = None,
                on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the ``airflow`` CLI of this environment (``env`` on top); output to ``<home>/<log_name>.log``, and
        with ``on_line`` each line of it as it comes (the log is followed, not piped: a job the command starts
        may inherit its stdout and outlive it)."""
        log = self.path / f"{log_name}.log"
        argv = [sys.executable, "-m", "airflow", *args]
        with log.open("w") as out:
            proc = subprocess.Popen(self.wrap(argv), env={**self.env, "PYTHONUNBUFFERED": "1", **(env or {})},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            _follow(proc, log, on_line or (lambda _: None), timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        return subprocess.CompletedProcess(argv, proc.returncode, log.read_text(errors="replace"), "")

    def migrate(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        done = self.airflow("db", "migrate", log_name="db-migrate")
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{done.stdout[-3000:]}")

    def dags_test(self, dag_id: str, conf: dict[str, Any] | None = None, *,
                  on_line: Callable[[str], None] | None = None,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``airflow dags test DAG_ID`` (deferred tasks run in-process); returncode 0 iff the run succeeded;
        ``on_line``: each line of its output as it comes; ``env``: variables on top of this home's.

        No scheduler runs here, so no stale exit report can fail a resumed task: deferrals need no minimum
        (``[ckpt] min_deferral`` 0; with a scheduler the operators hold each one 30 s, docs/airflow.md).
        """
        args = ["dags", "test", dag_id] + (["--conf", json.dumps(conf)] if conf else [])
        return self.airflow(*args, log_name=f"dags-test-{dag_id}-{time.monotonic_ns()}",
                            env={"AIRFLOW__CKPT__MIN_DEFERRAL": "0", **(env or {})}, on_line=on_line)

    def start_dags_test(self, dag_id: str, *, env: dict[str, str] | None = None) -> DagTestProcess:
        """``airflow dags test DAG_ID`` in the background, in a session of its own (``dags_test``'s settings,
        ``env`` on top; output unbuffered to ``<home>/dags-test-<dag>-<n>.log``)."""
        log = self.path / f"dags-test-{dag_id}-{time.monotonic_ns()}.log"
        argv = [sys.executable, "-m", "airflow", "dags", "test", dag_id]
        with log.open("wb") as out:
            env = {**self.env, "AIRFLOW__CKPT__MIN_DEFERRAL": "0", "PYTHONUNBUFFERED": "1", **(env or {})}
            proc = subprocess.Popen(self.wrap(argv), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return DagTestProcess(proc, log)
