"""The foreachBatch ledger with real Spark into SQLite and a real PostgreSQL server.

A deterministic file source (tests/support/sparkjobs: input file i is batch i, availableNow) feeds a stateless
query whose rows go through ``Ledger.foreach_batch`` into an ``out`` table next to the ledger.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.sinks.ledger import Ledger, committed_batches
from tests.support import sparkjobs

pytestmark = pytest.mark.integration

FILES = 3


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = sparkjobs.spark_session("ckpt-test_ledger_sink", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@dataclass
class Db:
    """A database under test: a connection factory, its placeholder, and fresh table names."""

    connect: Callable[[], Any]
    mark: str
    out: str
    ledger: str

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(sql)
            found = [tuple(r) for r in cur.fetchall()]
            conn.rollback()
            return found
        finally:
            conn.close()

    def execute(self, sql: str) -> None:
        conn = self.connect()
        try:
            conn.cursor().execute(sql)
            conn.commit()
        finally:
            conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    suffix = uuid.uuid4().hex[:8]
    if request.param == "sqlite":
        path = tmp_path / "sink.db"
        made = Db(lambda: sqlite3.connect(path, timeout=30), "?", f"out_{suffix}", f"ledger_{suffix}")
    else:
        import psycopg

        dsn = request.getfixturevalue("postgres_dsn")
        made = Db(lambda: psycopg.connect(dsn), "%s", f"out_{suffix}", f"ledger_{suffix}")
    made.execute(f"CREATE TABLE {made.out} (batch_id BIGINT, k VARCHAR(10), v BIGINT)")
    return made


def expected_rows(files: int) -> list[tuple[int, str, int]]:
    return sorted((i, r["k"], r["v"]) for i in range(files) for r in sparkjobs.input_rows(i))


def run(spark: Any, ledger: Ledger, write: Callable[[Any, Any, int], Any], input_dir: Path, checkpoint: Path,
        timeout: int = 180, rows: Callable[[Any], Any] = lambda stream: stream.select("k", "v")) -> Any:
    """Run the query (``rows`` of the input) over the input directory until every file is processed
    (availableNow); returns it."""
    stream = spark.readStream.schema(sparkjobs.SCHEMA).option("maxFilesPerTrigger", 1).json(os.fspath(input_dir))
    query = (
        rows(stream).writeStream.foreachBatch(ledger.foreach_batch(write))
        .option("checkpointLocation", os.fspath(checkpoint)).trigger(availableNow=True).start()
    )
    try:
        assert query.awaitTermination(timeout), f"the query did not finish within {timeout} s"
    finally:
        if query.isActive:
            query.stop()
    return query


seen_ids: set[str | None] = set()  # Spark's local property as the batch thread sees it


def row_writer(db: Db, calls: list[int], fail_on: int | None = None) -> Callable[[Any, Any, int], int]:
    def write(cur: Any, df: Any, batch_id: int) -> int:
        calls.append(batch_id)
        seen_ids.add(df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId"))
        rows = [(batch_id, r["k"], r["v"]) for r in df.collect()]
        cur.executemany(f"INSERT INTO {db.out} VALUES ({db.mark}, {db.mark}, {db.mark})", rows)
        if batch_id == fail_on:
            raise RuntimeError(f"write of batch {batch_id} failed on purpose")
        return len(rows)

    return write


def inputs(tmp_path: Path, files: int = FILES) -> Path:
    for i in range(files):
        sparkjobs.write_input(tmp_path / "in", i)
    return tmp_path / "in"


def test_exactly_once_and_replay_skipped(spark: Any, db: Db, tmp_path: Path) -> None:
    ledger = Ledger(connect=db.connect, job="ledger-it", table=db.ledger, epoch=3)
    ledger.check()
    calls: list[int] = []
    checkpoint = tmp_path / "ckpt"
    query = run(spark, ledger, row_writer(db, calls), inputs(tmp_path), checkpoint)
    qid = str(query.id)
    assert calls == [0, 1, 2]
    assert sorted(db.query(f"SELECT batch_id, k, v FROM {db.out}")) == expected_rows(FILES)
    # The query id came from Spark's local property on the batch thread (no query_id= was given).
    assert qid in seen_ids
    assert committed_batches(db.connect, "ledger-it", db.ledger) == [(qid, 0), (qid, 1), (qid, 2)]
    ledger_rows = sorted(db.query(f"SELECT batch_id, rows_written, epoch, committed_at FROM {db.ledger}"))
    assert [r[:3] for r in ledger_rows] == [(i, sparkjobs.ROWS_PER_FILE, 3) for i in range(FILES)]

    # A crash between the database commit and Spark's commit: batch 2 is replayed, the ledger skips it.
    (checkpoint / "commits" / "2").unlink()
    for crc in (checkpoint / "commits").glob(".2.crc"):
        crc.unlink()
    query = run(spark, ledger, row_writer(db, calls), inputs(tmp_path), checkpoint)
    assert str(query.id) == qid
    assert (checkpoint / "commits" / "2").exists()  # Spark ran and committed batch 2 again
    assert calls == [0, 1, 2]  # but the user's write was not called
    assert sorted(db.query(f"SELECT batch_id, k, v FROM {db.out}")) == expected_rows(FILES)
    assert sorted(db.query(f"SELECT batch_id, rows_written, epoch, committed_at FROM {db.ledger}")) == ledger_rows


def test_failing_write_rolls_back_its_batch(spark: Any, db: Db, tmp_path: Path) -> None:
    ledger = Ledger(connect=db.connect, job="ledger-it", table=db.ledger)
    ledger.check()
    calls: list[int] = []
    checkpoint, source = tmp_path / "ckpt", inputs(tmp_path)
    with pytest.raises(Exception, match="failed on purpose"):
        run(spark, ledger, row_writer(db, calls, fail_on=1), source, checkpoint)
    assert calls == [0, 1]
    assert sorted(db.query(f"SELECT batch_id, k, v FROM {db.out}")) == expected_rows(1)  # batch 1 left nothing
    assert [b for _, b in committed_batches(db.connect, "ledger-it", db.ledger)] == [0]

    run(spark, ledger, row_writer(db, calls), source, checkpoint)  # the restart replays batch 1
    assert calls == [0, 1, 1, 2]
    assert sorted(db.query(f"SELECT batch_id, k, v FROM {db.out}")) == expected_rows(FILES)
    assert [b for _, b in committed_batches(db.connect, "ledger-it", db.ledger)] == [0, 1, 2]


def test_incompatible_ledger_fails_before_writing(db: Db) -> None:
    db.execute(f"CREATE TABLE {db.ledger} (job VARCHAR(200), query_id VARCHAR(64), batch_id BIGINT, "
               "rows_written BIGINT, epoch BIGINT, committed_at VARCHAR(40))")  # no primary key
    with pytest.raises(ConfigError, match="incompatible key") as info:
        Ledger(connect=db.connect, job="ledger-it", table=db.ledger).check()
    assert "drop the table" in str(info.value)
    assert db.query(f"SELECT count(*) FROM {db.ledger}") == [(0,)]
    db.execute(f"DROP TABLE {db.ledger}")
    db.execute(f"CREATE TABLE {db.ledger} (job VARCHAR(200), batch_id BIGINT, PRIMARY KEY (job, batch_id))")
    with pytest.raises(ConfigError, match="incompatible schema"):
        Ledger(connect=db.connect, job="ledger-it", table=db.ledger).check()
    assert db.query(f"SELECT count(*) FROM {db.ledger}") == [(0,)]
    assert db.query(f"SELECT count(*) FROM {db.out}") == [(0,)]


def test_postgres_zombie_race_one_wins(postgres_dsn: str) -> None:
    """Two connections run batch 0 at once on PostgreSQL: the loser's ledger insert waits on the winner's
    key, then violates it; its rows roll back."""
    import threading

    import psycopg

    suffix = uuid.uuid4().hex[:8]
    db = Db(lambda: psycopg.connect(postgres_dsn), "%s", f"out_{suffix}", f"ledger_{suffix}")
    db.execute(f"CREATE TABLE {db.out} (batch_id BIGINT, k VARCHAR(10), v BIGINT)")
    ledger = Ledger(connect=db.connect, job="race", table=db.ledger)
    ledger.check()
    both_looked = threading.Barrier(2, timeout=30)
    results: dict[int, Any] = {}

    def driver(value: int) -> None:
        def write(cur: Any, _df: Any, batch_id: int) -> int:
            both_looked.wait()
            cur.execute(f"INSERT INTO {db.out} VALUES (%s, %s, %s)", (batch_id, "k", value))
            return 1

        try:
            results[value] = ledger.commit_batch(write, None, 0, "q", Coverage(0, "c" * 64, None))
        except Exception as err:  # the outcome is the assertion
            results[value] = err

    threads = [threading.Thread(target=driver, args=(v,)) for v in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winner = [v for v, r in results.items() if r is True]
    loser = [r for r in results.values() if r is not True]
    assert len(winner) == 1 and len(loser) == 1
    assert "committed meanwhile by another driver" in str(loser[0])
    assert db.query(f"SELECT batch_id, k, v FROM {db.out}") == [(0, "k", winner[0])]
    assert committed_batches(db.connect, "race", db.ledger) == [("q", 0)]


def test_postgres_whose_port_another_process_took_meanwhile_starts_again_on_a_fresh_port(
        caplog: pytest.LogCaptureFixture) -> None:
    """The tests' PostgreSQL is started like the package's servers: a port picked free and bound by another
    process before postgres did is given up for a fresh one, with one warning, as a second test worker's would."""
    import psycopg

    from airflow_ckpt_provider.embedded.process import PORT_TAKEN
    from tests.support.pgserver import PgServer
    from tests.support.ports import taken_port

    with taken_port() as port:
        pg = PgServer()
        pg.port = port  # as if picked free, then another process bound it before postgres did
        with pg, caplog.at_level("WARNING"):
            assert pg.port != port
            with psycopg.connect(pg.dsn) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
            log = pg.log_path.read_text()  # close() removes the directory: read while it exists
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"postgres failed to start on ports {port} (attempt 1 of 3" in warnings[0]
    assert PORT_TAKEN.search(log)
    assert not pg.root.exists()


def _fenced_pair(postgres_dsn: str) -> tuple[Db, Ledger, Ledger]:
    import psycopg

    suffix = uuid.uuid4().hex[:8]
    db = Db(lambda: psycopg.connect(postgres_dsn), "%s", f"out_{suffix}", f"ledger_{suffix}")
    db.execute(f"CREATE TABLE {db.out} (batch_id BIGINT, k VARCHAR(10), v BIGINT)")
    older = Ledger(connect=db.connect, job="fenced", table=db.ledger, epoch=1)
    older.check()
    return db, older, Ledger(connect=db.connect, job="fenced", table=db.ledger, epoch=2)


def _insert(db: Db, value: int, reached: Any = None, go: Any = None) -> Callable[[Any, Any, int], int]:
    def write(cur: Any, _df: Any, batch_id: int) -> int:
        cur.execute(f"INSERT INTO {db.out} VALUES (%s, %s, %s)", (batch_id, "k", value))
        if reached is not None:
            reached.set()
            assert go.wait(60), "the test never let the write go on"
        return 1

    return write


def test_postgres_an_older_driver_that_wrote_before_a_newer_driver_started_is_refused_at_commit(
        postgres_dsn: str) -> None:
    """Issue 41, finding 7, on PostgreSQL: the older driver's lease check passed and it wrote batch 0's rows; the newer
    driver starts (check() raises the ledger's fence) before the older one commits. The older commit is refused in
    its own transaction (FencedError, its rows rolled back), whatever its lease check said; the newer commits."""
    import threading

    db, older, newer = _fenced_pair(postgres_dsn)
    reached, go = threading.Event(), threading.Event()
    result: list[Any] = []

    def run_older() -> None:
        try:
            result.append(older.commit_batch(_insert(db, 1, reached, go), None, 0, "q", Coverage(0, "c" * 64, None)))
        except Exception as err:  # the outcome is the assertion
            result.append(err)

    thread = threading.Thread(target=run_older)
    thread.start()
    assert reached.wait(60)
    newer.check()  # the older transaction has not touched the fence row: nothing to wait for
    go.set()
    thread.join(60)
    assert len(result) == 1 and isinstance(result[0], FencedError), result
    assert "found the ledger fenced at epoch 2" in str(result[0])
    assert db.query(f"SELECT count(*) FROM {db.out}") == [(0,)]
    assert newer.commit_batch(_insert(db, 2), None, 0, "q", Coverage(0, "c" * 64, None))
    assert db.query(f"SELECT batch_id, v FROM {db.out}") == [(0, 2)]
    assert db.query(f"SELECT job, epoch FROM {db.ledger}_fence") == [("fenced", 2)]


def test_postgres_a_newer_driver_starting_during_an_older_commit_waits_for_it_and_fences_the_next(
        postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other order: the older commit already holds the fence row (it passed the fence, COMMIT not sent yet) when
    the newer driver starts. The newer check() waits on the row lock (seen in pg_locks, not by a sleep) until the
    older commit ends, so that commit precedes the fence: batch 0 stays, the older driver's next batch is refused."""
    import threading

    from airflow_ckpt_provider.sinks import ledger as ledger_module

    db, older, newer = _fenced_pair(postgres_dsn)
    holding, go = threading.Event(), threading.Event()
    point = ledger_module.crash_point

    def at_point(name: str, batch_id: int | None = None) -> None:  # the real commit, held at its crash point
        if name == "ledger.before-commit" and threading.current_thread().name == "older":
            holding.set()
            assert go.wait(60), "the test never let the commit go on"
        point(name, batch_id)

    monkeypatch.setattr(ledger_module, "crash_point", at_point)
    outcomes: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any]) -> None:
        try:
            outcomes[name] = fn()
        except Exception as err:  # the outcome is the assertion
            outcomes[name] = err

    first = threading.Thread(name="older", target=run, args=("older", lambda: older.commit_batch(
        _insert(db, 1), None, 0, "q", Coverage(0, "c" * 64, None))))
    first.start()
    assert holding.wait(60)
    second = threading.Thread(name="newer", target=run, args=("newer", newer.check))
    second.start()
    deadline = time.monotonic() + 30
    while not db.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                       f"query LIKE 'UPDATE %{db.ledger}_fence%'")[0][0]:
        assert time.monotonic() < deadline and second.is_alive(), f"the newer check() did not wait: {outcomes}"
        time.sleep(0.05)
    go.set()
    first.join(60)
    second.join(60)
    assert outcomes == {"older": True, "newer": None}
    with pytest.raises(FencedError, match="found the ledger fenced at epoch 2"):
        older.commit_batch(_insert(db, 11), None, 1, "q", Coverage(1, "d" * 64, "c" * 64))
    assert db.query(f"SELECT batch_id, v FROM {db.out}") == [(0, 1)]
    assert committed_batches(db.connect, "fenced", db.ledger) == [("q", 0)]


def test_postgres_a_batch_slower_than_the_idle_in_transaction_timeout_commits_its_transaction_is_as_short_as_its_writes(
        spark: Any, postgres_dsn: str, tmp_path: Path) -> None:
    """Finding 13 (docs/reliability.md, scenario 3): the batch is computed before its transaction opens. A batch whose
    Spark job takes 3 s (a UDF sleeps) against a server that ends sessions idle in a transaction for 1 s: each batch
    commits at once (no session killed, no retry). With the transaction opened before the computation, the server
    ended its session and the batch failed."""
    import psycopg
    from pyspark.sql import functions as F

    short = f"{postgres_dsn} options='-c idle_in_transaction_session_timeout=1000'"
    db = Db(lambda: psycopg.connect(short), "%s", f"out_{uuid.uuid4().hex[:8]}", f"ledger_{uuid.uuid4().hex[:8]}")
    db.execute(f"CREATE TABLE {db.out} (batch_id BIGINT, k VARCHAR(10), v BIGINT)")
    ledger = Ledger(connect=db.connect, job="ledger-slow", table=db.ledger, epoch=3)
    ledger.check()

    @F.udf("bigint")
    def slow(v: int) -> int:
        time.sleep(3.0 / sparkjobs.ROWS_PER_FILE)  # about 3 s per batch, in the batch's Spark job
        return v

    calls: list[int] = []
    query = run(spark, ledger, row_writer(db, calls), inputs(tmp_path, 2), tmp_path / "ckpt",
                rows=lambda stream: stream.select("k", slow("v").alias("v")).coalesce(1))
    assert query.exception() is None, query.exception()
    assert calls == [0, 1]  # each batch written once: no transaction was killed and retried
    assert sorted(db.query(f"SELECT batch_id, k, v FROM {db.out}")) == expected_rows(2)
    assert committed_batches(db.connect, "ledger-slow", db.ledger) == [(str(query.id), 0), (str(query.id), 1)]
