"""The exactly-once proof's harness: supervised jobs side by side, kill -9s at random moments and at crash points.

``prove_exactly_once`` runs one job per sink at once, all over the same 3-partition topic: each is
tests/jobs/eo_job.py (``dropDuplicates(["id"])`` into one exactly-once sink) under
``ckpt run --supervise``. The runtime runs one streaming query per job (one checkpoint location,
snapshots of that query's checkpoint), so the three sinks' queries run as three jobs, each under its
own supervisor, driven by one thread each. The kill plan covers every crash point of every sink's
commit protocol once (armed by a file in the job's CKPT_FAULT_DIR, core/faults.py), plus random
kill -9s (while the driver starts, or inside a batch after it completed one), at least ``min_kills``
in all, ``kills_per_sink`` at least per job. Records keep arriving: id i (key ``k<i % 10>``,
partition ``i % 3``, tests/support/runtimejob.produce) is produced twice, the second copy a feed
later, so the state must drop it. Then each job stops with a savepoint, restores it on a fresh
checkpoint location (``--restore latest-savepoint``), crashes once more at its sink's last step,
takes more ids and stops again. The expected output of every sink is exactly one row
``(id, key, part)`` per id, whatever the batch boundaries were.

A sink (``EoSink``) tells its job how to write (environment variables), reads its committed output
back and checks that nothing uncommitted is visible. The seed is printed; CKPT_EO_SEED replays the
kill plans and each job's random moments (each job draws from its own generator, so the threads'
interleaving does not change them).
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from airflow_ckpt_provider.core.control import Ack, Outcome, RequestAction
from airflow_ckpt_provider.core.status import ACTIVE_STATES, JobState, JobStatus
from airflow_ckpt_provider.core.storage import S3Options
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.support.runtimejob import KEYS, JobEnv, Run, kill_driver, produce

EO_JOB = Path(__file__).parent.parent / "jobs" / "eo_job.py"
MAX_OFFSETS = 60  # records per batch: each feed is two batches
CHUNK = 60  # new ids per feed (plus the second copies of the previous feed's ids)
WAIT = 180.0  # seconds any single condition may take

Row = tuple[int, str, int]  # (id, key, Kafka partition of the input record)


def expected_rows(count: int) -> list[Row]:
    return [(i, f"k{i % KEYS}", i % 3) for i in range(count)]


class EoSink(Protocol):
    """One exactly-once sink under test: how the job writes to it, and how its output is read back."""

    name: str
    crash_points: tuple[str, ...]

    def env(self) -> dict[str, str]:
        """Environment variables that select and configure this sink in tests/jobs/eo_job.py."""
        ...

    def committed(self) -> list[Row]:
        """The sink's committed output, as a reader of committed data sees it."""
        ...

    def check_nothing_uncommitted(self) -> str:
        """Assert that no uncommitted output is visible to readers; a one-line summary of what was hidden."""
        ...


@dataclass
class FilesSink:
    """ckpt-files on S3: read_committed reads manifests only; killed attempts' files stay as orphans."""

    url: str
    s3: S3Options
    name: str = "files"
    crash_points: tuple[str, ...] = ("files.task.after-write", "files.commit.before-manifest",
                                     "files.commit.after-manifest")

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "files", "CKPT_EO_PATH": self.url}

    def committed(self) -> list[Row]:
        from airflow_ckpt_provider.sinks.filelayout import read_committed

        table = read_committed(self.url, self.s3)
        return list(zip(table.column("id").to_pylist(), table.column("key").to_pylist(),
                        table.column("part").to_pylist(), strict=True))

    def check_nothing_uncommitted(self) -> str:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        from airflow_ckpt_provider.core.storage import open_storage
        from airflow_ckpt_provider.sinks.filelayout import read_committed
        from airflow_ckpt_provider.sinks.filemaintenance import verify_sink

        report = verify_sink(self.url, self.s3, checksums=True)
        assert report.ok, report.problems
        committed = read_committed(self.url, self.s3).num_rows
        assert committed == report.rows, (committed, report.rows)
        # The orphans (files of killed or replayed attempts) hold rows a naive reader of every file
        # would see twice; read_committed never opens them.
        storage = open_storage(self.url, self.s3)
        orphan_rows = 0
        for key in report.orphans:
            local = storage.local_path(key)
            orphan_rows += pq.read_metadata(str(local) if local else io.BytesIO(storage.read(key))).num_rows
        return (f"{report.files} committed files ({report.rows} rows) in {sum(map(len, report.batches.values()))} "
                f"batches; {len(report.orphans)} orphan files ({orphan_rows} rows) not read")


_KAFKA_COMMITTED = re.compile(r"batch (\d+) partition (\d+) of job \S+ \(query (\S+)\): \d+ records committed by")


@dataclass
class KafkaSink:
    """ckpt-kafka into a topic. tansu shows aborted transactional records to read_committed consumers
    (ENVIRONMENT.md); tests/kafkasink.read_sink_output keeps each (query, batch, sink partition)'s last
    attempt, which is what Apache Kafka's abort filtering leaves (see that module). Only Apache Kafka
    can confirm that the broker itself hides the aborted attempts from read_committed consumers and
    holds them at the last stable offset while a transaction is open."""

    bootstrap: str
    topic: str
    name: str = "kafka"
    crash_points: tuple[str, ...] = ("kafka.task.after-produce", "kafka.task.before-commit",
                                     "kafka.task.after-commit", "kafka.commit.driver")

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "kafka", "CKPT_EO_TOPIC": self.topic}

    def committed(self) -> list[Row]:
        from tests.support.kafkasink import read_sink_output

        rows = []
        for record in read_sink_output(self.bootstrap, self.topic):
            assert record.key is not None and record.value is not None, record
            value = json.loads(record.value)
            rows.append((int(value["id"]), record.key.decode(), int(value["part"])))
        return rows

    def check_single_commits(self, log: str) -> int:
        """Each (query, batch, sink partition) was committed by one transaction at most, from the tasks' log
        lines: the last-attempt filter alone would hide a second committed attempt (a broken skip)."""
        commits = Counter(_KAFKA_COMMITTED.findall(log))
        twice = sorted(k for k, n in commits.items() if n > 1)
        assert commits, "no 'records committed by' line of the sink's tasks in the supervisors' logs"
        assert not twice, f"(batch, partition, query) committed by more than one transaction: {twice[:5]}"
        return len(commits)

    def check_nothing_uncommitted(self) -> str:
        from tests.support.kafkasink import last_attempts, read_all

        everything = read_all(self.bootstrap, self.topic)
        kept = last_attempts(everything)
        assert all(r.query_id and r.batch_id is not None and r.attempt for r in everything), \
            "a record without the sink's headers"
        attempts = {(r.query_id, r.batch_id, r.sink_partition, r.attempt) for r in everything}
        last = {(r.query_id, r.batch_id, r.sink_partition, r.attempt) for r in kept}
        return (f"{len(kept)} records of {len(last)} committed transactions; {len(everything) - len(kept)} records "
                f"of {len(attempts - last)} aborted attempts (visible on tansu only) filtered out")


@dataclass
class LedgerSink:
    """foreachBatch through the Ledger into SQLite: rows and ledger row commit in one transaction."""

    db: Path
    job: str
    name: str = "ledger"
    crash_points: tuple[str, ...] = ("ledger.before-commit", "ledger.after-commit")

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "ledger", "CKPT_EO_DB": str(self.db)}

    def _query(self, sql: str) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def committed(self) -> list[Row]:
        return [(int(i), str(k), int(p)) for i, k, p in self._query("SELECT id, key, part FROM eo_out")]  # type: ignore[call-overload]

    def check_nothing_uncommitted(self) -> str:
        # Every output row belongs to a batch the ledger recorded for this job, in the same numbers:
        # no row of an uncommitted (rolled back) transaction survived, none is missing.
        ledger = {(str(q), int(b)): r for q, b, r in self._query(  # type: ignore[call-overload]
            f"SELECT query_id, batch_id, rows_written FROM ckpt_ledger WHERE job = '{self.job}'")}
        rows = Counter((str(q), int(b)) for q, b in self._query("SELECT query_id, batch_id FROM eo_out"))  # type: ignore[call-overload]
        orphans = sorted(set(rows) - set(ledger))
        assert not orphans, f"output rows of batches the ledger does not hold: {orphans}"
        wrong = {k: (rows.get(k, 0), n) for k, n in ledger.items() if rows.get(k, 0) != n}
        assert not wrong, f"(query, batch): (rows found, rows the ledger recorded) differ: {wrong}"
        return f"{sum(rows.values())} rows in {len(ledger)} ledger batches, every row's batch in the ledger"


@dataclass
class Kill:
    sink: str
    epoch: int
    how: str
    state: str
    batch_id: int | None


@dataclass
class Proof:
    """What a proof run did and saw (printed by the test, asserted on by it)."""

    seed: int
    sinks: tuple[str, ...]
    plans: dict[str, list[str]] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    ids: int = 0
    records: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    uncommitted: dict[str, str] = field(default_factory=dict)

    def kills_of(self, sink: str) -> list[Kill]:
        return [k for k in self.kills if k.sink == sink]

    def summary(self) -> str:
        times = ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items())
        lines = [f"exactly-once proof, sinks {', '.join(self.sinks)} side by side, seed {self.seed} (CKPT_EO_SEED): "
                 f"{self.ids} ids, {self.records} records, {len(self.kills)} kills; {times}"]
        for sink in self.sinks:
            kills = self.kills_of(sink)
            lines.append(f"  {sink}: {len(kills)} kills")
            lines += [f"    epoch {k.epoch:2d} {k.state:8s} batch {k.batch_id!s:>4s}: {k.how}" for k in kills]
            lines.append(f"    {self.uncommitted.get(sink, '')}")
        return "\n".join(lines)


class Feeder:
    """Produces the known stream: each feed brings CHUNK new ids and the second copies of the last feed's.
    Thread-safe: every job's thread feeds the one topic they all read."""

    def __init__(self, bootstrap: str, topic: str, first_id: int = 0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.next_id = first_id
        self.pending: tuple[int, int] | None = None  # (start, count) produced once so far
        self.records = 0
        self._lock = threading.Lock()

    def _produce(self, start: int, count: int) -> None:
        produce(self.bootstrap, self.topic, start, count)
        self.records += count

    def feed(self, count: int = CHUNK) -> None:
        with self._lock:
            self._produce(self.next_id, count)
            if self.pending:
                self._produce(*self.pending)
            self.pending = (self.next_id, count)
            self.next_id += count

    def finish(self) -> None:
        """The second copies of the last feed: every id has now been produced twice."""
        with self._lock:
            if self.pending:
                self._produce(*self.pending)
            self.pending = None


def wait_for(what: str, ok: Callable[[], bool], timeout: float, *runs: Run) -> None:
    """Poll ``ok``; fail early, with the logs, if a run exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not ok():
        for run in runs:
            if run.proc.poll() is not None:
                raise AssertionError(f"{run.name} exited with {run.proc.returncode} while waiting for {what}\n"
                                     f"{run.tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(r.tail() for r in runs)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")
        time.sleep(0.2)


RANDOM = "random"  # a plan's step: kill -9 at a random moment (the others name crash points)


def kill_plans(sinks: Sequence[EoSink], rng: random.Random, *, min_kills: int,
               kills_per_sink: int = 0) -> dict[str, list[str]]:
    """Each sink's kills before its savepoint, in a random order: every crash point of its commit protocol once,
    and random kills until there is at least one, ``min_kills`` in all and ``kills_per_sink`` per sink. A random
    kill goes to a sink drawn among those with fewer kills than the most (among all if none): the jobs run side
    by side, so even plans end together."""
    plans = {s.name: list(s.crash_points) for s in sinks}

    def short() -> bool:
        kills = [len(p) for p in plans.values()]
        randoms = sum(p.count(RANDOM) for p in plans.values())
        return randoms == 0 or sum(kills) < min_kills or min(kills) < kills_per_sink

    while short():
        most = max(len(p) for p in plans.values())
        behind = sorted(n for n, p in plans.items() if len(p) < most) or sorted(plans)
        plans[rng.choice(behind)].append(RANDOM)
    for plan in plans.values():
        rng.shuffle(plan)
    return plans


class Chaos:
    """One job of the proof: its supervised runs (before and after the restore), and the kills that hit its
    drivers. Its methods run on the job's own thread (``in_parallel``)."""

    def __init__(self, env: JobEnv, sink: EoSink, proof: Proof, feeder: Feeder, rng: random.Random,
                 runs: list[Run]) -> None:
        self.env = env
        self.sink = sink
        self.proof = proof
        self.feeder = feeder
        self.rng = rng
        self.runs = runs
        self.faults = env.work / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        self.epoch = 0  # the newest driver's epoch seen so far
        self.last_batch = -1  # the highest batch id any status reported
        self.first: Run | None = None  # the supervisor of the chaos phase
        self.second: Run | None = None  # the supervisor of the restored job

    def start(self, name: str, checkpoint: Path, *args: str, restarts: int) -> Run:
        run = self.env.run(name, checkpoint,
                           "--supervise", "-v", "--restart-strategy", "fixed-delay",
                           "--restart-attempts", str(restarts), "--restart-delay", "0.5", "--poll", "1", *args,
                           max_offsets=MAX_OFFSETS, job_file=EO_JOB,
                           extra_env={**self.sink.env(), "CKPT_FAULT_DIR": str(self.faults)})
        self.runs.append(run)
        return run

    def _seen(self, status: JobStatus) -> None:
        if status.batch_id is not None:
            self.last_batch = max(self.last_batch, status.batch_id)

    def next_driver(self, run: Run) -> JobStatus:
        """Wait for a driver newer than the last one seen (the supervisor's restart)."""
        epoch = self.epoch

        def newer(s: JobStatus) -> bool:
            return s.epoch > epoch and s.state in ACTIVE_STATES

        status = self.env.wait_status(f"a driver newer than epoch {epoch}", newer, WAIT, run)
        self.epoch = status.epoch
        return status

    def crash_at(self, run: Run, point: str) -> None:
        """Arm ``point``, feed records so that a batch reaches it, wait until it fired (its file is gone).

        The point kills the driver's JVM process group itself (core/faults.py), from the Python driver
        (the ledger's points) or from a Python worker of pyspark's daemon (tasks, a sink's commit()).
        """
        status = self.env.status()
        assert status is not None and status.epoch == self.epoch and status.pid is not None, status
        armed = self.faults / point
        armed.touch()
        self.feeder.feed()
        deadline = time.monotonic() + WAIT
        while armed.exists():
            if run.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"crash point {point} did not fire in epoch {self.epoch}\n{run.tail()}")
            time.sleep(0.02)
        self._record(status, f"crash point {point}")

    def kill_randomly(self, run: Run) -> None:
        """kill -9 at a random moment of this driver's life: while it starts (restore, query start, first
        batch), or inside a batch after it completed one of its own."""
        if self.rng.random() < 0.35:
            delay = self.rng.uniform(0.5, 8.0)
            how = f"random: {delay:.1f} s after the lease"
            time.sleep(delay)
        else:
            base, delay = self.last_batch, self.rng.uniform(0.0, 2.5)
            how = f"random: {delay:.1f} s after its first batch"

            def ran_one(s: JobStatus) -> bool:
                return s.epoch == self.epoch and s.batch_id is not None and s.batch_id > base

            self._seen(self.env.wait_status(f"a batch of epoch {self.epoch}", ran_one, WAIT, run))
            time.sleep(delay)
        status = self.env.status()
        assert status is not None and status.epoch == self.epoch and status.state in ACTIVE_STATES, \
            f"driver of epoch {self.epoch} died on its own: {status}\n{run.tail()}"
        kill_driver(status)
        self._record(status, how)
        self.feeder.feed()  # while the supervisor restarts the driver

    def _record(self, status: JobStatus | None, how: str) -> None:
        if status is not None:
            self._seen(status)
        self.proof.kills.append(Kill(self.sink.name, self.epoch, how, status.state.value if status else "?",
                                     status.batch_id if status else None))

    def drain_and_stop(self, run: Run | None, total: int) -> Ack:
        """Wait until every record was consumed, then stop with savepoint; the stop's answer."""
        assert run is not None, "the job was not started"
        final = self.env.wait_status(f"all {total} records consumed",
                                     lambda s: self.env.consumed(s) == total and s.state is JobState.RUNNING,
                                     WAIT * 2, run)
        ack = self.env.request(RequestAction.STOP, final.epoch)
        assert ack.outcome is Outcome.COMPLETED, ack
        assert run.wait(WAIT) == EXIT_STOPPED, run.tail()
        assert ack.snapshot_id, ack
        return ack

    # -- the phases ----------------------------------------------------------------------------

    def run_plan(self, plan: Sequence[str]) -> None:
        """Start the job and kill its drivers as planned; returns once the driver after the last kill runs."""
        self.first = self.start("supervisor", self.env.work / "checkpoint-a", restarts=len(plan) * 3)
        for step in plan:
            self.next_driver(self.first)
            if step == RANDOM:
                self.kill_randomly(self.first)
            else:
                self.crash_at(self.first, step)
        self.next_driver(self.first)

    def check_plan_run(self, kills: int) -> None:
        """The supervisor restarted the driver once per kill, each time from the latest completed checkpoint
        (latest-state: the live checkpoint), and every armed crash point fired."""
        assert self.first is not None
        log = self.first.log.read_text()
        assert len(re.findall(r"driver exited with code -9 ", log)) == kills, self.first.tail()
        assert len(re.findall(r"restarting in 0\.5 s", log)) == kills, self.first.tail()
        assert log.count("restore latest-state") == kills + 1, self.first.tail()
        assert not list(self.faults.iterdir()), "a crash point did not fire"

    def restore(self, savepoint: Ack) -> None:
        """Another machine: a fresh checkpoint location restored from the stop's savepoint; one crash at the sink's
        last step (the batch is committed in the sink, not in Spark's checkpoint) once the supervisor saw the
        driver run, so the restart resumes from latest-state: the new location's own checkpoint, in the
        savepoint's lineage. Returns once the driver after that crash runs."""
        self.second = second = self.start("restored", self.env.work / "checkpoint-b", "--restore",
                                          "latest-savepoint", restarts=3)
        epoch = self.next_driver(second).epoch

        def restored(s: JobStatus) -> bool:
            return s.epoch == epoch and s.restored_from is not None

        status = self.env.wait_status("the restored driver's snapshot", restored, WAIT, second)
        assert status.restored_from == savepoint.snapshot_id, (status, savepoint)
        running = f"runs the job at epoch {status.epoch}: restarts resume from latest-state"
        wait_for("the supervisor to see the restored driver run", lambda: running in second.log.read_text(), WAIT,
                 second)
        self.crash_at(second, self.sink.crash_points[-1])
        self.next_driver(second)

    def check_restore_run(self) -> None:
        assert self.second is not None
        log = self.second.log.read_text()
        assert log.count("restore latest-savepoint") == 1 and log.count("restore latest-state") == 1, \
            self.second.tail()
        assert len(re.findall(r"driver exited with code -9 ", log)) == 1, self.second.tail()
        assert not list(self.faults.iterdir()), "a crash point did not fire"

    def check_output(self, ids: int) -> str:
        """Every id exactly once in the sink's committed output, with its content; nothing uncommitted visible.
        A one-line summary of what the checks saw."""
        assert self.first is not None and self.second is not None
        rows = self.sink.committed()
        counts = Counter(r[0] for r in rows)
        duplicated = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(ids)) - set(counts))
        assert not duplicated and not missing, (f"{len(duplicated)} ids duplicated (first {duplicated[:10]}), "
                                                f"{len(missing)} missing (first {missing[:10]})")
        assert sorted(rows) == expected_rows(ids), "every id once, but some content differs"
        summary = self.sink.check_nothing_uncommitted()
        if isinstance(self.sink, KafkaSink):
            transactions = self.sink.check_single_commits(self.first.log.read_text() + self.second.log.read_text())
            summary += f"; {transactions} (batch, partition) transactions committed once each (task logs)"
        return summary


T = TypeVar("T")


def in_parallel(chaoses: Sequence[Chaos], step: Callable[[Chaos], T], runs: list[Run]) -> list[T]:
    """``step`` for every job at once, one thread each; their results in order. The first failure (its message
    names the sink) stops every run, which ends the other threads' waits, and is raised."""

    def named(chaos: Chaos) -> T:
        try:
            return step(chaos)
        except AssertionError as err:
            raise AssertionError(f"sink {chaos.sink.name} (job {chaos.env.job}): {err}") from err

    pool = ThreadPoolExecutor(len(chaoses), thread_name_prefix="eo-proof")
    futures: list[Future[T]] = [pool.submit(named, c) for c in chaoses]
    done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    failed = [err for f in futures if f in done and (err := f.exception()) is not None]
    if failed:
        for run in list(runs):
            run.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        raise failed[0]
    pool.shutdown()
    return [f.result() for f in futures]


def prove_exactly_once(jobs: Sequence[tuple[JobEnv, EoSink]], runs: list[Run], *, min_kills: int = 10,
                       kills_per_sink: int = 0, more_ids: int = 200, seed: int | None = None) -> Proof:
    """Run the whole proof for every (job, sink) at once (see the module docstring); assert on the supervisors'
    logs and every sink's output. The jobs share one input topic."""
    seed = int(os.environ.get("CKPT_EO_SEED", random.randrange(1 << 30))) if seed is None else seed
    sinks = tuple(s.name for _, s in jobs)
    print(f"exactly-once proof: sinks {', '.join(sinks)} side by side, seed {seed}")
    assert len(set(sinks)) == len(sinks), sinks
    first_env = jobs[0][0]
    assert all(env.topic == first_env.topic for env, _ in jobs), "the jobs must read one topic"
    rng = random.Random(seed)
    proof = Proof(seed, sinks, plans=kill_plans([s for _, s in jobs], rng, min_kills=min_kills,
                                                kills_per_sink=kills_per_sink))
    feeder = Feeder(first_env.kafka.bootstrap_servers, first_env.topic)
    # Each job draws its random moments from its own generator: the threads' interleaving cannot change them.
    chaoses = [Chaos(env, sink, proof, feeder, random.Random(f"{seed}/{sink.name}"), runs) for env, sink in jobs]
    started = time.monotonic()

    feeder.feed()
    in_parallel(chaoses, lambda c: c.run_plan(proof.plans[c.sink.name]), runs)
    feeder.finish()
    acks = in_parallel(chaoses, lambda c: c.drain_and_stop(c.first, feeder.records), runs)
    proof.seconds["chaos"] = time.monotonic() - started
    for chaos in chaoses:
        chaos.check_plan_run(len(proof.plans[chaos.sink.name]))
    savepoints = {c.sink.name: ack for c, ack in zip(chaoses, acks, strict=True)}

    restored_at = time.monotonic()
    feeder.feed(more_ids // 2)  # arrived while the jobs were stopped
    in_parallel(chaoses, lambda c: c.restore(savepoints[c.sink.name]), runs)
    feeder.feed(more_ids - more_ids // 2)
    feeder.finish()
    in_parallel(chaoses, lambda c: c.drain_and_stop(c.second, feeder.records), runs)
    proof.seconds["restore"] = time.monotonic() - restored_at
    for chaos in chaoses:
        chaos.check_restore_run()

    checked_at = time.monotonic()
    proof.ids, proof.records = feeder.next_id, feeder.records
    for chaos in chaoses:
        try:
            proof.uncommitted[chaos.sink.name] = chaos.check_output(proof.ids)
        except AssertionError as err:
            raise AssertionError(f"sink {chaos.sink.name}: {err}\n{proof.summary()}") from err
    proof.seconds["check"] = time.monotonic() - checked_at
    proof.seconds["total"] = time.monotonic() - started
    return proof
