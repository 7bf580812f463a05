"""Restoring an older snapshot onto the same exactly-once sink: the output follows the restored timeline.

Real Spark (local[2]) with a file source: input file i is batch i (tests/sparkjobs, availableNow). A
savepoint here is a copy of the checkpoint directory at a completed batch (what a restore
materializes). The story, for each sink:

- timeline 0: files 0, 1 -> savepoint s1 (batch 1) -> files 2, 3 (batches 2, 3);
- restore s1 on a fresh location, files 2 and 3 gone, 4 arrives -> batch 2 is file 4 (a fork at 2):
  savepoint s2 (batch 2) -> file 5 (batch 3);
- restore s2, file 5 gone, 6 arrives -> batch 3 is file 6 (a second fork, at 3);
- a replay of batch 3 (its commit log entry removed, as after a kill) must still be skipped.

The restored timeline is files 0, 1, 4, 6. Before timelines the sinks skipped the replanned batches 2
and 3 as replays: files 4, 5 and 6 never reached the output.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.sinks.filelayout import committed_batches, read_committed, sink_view
from airflow_ckpt_provider.sinks.filemaintenance import verify_sink
from airflow_ckpt_provider.sinks.ledger import Ledger, delete_batches
from airflow_ckpt_provider.sinks.ledger import committed_batches as ledger_batches
from tests.integration.conftest import sink_session
from tests.support import sparkjobs
from tests.support.kafkasink import read_all
from tests.support.runtimejob import JobEnv, Run, produce

pytestmark = pytest.mark.integration

RESTORED = [0, 1, 4, 6]  # the input files of the final timeline, batch by batch


@pytest.fixture(scope="module")
def spark(s3_server: EmbeddedS3) -> Iterator[Any]:
    with sink_session(s3_server, "ckpt-test-time-travel", **{"spark.sql.shuffle.partitions": "2"}) as session:
        yield session


Start = Callable[[Any, Path], Any]  # (stream DataFrame, checkpoint) -> a started query


class Story:
    """Runs the two-fork story of the module docstring with a sink given as ``start``."""

    def __init__(self, spark: Any, tmp_path: Path, start: Start) -> None:
        self.spark, self.start = spark, start
        self.inp = tmp_path / "in"
        self.tmp = tmp_path

    def run(self, checkpoint: Path) -> None:
        stream = self.spark.readStream.schema(sparkjobs.SCHEMA).option("maxFilesPerTrigger", 1).json(str(self.inp))
        query = self.start(stream, checkpoint)
        try:
            assert query.awaitTermination(180), "the query did not finish within 180 s"
        finally:
            if query.isActive:
                query.stop()
        assert query.exception() is None, query.exception()

    def files(self, present: list[int]) -> None:
        for path in self.inp.glob("part-*.json"):
            if int(path.stem.split("-")[1]) not in present:
                path.unlink()
        for i in present:
            sparkjobs.write_input(self.inp, i)

    def savepoint(self, checkpoint: Path, name: str) -> Path:
        copy = self.tmp / name
        shutil.copytree(checkpoint, copy)
        return copy

    def restore(self, savepoint: Path, name: str) -> Path:
        return self.savepoint(savepoint, name)

    def first_timeline(self) -> tuple[Path, Path]:
        """Timeline 0 up to batch 3; returns (its checkpoint, savepoint s1 at batch 1)."""
        c0 = self.tmp / "c0"
        self.files([0, 1])
        self.run(c0)
        s1 = self.savepoint(c0, "s1")
        self.files([0, 1, 2, 3])
        self.run(c0)
        return c0, s1

    def forks(self, s1: Path) -> Path:
        """Restore s1 (fork at batch 2), then s2 (fork at batch 3); returns the final checkpoint."""
        c1 = self.restore(s1, "c1")
        self.files([0, 1, 4])
        self.run(c1)
        s2 = self.savepoint(c1, "s2")
        self.files([0, 1, 4, 5])
        self.run(c1)
        c2 = self.restore(s2, "c2")
        self.files([0, 1, 4, 6])
        self.run(c2)
        return c2

    def replay_last(self, checkpoint: Path) -> None:
        """Batch 3 runs again with the same offsets, as after a kill between the sink's commit and Spark's."""
        (checkpoint / "commits" / "3").unlink()
        (checkpoint / "commits" / ".3.crc").unlink(missing_ok=True)
        self.run(checkpoint)


def _values(files: list[int]) -> list[int]:
    return sorted(r["v"] for i in files for r in sparkjobs.input_rows(i))


@pytest.fixture(params=["local", "s3"])
def sink_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "sink")
    return f"s3://{request.getfixturevalue('bucket')}/out/{uuid.uuid4().hex[:8]}"


def test_files_sink_shows_exactly_the_restored_timeline_after_two_forks(spark: Any, tmp_path: Path,
                                                                         sink_url: str) -> None:
    def start(stream: Any, checkpoint: Path) -> Any:
        return (stream.writeStream.format("ckpt-files").option("path", sink_url).option("job", "tt")
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    story = Story(spark, tmp_path, start)
    _, s1 = story.first_timeline()
    assert sorted(read_committed(sink_url).column("v").to_pylist()) == _values([0, 1, 2, 3])
    final = story.forks(s1)

    shown = committed_batches(sink_url)
    assert [(m.batch_id, m.timeline) for m in shown] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert sorted(read_committed(sink_url).column("v").to_pylist()) == _values(RESTORED)
    view = sink_view(sink_url)
    assert sorted((m.batch_id, m.timeline) for m in view.abandoned) == [(2, 0), (3, 0), (3, 1)]
    report = verify_sink(sink_url, checksums=True)
    assert report.ok, report.problems
    (forks,) = report.forks.values()
    assert [(f["timeline"], f["parent"], f["fork_batch"], f["abandoned"]) for f in forks] == [
        (1, 0, 2, [2, 3]), (2, 1, 3, [3])]
    assert sum(len(a) for a in report.abandoned.values()) == 3

    story.replay_last(final)  # a real replay is still a replay
    assert [(m.batch_id, m.timeline) for m in committed_batches(sink_url)] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert sorted(read_committed(sink_url).column("v").to_pylist()) == _values(RESTORED)
    assert verify_sink(sink_url).orphans == []  # the replay's files were deleted by its commit


def test_files_sink_refuses_a_zombie_of_an_abandoned_timeline(spark: Any, tmp_path: Path) -> None:
    """After a fork, a driver still running the old timeline must not append to the new one."""
    sink = str(tmp_path / "sink")

    def start(stream: Any, checkpoint: Path) -> Any:
        return (stream.writeStream.format("ckpt-files").option("path", sink).option("job", "tt")
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    story = Story(spark, tmp_path, start)
    c0, s1 = story.first_timeline()
    zombie = story.savepoint(c0, "zombie")  # the old timeline's checkpoint at batch 3
    c1 = story.restore(s1, "c1")
    story.files([0, 1, 4])
    story.run(c1)  # timeline 1: batch 2 = file 4
    story.files([0, 1, 4, 7])
    stream = spark.readStream.schema(sparkjobs.SCHEMA).option("maxFilesPerTrigger", 1).json(str(story.inp))
    query = start(stream, zombie)  # batch 4 of timeline 0 follows batch 3 of timeline 0, which is hidden
    with pytest.raises(Exception, match="follows batch 3 of a timeline this sink abandoned"):
        query.awaitTermination(180)
    assert sorted(read_committed(sink).column("v").to_pylist()) == _values([0, 1, 4])


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Callable[[], Any], str]:
    if request.param == "sqlite":
        path = tmp_path / "out.db"
        return (lambda: sqlite3.connect(path, timeout=30)), "qmark"
    import psycopg

    dsn = request.getfixturevalue("postgres_dsn")
    return (lambda: psycopg.connect(dsn)), "format"


def test_ledger_shows_exactly_the_restored_timeline_after_two_forks(spark: Any, tmp_path: Path,
                                                                    database: tuple[Callable[[], Any], str]) -> None:
    connect, style = database
    suffix = uuid.uuid4().hex[:8]
    out, table = f"out_{suffix}", f"ledger_{suffix}"
    conn = connect()
    conn.cursor().execute(f"CREATE TABLE {out} (query_id VARCHAR(64), batch_id BIGINT, v BIGINT)")
    conn.commit()
    conn.close()
    mark = "?" if style == "qmark" else "%s"
    ledger = Ledger(connect, "tt", table, undo=delete_batches(out, paramstyle=style))
    ledger.check()

    def write(cur: Any, df: Any, batch_id: int) -> int:
        qid = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        rows = [(qid, batch_id, r["v"]) for r in df.collect()]
        cur.executemany(f"INSERT INTO {out} VALUES ({mark}, {mark}, {mark})", rows)
        return len(rows)

    def start(stream: Any, checkpoint: Path) -> Any:
        return (stream.select("v").writeStream.foreachBatch(ledger.foreach_batch(write))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    def values() -> list[int]:
        c = connect()
        try:
            cur = c.cursor()
            cur.execute(f"SELECT v FROM {out}")
            return sorted(int(r[0]) for r in cur.fetchall())
        finally:
            c.close()

    story = Story(spark, tmp_path, start)
    _, s1 = story.first_timeline()
    assert values() == _values([0, 1, 2, 3])
    final = story.forks(s1)
    assert values() == _values(RESTORED)
    assert [b for _, b in ledger_batches(connect, "tt", table)] == [0, 1, 2, 3]
    c = connect()
    try:
        cur = c.cursor()
        cur.execute(f"SELECT batch_id, timeline FROM {table} ORDER BY batch_id")
        assert [tuple(r) for r in cur.fetchall()] == [(0, 0), (1, 0), (2, 1), (3, 2)]
        cur.execute(f"SELECT batch_id, timeline, abandoned_by_timeline FROM {table}_abandoned "
                    "ORDER BY abandoned_by_timeline, batch_id")
        assert [tuple(r) for r in cur.fetchall()] == [(2, 0, 1), (3, 0, 1), (3, 1, 2)]
    finally:
        c.close()
    story.replay_last(final)
    assert values() == _values(RESTORED)


def test_ledger_without_undo_refuses_the_fork_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "out.db"

    def connect() -> Any:
        return sqlite3.connect(path, timeout=30)

    c = connect()
    c.execute("CREATE TABLE out (batch_id BIGINT, v BIGINT)")
    c.commit()
    c.close()
    ledger = Ledger(connect, "tt")
    ledger.check()

    def write(cur: Any, df: Any, batch_id: int) -> int:
        rows = [(batch_id, r["v"]) for r in df.collect()]
        cur.executemany("INSERT INTO out VALUES (?, ?)", rows)
        return len(rows)

    def start(stream: Any, checkpoint: Path) -> Any:
        return (stream.select("v").writeStream.foreachBatch(ledger.foreach_batch(write))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    story = Story(spark, tmp_path, start)
    _, s1 = story.first_timeline()
    c1 = story.restore(s1, "c1")
    story.files([0, 1, 4])
    stream = spark.readStream.schema(sparkjobs.SCHEMA).option("maxFilesPerTrigger", 1).json(str(story.inp))
    query = start(stream, c1)
    with pytest.raises(Exception, match=r"expected Ledger\(undo=\.\.\.\)"):
        query.awaitTermination(180)
    c = connect()
    try:
        assert sorted(r[0] for r in c.execute("SELECT v FROM out")) == _values([0, 1, 2, 3])
    finally:
        c.close()


def test_kafka_sink_writes_the_restored_timeline_and_only_the_documented_duplicates(
        spark: Any, tmp_path: Path, kafka_server: EmbeddedKafka) -> None:
    topic = f"tt-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(topic, partitions=1)

    def start(stream: Any, checkpoint: Path) -> Any:
        return (stream.selectExpr("CAST(v AS STRING) AS value").writeStream.format("ckpt-kafka")
                .option("kafka.bootstrap.servers", kafka_server.bootstrap_servers).option("topic", topic)
                .option("job", "tt-kafka")
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    story = Story(spark, tmp_path, start)
    _, s1 = story.first_timeline()
    final = story.forks(s1)
    story.replay_last(final)  # skipped: no record of batch 3 (file 6) twice
    got = sorted(int(r.value or b"0") for r in read_all(kafka_server.bootstrap_servers, topic))
    # Every record of the restored timeline, plus the abandoned batches' records (files 2, 3 of timeline 0
    # and file 5 of timeline 1) that Kafka consumers had already received: no loss, no other duplicate.
    assert got == sorted(_values(RESTORED) + _values([2, 3, 5]))


# -- the runtime: `ckpt run --restore <older savepoint>` onto the same sink ------------------------


def _snapshot_of_job(env: JobEnv) -> dict[str, str]:
    """Every object of the job's store (key -> SHA-256 of its content): what a refused start must leave alone."""
    import hashlib

    storage = env.store().storage
    return {o.key: hashlib.sha256(storage.read(o.key)).hexdigest() for o in storage.list()}


def test_runtime_restore_of_older_savepoints_onto_the_same_files_sink_follows_the_timeline(
        env: JobEnv, runs: list[Run], pytestconfig: pytest.Config) -> None:
    """The acceptance run's scenario: dropDuplicates(id) over ckpt-kafka into ckpt-files on S3; savepoint s1,
    more batches, stop with savepoint, restore s1 keeping the sink path (other batch sizes: the replanned
    batches cover other offsets); with --full once more from a savepoint of the new timeline. Under
    --time-travel refuse the same restore is refused before the lease, changing nothing."""
    full = bool(pytestconfig.getoption("--full", default=False))
    from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
    from airflow_ckpt_provider.core.records.lease import read_lease
    from airflow_ckpt_provider.core.store.storage import S3Options
    from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_STOPPED
    from tests.support.exactlyonce import EO_JOB

    bootstrap = env.kafka.bootstrap_servers
    sink = f"s3://{env.bucket}/tt-{env.job}"
    s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region, access_key_id=env.s3.access_key,
                   secret_access_key=env.s3.secret_key)
    extra = {"CKPT_EO_SINK": "files", "CKPT_EO_PATH": sink}

    def start(name: str, *args: str, max_offsets: int) -> Run:
        run = env.run(name, env.work / f"ckpt-{name}", *args, "--checkpoint-interval", "none",
                      max_offsets=max_offsets, job_file=EO_JOB, extra_env=extra)
        runs.append(run)
        return run

    def consumed(n: int, run: Run) -> int:
        return env.wait_status(f"{n} records consumed", lambda s: env.consumed(s) >= n, 240, run).epoch

    def savepoint(epoch: int) -> str:
        ack = env.request(RequestAction.SAVEPOINT, epoch)
        assert ack.outcome is Outcome.COMPLETED and ack.snapshot_id, ack
        return ack.snapshot_id

    def stop(epoch: int, run: Run) -> None:
        assert env.request(RequestAction.STOP, epoch).outcome is Outcome.COMPLETED
        assert run.wait(120) == EXIT_STOPPED, run.tail()

    produce(bootstrap, env.topic, 0, 300)
    first = start("t0", max_offsets=60)
    epoch = consumed(300, first)
    s1 = savepoint(epoch)
    produce(bootstrap, env.topic, 300, 300)
    consumed(600, first)
    stop(epoch, first)
    produce(bootstrap, env.topic, 600, 300)  # more has arrived while the job was stopped

    before = _snapshot_of_job(env)
    lease = read_lease(env.store())
    refused = start("refused", "--restore", s1, "--time-travel", "refuse", max_offsets=90)
    assert refused.wait(180) == EXIT_CONFIG, refused.tail()
    assert "goes back in time" in refused.log.read_text()
    assert _snapshot_of_job(env) == before and read_lease(env.store()) == lease
    assert sorted(read_committed(sink, s3).column("id").to_pylist()) == list(range(600))

    second = start("t1", "--restore", s1, max_offsets=90)  # other batch sizes: other offset ranges
    epoch = consumed(900, second)
    assert sorted(read_committed(sink, s3).column("id").to_pylist()) == list(range(900))
    restores = [s1]
    total = 900
    if full:  # a second fork, from a savepoint of the new timeline (the Spark-level tests always do two)
        s2 = savepoint(epoch)
        produce(bootstrap, env.topic, 900, 300)
        consumed(1200, second)
        stop(epoch, second)
        produce(bootstrap, env.topic, 1200, 300)
        third = start("t2", "--restore", s2, max_offsets=45)
        epoch = consumed(1500, third)
        stop(epoch, third)
        restores, total = [s1, s2], 1500
    else:
        stop(epoch, second)

    ids = read_committed(sink, s3).column("id").to_pylist()
    assert sorted(ids) == list(range(total))  # every id exactly once: none lost, none twice
    report = verify_sink(sink, s3)
    assert report.ok, report.problems
    (forks,) = report.forks.values()
    assert [f["timeline"] for f in forks] == list(range(1, len(restores) + 1))
    assert all(f["took_effect"] for f in forks)
    storage = env.store().storage
    records = [json.loads(storage.read(o.key)) for o in sorted(storage.list("deployments/"), key=lambda o: o.key)]
    travels = [r["time_travel"] for r in records if r.get("time_travel")]
    assert [(t["snapshot"], t["from_batch"] > t["to_batch"]) for t in travels] == [(s, True) for s in restores]
    assert [r["timeline"] for r in records][-1] == len(restores)
    assert any("TIME TRAVEL to" in line for line in second.ckpt_lines())
    assert any("TIMELINE 1 starts here" in line for line in second.log.read_text().splitlines())
