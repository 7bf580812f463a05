"""The exactly-once proof's harness: supervised jobs, kill -9s at random moments and at every crash point.

``prove_exactly_once`` proves the three exactly-once sinks in one run with one kill plan: one job per sink,
tests/jobs/eo_job.py (``dropDuplicates(["id"])`` over a 3-partition topic of its own, into that sink) under
``ckpt run --supervise``, the jobs side by side (a thread each) or one after the other. They are separate jobs
because the runtime runs one streaming query per job: one checkpoint location, snapshots and restores of that
query's checkpoint. The plan covers every crash point of every sink's commit protocol once (armed by a file in
the job's CKPT_FAULT_DIR, core/policy/faults.py) and random kill -9s (while the driver starts, or inside a batch after
it completed one): at least ``min_kills`` in all, one random at least. Records keep arriving: id i (key
``k<i % 10>``, partition ``i % 3``, tests/support/runtimejob.produce) is produced twice, the second copy a
feed later, so the state must drop it. Each job is killed at its sink's crash points but the last and at its
random moments; stops with a savepoint; restores it on a fresh checkpoint location
(``--restore latest-savepoint``); crashes there at its sink's last step (committed in the sink, not in
Spark's checkpoint: the restored lineage must skip the replay), takes more ids and stops again. Its sink's
committed output is exactly one row ``(id, key, part)`` per id it was fed, whatever the batch boundaries were.

Most of the time goes to driver starts (a JVM, the Python driver, the first batch's Python workers); the
drivers' JVM runs with the client JIT only (``TEST_DRIVER_JVM`` in tests/conftest.py, for every test's
drivers), which halves that on two cores.

A sink (``EoSink``) tells its job how to write (environment variables), reads its committed output back and
checks that nothing uncommitted is visible. The seed is printed; CKPT_EO_SEED replays the plan and the
random moments.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
import random
import re
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import ACTIVE_STATES, JobState, JobStatus
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded import EmbeddedKafka
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

    def conf(self) -> dict[str, str]:
        """Spark settings of this sink's job (beyond tests/support/runtimejob.SPARK_CONF)."""
        ...

    def committed(self) -> list[Row]:
        """The sink's committed output, as a reader of committed data sees it."""
        ...

    def check_nothing_uncommitted(self) -> str:
        """Assert that no uncommitted output is visible to readers; a one-line summary of what was hidden."""
        ...

    def explain(self, missing: set[int]) -> str:
        """What the sink holds of ``missing`` ids (for the failure message)."""
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

    def conf(self) -> dict[str, str]:
        return {}

    def committed(self) -> list[Row]:
        from airflow_ckpt_provider.sinks.filelayout import read_committed

        table = read_committed(self.url, self.s3)
        if table.num_rows == 0:  # nothing committed yet: a table without columns
            return []
        return list(zip(table.column("id").to_pylist(), table.column("key").to_pylist(),
                        table.column("part").to_pylist(), strict=True))

    def check_nothing_uncommitted(self) -> str:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs (no py.typed)

        from airflow_ckpt_provider.core.store.storage import open_storage
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

    def explain(self, missing: set[int]) -> str:
        from airflow_ckpt_provider.sinks.filemaintenance import verify_sink

        report = verify_sink(self.url, self.s3, checksums=True)
        return f"verify_sink: ok {report.ok}, {report.rows} rows, {len(report.orphans)} orphans, {report.problems}"


#: A task's commit line (kafka/writer.py): worker pid, batch, sink partition, query, the marker the task found.
_KAFKA_COMMITTED = re.compile(r"\[worker (\d+)\]: batch (\d+) partition (\d+) of job \S+ \(query (\S+)\): \d+ records "
                              r"committed by \S+ \(marker found: (?:batch )?(\d+|none)")

#: A task's commit: (batch, sink partition, query).
KAFKA_TASK_COMMIT = re.compile(r"batch (\d+) partition (\d+) of job \S+ \(query (\S+)\): \d+ records committed by ")

SINK_TOPIC_PARTITIONS = 4  # keys hash over them: every sink partition's transactions share them, as in users' jobs
#: Sink partitions of the Kafka sink's job (spark.sql.shuffle.partitions of its dropDuplicates): more than the two
#: Python workers of local[2], so a sink partition's tasks move between workers from batch to batch.
KAFKA_SINK_PARTITIONS = 4


def new_sink_topic(kafka: EmbeddedKafka) -> str:
    """The Kafka sink's output topic: tests/jobs/eo_job.py keys its records, so every sink partition writes
    every Kafka partition and their transactions overlap, as in users' jobs (tansu 0.6 then applies a
    transaction's marker only when the overlapping ones have ended: the sink waits for it, kafka/writer.py)."""
    topic = f"eo-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(topic, partitions=SINK_TOPIC_PARTITIONS)
    return topic


@dataclass
class KafkaSink:
    """ckpt-kafka into a topic. tansu shows aborted transactional records to read_committed consumers
    (ENVIRONMENT.md) and can hold them at a last stable offset that never moves (kafkasink.py);
    tests/kafkasink.read_sink_output reads everything and keeps each (query, batch, sink partition)'s last
    attempt, which is what Apache Kafka's abort filtering leaves (see that module). Only Apache Kafka can
    confirm that the broker itself hides the aborted attempts from read_committed consumers and holds them at
    the last stable offset while a transaction is open."""

    bootstrap: str
    topic: str
    name: str = "kafka"
    sink_partitions: int = KAFKA_SINK_PARTITIONS
    crash_points: tuple[str, ...] = ("kafka.task.after-produce", "kafka.task.before-commit",
                                     "kafka.task.after-commit", "kafka.commit.driver")

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "kafka", "CKPT_EO_TOPIC": self.topic}

    def conf(self) -> dict[str, str]:
        return {"spark.sql.shuffle.partitions": str(self.sink_partitions)}

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
        lines: the last-attempt filter alone would hide a second committed attempt (a broken skip). And the
        markers advanced with every batch: the marker a task found is at least the previous batch its sink
        partition committed (a line lost to a kill -9 right after a commit only makes it newer)."""
        found = _KAFKA_COMMITTED.findall(log)
        check_markers_advanced([line[1:] for line in found])
        workers: dict[tuple[str, str], set[str]] = {}
        for worker, _, partition, query, _ in found:
            workers.setdefault((query, partition), set()).add(worker)
        assert any(len(w) > 1 for w in workers.values()), \
            f"no sink partition's tasks ran in more than one Python worker: {workers}"
        commits = Counter((b, p, q) for _, b, p, q, _ in found)
        twice = sorted(k for k, n in commits.items() if n > 1)
        assert commits, "no 'records committed by' line of the sink's tasks in the supervisors' logs"
        lines = [ln for ln in log.splitlines() for b, p, q in twice[:3]
                 if f"batch {b} partition {p} of job " in ln and f"(query {q})" in ln]
        assert not twice, (f"(batch, partition, query) committed by more than one transaction: {twice[:5]}; their "
                           "lines (the marker each task found):\n" + "\n".join(lines))
        return len(commits)

    def check_nothing_uncommitted(self) -> str:
        from tests.support.kafkasink import last_attempts, read_all

        everything = read_all(self.bootstrap, self.topic)
        # The documented consumer view: a read_committed consumer reaches the end of every partition (no
        # transaction left open holds the last stable offset; the restarts aborted the killed drivers' ones).
        committed_view = read_all(self.bootstrap, self.topic, isolation="read_committed")
        assert len(committed_view) == len(everything), (
            f"a read_committed consumer read {len(committed_view)} of {len(everything)} records: a transaction "
            "left open holds the last stable offset")
        kept = last_attempts(everything)
        assert all(r.query_id and r.batch_id is not None and r.attempt for r in everything), \
            "a record without the sink's headers"
        attempts = {(r.query_id, r.batch_id, r.sink_partition, r.attempt) for r in everything}
        last = {(r.query_id, r.batch_id, r.sink_partition, r.attempt) for r in kept}
        return (f"{len(kept)} records of {len(last)} committed transactions; {len(everything) - len(kept)} records "
                f"of {len(attempts - last)} aborted attempts (visible on tansu only) filtered out")

    def explain(self, missing: set[int]) -> str:
        from tests.support.kafkasink import explain_missing

        return explain_missing(self.bootstrap, self.topic, missing,
                               lambda r: int(json.loads(r.value or b"{}").get("id", -1)))


def check_markers_advanced(lines: list[tuple[str, str, str, str]]) -> None:
    """(batch, sink partition, query, marker found) of the tasks' commit lines: per (query, partition), in batch
    order, each marker found is below its batch and at least the previous committed batch."""
    chains: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for batch, partition, query, marker in lines:
        chains.setdefault((query, partition), []).append((int(batch), -1 if marker == "none" else int(marker)))
    stuck = []
    for (query, partition), chain in chains.items():
        chain.sort()
        for (before, _), (batch, marker) in itertools.pairwise(chain):
            if batch != before and not before <= marker < batch:
                stuck.append(f"query {query} partition {partition}: batch {batch} found the marker at {marker}, "
                             f"expected {before}..{batch - 1} (batch {before} was committed before)")
    assert not stuck, "markers that did not advance with the batches:\n" + "\n".join(stuck[:10])


class _LedgerRows:
    """What the ledger sinks share: the output table and the ledger read through ``_query`` of the database."""

    job: str
    name = "ledger"
    crash_points: tuple[str, ...] = ("ledger.before-commit", "ledger.after-commit")

    def conf(self) -> dict[str, str]:
        return {}

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def committed(self) -> list[Row]:
        return [(int(i), str(k), int(p)) for i, k, p in self._query("SELECT id, key, part FROM eo_out")]

    def check_nothing_uncommitted(self) -> str:
        # Every output row belongs to a batch the ledger recorded for this job, in the same numbers:
        # no row of an uncommitted (rolled back) transaction survived, none is missing.
        ledger = {(str(q), int(b)): r for q, b, r in self._query(
            f"SELECT query_id, batch_id, rows_written FROM ckpt_ledger WHERE job = '{self.job}'")}
        rows = Counter((str(q), int(b)) for q, b in self._query("SELECT query_id, batch_id FROM eo_out"))
        orphans = sorted(set(rows) - set(ledger))
        assert not orphans, f"output rows of batches the ledger does not hold: {orphans}"
        wrong = {k: (rows.get(k, 0), n) for k, n in ledger.items() if rows.get(k, 0) != n}
        assert not wrong, f"(query, batch): (rows found, rows the ledger recorded) differ: {wrong}"
        return f"{sum(rows.values())} rows in {len(ledger)} ledger batches, every row's batch in the ledger"

    def explain(self, missing: set[int]) -> str:
        batches = self._query(f"SELECT query_id, batch_id, rows_written FROM ckpt_ledger WHERE job = '{self.job}'")
        return f"ledger batches (query, batch, rows): {batches}"


@dataclass
class LedgerSink(_LedgerRows):
    """foreachBatch through the Ledger into SQLite: rows and ledger row commit in one transaction."""

    db: Path
    job: str

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "ledger", "CKPT_EO_DB": str(self.db)}

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()


@dataclass
class PgLedgerSink(_LedgerRows):
    """The ledger sink into PostgreSQL (``dsn``): the database on a host of its own, which a driver may reach while it
    is cut from the job store (docs/reliability.md, scenario 1)."""

    dsn: str
    job: str

    def env(self) -> dict[str, str]:
        return {"CKPT_EO_SINK": "ledger", "CKPT_EO_DSN": self.dsn}

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(sql).fetchall())

    def open_transactions(self, address: str) -> list[tuple[Any, ...]]:
        """The transactions open in sessions from ``address`` (state, seconds open, the last statement)."""
        return self._query("SELECT state, round(extract(epoch FROM now() - xact_start))::int, left(query, 80) FROM "
                           f"pg_stat_activity WHERE client_addr = '{address}' AND xact_start IS NOT NULL")


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
    ids: dict[str, int] = field(default_factory=dict)  # per sink: the ids its job was fed
    records: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    uncommitted: dict[str, str] = field(default_factory=dict)

    def kills_of(self, sink: str) -> list[Kill]:
        return [k for k in self.kills if k.sink == sink]

    def summary(self) -> str:
        times = ", ".join(f"{k} {v:.0f} s" for k, v in list(self.seconds.items()))
        lines = [f"exactly-once proof, sinks {', '.join(self.sinks)}, seed {self.seed} (CKPT_EO_SEED): "
                 f"{len(self.kills)} kills; {times}"]
        for sink in self.sinks:
            kills = self.kills_of(sink)
            lines.append(f"  {sink}: {self.ids.get(sink, 0)} ids, {self.records.get(sink, 0)} records, "
                         f"{len(kills)} kills")
            lines += [f"    epoch {k.epoch:2d} {k.state:8s} batch {k.batch_id!s:>4s}: {k.how}" for k in kills]
            lines.append(f"    {self.uncommitted.get(sink, '')}")
        return "\n".join(lines)


class Feeder:
    """Produces the known stream: each feed brings CHUNK new ids and the second copies of the last feed's."""

    def __init__(self, env: JobEnv, first_id: int = 0) -> None:
        self.env = env
        self.next_id = first_id
        self.pending: tuple[int, int] | None = None  # (start, count) produced once so far
        self.records = 0

    def _produce(self, start: int, count: int) -> None:
        produce(self.env.kafka.bootstrap_servers, self.env.topic, start, count)
        self.records += count

    def feed(self, count: int = CHUNK) -> None:
        self._produce(self.next_id, count)
        if self.pending:
            self._produce(*self.pending)
        self.pending = (self.next_id, count)
        self.next_id += count

    def finish(self) -> None:
        """The second copies of the last feed: every id has now been produced twice."""
        if self.pending:
            self._produce(*self.pending)
        self.pending = None


def job_of_its_own(env: JobEnv, name: str) -> JobEnv:
    """A job of its own with a 3-partition input topic of its own, on ``env``'s store bucket and servers."""
    work = env.work / name
    work.mkdir()
    topic = f"t-{uuid.uuid4().hex[:10]}"
    env.kafka.create_topic(topic, partitions=3)
    return JobEnv(env.s3, env.kafka, work, env.bucket, topic, job=f"eo-{name}-{uuid.uuid4().hex[:6]}")


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
    """Each sink's kills before its savepoint, shuffled: every crash point of its commit protocol but the last
    (its crash after the restore), then random kills until every sink has ``kills_per_sink`` and all together
    ``min_kills``, one at least (counting the crashes after the restores). A kill beyond the per-sink minimum
    goes to a sink drawn among those with fewer kills than the most (among all if none): side by side, the
    job with the most kills takes the longest, and this one gets no more."""
    plans = {s.name: list(s.crash_points[:-1]) for s in sinks}

    def kills(name: str) -> int:
        return len(plans[name]) + 1  # and the crash after the restore

    for name, plan in plans.items():
        plan.extend([RANDOM] * max(0, kills_per_sink - kills(name)))
    while sum(map(kills, plans)) < min_kills or not any(RANDOM in p for p in plans.values()):
        most = max(map(kills, plans))
        plans[rng.choice(sorted(n for n in plans if kills(n) < most) or sorted(plans))].append(RANDOM)
    for plan in plans.values():
        rng.shuffle(plan)
    return plans


class Chaos:
    """One job of the proof: its supervised runs (before and after the restore), and the kills that hit its
    drivers, while ``feeder`` brings records to the job's topic."""

    def __init__(self, env: JobEnv, sink: EoSink, proof: Proof, rng: random.Random, runs: list[Run]) -> None:
        self.env = env
        self.sink = sink
        self.proof = proof
        self.rng = rng
        self.runs = runs
        self.feeder = Feeder(env)
        self.faults = env.work / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        self.epoch = 0  # the newest driver's epoch seen so far
        self.last_batch = -1  # the highest batch id any status reported

    def start(self, name: str, checkpoint: Path, *args: str, restarts: int) -> Run:
        run = self.env.run(name, checkpoint,
                           "--supervise", "-v", "--restart-strategy", "fixed-delay",
                           "--restart-attempts", str(restarts), "--restart-delay", "0.5", "--poll", "1", *args,
                           max_offsets=MAX_OFFSETS, job_file=EO_JOB, conf=self.sink.conf(),
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

        The point kills the driver's JVM process group itself (core/policy/faults.py), from the Python driver
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

    def drain_and_stop(self, run: Run) -> Ack:
        """Wait until every record was consumed, then stop with savepoint; the stop's answer."""
        total = self.feeder.records
        final = self.env.wait_status(f"all {total} records consumed",
                                     lambda s: self.env.consumed(s) == total and s.state is JobState.RUNNING,
                                     WAIT * 2, run)
        ack = self.env.request(RequestAction.STOP, final.epoch)
        assert ack.outcome is Outcome.COMPLETED, ack
        assert run.wait(WAIT) == EXIT_STOPPED, run.tail()
        assert ack.snapshot_id, ack
        return ack

    def prove(self, plan: Sequence[str], more_ids: int) -> None:
        """The whole proof for this job (the module docstring), with ``plan``'s kills before the savepoint."""
        name = self.sink.name
        started = time.monotonic()
        self.feeder.feed()
        first = self.start("supervisor", self.env.work / "checkpoint-a", restarts=len(plan) * 3 + 1)
        for step in plan:
            self.next_driver(first)
            if step == RANDOM:
                self.kill_randomly(first)
            else:
                self.crash_at(first, step)
        self.next_driver(first)
        self.feeder.finish()
        savepoint = self.drain_and_stop(first)
        self.proof.seconds[f"{name} chaos"] = time.monotonic() - started
        log = first.log.read_text()
        # Every restart resumed from the latest completed checkpoint (latest-state: the live checkpoint).
        assert len(re.findall(r"driver exited with code -9 ", log)) == len(plan), first.tail()
        assert len(re.findall(r"restarting in 0\.5 s", log)) == len(plan), first.tail()
        assert log.count("restore latest-state") == len(plan) + 1, first.tail()
        assert not list(self.faults.iterdir()), "a crash point did not fire"

        # Another machine: a fresh checkpoint location restored from the stop's savepoint, more ids; one crash
        # at the sink's last step once the supervisor saw the driver run (so the restart resumes from
        # latest-state: the new location's own checkpoint, in the savepoint's lineage).
        restored_at = time.monotonic()
        self.feeder.feed(more_ids // 2)  # arrived while the job was stopped
        second = self.start("restored", self.env.work / "checkpoint-b", "--restore", "latest-savepoint",
                            restarts=3)
        assert savepoint.snapshot_id is not None
        self.crash_after_restore(second, savepoint.snapshot_id)
        self.feeder.feed(more_ids - more_ids // 2)
        self.feeder.finish()
        self.drain_and_stop(second)
        self.proof.seconds[f"{name} restore"] = time.monotonic() - restored_at
        log = second.log.read_text()
        assert log.count("restore latest-savepoint") == 1 and log.count("restore latest-state") == 1, second.tail()
        assert len(re.findall(r"driver exited with code -9 ", log)) == 1, second.tail()
        assert not list(self.faults.iterdir()), "a crash point did not fire"

        self.check_output(first.log.read_text() + second.log.read_text())

    def crash_after_restore(self, run: Run, snapshot_id: str) -> None:
        """Once ``run``'s first driver restored ``snapshot_id`` and its supervisor saw it run (so the restart
        resumes from latest-state: the new location's own checkpoint, in the snapshot's lineage), crash it at
        the sink's last commit step; wait for the restarted driver."""
        epoch = self.next_driver(run).epoch

        def restored(s: JobStatus) -> bool:
            return s.epoch == epoch and s.restored_from is not None

        status = self.env.wait_status("the restored driver's snapshot", restored, WAIT, run)
        assert status.restored_from == snapshot_id, (status, snapshot_id)
        running = f"runs the job at epoch {status.epoch}: restarts resume from latest-state"
        wait_for("the supervisor to see the restored driver run", lambda: running in run.log.read_text(), WAIT, run)
        self.crash_at(run, self.sink.crash_points[-1])
        self.next_driver(run)

    def check_output(self, logs: str) -> None:
        """Every id fed is in the sink's committed output exactly once with its content, nothing uncommitted is
        visible, and (Kafka) each (batch, partition) was committed once according to the supervisors' ``logs``."""
        name = self.sink.name
        ids = self.proof.ids[name] = self.feeder.next_id
        self.proof.records[name] = self.feeder.records
        rows = self.sink.committed()
        counts = Counter(r[0] for r in rows)
        duplicated = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(ids)) - set(counts))
        assert not duplicated and not missing, (f"{len(duplicated)} ids duplicated (first {duplicated[:10]}), "
                                                f"{len(missing)} missing (first {missing[:10]})"
                                                f"\n{self.sink.explain(set(missing)) if missing else ''}")
        assert sorted(rows) == expected_rows(ids), "every id once, but some content differs"
        summary = self.sink.check_nothing_uncommitted()
        if isinstance(self.sink, KafkaSink):
            transactions = self.sink.check_single_commits(logs)
            summary += f"; {transactions} (batch, partition) transactions committed once each (task logs)"
        self.proof.uncommitted[name] = summary


def prove_exactly_once(jobs: Sequence[tuple[JobEnv, EoSink]], runs: list[Run], *, min_kills: int = 10,
                       kills_per_sink: int = 0, more_ids: int = 200, seed: int | None = None,
                       side_by_side: bool = False) -> Proof:
    """Run the whole proof for every (job, sink) with one kill plan (see the module docstring), one job after the
    other or, ``side_by_side``, all at once (a thread each); assert on the supervisors' logs and every sink's
    output. Each job needs a topic of its own."""
    seed = int(os.environ.get("CKPT_EO_SEED", random.randrange(1 << 30))) if seed is None else seed
    sinks = tuple(s.name for _, s in jobs)
    print(f"exactly-once proof: sinks {', '.join(sinks)}, seed {seed}")
    assert len(set(sinks)) == len(sinks) and len({env.topic for env, _ in jobs}) == len(jobs), "a topic per job"
    rng = random.Random(seed)
    proof = Proof(seed, sinks, plans=kill_plans([s for _, s in jobs], rng, min_kills=min_kills,
                                                kills_per_sink=kills_per_sink))
    started = time.monotonic()

    def prove(env: JobEnv, sink: EoSink) -> None:
        # Each job draws its random moments from a generator of its own: the order of the jobs, or their
        # interleaving side by side, does not change them.
        chaos = Chaos(env, sink, proof, random.Random(f"{seed}/{sink.name}"), runs)
        try:
            chaos.prove(proof.plans[sink.name], more_ids)
        except AssertionError as err:
            raise AssertionError(f"sink {sink.name} (job {env.job}): {err}\n{proof.summary()}") from err

    if side_by_side:
        all_at_once([functools.partial(prove, env, sink) for env, sink in jobs], runs)
    else:
        for env, sink in jobs:
            prove(env, sink)
    proof.seconds["total"] = time.monotonic() - started
    return proof


def all_at_once(steps: Sequence[Callable[[], None]], runs: list[Run]) -> None:
    """Every step on a thread of its own; the first failure stops every run (which ends the other threads'
    waits) and is raised."""
    pool = ThreadPoolExecutor(len(steps), thread_name_prefix="eo-proof")
    futures = [pool.submit(step) for step in steps]
    done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    failed = [err for f in futures if f in done and (err := f.exception()) is not None]
    if failed:
        for run in list(runs):
            run.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        raise failed[0]
    pool.shutdown()
