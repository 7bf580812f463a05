"""Benchmark of the job runtime: recovery after a query failure inside a live driver and after kill -9,
versus a cold start, and the throughput cost of periodic snapshots, measured side by side in one run.

    .venv/bin/python bench/runtime_bench.py [--rounds 3] [--kills 1] [--failures 3] [--window 30] [--warmup 60]
                                           [--turns 4] [--turn-window 10] [--quick]

Runs the test job (tests/jobs/kafka_count.py: a stateful count per key over a ckpt-kafka topic) with
``ckpt run --supervise`` (fixed-delay restarts, 0.5 s apart) exactly as users do, on one backlog topic
that every job reads from the start (fresh job, fresh checkpoint). Each round runs the job twice,
A = checkpoint snapshot after every batch + a savepoint every 30 s, B = no snapshots, in alternating
order (A B, B A, A B). Each job is measured for:

1. Cold start: spawn of ``ckpt run`` to the first batch that read rows (batch 1: the ckpt-kafka
   source's batch 0 only resolves startingOffsets and reads nothing).
2. Throughput: records/s of the batches completed over --window seconds (the backlog never runs dry), in
   steady state: the window starts --warmup seconds after that first batch; target: A within 5% of B. The
   warm-up window before it is measured and reported apart, without a target: a fresh driver JVM's JIT
   compiler threads are still compiling Spark's planner and scheduler then (about half the JVM's CPU per batch
   in the first 30 s on a 2-core VM, a third of that a minute later; the "JIT" CPU in the tables), and anything
   else running on the machine, snapshots included, delays that compilation and slows the batches.
   Then (A jobs only) --turns windows of --turn-window seconds with checkpoint snapshots paused and taken in
   turns (the file named by CKPT_BENCH_PAUSE_CHECKPOINTS, core/policy/faults.py): the same driver JVM against itself,
   free of the JIT and GC modes that make whole jobs 10-15% faster or slower than others; same target.
3. Recovery (A jobs only: the default configuration), --kills times after the window: kill -9 of
   the driver's process group in steady state (after >= 2 batches with rows of its epoch), to the
   first batch the restarted driver completes, split into detection, restart, JVM + Python,
   SparkSession + build, start decision, query start and that batch. Targets: recovery <= 1.3x the
   cold start of the same jobs; detection < 5 s.
4. Recovery inside the driver (A jobs only), --failures times before the kills: the job's foreachBatch
   raises once (tests/jobs/kafka_count.py's ``sink`` fault, which writes the time it fired), the driver
   restarts the query in its SparkSession (fixed-delay, --restart-delay); from the raise to the first batch
   committed after it, split into detection, delay, query start and that batch. Targets: median <= 5 s and
   <= 0.2x the cold start of the same jobs.

With ``--cluster`` each round also runs C = A on a Spark standalone cluster on 127.0.0.1 (embedded/sparkcluster.py:
a master and two workers, 1 core and 1 GB each; the executors' Python shipped with ``--python-env ship`` from an
environment cache that starts empty, so the first C job builds it and the later ones reuse it; the first round
runs C twice): throughput and
both recoveries of C next to A's, and the cost of shipping (the first C cold start versus the later ones).

Times come from the ``ckpt run -v`` log lines (supervisor and driver, millisecond timestamps; Spark's
own lines have whole seconds) and from this script's clock at spawn and kill. Prints tables and a
verdict per target; nothing is asserted. Starts its own SeaweedFS and tansu on 127.0.0.1 and stops
every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make `tests` importable

from airflow_ckpt_provider.core.policy.faults import PAUSE_ENV
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster
from tests.support.runtimejob import JobEnv, Run

PARTITIONS = 3
RECOVERY_TARGET = 1.3
IN_DRIVER_TARGET_S = 5.0
IN_DRIVER_TARGET = 0.2
DETECTION_TARGET_S = 5.0
OVERHEAD_TARGET = 0.05
WAIT_S = 240.0  # the longest any single step may take before the bench gives up


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to measure."""


@dataclass(frozen=True)
class Options:
    rounds: int
    kills: int
    records: int
    keys: int
    max_offsets: int
    window: float
    checkpoint_interval: float
    savepoint_interval: float
    restart_delay: float
    kill_after: float
    workdir: Path
    failures: int = 3
    cluster: bool = False
    driver_jvm: str = ""
    warmup: float = 60.0
    snapshot_nice: int | None = None  # A's and C's snapshot thread (None: the runtime's default)
    turns: int = 0  # A's windows with and without checkpoint snapshots in turns, after its steady window
    turn_window: float = 10.0


# -- the ckpt run log ------------------------------------------------------------------------------

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) [A-Z]+ \S+: (.*)$")
SPARK_LINE = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d) (.*)$")  # log4j: whole seconds
PATTERNS = {
    "spawn": re.compile(r"^job \S+: driver pid (\d+) started \(attempt (\d+)"),
    "exit": re.compile(r"^job \S+: driver exited with code (-?\d+) after"),
    "lease": re.compile(r"^job \S+: lease taken at epoch (\d+)"),
    "start": re.compile(r"^job \S+: start: (.*)"),
    "restored": re.compile(r"restored into .*; Spark resumes at batch (\d+)"),
    "grace": re.compile(r"^job \S+ epoch \d+: waiting ([\d.]+) s for the previous driver"),
    "query": re.compile(r"^job \S+ epoch (\d+): query \S+ started"),
    "batch": re.compile(r"^job \S+ epoch (\d+) batch (\d+): completed, (\d+) rows"),
    "sparkctx": re.compile(r"^INFO SparkContext: Running Spark version"),
    "qfailed": re.compile(r"^job \S+ epoch (\d+): query failed at batch (\S+) .* restarting it in this driver in "
                          r"([\d.]+) s \(attempt (\d+)"),
    "qrestarted": re.compile(r"^job \S+ epoch (\d+): query restarted in this driver \(attempt (\d+)\)"),
    "envbuilt": re.compile(r"^built the executors' Python environment in ([\d.]+) s: (\S+) \(([\d.]+) MB\)"),
    "snapshot": re.compile(r"^job \S+ snapshot \S+ \(batch (\d+)\): completed (checkpoint|savepoint) .* ([\d.]+) s$"),
}


@dataclass(frozen=True)
class Event:
    """One log line the bench cares about: its time (epoch seconds, ms resolution), kind and fields."""

    t: float
    kind: str
    fields: tuple[str, ...]

    def int(self, i: int) -> int:
        return int(self.fields[i])


@dataclass
class LogWatch:
    """Follows one ``ckpt run -v`` log file and turns its lines into events; samples the machine's load
    (1-min load average, and JVMs this bench did not start: other people's Spark on the shared VM)."""

    run: Run
    events: list[Event] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    others: int = 0
    _offset: int = 0
    _partial: bytes = b""
    _sampled: float = 0.0

    def sample(self) -> None:
        if time.monotonic() - self._sampled >= 1.0:
            self._sampled = time.monotonic()
            self.loads.append(os.getloadavg()[0])
            self.others = max(self.others, foreign_jvms())

    def mark(self) -> int:
        """Start a new noise interval: the index of its first load sample."""
        self.others = 0
        return len(self.loads)

    def noise(self, since: int = 0) -> str:
        """Mean load average / most foreign JVMs seen, since ``mark()`` returned ``since``."""
        loads = self.loads[since:]
        return f"{statistics.mean(loads):.1f} / {self.others}" if loads else "-"

    def poll(self) -> list[Event]:
        with open(self.run.log, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            text = raw.decode(errors="replace")
            if m := LINE.match(text):
                stamp = "%Y-%m-%d %H:%M:%S,%f"
            elif m := SPARK_LINE.match(text):
                stamp = "%y/%m/%d %H:%M:%S"
            else:
                continue
            for kind, pattern in PATTERNS.items():
                found = pattern.search(m.group(2))
                if found:
                    self.events.append(Event(datetime.strptime(m.group(1), stamp).timestamp(), kind, found.groups()))
                    break
        return self.events

    def wait(self, what: str, found: Callable[[list[Event]], Event | None], timeout: float = WAIT_S) -> Event:
        """Poll until ``found`` picks an event; fail with the log's tail if the run exits or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            self.sample()
            event = found(self.poll())
            if event is not None:
                return event
            if self.run.proc.poll() is not None:
                raise BenchError(f"{self.run.name} exited with {self.run.proc.returncode} while waiting for "
                                 f"{what}\n{self.run.tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.run.tail()}")
            time.sleep(0.05)


def first(events: Sequence[Event], kind: str, after: float = 0.0, test: Callable[[Event], bool] | None = None,
          start: int = 0) -> Event | None:
    """The first event of ``kind`` from index ``start`` at or after time ``after`` that passes ``test``."""
    for e in events[start:]:
        if e.kind == kind and e.t >= after and (test is None or test(e)):
            return e
    return None


def need(event: Event | None, what: str, watch: LogWatch) -> Event:
    """``event``, or BenchError: a line the bench relies on is missing from the log."""
    if event is None:
        raise BenchError(f"no log line for {what} in {watch.run.log}\n{watch.run.tail()}")
    return event


def batches(events: Sequence[Event], epoch: int) -> list[Event]:
    return [e for e in events if e.kind == "batch" and e.int(0) == epoch]


# -- processes -------------------------------------------------------------------------------------

def _stat(pid: int, tid: int | None = None) -> list[str] | None:
    """Fields of /proc/PID/stat (or of its thread TID) after the command name (state, ppid, pgrp, session, ...),
    or None."""
    try:
        return Path(f"/proc/{pid}" + (f"/task/{tid}" if tid else "") + "/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def stop_run(run: Run, watch: LogWatch | None) -> None:
    """Kill a supervised ``ckpt run`` and every driver it started, with all their processes; warn about survivors.

    The supervisor runs in a session of its own and starts each driver (spark-submit, its JVM, the
    Python driver and workers) in another; PySpark's worker daemon leaves the driver's process group
    (setpgid), so each session is swept by its id: the supervisor's, its children's, and those of the
    drivers the log shows it started (killed ones included). The supervisor is frozen first so that it
    cannot start a driver meanwhile.
    """
    leader = run.proc.pid
    if run.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGSTOP)
    sessions = {leader} | {pid for pid in _pids() if (s := _stat(pid)) and int(s[1]) == leader}
    if watch is not None:
        sessions |= {e.int(0) for e in watch.poll() if e.kind == "spawn"}
    for pid in _pids():
        s = _stat(pid)
        if s is not None and int(s[3]) in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGCONT)
    run.proc.wait(30)
    left = leftovers(sessions)
    if left:
        print(f"warning: processes {left} of {run.name} still alive after the stop", file=sys.stderr)


def leftovers(sessions: set[int], timeout: float = 10.0) -> list[int]:
    """Processes of ``sessions`` still alive after ``timeout`` (SIGKILL is not instant under load)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in _pids() if (s := _stat(pid)) and int(s[3]) in sessions and s[0] != "Z"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def foreign_jvms() -> int:
    """Running JVMs that this process did not start (walks each one's parents; zombies do not count)."""
    me, count = os.getpid(), 0
    for pid in _pids():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "java" or (_stat(pid) or ["Z"])[0] == "Z":
                continue
        except OSError:
            continue
        parent: int | None = pid
        while parent is not None and parent > 1 and parent != me:
            s = _stat(parent)
            parent = int(s[1]) if s else None  # gone meanwhile (spark-submit's launcher JVM): not counted
        count += parent is not None and parent != me
    return count


ROLES = ("jvm", "jit", "driver", "workers", "s3", "kafka")
#: HotSpot's JIT compiler threads ("C1 CompilerThread0", "C2 CompilerThread1"; /proc truncates names to 15 bytes)
JIT_THREAD = re.compile(r"^C\d CompilerThre")


def jit_seconds(pid: int, tick: int) -> float:
    """CPU seconds the JVM ``pid``'s JIT compiler threads used so far (part of its own CPU seconds)."""
    used = 0.0
    with contextlib.suppress(OSError):  # the JVM exited meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                if JIT_THREAD.match((task / "comm").read_text()) and (s := _stat(pid, int(task.name))):
                    used += (int(s[11]) + int(s[12])) / tick
    return used


def cpu_seconds(driver_session: int, servers: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the driver's JVM (and, part of it, its JIT compiler threads),
    its Python driver, its other processes (Python workers, the streaming source runner) and the S3 and Kafka
    servers' sessions."""
    tick = os.sysconf("SC_CLK_TCK")
    used = dict.fromkeys(ROLES, 0.0)
    by_session = {sid: role for role, sid in servers.items() if sid is not None}
    for pid in _pids():
        s = _stat(pid)
        if s is None:
            continue
        cpu, session = (int(s[11]) + int(s[12])) / tick, int(s[3])
        if session in by_session:
            used[by_session[session]] += cpu
        elif session == driver_session:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            role = ("jvm" if argv[0].endswith(b"java") else
                    "driver" if any(a.endswith(b"entrypoint.py") for a in argv) else "workers")
            used[role] += cpu
            if role == "jvm":
                used["jit"] += jit_seconds(pid, tick)
    return used


WARM_PACKAGES = ("pyspark", "pyarrow", "pandas", "numpy", "botocore", "confluent_kafka", "airflow_ckpt_provider")


def warm_page_cache() -> tuple[int, float]:
    """Read Spark's jars, the JDK and the Python packages the driver loads once: (bytes, seconds).

    A restarted driver finds them in the page cache; without this, the first cold start of a run after
    other work (another venv's Spark) reads them from disk and the comparison flatters recovery.
    """
    import importlib.util

    started, total = time.perf_counter(), 0
    roots = [Path(spec.origin).parent for name in WARM_PACKAGES
             if (spec := importlib.util.find_spec(name)) is not None and spec.origin]
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin") + os.pathsep
                        + os.environ.get("PATH", ""))
    if java:
        roots.append(Path(java).resolve().parents[1])
    for root in roots:
        for path in root.rglob("*"):
            with contextlib.suppress(OSError), open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
    return total, time.perf_counter() - started


# -- data ------------------------------------------------------------------------------------------

def produce(bootstrap: str, topic: str, records: int, keys: int) -> None:
    """``records`` records keyed ``k<i % keys>``: fast batched produce, then one single-record batch per partition.

    tansu answers ListOffsets(LATEST) with the base offset of the last record batch + 1 (see
    ENVIRONMENT.md); a final one-record batch per partition makes that the true end.
    """
    from confluent_kafka import Producer

    payload = b"x" * 100
    bulk = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                     "batch.num.messages": 10000, "compression.type": "none"})
    for i in range(records - PARTITIONS):
        while True:
            try:
                bulk.produce(topic, value=payload, key=f"k{i % keys}".encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                bulk.poll(0.05)
        if i % 10000 == 0:
            bulk.poll(0)
    assert bulk.flush(120) == 0, "records still queued after 120 s"
    last = Producer({"bootstrap.servers": bootstrap, "acks": "all", "batch.num.messages": 1})
    for p in range(PARTITIONS):
        last.produce(topic, value=payload, key=b"end", partition=p)
    assert last.flush(30) == 0, "records still queued after 30 s"


# -- starts and recoveries --------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    """One start of the job: cold (spawn of ``ckpt run``) or a recovery (kill -9 of the driver).

    Phases in seconds, in the driver's order: ``jvm`` from the spawn of spark-submit to Spark's
    "Running Spark version" line (JVM, Python driver, the job file, the restore check; whole-second
    resolution), ``session`` from there to the lease (SparkContext and SparkSession, registering the
    Python data source, the job's build function: all before the lease is taken), ``decide`` to the
    start decision (fence grace, if any, and observe/decide), ``query`` to the query's start (a
    snapshot restore, if any, and ``writeStream.start()``). ``cli`` and ``batch0`` only for cold
    starts, ``detect`` and ``delay`` only for recoveries. ``total`` runs to the first batch with rows.
    """

    round: int
    config: str
    kind: str
    total: float
    detect: float | None
    delay: float | None
    cli: float | None
    jvm: float | None
    session: float | None
    decide: float
    query: float
    batch0: float | None
    first_batch: float
    batch_id: int
    rows: int
    grace: float = 0.0
    note: str = ""
    noise: str = ""


def _split_up(ev: Sequence[Event], spawn: Event, lease: Event) -> tuple[float | None, float | None]:
    ctx = first(ev, "sparkctx", after=spawn.t - 1.0, test=lambda e: e.t <= lease.t)
    return (ctx.t - spawn.t, lease.t - ctx.t) if ctx else (None, None)


def cold_start(watch: LogWatch, spawned: float, rnd: int, config: str) -> Start:
    has_rows = watch.wait("the first batch with rows of epoch 1",
                          lambda ev: first(ev, "batch", test=lambda e: e.int(0) == 1 and e.int(2) > 0))
    ev = watch.events
    spawn, lease, start, query = (need(first(ev, k), k, watch) for k in ("spawn", "lease", "start", "query"))
    batch0 = need(first(ev, "batch", test=lambda e: e.int(0) == 1), "batch 0", watch)
    gap = batch0.t - query.t if batch0 is not has_rows else None
    jvm, session = _split_up(ev, spawn, lease)
    return Start(rnd, config, "cold", has_rows.t - spawned, None, None, spawn.t - spawned, jvm, session,
                 start.t - lease.t, query.t - start.t, gap,
                 has_rows.t - (batch0.t if gap is not None else query.t), has_rows.int(1), has_rows.int(2),
                 noise=watch.noise())


def recover(watch: LogWatch, opts: Options, rnd: int, config: str, epoch: int, checkpoint: Path) -> Start:
    """Wait for 2 batches with rows of ``epoch``, kill -9 its driver, measure until its successor's first batch."""
    since = watch.mark()
    watch.wait(f"2 batches with rows of epoch {epoch}",
               lambda ev: b[1] if len(b := [e for e in batches(ev, epoch) if e.int(2) > 0]) >= 2 else None)
    time.sleep(opts.kill_after)
    spawn = [e for e in watch.poll() if e.kind == "spawn"][-1]
    if watch.run.proc.poll() is not None or [e for e in watch.events if e.kind == "exit" and e.t >= spawn.t]:
        raise BenchError(f"the driver of epoch {epoch} is not running\n{watch.run.tail()}")
    mark = len(watch.events)
    killed = time.time()
    os.killpg(spawn.int(0), signal.SIGKILL)  # spark-submit leads the driver's process group
    nxt = epoch + 1
    done = watch.wait(f"the first batch of epoch {nxt}",
                      lambda ev: first(ev, "batch", test=lambda e: e.int(0) == nxt, start=mark))
    ev = watch.events
    exited = need(first(ev, "exit", start=mark), "the supervisor's exit line", watch)
    respawn = need(first(ev, "spawn", start=mark), "the restart", watch)
    lease = need(first(ev, "lease", start=mark, test=lambda e: e.int(0) == nxt), f"lease epoch {nxt}", watch)
    start = need(first(ev, "start", after=lease.t, start=mark), "the start decision", watch)
    query = need(first(ev, "query", start=mark, test=lambda e: e.int(0) == nxt), f"query of epoch {nxt}", watch)
    grace = first(ev, "grace", start=mark)
    restored = first(ev, "restored", start=mark)
    notes = [f"restored a snapshot (batch {restored.fields[0]})"] if restored else []
    # A batch the killed driver had planned (offsets/N written before the kill) is replayed with its offsets.
    with contextlib.suppress(OSError):
        if (checkpoint / "offsets" / str(done.int(1))).stat().st_mtime < killed:
            notes.insert(0, "replayed")
    jvm, session = _split_up(ev[mark:], respawn, lease)
    return Start(rnd, config, "recovery", done.t - killed, exited.t - killed, respawn.t - exited.t, None, jvm,
                 session, start.t - lease.t, query.t - start.t, None, done.t - query.t, done.int(1), done.int(2),
                 grace=float(grace.fields[0]) if grace else 0.0, note=", ".join(notes), noise=watch.noise(since))


@dataclass(frozen=True)
class QueryRecovery:
    """One query failure inside a live driver: seconds from the sink's raise to the restart decision
    (``detect``), the strategy's ``delay``, the query's start again (``query``), and the first batch
    committed after it (``batch``); ``total`` is the raise to that batch."""

    round: int
    config: str
    total: float
    detect: float
    delay: float
    query: float
    batch: float
    batch_id: int
    rows: int
    pid_kept: bool
    noise: str = ""


def query_failure(watch: LogWatch, opts: Options, rnd: int, config: str, epoch: int, faults: Path,
                  attempt: int) -> QueryRecovery:
    """Wait for 2 batches with rows of ``epoch`` after the last mark, make the sink raise once, and measure
    until the restarted query completed the batch that failed (its replay)."""
    since, mark = watch.mark(), len(watch.poll())
    watch.wait(f"2 batches with rows of epoch {epoch}", lambda ev: b[1] if len(
        b := [e for e in batches(ev[mark:], epoch) if e.int(2) > 0]) >= 2 else None)
    time.sleep(opts.kill_after)
    spawns = [e for e in watch.events if e.kind == "spawn"]
    fired = faults / "sink.fired"
    fired.unlink(missing_ok=True)
    mark = len(watch.poll())
    (faults / "sink").touch()
    watch.wait(f"query restart {attempt}", lambda ev: first(
        ev, "qrestarted", start=mark, test=lambda e: e.int(0) == epoch))
    raised_at, failed_batch = fired.read_text().split()
    raised = float(raised_at)
    done = watch.wait(f"batch {failed_batch} again", lambda ev: first(
        ev, "batch", start=mark, test=lambda e: e.int(0) == epoch and e.fields[1] == failed_batch))
    failed = need(first(watch.events, "qfailed", start=mark), "the restart decision", watch)
    query = need(first(watch.events, "query", start=mark, after=failed.t), "the restarted query", watch)
    kept = [e for e in watch.events if e.kind == "spawn"] == spawns
    return QueryRecovery(rnd, config, done.t - raised, failed.t - raised, float(failed.fields[2]),
                         query.t - failed.t, done.t - query.t, done.int(1), done.int(2), kept, watch.noise(since))


def log_start(s: Start) -> None:
    print(f"  round {s.round} {s.config} {s.kind}: {s.total:.1f} s to batch {s.batch_id} ({s.rows} rows); "
          f"load / other JVMs {s.noise}", file=sys.stderr)


# -- throughput ------------------------------------------------------------------------------------

CONFIGS = {
    "A": ("--checkpoint-interval", "{ci}", "--savepoint-interval", "{sp}"),
    "B": ("--checkpoint-interval", "none", "--savepoint-interval", "none"),
    "C": ("--checkpoint-interval", "{ci}", "--savepoint-interval", "{sp}", "--python-env", "ship"),
}


@dataclass(frozen=True)
class Throughput:
    round: int
    config: str
    batches: int
    rows: int
    seconds: float
    batch_s: float  # median time between consecutive batch completions
    checkpoints: int = 0  # completed during the window (log)
    savepoints: int = 0
    stored: str = ""  # what list_snapshots finds in the store at the end of the window
    snapshot_s: float | None = None  # median seconds per checkpoint snapshot (log)
    noise: str = ""  # mean load average / most foreign JVMs during the window
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per batch in the window, by role
    warmup: bool = False  # the window of the job's first --warmup seconds, not the measured steady one

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def throughput(env: JobEnv, watch: LogWatch, opts: Options, rnd: int, config: str, begin: Event,
               servers: dict[str, int | None], *, warmup: bool = False) -> tuple[Throughput, Event]:
    """Records/s of the batches completed in the window that starts at batch ``begin`` and lasts ``--window``
    seconds (``--warmup`` seconds for the warm-up window), the CPU seconds per batch each part used meanwhile
    (sampled when the bench sees the first and last batch), and the window's last batch."""
    seconds = opts.warmup if warmup else opts.window
    since = watch.mark()
    session = need(first(watch.events, "spawn"), "the driver's spawn", watch).int(0)
    cpu_begin = cpu_seconds(session, servers)

    def window_end(ev: list[Event]) -> Event | None:
        short = first(ev, "batch", after=begin.t, test=lambda e: e.int(2) < opts.max_offsets)
        if short is not None:
            raise BenchError(f"{watch.run.name}: batch {short.int(1)} read {short.int(2)} rows, fewer than "
                             f"{opts.max_offsets}: the backlog ran out within the window; raise --records")
        return first(ev, "batch", after=begin.t + seconds)

    last = watch.wait(f"a batch {seconds:g} s after batch {begin.int(1)}", window_end)
    cpu_end = cpu_seconds(session, servers)
    if [e for e in watch.events if e.kind == "exit"]:
        raise BenchError(f"{watch.run.name}: the driver exited during the measurement\n{watch.run.tail()}")
    done = [e for e in batches(watch.events, 1) if begin.t <= e.t <= last.t]
    snaps = [e for e in watch.events if e.kind == "snapshot" and begin.t < e.t <= last.t]
    ckpts = [float(e.fields[2]) for e in snaps if e.fields[1] == "checkpoint"]
    stored = ""
    if config in MEASURED and not warmup:
        found = list_snapshots(env.store())
        stored = (f"{sum(m.kind is Kind.CHECKPOINT for m in found)} ckpt + "
                  f"{sum(m.kind is Kind.SAVEPOINT for m in found)} sp")
    result = Throughput(
        rnd, config, len(done) - 1, sum(e.int(2) for e in done[1:]), last.t - begin.t,
        statistics.median(b.t - a.t for a, b in itertools.pairwise(done)),
        len(ckpts), len(snaps) - len(ckpts), stored, statistics.median(ckpts) if ckpts else None,
        watch.noise(since), {k: (cpu_end[k] - cpu_begin[k]) / max(1, len(done) - 1) for k in ROLES}, warmup,
    )
    print(f"  round {rnd} {config} {'warm-up' if warmup else 'steady'} throughput: {result.rows} rows in "
          f"{result.seconds:.1f} s = {result.rate:,.0f}/s, batch {result.batch_s:.2f} s, JIT "
          f"{result.cpu['jit']:.2f} CPU-s per batch, snapshots {result.checkpoints} ckpt + {result.savepoints} sp; "
          f"load / other JVMs {result.noise}", file=sys.stderr)
    return result, last


@dataclass(frozen=True)
class Turn:
    """One window of an A job's turns: checkpoint snapshots taken after every batch, or paused."""

    round: int
    index: int
    snapshots: bool
    batches: int
    rows: int
    seconds: float
    checkpoints: int  # checkpoint snapshots completed in the window (log)
    savepoints: int  # the periodic savepoints (--savepoint-interval) completed in it, taken either way

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


#: A turn's window starts at the first batch completed this long after the switch: a snapshot under way at the
#: switch is done by then, and the first snapshot after a pause (the paused batches' files) lands before it.
SETTLE_S = 2.0


def turns(watch: LogWatch, opts: Options, rnd: int, pause: Path, rate: float) -> list[Turn]:
    """``--turns`` windows of ``--turn-window`` seconds, checkpoint snapshots paused (the file that
    core/policy/faults.checkpoints_paused looks for) and taken in turns, pairs in alternating order (off-on, on-off,
    ...): the same driver JVM against itself, so its JIT and GC luck is the same on both sides. ``rate``: records/s of
    the steady window, to tell before the turns whether the backlog lasts them (an idle job logs no batches)."""
    left = opts.records - sum(e.int(2) for e in batches(watch.events, 1))
    needed = int(1.2 * rate * opts.turns * (opts.turn_window + SETTLE_S + 2))
    if left < needed:
        raise BenchError(f"{watch.run.name}: {left:,} records left in the backlog, the turns need about {needed:,}; "
                         "raise --records")
    done: list[Turn] = []
    for index in range(opts.turns):
        pair, second = divmod(index, 2)
        snapshots = (second == 1) == (pair % 2 == 0)
        if snapshots:
            pause.unlink(missing_ok=True)
        else:
            pause.touch()
        switched = time.time()
        start = watch.wait("a batch after the switch", lambda ev, t=switched: first(ev, "batch", after=t + SETTLE_S))
        end = watch.wait(f"a batch {opts.turn_window:g} s later",
                         lambda ev, t=start.t: first(ev, "batch", after=t + opts.turn_window))
        if [e for e in watch.events if e.kind == "exit"]:
            raise BenchError(f"{watch.run.name}: the driver exited during the turns\n{watch.run.tail()}")
        short = [e for e in batches(watch.events, 1) if start.t < e.t <= end.t and e.int(2) < opts.max_offsets]
        if short:
            raise BenchError(f"{watch.run.name}: batch {short[0].int(1)} read {short[0].int(2)} rows, fewer than "
                             f"{opts.max_offsets}: the backlog ran out in the turns; raise --records")
        window = [e for e in batches(watch.events, 1) if start.t < e.t <= end.t]
        kinds = [e.fields[1] for e in watch.events if e.kind == "snapshot" and start.t < e.t <= end.t]
        turn = Turn(rnd, index + 1, snapshots, len(window), sum(e.int(2) for e in window), end.t - start.t,
                    kinds.count("checkpoint"), kinds.count("savepoint"))
        print(f"  round {rnd} A turn {turn.index} ({'snapshots' if snapshots else 'paused'}): {turn.rows} rows in "
              f"{turn.seconds:.1f} s = {turn.rate:,.0f}/s, {turn.checkpoints} checkpoint snapshots + "
              f"{turn.savepoints} savepoints", file=sys.stderr)
        done.append(turn)
    pause.unlink(missing_ok=True)
    return done


def _turn_ratios(done: Sequence[Turn]) -> list[float]:
    """Per pair of turns of one job: records/s with snapshots over records/s paused."""
    ratios = []
    for rnd in sorted({t.round for t in done}):
        mine = sorted((t for t in done if t.round == rnd), key=lambda t: t.index)
        for a, b in zip(mine[::2], mine[1::2], strict=False):
            on, off = (a, b) if a.snapshots else (b, a)
            ratios.append(on.rate / off.rate)
    return ratios


# -- one job: cold start, throughput, recoveries --------------------------------------------------

#: The configurations whose recoveries are measured: A in local mode, and C, the same on the cluster.
MEASURED = ("A", "C")
BUILT = "built the environment"


def job_run(env: JobEnv, opts: Options, rnd: int, config: str, servers: dict[str, int | None],
            cluster: EmbeddedSparkCluster | None = None
            ) -> tuple[list[Start], list[Throughput], list[QueryRecovery], list[Turn]]:
    """One job: its cold start, its throughput in the warm-up window (if any) and the steady window after it, for A
    its turns with and without checkpoint snapshots, then its in-driver recoveries and kill recoveries."""
    name = f"{rnd}-{config}"
    if (opts.workdir / name).exists():  # the second C job of the first round: its own log and checkpoint
        name += "-2"
    checkpoint = opts.workdir / name / "checkpoint"
    faults = opts.workdir / name / "faults"
    faults.mkdir(parents=True, exist_ok=True)
    args = [a.format(ci=f"{opts.checkpoint_interval:g}", sp=f"{opts.savepoint_interval:g}") for a in CONFIGS[config]]
    if opts.snapshot_nice is not None and config != "B":
        args += ["--snapshot-nice", str(opts.snapshot_nice)]
    spawned = time.time()
    # fixed-delay counts the restarts of one driver (in-driver) and of the supervisor (processes) apart
    where: dict[str, Any] = {}
    pause = opts.workdir / name / "pause-checkpoints"
    extra = {"CKPT_TEST_FAULT_DIR": str(faults), "CKPT_TEST_FAULTS": "sink", PAUSE_ENV: str(pause)}
    if opts.driver_jvm:
        extra["SPARK_SUBMIT_OPTS"] = opts.driver_jvm
    if config == "C":
        assert cluster is not None
        where = {"master": cluster.master_url, "conf": cluster.job_conf()}
        extra["CKPT_ENV_CACHE"] = str(opts.workdir / "env-cache")  # empty at the start of the bench
    run = env.run(name, checkpoint, "--supervise", "-v", "--restart-strategy", "fixed-delay",
                  "--restart-attempts", str(max(opts.kills, opts.failures) + 1),
                  "--restart-delay", f"{opts.restart_delay:g}", *args, max_offsets=opts.max_offsets,
                  extra_env=extra, **where)
    watch = LogWatch(run)
    in_driver: list[QueryRecovery] = []
    try:
        starts = [cold_start(watch, spawned, rnd, config)]
        built = first(watch.events, "envbuilt")
        if built is not None:
            starts[0] = dataclasses.replace(starts[0], note=f"{BUILT}: {built.fields[0]} s, "
                                            f"{built.fields[2]} MB")
        log_start(starts[0])
        begin = need(first(watch.events, "batch", test=lambda e: e.int(2) > 0), "the first batch with rows", watch)
        windows: list[Throughput] = []
        if opts.warmup > 0:
            warm, begin = throughput(env, watch, opts, rnd, config, begin, servers, warmup=True)
            windows.append(warm)
        windows.append(throughput(env, watch, opts, rnd, config, begin, servers)[0])
        taken = turns(watch, opts, rnd, pause, windows[-1].rate) if config == "A" else []
        for attempt in range(1, opts.failures + 1 if config in MEASURED else 1):
            in_driver.append(query_failure(watch, opts, rnd, config, 1, faults, attempt))
            q = in_driver[-1]
            print(f"  round {rnd} {config} in-driver recovery {attempt}: {q.total:.1f} s to batch {q.batch_id} "
                  f"({q.rows} rows); load / other JVMs {q.noise}", file=sys.stderr)
        for epoch in range(1, opts.kills + 1 if config in MEASURED else 1):
            starts.append(recover(watch, opts, rnd, config, epoch, checkpoint))
            log_start(starts[-1])
        return starts, windows, in_driver, taken
    finally:
        stop_run(run, watch)


# -- report ----------------------------------------------------------------------------------------

def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cpu(cpu: dict[str, float]) -> str:
    """The CPU seconds by role, the JIT's within the JVM's: "JVM (JIT) / Python driver / workers / S3 / Kafka"."""
    parts = [f"{cpu['jvm']:.2f} ({cpu['jit']:.2f})", *(f"{cpu[k]:.2f}" for k in ROLES if k not in ("jvm", "jit"))]
    return " / ".join(parts) + f" (sum {sum(v for k, v in cpu.items() if k != 'jit'):.2f})"


CPU_HEADER = "CPU s per batch: JVM (its JIT) / Python driver / Python workers / S3 / Kafka"


def _ratios(runs: list[Throughput]) -> list[float]:
    """A's records/s over B's, per round."""
    ratios = []
    for rnd in sorted({r.round for r in runs}):
        a = next(r for r in runs if r.round == rnd and r.config == "A")
        b = next(r for r in runs if r.round == rnd and r.config == "B")
        ratios.append(a.rate / b.rate)
    return ratios


def _med(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


PHASES = ("total", "detect", "delay", "cli", "jvm", "session", "decide", "query", "batch0", "first_batch")


def report_throughput(runs: list[Throughput], opts: Options) -> list[str]:
    every = f"every {opts.checkpoint_interval:g} s" if opts.checkpoint_interval else "after every batch"
    print(f"\n## Snapshot overhead: records/s, A = checkpoint {every} + savepoint every "
          f"{opts.savepoint_interval:g} s, B = no snapshots\n")
    after = (f"the first batch {opts.warmup:g} s after the first batch with rows (the warm-up window below)"
             if opts.warmup > 0 else "the first batch with rows")
    print(f"Rows of the batches completed after {after}, over the time between their completion lines "
          f"({opts.window:g} s window, {opts.max_offsets} records per batch). Driver JVMs: "
          f"{opts.driver_jvm or 'Spark defaults'}. The snapshot thread's nice: "
          f"{'the runtime default' if opts.snapshot_nice is None else opts.snapshot_nice}.\n")
    print("| round | config | batches | rows | s | records/s | s per batch | snapshots in the window "
          f"| in the store after | s per checkpoint snapshot | {CPU_HEADER} | load / other JVMs |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | ---: |")
    for r in runs:
        snaps = f"{r.checkpoints} ckpt + {r.savepoints} sp" if r.config == "A" else "-"
        print(f"| {r.round} | {r.config} | {r.batches} | {r.rows} | {r.seconds:.1f} | {r.rate:,.0f} | {r.batch_s:.2f} "
              f"| {snaps} | {r.stored or '-'} | {_f(r.snapshot_s, 2)} | {_cpu(r.cpu)} | {r.noise} |")
    ratios = _ratios(runs)
    for config in ("A", "B"):
        mine = [r for r in runs if r.config == config]
        med = {k: statistics.median(r.cpu[k] for r in mine) for k in ROLES}
        print(f"| median | {config} | | | | {statistics.median(r.rate for r in mine):,.0f} "
              f"| {statistics.median(r.batch_s for r in mine):.2f} | | | | {_cpu(med)} | |")
    med_a = statistics.median(r.rate for r in runs if r.config == "A")
    med_b = statistics.median(r.rate for r in runs if r.config == "B")
    ratio = statistics.median(ratios)
    print(f"\nmedian A {med_a:,.0f}/s, B {med_b:,.0f}/s; A/B per round "
          + ", ".join(f"{x:.3f}" for x in ratios) + f"; median of per-round ratios {ratio:.3f}")
    diff = 1 - ratio
    return [f"snapshot overhead < {OVERHEAD_TARGET:.0%}: {'met' if abs(diff) < OVERHEAD_TARGET else 'MISSED'} "
            f"(A/B {ratio:.3f}: {abs(diff):.1%} {'fewer' if diff > 0 else 'more'} records/s with snapshots; per round "
            f"{min(ratios):.3f} to {max(ratios):.3f})"]


def report_turns(done: list[Turn], opts: Options) -> list[str]:
    """Each A job against itself: its turns with checkpoint snapshots after every batch and paused."""
    print(f"\n## Snapshot overhead within one job: {opts.turns} turns of {opts.turn_window:g} s per A job, checkpoint "
          "snapshots taken and paused in turns\n")
    print("After the steady window each A job pauses its checkpoint snapshots and takes them again in turns "
          f"(pairs in alternating order; each turn from the first batch {SETTLE_S:g} s after the switch). Both sides "
          "of a pair run in the same driver JVM, so the JIT and GC modes that move whole jobs by 10-15% (A against B "
          "above) are the same on both; what differs is only the snapshots.\n")
    print("| round | turn | checkpoint snapshots | batches | rows | s | records/s | snapshots in the window |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for t in done:
        print(f"| {t.round} | {t.index} | {'taken' if t.snapshots else 'paused'} | {t.batches} | {t.rows} "
              f"| {t.seconds:.1f} | {t.rate:,.0f} | {t.checkpoints} ckpt + {t.savepoints} sp |")
    ratios = _turn_ratios(done)
    if not ratios:
        return ["snapshot overhead within one job: no pair of turns (--turns 2 or more)"]
    ratio = statistics.median(ratios)
    print("\nwith / without per pair " + ", ".join(f"{x:.3f}" for x in ratios) + f"; median {ratio:.3f}")
    diff = 1 - ratio
    return [f"snapshot overhead within one job < {OVERHEAD_TARGET:.0%}: "
            f"{'met' if abs(diff) < OVERHEAD_TARGET else 'MISSED'} (with / without {ratio:.3f}: {abs(diff):.1%} "
            f"{'fewer' if diff > 0 else 'more'} records/s with snapshots; per pair {min(ratios):.3f} to "
            f"{max(ratios):.3f}, {len(ratios)} pairs)"]


def report_warmup(runs: list[Throughput], opts: Options) -> list[str]:
    """The same jobs' first --warmup seconds: the JVM is still compiling Spark's planner and scheduler then."""
    print(f"\n## The first {opts.warmup:g} s of the same jobs (JIT warm-up; not the overhead target)\n")
    print("From the first batch with rows. A fresh driver JVM's JIT compiler threads are still compiling Spark's "
          "planner, scheduler and codegen then: their CPU per batch (in brackets) is several times the steady "
          "window's, and whatever else runs on the machine (here the snapshots and the S3 server) delays it.\n")
    print(f"| round | config | batches | records/s | s per batch | {CPU_HEADER} |")
    print("| ---: | --- | ---: | ---: | ---: | --- |")
    for r in runs:
        print(f"| {r.round} | {r.config} | {r.batches} | {r.rate:,.0f} | {r.batch_s:.2f} | {_cpu(r.cpu)} |")
    ratios = _ratios(runs)
    ratio = statistics.median(ratios)
    print("\nA/B per round " + ", ".join(f"{x:.3f}" for x in ratios) + f"; median {ratio:.3f}")
    return [f"the first {opts.warmup:g} s (JIT warm-up, no target): A/B {ratio:.3f}, per round {min(ratios):.3f} to "
            f"{max(ratios):.3f}"]


def report_starts(starts: list[Start], opts: Options) -> list[str]:
    print("\n## Recovery after kill -9 versus a cold start (seconds)\n")
    print("Cold: spawn of `ckpt run --supervise` to the first batch with rows (batch 1; batch 0 reads nothing). "
          "Recovery: kill -9 of the driver's process group to the first batch the restarted driver completes "
          f"(fixed-delay restart, {opts.restart_delay:g} s delay). JVM + Python is to Spark's 'Running Spark "
          f"version' line (whole seconds). {opts.max_offsets} records per batch.\n")
    print("| round | config | start | total | detection | exit to respawn | CLI start | JVM + Python driver "
          "| SparkSession + build | lease to start decision | to query started | batch 0 | first batch with rows "
          "| batch id | load / other JVMs |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in starts:
        note = f" ({s.note})" if s.note else ""
        print(f"| {s.round} | {s.config} | {s.kind} | {s.total:.1f} | {_f(s.detect, 2)} | {_f(s.delay, 2)} "
              f"| {_f(s.cli)} | {_f(s.jvm, 0)} | {_f(s.session, 0)} | {s.decide:.2f} | {s.query:.1f} "
              f"| {_f(s.batch0)} | {s.first_batch:.1f} | {s.batch_id}{note} | {s.noise} |")
    for kind in ("cold", "recovery"):
        group = [s for s in starts if s.kind == kind]
        med = {p: _med([getattr(s, p) for s in group]) for p in PHASES}
        print(f"| median | | {kind} (n={len(group)}) | {_f(med['total'])} | {_f(med['detect'], 2)} "
              f"| {_f(med['delay'], 2)} | {_f(med['cli'])} | {_f(med['jvm'])} | {_f(med['session'])} "
              f"| {_f(med['decide'], 2)} | {_f(med['query'])} | {_f(med['batch0'])} | {_f(med['first_batch'])} "
              "| | |")
    recs = [s for s in starts if s.kind == "recovery"]
    killed = {(s.round, s.config) for s in recs}
    colds = [s for s in starts if s.kind == "cold" and (s.round, s.config) in killed]  # the same jobs
    cold, rec = statistics.median(s.total for s in colds), statistics.median(s.total for s in recs)
    every_cold = statistics.median(s.total for s in starts if s.kind == "cold")
    cold0 = statistics.median(s.total - s.first_batch for s in colds)  # to batch 0, the first batch committed
    paired = [r.total / c.total for c in colds for r in recs if (r.round, r.config) == (c.round, c.config)]
    ratio = rec / cold
    print(f"\nrecovery / cold start of the same jobs: {ratio:.2f} (medians {rec:.1f} / {cold:.1f} s); per kill "
          + ", ".join(f"{x:.2f}" for x in paired)
          + f"; against every cold start (A and B, median {every_cold:.1f} s): {rec / every_cold:.2f}; against "
          f"the same jobs' cold start to batch 0 (the first batch committed, no rows): {rec / cold0:.2f}")
    graces = [s.grace for s in recs if s.grace]
    if graces:
        print(f"restarted drivers waited {', '.join(f'{g:.1f}' for g in graces)} s for the fenced one (fence grace)")
    detect = [s.detect or 0.0 for s in recs]
    return [
        f"recovery <= {RECOVERY_TARGET}x cold start: {'met' if ratio <= RECOVERY_TARGET else 'MISSED'} "
        f"(median {rec:.1f} s vs {cold:.1f} s = {ratio:.2f}x; per kill {min(paired):.2f} to {max(paired):.2f})",
        f"detection < {DETECTION_TARGET_S:g} s: {'met' if max(detect) < DETECTION_TARGET_S else 'MISSED'} "
        f"(median {statistics.median(detect):.2f} s, max {max(detect):.2f} s)",
    ]


def report_in_driver(recs: list[QueryRecovery], starts: list[Start], opts: Options) -> list[str]:
    print("\n## Recovery after a query failure inside a live driver versus a cold start (seconds)\n")
    print("The job's foreachBatch raises once; the driver restarts the query in its SparkSession (fixed-delay, "
          f"{opts.restart_delay:g} s). Total: the raise to the first batch committed after it (the failed batch, "
          "replayed). Detection: the raise to the driver's restart line; query start: the restart decision "
          "and the delay to `query started`.\n")
    print("| round | config | total | detection | delay | to query started | first batch | batch id | rows "
          "| same driver | load / other JVMs |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for q in recs:
        print(f"| {q.round} | {q.config} | {q.total:.1f} | {q.detect:.2f} | {q.delay:.2f} | {q.query:.1f} "
              f"| {q.batch:.1f} | {q.batch_id} | {q.rows} | {'yes' if q.pid_kept else 'NO'} | {q.noise} |")
    med = statistics.median(q.total for q in recs)
    jobs = {(q.round, q.config) for q in recs}
    colds = [s.total for s in starts if s.kind == "cold" and (s.round, s.config) in jobs]
    cold = statistics.median(colds)
    print(f"| median | | {med:.1f} | {statistics.median(q.detect for q in recs):.2f} "
          f"| {statistics.median(q.delay for q in recs):.2f} | {statistics.median(q.query for q in recs):.1f} "
          f"| {statistics.median(q.batch for q in recs):.1f} | | | | |")
    ratio = med / cold
    print(f"\nin-driver recovery / cold start of the same jobs: {ratio:.2f} (medians {med:.1f} / {cold:.1f} s)")
    return [
        f"in-driver recovery <= {IN_DRIVER_TARGET_S:g} s median: {'met' if med <= IN_DRIVER_TARGET_S else 'MISSED'} "
        f"(median {med:.1f} s over {len(recs)} failures, max {max(q.total for q in recs):.1f} s)",
        f"in-driver recovery <= {IN_DRIVER_TARGET}x cold start: {'met' if ratio <= IN_DRIVER_TARGET else 'MISSED'} "
        f"({med:.1f} s vs {cold:.1f} s = {ratio:.2f}x)",
        f"in-driver recovery kept the driver process: {'yes' if all(q.pid_kept for q in recs) else 'NO'}",
    ]


def _built(start: Start) -> bool:
    """This cold start built the executors' environment (the first C job; the later ones find it cached)."""
    return start.note.startswith(BUILT)


def report_cluster(runs: list[Throughput], starts: list[Start], in_driver: list[QueryRecovery]) -> list[str]:
    """C (the cluster) next to A (local mode): medians, and what shipping the environment costs."""
    print("\n## On a Spark standalone cluster (C) next to local mode (A), medians\n")
    print("C: a master and two workers on 127.0.0.1 (1 core, 1 GB each), executors 512 MB, the executors' Python "
          "shipped. Cold start: the C jobs that found the environment cached.\n")
    print("| config | records/s | s per batch | cold start s | in-driver recovery s | kill -9 recovery s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = {}
    for config in MEASURED:
        rate = _med([r.rate for r in runs if r.config == config])
        batch = _med([r.batch_s for r in runs if r.config == config])
        cold = _med([s.total for s in starts if s.config == config and s.kind == "cold" and not _built(s)])
        query = _med([q.total for q in in_driver if q.config == config])
        killed = _med([s.total for s in starts if s.config == config and s.kind == "recovery"])
        rows[config] = (rate, cold, query, killed)
        print(f"| {config} | {_f(rate, 0)} | {_f(batch, 2)} | {_f(cold)} | {_f(query)} | {_f(killed)} |")
    first_c = next((s for s in starts if s.config == "C" and _built(s)), None)
    cached = _med([s.total for s in starts if s.config == "C" and s.kind == "cold" and not _built(s)])
    if first_c is not None:
        print(f"\nshipping the environment: the first C cold start {first_c.total:.1f} s ({first_c.note}) versus "
              f"{_f(cached)} s with the cached environment (median of the later C cold starts)")
    (rate_a, cold_a, query_a, kill_a), (rate_c, cold_c, query_c, kill_c) = rows["A"], rows["C"]

    def ratio(c: float | None, a: float | None) -> str:
        return f"{c / a:.2f}" if c and a else "-"

    return [f"cluster / local: records/s {ratio(rate_c, rate_a)}, cold start {ratio(cold_c, cold_a)}, in-driver "
            f"recovery {ratio(query_c, query_a)}, kill -9 recovery {ratio(kill_c, kill_a)} (C / A medians; "
            "no target: one host plays the whole cluster)"]


# -- main ------------------------------------------------------------------------------------------

#: The defaults of the options a --quick run shortens. The backlog lasts the warm-up, the window, A's turns, the
#: in-driver failures (two batches each) and the kills.
QUICK = {"rounds": 1, "kills": 1, "records": 2_800_000, "window": 15.0, "warmup": 15.0, "savepoint_interval": 10.0,
         "turns": 2}
FULL = {"rounds": 3, "kills": 1, "records": 7_000_000, "window": 30.0, "warmup": 60.0, "savepoint_interval": 30.0,
        "turns": 4}


def parse_args(argv: Sequence[str] | None) -> tuple[Options, bool]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help=f"rounds of one A and one B job (default {FULL['rounds']})")
    parser.add_argument("--kills", type=int,
                        help=f"kill -9s per A job after its throughput window (default {FULL['kills']})")
    parser.add_argument("--failures", type=int, default=3,
                        help="query failures per A job, recovered inside the driver, before the kills (default 3)")
    parser.add_argument("--records", type=int, help=f"backlog records (default {FULL['records']:,})")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    parser.add_argument("--max-offsets", type=int, default=20_000, help="maxOffsetsPerTrigger (default 20000)")
    parser.add_argument("--window", type=float,
                        help=f"seconds of batches per throughput measurement (default {FULL['window']:g})")
    parser.add_argument("--warmup", type=float,
                        help="seconds of batches before the throughput window, measured and reported apart: the "
                             f"driver JVM's JIT warm-up (default {FULL['warmup']:g}; 0: the window starts at the first "
                             "batch)")
    parser.add_argument("--checkpoint-interval", type=float, default=0.0,
                        help="config A's checkpoint interval (default 0: after every batch)")
    parser.add_argument("--savepoint-interval", type=float,
                        help=f"config A's savepoint interval (default {FULL['savepoint_interval']:g})")
    parser.add_argument("--restart-delay", type=float, default=0.5, help="fixed-delay restart delay (default 0.5)")
    parser.add_argument("--kill-after", type=float, default=1.0,
                        help="seconds after a driver's second batch with rows before the kill (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, short window, 10 s savepoints")
    parser.add_argument("--cluster", action="store_true",
                        help="also run C = A on a Spark standalone cluster on 127.0.0.1 (executors' Python shipped)")
    parser.add_argument("--workdir", type=Path, help="keep logs and checkpoints here (default: a temp dir, removed)")
    parser.add_argument("--driver-jvm", default="", metavar="OPTS",
                        help="extra options of every job's driver JVM, A's and B's alike (SPARK_SUBMIT_OPTS; default: "
                             "none, Spark's defaults), e.g. -XX:G1HeapRegionSize=16m (docs/benchmarks.md)")
    parser.add_argument("--turns", type=int,
                        help="windows of each A job after its steady window, checkpoint snapshots paused and taken in "
                             f"turns: the same driver JVM measured against itself (default {FULL['turns']}; 0: none)")
    parser.add_argument("--turn-window", type=float, default=10.0, help="seconds of batches per turn (default 10)")
    parser.add_argument("--snapshot-nice", type=int, metavar="N",
                        help="`ckpt run --snapshot-nice N` for the jobs that take snapshots (default: the runtime's)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    chosen: dict[str, Any] = {k: defaults[k] if getattr(args, k) is None else getattr(args, k) for k in FULL}
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="runtime-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    opts = Options(**chosen, keys=args.keys, max_offsets=args.max_offsets,
                   checkpoint_interval=args.checkpoint_interval, restart_delay=args.restart_delay,
                   kill_after=args.kill_after, workdir=workdir, failures=args.failures, cluster=args.cluster,
                   driver_jvm=args.driver_jvm, snapshot_nice=args.snapshot_nice, turn_window=args.turn_window)
    return opts, keep


def main(argv: Sequence[str] | None = None) -> int:
    opts, keep = parse_args(argv)
    # kill (SIGTERM) unwinds like Ctrl-C: the jobs, SeaweedFS and tansu this bench started are stopped on the way out
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    started = time.monotonic()
    starts: list[Start] = []
    runs: list[Throughput] = []
    in_driver: list[QueryRecovery] = []
    all_turns: list[Turn] = []
    try:
        with EmbeddedServices() as services, contextlib.ExitStack() as stack:
            cluster = stack.enter_context(EmbeddedSparkCluster(workdir=opts.workdir / "spark")) if opts.cluster \
                else None
            bucket = "bench"
            services.s3.create_bucket(bucket)
            topic = f"bench-{uuid.uuid4().hex[:6]}"
            services.kafka.create_topic(topic, PARTITIONS)
            servers = {"s3": services.s3.pid, "kafka": services.kafka.pid}  # each leads its own session
            warmed, seconds = warm_page_cache()
            print(f"read {warmed / 2**20:,.0f} MiB of jars and packages in {seconds:.1f} s (page cache)",
                  file=sys.stderr)
            t0 = time.perf_counter()
            produce(services.kafka.bootstrap_servers, topic, opts.records, opts.keys)
            print(f"produced {opts.records:,} records ({opts.keys} keys, 100 B values) in "
                  f"{time.perf_counter() - t0:.1f} s; work dir {opts.workdir}", file=sys.stderr)
            for rnd in range(1, opts.rounds + 1):
                order = ("A", "B") if rnd % 2 else ("B", "A")
                # C once per round, and once more in the first: a start with the environment cached, even with --quick
                extra = ("C", "C") if rnd == 1 else ("C",)
                for config in (*order, *extra) if cluster else order:
                    env = JobEnv(services.s3, services.kafka, opts.workdir, bucket, topic,
                                 job=f"bench-{uuid.uuid4().hex[:8]}")
                    job_starts, windows, recoveries, job_turns = job_run(env, opts, rnd, config, servers, cluster)
                    all_turns += job_turns
                    starts += job_starts
                    runs += windows
                    in_driver += recoveries
    finally:
        if not keep:
            shutil.rmtree(opts.workdir, ignore_errors=True)
    print(f"# Job runtime benchmark ({time.monotonic() - started:.0f} s, load average "
          f"{os.getloadavg()[0]:.1f} at the end)")
    local = [r for r in runs if r.config != "C"]
    verdicts = report_throughput([r for r in local if not r.warmup], opts)
    if all_turns:
        verdicts += report_turns(all_turns, opts)
    if opts.warmup > 0:
        verdicts += report_warmup([r for r in local if r.warmup], opts)
    runs = [r for r in runs if not r.warmup]
    if in_driver:
        verdicts += report_in_driver([q for q in in_driver if q.config != "C"], starts, opts)
    if any(s.kind == "recovery" for s in starts):
        verdicts += report_starts([s for s in starts if s.config != "C"], opts)
    if opts.cluster:
        verdicts += report_cluster(runs, starts, in_driver)
    print("\n## Verdicts\n")
    for line in verdicts:
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
