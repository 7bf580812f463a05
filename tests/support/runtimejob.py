"""Run the test job (tests/jobs/kafka_count.py) the way users do: ``ckpt run`` in a subprocess.

A ``Run`` holds one ``ckpt run`` process (one driver, or a supervisor with ``--supervise``); its
output goes to a log file that failing assertions print. Results are read from the job's files:
``batch-<id>.json`` (the keys a batch updated, with their running counts) and
``commits-epoch-<epoch>.log`` (``<batch id> <time>`` for every batch the driver of that epoch let
Spark commit).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.status import JobStatus, read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.snapshots.manifest import Manifest
    from airflow_ckpt_provider.runtime.restore_check_verdict import RestoreCheck

JOB_FILE = Path(__file__).parent.parent / "jobs" / "kafka_count.py"
KEYS = 10
SPARK_CONF = ("spark.ui.enabled=false", "spark.sql.shuffle.partitions=2", "spark.ui.showConsoleProgress=false")
# The tests of snapshots, restores and fencing snapshot after every batch unless they say otherwise (the product's
# default is a snapshot every 60 s: tests/integration/test_snapshot_cadence.py proves it).
EVERY_BATCH = ("--checkpoint-interval", "0")


def snapshot_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """``args``, with a checkpoint snapshot after every batch unless they name a ``--checkpoint-interval``."""
    return [*args] if "--checkpoint-interval" in args else [*EVERY_BATCH, *args]
#: RocksDB state: the only store Spark's offline repartition takes (docs/rescaling.md).
ROCKSDB = ("spark.sql.streaming.stateStore.providerClass="
           "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    """Records ``start .. start+count-1``, keyed ``k<i % KEYS>``, round-robin over partitions.

    ``batch.num.messages=1``: tansu's ListOffsets(LATEST) answers the last record BATCH's base offset + 1.
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "batch.num.messages": 1, "linger.ms": 0})
    try:
        for i in range(start, start + count):
            producer.produce(topic, key=f"k{i % KEYS}".encode(), value=str(i).encode(), partition=i % 3)
        assert producer.flush(30) == 0, "records still queued after 30 s"
    finally:
        del producer


def stop_supervisor(store: JobStore, launch_id: str) -> None:
    """Teardown: the supervisor of ``launch_id`` still alive (a failed assertion) gets SIGTERM, then SIGKILL."""
    from airflow_ckpt_provider.core.records.supervision import SupervisorState, read_supervisor

    record = read_supervisor(store, launch_id)
    if record is None or record.state is SupervisorState.ENDED:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(record.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(record.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def expected_counts(total: int) -> dict[str, int]:
    return dict(Counter(f"k{i % KEYS}" for i in range(total)))


@dataclass
class JobEnv:
    """One job of a test: its store, topic, output directory, and the environment of its drivers."""

    s3: EmbeddedS3
    kafka: EmbeddedKafka
    work: Path
    bucket: str
    topic: str
    job: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}")

    @property
    def store_url(self) -> str:
        return f"s3://{self.bucket}/jobs"

    @property
    def out(self) -> Path:
        return self.work / "out"

    def store(self) -> JobStore:
        from airflow_ckpt_provider.core.store.storage import S3Options

        return JobStore.open(self.store_url, self.job, S3Options(
            endpoint_url=self.s3.endpoint_url, region=self.s3.region, access_key_id=self.s3.access_key,
            secret_access_key=self.s3.secret_key,
        ))

    def env(self, max_offsets: int = 200, extra: dict[str, str] | None = None, *,
            local: bool = True) -> dict[str, str]:
        """The drivers' environment; ``extra`` adds job settings (e.g. CKPT_EO_*, CKPT_FAULT_DIR).

        On a cluster (``local=False``) PYSPARK_PYTHON is left out, as in a user's shell: executors run the
        shipped environment's Python, or the nodes' own python3 with ``--python-env none``.
        """
        env = {
            **os.environ, **self.s3.env(),
            "CKPT_TEST_TOPIC": self.topic, "CKPT_TEST_BOOTSTRAP": self.kafka.bootstrap_servers,
            "CKPT_TEST_OUT": str(self.out), "CKPT_TEST_MAX_OFFSETS": str(max_offsets),
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            **(extra or {}),
        }
        if not local:
            env.pop("PYSPARK_PYTHON")
        return env

    def run(self, name: str, checkpoint: Path, *args: str, max_offsets: int = 200, job_file: Path = JOB_FILE,
            extra_env: dict[str, str] | None = None, master: str = "local[2]",
            conf: dict[str, str] | None = None) -> Run:
        """Start ``ckpt run job_file`` (default: the counting job) with ``args``; ``extra_env`` for its settings,
        ``master`` and ``conf`` for Spark (a cluster's executor settings)."""
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(job_file), "--job", self.job,
                "--store", self.store_url, "--checkpoint", str(checkpoint), "--master", master]
        for setting in [*SPARK_CONF, *(f"{k}={v}" for k, v in (conf or {}).items())]:
            argv += ["--conf", setting]
        log = self.work / f"{name}.log"
        env = self.env(max_offsets, extra_env, local=master.startswith("local"))
        with open(log, "ab") as out:
            proc = subprocess.Popen([*argv, *snapshot_args(args)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return Run(name, proc, log)

    def rescale_step(self, job_file: Path, checkpoint: Path, savepoint: str, partitions: int, *,
                     env: dict[str, str], timeout: float, conf: tuple[str, ...] = (ROCKSDB,)) -> RestoreCheck:
        """The rescale step as a rescale runs it (``ckpt run --check-restore --restore SAVEPOINT --rescale-to N
        --save-rescaled``, RocksDB state): restore the savepoint on a copy, repartition, the job's empty batch,
        saved as a savepoint of its own. ``env``: the job's environment (its settings)."""
        return self.check_step(job_file, checkpoint, savepoint, env=env, timeout=timeout, conf=conf,
                               partitions=partitions)

    def check_step(self, job_file: Path, checkpoint: Path, savepoint: str, *, env: dict[str, str], timeout: float,
                   conf: tuple[str, ...], partitions: int | None = None) -> RestoreCheck:
        """The restore check of an upgrade (``ckpt run --check-restore --restore SAVEPOINT``: the job file's query
        restored on a copy of the savepoint, one batch), or with ``partitions`` the rescale step; ``conf``: the
        job's Spark settings beyond SPARK_CONF."""
        from airflow_ckpt_provider.core.policy.modes import RestoreSpec
        from airflow_ckpt_provider.launcher.restore_check import check_restore
        from airflow_ckpt_provider.launcher.submit import SubmitSpec, parse_conf
        from airflow_ckpt_provider.runtime.config import RuntimeConfig

        config = RuntimeConfig(job=self.job, store=self.store_url, checkpoint=str(checkpoint),
                               endpoint_url=self.s3.endpoint_url, region=self.s3.region,
                               restore=RestoreSpec.parse(savepoint), rescale_to=partitions,
                               save_rescaled=partitions is not None, check_restore=True)
        spec = SubmitSpec(job_file=str(job_file), config=config, conf=parse_conf([*SPARK_CONF, *conf]))
        log = self.work / f"check-{savepoint}-{partitions or 'same'}-{job_file.stem}.log"
        return check_restore(spec, timeout, log_file=str(log), env=env)

    def status(self) -> JobStatus | None:
        return read_status(self.store())

    def wait_status(self, what: str, ok: Callable[[JobStatus], bool], timeout: float, *runs: Run) -> JobStatus:
        """Poll status.json until ``ok``; fail early, with the logs, if a run exits meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and ok(status):
                return status
            for run in runs:
                if run.proc.poll() is not None:
                    raise AssertionError(f"{run.name} exited with {run.proc.returncode} while waiting for {what}; "
                                         f"status {status}\n{run.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; status {self.status()}\n"
                             + "\n".join(r.tail() for r in runs))

    def request(self, action: RequestAction, epoch: int, timeout: float = 180.0) -> Ack:
        store = self.store()
        request = submit_request(store, action, epoch)
        ack = wait_ack(store, request.id, timeout, poll=0.2)
        assert ack is not None, f"no ack to {action.value} within {timeout} s"
        return ack

    def stop_when(self, name: str, run: Run, ready: Callable[[JobStatus], bool], done: Callable[[], bool] | None = None,
                  timeout: float = 180.0) -> Manifest:
        """Once the job's status is ``ready`` (and ``done()``, looked at every second): stop with savepoint, wait for
        ``run`` to exit stopped; the savepoint's manifest."""
        from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
        from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED

        status = self.wait_status(f"{name}: ready to stop", ready, timeout, run)
        deadline = time.monotonic() + timeout
        while done is not None and not done():
            assert run.proc.poll() is None, run.tail()
            assert time.monotonic() < deadline, f"{name}: the output is not complete after {timeout:.0f} s"
            time.sleep(1.0)
        ack = self.request(RequestAction.STOP, status.epoch)
        assert ack.outcome is Outcome.COMPLETED and ack.snapshot_id is not None, ack
        assert run.wait(90) == EXIT_STOPPED, run.tail()
        return load_manifest(self.store(), ack.snapshot_id)

    def consumed(self, status: JobStatus) -> int:
        """Records the driver's last completed batch has read, from its reported end offsets."""
        total = 0
        for offsets in status.offsets.values():
            for partitions in (offsets or {}).get(self.topic, {}).values() if isinstance(offsets, dict) else []:
                total += int(partitions)
        return total

    def final_counts(self) -> dict[str, int]:
        """Each key's count in the highest batch that updated it (update mode)."""
        counts: dict[str, int] = {}
        for path in sorted(self.out.glob("batch-*.json")):
            for key, count in json.loads(path.read_text()):
                counts[key] = count
        return counts

    def commits(self) -> dict[int, list[tuple[int, float]]]:
        """Per epoch: (batch id, time) of every batch its driver let Spark commit."""
        found: dict[int, list[tuple[int, float]]] = {}
        for path in self.out.glob("commits-epoch-*.log"):
            epoch = int(path.stem.rsplit("-", 1)[1])
            found[epoch] = [(int(b), float(t)) for b, t in (line.split() for line in path.read_text().splitlines())]
        return found


@dataclass
class Run:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s\n{self.tail()}") from None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        ours = [ln for ln in text if "airflow_ckpt_provider" in ln or "Error" in ln or "error" in ln]
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join((ours or text)[-lines:])

    def ckpt_lines(self) -> list[str]:
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if "airflow_ckpt_provider" in ln]

    def stop(self) -> None:
        """Kill what is left of this run (test teardown): ``ckpt run`` and the drivers it started in
        their own process groups (found by the group's leader, a child of ``ckpt run``)."""
        if self.proc.poll() is not None:
            return
        for child in _children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def kill_driver(status: JobStatus) -> None:
    """kill -9 the driver's whole process group (spark-submit's JVM, the Python driver, its workers)."""
    assert status.pid is not None
    os.killpg(os.getpgid(status.pid), signal.SIGKILL)


def wait_logged(what: str, check: Callable[[], Any], timeout: float, *logs: Path) -> Any:
    """The first truthy ``check()`` within ``timeout`` s (a look every 0.3 s); else fail naming ``what``, with the
    last lines of ``logs`` (a launch's, a service instance's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    tails = "\n".join(f"--- {log} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
                      for log in logs if log.exists()) or "(no log)"
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
