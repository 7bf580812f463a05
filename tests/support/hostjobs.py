"""Jobs on the test hosts of issue 41 (tests/support/hosts.py): drivers whose output lines are stamped with their
arrival time, the known stream they read, the exactly-once sink they write, and the commits their lines show.

Used by the scenarios of tests/integration/test_partitions.py (the driver cut from the store, from Kafka) and
tests/integration/test_paused_driver.py (a driver paused past its lease). Each driver runs tests/jobs/eo_job.py
(``dropDuplicates(["id"])`` over a 3-partition topic into one exactly-once sink) with ``ckpt run`` unsupervised,
local[2] bound to its host's address, and a live checkpoint and CKPT_HOME of its own on the shared file system
(namespaces separate the network only). Every output line is stamped with the time it arrived here (one wall clock:
the hosts share this machine's); lines that carry their log record's own time (``2026-11-28 09:57:43,860 INFO``)
can also be timed by it, which a line held in a pipe while its writer was paused does not change.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.lease import LeaseRecord, read_lease
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.conftest import TEST_DRIVER_JVM
from tests.support.exactlyonce import EO_JOB, EoSink, FilesSink, KafkaSink, PgLedgerSink, new_sink_topic
from tests.support.hosts import Host, Topology
from tests.support.runtimejob import SPARK_CONF, JobEnv, produce, snapshot_args
from tests.support.sparkhosts import MASTER, WORKERS, HostCluster, start_spark_cluster

BUCKET = "ckpt"
POLL = 1.0  # --poll-interval and --lease-interval: the driver looks at its lease and control requests every second
FENCE_GRACE = 4.0  # --fence-grace: outage tolerance 3 s; a newer driver waits max(4, 2*1+1, 3+1+1) = 5 s
MAX_OFFSETS = 150  # records per batch at most: a driver keeps up with the feed (a batch takes 2.5-4 s here)
CHUNK = 10  # new ids per feed (plus the previous feed's second copies): one feed a second, 20 records/s
FEEDS = 150  # at most: the feed is bounded however long the drivers take
WAIT = 180.0

#: A ckpt-kafka task's commit line (kafka/writer.py) and the sink's driver-side commit line.
TASK_COMMIT = re.compile(r"batch (\d+) partition (\d+) of job \S+ \(query (\S+)\): (\d+) records committed by")
BATCH_COMMIT = re.compile(r"batch (\d+) of job \S+ \(query \S+\) committed: ")
#: The ledger's commit line (sinks/ledger.py): its transaction committed.
LEDGER_COMMIT = re.compile(r"job \S+ query (\S+): batch (\d+) committed, \S+ rows, epoch (\S+), timeline (\d+)")
#: The ckpt-files sink's driver-side commit line (sinks/filecommit.py): its manifest was created.
FILES_COMMIT = re.compile(r"ckpt-files committed job \S+ query (\S+) batch (\d+) \(timeline (\d+)")
#: The Python worker that runs a sink's driver-side commit (Spark's commit runner), from its commit line.
COMMIT_WORKER = re.compile(r"\[worker (\d+)\]: (?:ckpt-files committed job |batch \d+ of job \S+ \(query \S+\) "
                           r"committed: )")
#: The runtime's batch line (runtime/driver.py): Spark committed the batch.
COMPLETED = re.compile(r"job \S+ epoch (\d+) batch (\d+): completed, (\d+) rows")
#: The second driver's restore (core/snapshots/restore.py).
RESTORED = re.compile(r"snapshot \S+ \(batch (\d+)\): restored into")
#: The lease watch's stop (runtime/leasewatch.py).
WATCH_STOP = "stopping the query now, nothing may commit"
_LOGGED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_time(line: str) -> float | None:
    """The time of a Python log record (``2026-11-28 09:57:43,860 ...``, local time) at the line's start."""
    match = _LOGGED.match(line)
    if match is None:
        return None
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Lines:
    """A driver's output lines, each with a time: what the commits, restores and stops it logged are read from."""

    def __init__(self, name: str, lines: list[tuple[float, str]] | None = None,
                 checkpoint: Path | None = None) -> None:
        self.name = name
        self.checkpoint = checkpoint  # its live checkpoint on this machine's disk: commits/N times Spark's commits
        self.lines: list[tuple[float, str]] = lines or []
        self._lock = threading.Lock()

    @classmethod
    def read(cls, name: str, log: Path) -> Lines:
        """The lines of a log file written elsewhere (a launch's log), each timed by its log record's own time when
        it has one, else by the previous line's."""
        lines, last = [], 0.0
        for line in log.read_text(errors="replace").splitlines():
            last = logged_time(line) or last
            lines.append((last, line))
        return cls(name, lines)

    def matching(self, pattern: re.Pattern[str], *, logged: bool = False) -> list[tuple[float, re.Match[str]]]:
        """(time, match) of every line that matches: its arrival time, or with ``logged`` its log record's time
        when the line has one (the moment it was written, even if the pipe held it while its writer was paused)."""
        with self._lock:
            lines = list(self.lines)
        found = [(t, line, m) for t, line in lines if (m := pattern.search(line))]
        return [((logged_time(line) or t) if logged else t, m) for t, line, m in found]

    def first(self, text: str) -> float | None:
        with self._lock:
            return next((t for t, line in self.lines if text in line), None)

    def containing(self, text: str) -> list[tuple[float, str]]:
        with self._lock:
            return [(t, line) for t, line in self.lines if text in line]

    def tail(self, count: int = 40) -> str:
        with self._lock:
            lines = [line for _, line in self.lines]
        ours = [ln for ln in lines if "airflow_ckpt_provider" in ln or "rror" in ln]
        return f"--- {self.name} ---\n" + "\n".join((ours or lines)[-count:])


class Stamped(Lines):
    """A process on a test host whose output lines are read here and stamped with their arrival time (written to
    ``log`` as ``<time> <line>``)."""

    def __init__(self, name: str, host: Host, argv: list[str], env: dict[str, str], log: Path,
                 checkpoint: Path | None = None) -> None:
        super().__init__(name, checkpoint=checkpoint)
        self.log = log
        self.proc = host.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, out: IO[bytes]) -> None:
        with open(self.log, "a") as file:
            for raw in iter(out.readline, b""):
                now = time.time()
                line = raw.decode(errors="replace").rstrip("\n")
                with self._lock:
                    self.lines.append((now, line))
                file.write(f"{now:.3f} {line}\n")
                file.flush()

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:.0f} s\n{self.tail()}") from None
        self._reader.join(10)
        return code

    def tail(self, count: int = 40) -> str:
        return super().tail(count).replace(f"--- {self.name} ---", f"--- {self.name} ({self.log}) ---", 1)

    def stop(self) -> None:
        """Teardown: kill the whole process group (ckpt run, spark-submit's JVM, the Python driver, its workers)."""
        if self.proc.poll() is None:
            for pid in _group_members(self.proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, 9)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait(30)


def _group_members(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def proc_state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of the process's main thread (clock ticks; not its client libraries' threads), None once it is
    gone."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of /proc/PID/stat


_SYSCALLS = {0: "read", 1: "write", 7: "poll", 23: "select", 35: "nanosleep", 44: "sendto", 45: "recvfrom",
             46: "sendmsg", 47: "recvmsg", 61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
             270: "pselect6", 271: "ppoll", 281: "epoll_pwait"}
_FD_CALLS = {"read", "write", "sendto", "recvfrom", "sendmsg", "recvmsg"}


def blocked_on(pid: int) -> str:
    """Where each thread of a (stopped) process is: its system call and, for a socket, the peer it talks to
    (``recvfrom(fd 9: tcp 10.213.41.10:8333)``); from /proc/PID/task/TID/syscall, as root."""
    found = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name)):
        try:
            fields = (task / "syscall").read_text().split()
        except OSError:
            continue
        if not fields or fields[0] == "running" or int(fields[0]) < 0:
            found.append(f"{task.name}: running")
            continue
        name = _SYSCALLS.get(int(fields[0]), f"syscall {fields[0]}")
        args = [int(a, 16) for a in fields[1:7]]
        fds = [args[0]] if name in _FD_CALLS else _poll_fds(pid, args[0], args[1]) if name in ("poll", "ppoll") else []
        found.append(f"{task.name}: {name}({', '.join(_describe_fd(pid, fd) for fd in fds)})")
    return "; ".join(found) or "gone"


def _poll_fds(pid: int, address: int, count: int) -> list[int]:
    import struct

    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(address)
            data = mem.read(8 * min(count, 16))
    except OSError:
        return []
    return [struct.unpack_from("ihh", data, 8 * i)[0] for i in range(len(data) // 8)]


def _describe_fd(pid: int, fd: int) -> str:
    import ipaddress

    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return f"fd {fd}"
    inode = target[len("socket:["):-1] if target.startswith("socket:[") else None
    if inode is None:
        return f"fd {fd}: {target}"
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[9] == inode:
                    host, port = cols[2].split(":")
                    if len(host) == 8:  # IPv4, little-endian
                        addr = str(ipaddress.IPv4Address(int.from_bytes(bytes.fromhex(host), "little")))
                    else:
                        addr = host
                    return f"fd {fd}: tcp {addr}:{int(port, 16)}"
    return f"fd {fd}: {target}"


def alive(pids: list[int]) -> list[int]:
    """The processes of ``pids`` that still exist and are not zombies."""
    return [p for p in pids if Path(f"/proc/{p}").exists() and proc_state(p) not in (None, "Z")]


class Feed:
    """The known stream, produced from the launcher host: each feed CHUNK new ids and the previous feed's second
    copies (dropDuplicates keeps the first), one a second on a thread, until ``finish()``; FEEDS at most."""

    def __init__(self, launcher: Host, bootstrap: str, topic: str) -> None:
        self.launcher = launcher
        self.bootstrap = bootstrap
        self.topic = topic
        self.next_id = 0
        self.records = 0
        self.pending: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feed", daemon=True)
        self.error: BaseException | None = None

    def _produce(self, start: int, count: int) -> None:
        self.launcher.call(produce, self.bootstrap, self.topic, start, count)
        self.records += count

    def feed(self) -> None:
        self._produce(self.next_id, CHUNK)
        if self.pending:
            self._produce(*self.pending)
        self.pending = (self.next_id, CHUNK)
        self.next_id += CHUNK

    def _loop(self) -> None:
        try:
            for _ in range(FEEDS):
                if self._stop.wait(1.0):
                    return
                self.feed()
        except BaseException as err:  # reported by finish()
            self.error = err

    def start(self) -> None:
        self.feed()
        self._thread.start()

    def halt(self) -> None:
        """Teardown: stop feeding, produce nothing more."""
        self._stop.set()

    def finish(self) -> None:
        """Stop feeding; produce the last feed's second copies: every id has been produced twice."""
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, f"the feed failed: {self.error!r}"
        if self.pending:
            self._produce(*self.pending)
        self.pending = None


@dataclass
class Scenario:
    """One run of a scenario with one sink: the topology, the job, its drivers and what the test measured."""

    topo: Topology
    env: JobEnv
    sink: Any
    work: Path
    drivers: list[Stamped] = field(default_factory=list)
    times: dict[str, Any] = field(default_factory=dict)
    #: the host of the test's clients (the feed, status and sink reads): one the scenario never harms
    client: str = "launcher"
    #: the Spark standalone cluster the drivers run on in client mode (one core each), None for local[2] drivers
    cluster: HostCluster | None = None

    @property
    def clients(self) -> Host:
        """The host of the test's clients (``client``)."""
        return self.topo[self.client]

    def in_launcher(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(...)`` on the clients' host (the launcher unless the scenario harms it)."""
        return self.clients.call(fn, *args, **kwargs)

    def status(self) -> JobStatus | None:
        return self.in_launcher(self.env.status)  # type: ignore[no-any-return]

    def lease(self) -> LeaseRecord | None:
        return self.in_launcher(lambda: read_lease(self.env.store()))  # type: ignore[no-any-return]

    def start_driver(self, name: str, host: Host, *args: str, lease_defaults: bool = False) -> Stamped:
        """``ckpt run`` of the job on ``host``; with ``lease_defaults`` the product's lease settings (poll 1 s, fence
        grace 10 s) instead of this module's (``POLL``, ``FENCE_GRACE``)."""
        local = self.cluster is None
        env = self.env.env(MAX_OFFSETS, {**self.sink.env()}, local=local)
        faults = self.work / f"faults-{name}"  # crash and hold points a test arms (core/policy/faults.py)
        faults.mkdir(exist_ok=True)
        env.update(SPARK_LOCAL_IP=host.address, CKPT_HOME=str(self.work / f"home-{name}"), CKPT_FAULT_DIR=str(faults))
        lease = [] if lease_defaults else ["--poll-interval", str(POLL), "--lease-interval", str(POLL),
                                           "--fence-grace", str(FENCE_GRACE)]
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(EO_JOB), "--job", self.env.job,
                "--store", self.env.store_url, "--checkpoint", str(self.work / f"checkpoint-{name}"),
                "--master", "local[2]" if self.cluster is None else self.cluster.cluster.master_url, "-v", *lease,
                *snapshot_args(args)]
        # On the cluster one core each: a second driver gets the other worker's core while the first one runs.
        settings = {**self.sink.conf(), **({} if self.cluster is None else self.cluster.cluster.job_conf(cores=1)),
                    "spark.driver.host": host.address, "spark.driver.bindAddress": host.address}
        conf = [*SPARK_CONF, *(f"{k}={v}" for k, v in settings.items())]
        for setting in conf:
            argv += ["--conf", setting]
        driver = Stamped(name, host, argv, env, self.work / f"{name}.log", self.work / f"checkpoint-{name}")
        self.drivers.append(driver)
        return driver

    def hold_at(self, name: str, point: str, timeout: float = 60.0) -> Path:
        """Arm ``point`` of driver ``name`` to hold, wait until the driver holds there; returns the file whose
        deletion lets it go on (core/policy/faults.py)."""
        from airflow_ckpt_provider.core.policy.faults import HOLD

        armed = self.work / f"faults-{name}" / point
        armed.write_bytes(HOLD)
        held = armed.with_name(point + ".held")
        deadline = time.monotonic() + timeout
        while not held.exists():
            assert time.monotonic() < deadline, f"driver {name} did not reach {point} within {timeout:.0f} s"
            time.sleep(0.02)
        return held

    def wait_status(self, what: str, ok: Any, timeout: float, *watch: Stamped) -> JobStatus:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.status()
            except Exception:  # the store answers again on the next look
                status = None
            if status is not None and ok(status):
                return status
            for driver in watch:
                if driver.proc.poll() is not None:
                    raise AssertionError(f"{driver.name} exited with {driver.proc.returncode} while waiting for "
                                         f"{what}; status {status}\n{driver.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; status {status}\n"
                                     + "\n".join(d.tail() for d in watch))
            time.sleep(0.3)

    def wait_newer_lease(self, than: int, driver: Stamped, timeout: float = WAIT) -> LeaseRecord:
        """The lease once a driver newer than epoch ``than`` took it (``driver``, which must not exit meanwhile)."""
        lease = None
        deadline = time.monotonic() + timeout
        while lease is None or lease.epoch <= than:
            assert time.monotonic() < deadline, f"{driver.name} took no lease in {timeout:.0f} s\n{driver.tail()}"
            assert driver.proc.poll() is None, f"{driver.name} exited with {driver.proc.returncode}\n{driver.tail()}"
            time.sleep(0.3)
            with contextlib.suppress(Exception):  # the store answers again on the next look
                lease = self.lease()
        return lease

    def consumed(self, status: JobStatus) -> int:
        return self.env.consumed(status)


def start_services(sc: Scenario, roles: tuple[str, ...],
                   job_env: dict[str, str] | None = None) -> dict[str, tuple[subprocess.Popen[Any], Path]]:
    """``ckpt service run`` on each host of ``roles`` (issue 42): its own host name, instance name and CKPT_HOME (the
    supervisors and drivers it starts run on its host), the store's credentials in its environment (and ``job_env``,
    the job's settings, for a deployment that records none); role -> (process, output file)."""
    started = {}
    for role in roles:
        host = sc.topo[role]
        env = sc.env.env(MAX_OFFSETS, job_env)
        env.update(SPARK_LOCAL_IP=host.address, CKPT_HOME=str(sc.work / f"home-{role}"))
        log = sc.work / f"{role}.log"
        with log.open("ab") as out:
            proc = host.popen([sys.executable, "-m", "airflow_ckpt_provider.cli", "service", "run", "--store",
                               sc.env.store_url, "--instance", role, "--endpoint-url", sc.env.s3.endpoint_url,
                               "--region", sc.env.s3.region], own_hostname=True, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
        started[role] = (proc, log)
    return started


def stop_services(services: dict[str, tuple[subprocess.Popen[Any], Path]]) -> None:
    """Teardown: SIGTERM each instance still running (it releases its jobs), then wait for it."""
    for proc, _log in services.values():
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


#: One look at status.json: (time, state, batch, restart_count, epoch, pid).
Look = tuple[float, str, int | None, int, int, int | None]


def watch_status(sc: Scenario, driver: Stamped, done: Callable[[], bool], timeout: float) -> list[Look]:
    """Look at status.json every half second until ``done()`` (``timeout`` at most): each look; fails if the
    driver's process exits meanwhile."""
    seen: list[Look] = []
    deadline = time.monotonic() + timeout
    while True:
        assert driver.proc.poll() is None, f"the driver exited with {driver.proc.returncode}\n{driver.tail()}"
        status: JobStatus | None = None
        try:
            status = sc.status()
        except Exception:  # the store answers again on the next look
            status = None
        if status is not None:
            seen.append((time.time(), status.state.value, status.batch_id, status.restart_count, status.epoch,
                         status.pid))
        if done() or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def grace_end(lease: LeaseRecord) -> float:
    """When a driver that took ``lease`` from a running one may first commit: its lease time plus the grace it
    waits for the previous holder (Lease.grace, with this module's settings)."""
    return lease.acquired_at + max(FENCE_GRACE, 2 * POLL + 1.0, (FENCE_GRACE - POLL) + POLL + 1.0)


def files_sink(s3: Any) -> FilesSink:
    return FilesSink(f"s3://{BUCKET}/out", S3Options(endpoint_url=s3.endpoint_url, region=s3.region,
                                                     access_key_id=s3.access_key, secret_access_key=s3.secret_key))


def kafka_sink(topo: Topology, kafka: Any) -> KafkaSink:
    topic = topo["kafka"].call(new_sink_topic, kafka)
    return KafkaSink(kafka.bootstrap_servers, topic)


def ground(topo: Topology, sink_name: str, work: Path, job_prefix: str, client: str = "launcher") -> Scenario:
    """SeaweedFS on ``store`` (the job store and the files sink's bucket), tansu with memory storage on ``kafka``
    (the input topic, 3 partitions, and the Kafka sink's topic), and the job's scenario, nothing started yet;
    ``client``: the host of the test's clients."""
    s3 = topo.start_store()
    kafka = topo.start_kafka(on_s3=False)  # memory storage: no tansu-on-S3 ListOffsets lag; the faults are elsewhere
    topo[client].call(s3.create_bucket, BUCKET)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    topo["kafka"].call(kafka.create_topic, topic, 3)
    job = f"{job_prefix}-{sink_name}-{uuid.uuid4().hex[:6]}"
    sink: EoSink
    if sink_name == "ledger":
        sink = PgLedgerSink(topo.start_db().dsn, job)
    else:
        sink = kafka_sink(topo, kafka) if sink_name == "kafka" else files_sink(s3)
    env = JobEnv(s3, kafka, work, BUCKET, topic, job=job)
    return Scenario(topo, env, sink, work, client=client)


def commit_times(driver: Lines, *, logged: bool = False) -> list[tuple[float, str]]:
    """Every sink commit the driver's lines show, (time, what): the ckpt-kafka tasks' and driver-side commits, the
    ledger's transactions, the ckpt-files manifest commits (arrival times, or the log records' own times with
    ``logged``), and the batches the runtime says completed, timed by Spark's commit itself (``spark_commit_time``)."""
    found = [(t, f"task commit batch {m[1]} partition {m[2]}") for t, m in driver.matching(TASK_COMMIT, logged=logged)]
    found += [(t, f"batch {m[1]} committed (sink's driver commit)")
              for t, m in driver.matching(BATCH_COMMIT, logged=logged)]
    found += [(t, f"batch {m[2]} committed (ckpt-files manifest, timeline {m[3]})")
              for t, m in driver.matching(FILES_COMMIT, logged=logged)]
    found += [(t, f"batch {m[2]} committed (ledger, epoch {m[3]}, timeline {m[4]})")
              for t, m in driver.matching(LEDGER_COMMIT, logged=logged)]
    found += [(spark_commit_time(driver, int(m[2]), t), f"batch {m[2]} completed (Spark commit)")
              for t, m in driver.matching(COMPLETED, logged=logged)]
    return sorted(found)


def with_executors(driver: Lines, cluster: HostCluster | None, app_id: str | None) -> Lines:
    """``driver``'s lines and, on a cluster, the lines its application's executors logged (their stderr under the
    workers' work directories, each timed by its log record's own time): the ckpt-kafka tasks commit there."""
    if cluster is None or not app_id:
        return driver
    lines = list(driver.lines)
    for worker in cluster.cluster.workers:
        for stderr in sorted((worker.workdir / "work" / app_id).glob("*/stderr")):
            lines += Lines.read(driver.name, stderr).lines
    return Lines(driver.name, sorted(lines, key=lambda timed: timed[0]), checkpoint=driver.checkpoint)


def spark_commit_time(driver: Lines, batch: int, line_time: float) -> float:
    """When Spark committed ``batch``: its commits/N file in the driver's live checkpoint was written then. The
    runtime's ``completed`` line can come much later (its loop drains the batch events between store requests, which a
    cut holds: scenario 1 saw the line of a batch committed 2 s into the cut logged at the heal, 60 s in)."""
    if driver.checkpoint is not None:
        with contextlib.suppress(OSError):
            return (driver.checkpoint / "commits" / str(batch)).stat().st_mtime
    return line_time


def check_left_behind(topo: Topology, pids: list[int]) -> None:
    """Nothing of the topology left: no namespace, link or process (``pids``: the hosts' processes at the end)."""
    assert topo.leftovers() == {"namespaces": [], "links": [], "processes": []}, "something left behind"
    assert not alive(pids), f"processes left behind: {alive(pids)}"


#: The roles of the scenarios: the store, Kafka, the (first) driver's host and the launcher (a second driver, the
#: test's clients); ``db`` joins them for the ledger sink.
SCENARIO_ROLES = ["store", "kafka", "launcher", "driver"]


def run_scenario(name: str, sink_name: str, work: Path, job_prefix: str, run: Callable[[Scenario, Feed], None], *,
                 roles: list[str] = SCENARIO_ROLES, client: str = "launcher", spark: str = "local") -> None:
    """A scenario on its own topology of ``roles`` (``db`` added for the ledger): the ground (``ground``; the test's
    clients on ``client``), the feed, ``run``; then, whatever happened, the feed halted, every driver stopped, the
    timeline written to ``work/report.json`` and nothing left behind (``check_left_behind``); ``run`` asserts the
    scenario's claims. ``spark``: ``local`` (each driver local[2] on its host) or ``standalone`` (the master and
    worker hosts join the topology; the drivers run in client mode on their hosts, one core of a worker each)."""
    if spark not in ("local", "standalone"):
        raise ValueError(f"spark must be 'local' or 'standalone', found {spark!r}")
    cluster_roles = [MASTER, *WORKERS] if spark == "standalone" else []
    pids: list[int] = []
    with Topology(roles + cluster_roles + (["db"] if sink_name == "ledger" else [])) as topo:
        try:
            sc = ground(topo, sink_name, work, job_prefix, client)
            if cluster_roles:
                sc.cluster = start_spark_cluster(topo, work / "spark", java_opts=TEST_DRIVER_JVM)
            sc.times["spark"] = "local[2]" if sc.cluster is None else f"standalone {sc.cluster.cluster.master_url}"
            feed = Feed(sc.clients, sc.env.kafka.bootstrap_servers, sc.env.topic)
            try:
                run(sc, feed)
            finally:
                feed.halt()
                for driver in sc.drivers:
                    driver.stop()
                (work / "report.json").write_text(json.dumps(sc.times, indent=1))
                print(f"{name} ({sink_name}): {json.dumps(sc.times)}")
        finally:
            pids = [p for role in topo.hosts for p in topo[role].pids()]
    check_left_behind(topo, pids)  # (d)


def finish_and_count(sc: Scenario, feed: Feed, driver: Stamped) -> tuple[JobStatus, list[Any], list[str]]:
    """The end of a one-driver scenario: the rest of the feed, every record consumed, a stop with a savepoint (exit
    0), the sink's committed rows read and counted into ``sc.times``; returns the final status, the rows and the
    supervisor's driver starts."""
    times = sc.times
    feed.finish()
    final = sc.wait_status(f"all {feed.records} records consumed", lambda s: sc.consumed(s) == feed.records
                           and s.state is JobState.RUNNING, WAIT, driver)
    times["ids"] = feed.next_id
    times["records"] = feed.records
    times["restart_count at the end"] = final.restart_count
    times["restarts at the end"] = final.restarts
    starts = [line for _, line in driver.containing("started (attempt") if "launcher.supervisor" in line]
    times["drivers started by the supervisor"] = len(starts)
    ack = sc.in_launcher(sc.env.request, RequestAction.STOP, final.epoch)
    assert ack.outcome is Outcome.COMPLETED, ack
    assert driver.wait(WAIT) == EXIT_STOPPED, driver.tail()
    return final, count_committed(sc, feed), starts


def count_committed(sc: Scenario, feed: Feed) -> list[Any]:
    """The sink's committed rows, read from the launcher; their count, duplicated and missing ids go to
    ``sc.times``."""
    rows: list[Any] = sc.in_launcher(sc.sink.committed)
    counts = Counter(r[0] for r in rows)
    sc.times["committed rows"] = len(rows)
    sc.times["duplicated ids"] = sum(1 for n in counts.values() if n > 1)
    sc.times["missing ids"] = len(set(range(feed.next_id)) - set(counts))
    return rows
