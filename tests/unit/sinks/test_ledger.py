"""The ledger protocol on a real SQLite file (no Spark): commit, replay skip, rollback, zombie race, checks."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.streambatch import forget_before_query_start, run_before_query_start
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.core.snapshots.coverage import Coverage
from airflow_ckpt_provider.sinks.dbapi import placeholders, quote_table, redact
from airflow_ckpt_provider.sinks.ledger import Ledger, committed_batches, delete_batches


def cov(batch: int, timeline: int = 0, previous_timeline: int | None = None) -> Coverage:
    """A stand-in for what batch ``batch`` of ``timeline`` covered (the digest of its offsets log entry)."""
    before = timeline if previous_timeline is None else previous_timeline
    return Coverage(batch, f"{timeline:032d}{batch:032d}", f"{before:032d}{batch - 1:032d}" if batch else None)


class Fence:
    """A stand-in for the runtime's JobContext: epoch and a lease check that can be made to fail."""

    def __init__(self) -> None:
        self.epoch = 7
        self.fenced = False

    def check_lease(self) -> None:
        if self.fenced:
            raise RuntimeError("fenced")

    def lease_held(self) -> None:  # the runtime's answers without a request; this stand-in's, the same
        self.check_lease()


@pytest.fixture
def db(tmp_path: Path) -> Callable[[], sqlite3.Connection]:
    path = tmp_path / "sink.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE out (batch INTEGER, v INTEGER)")
    conn.close()
    return lambda: sqlite3.connect(path, timeout=10)


def writer(values: list[int]) -> Callable[[Any, Any, int], int]:
    def write(cur: Any, _df: Any, batch_id: int) -> int:
        cur.executemany("INSERT INTO out VALUES (?, ?)", [(batch_id, v) for v in values])
        return len(values)

    return write


def rows(connect: Callable[[], sqlite3.Connection], sql: str = "SELECT batch, v FROM out ORDER BY 1, 2") -> list[Any]:
    conn = connect()
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_commit_then_replay_is_skipped(db: Callable[[], sqlite3.Connection], caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(connect=db, job="j1", ctx=Fence())
    ledger.check()
    caplog.set_level(logging.INFO, "airflow_ckpt_provider.sinks.ledger")
    assert ledger.commit_batch(writer([1, 2]), None, 0, "q1", cov(0)) is True
    assert ledger.commit_batch(writer([3]), None, 1, "q1", cov(1)) is True
    assert ledger.commit_batch(writer([9, 9, 9]), None, 1, "q1", cov(1)) is False  # the replay writes nothing
    assert rows(db) == [(0, 1), (0, 2), (1, 3)]
    assert rows(db, "SELECT job, query_id, batch_id, rows_written, epoch FROM ckpt_ledger ORDER BY 3") == [
        ("j1", "q1", 0, 2, 7), ("j1", "q1", 1, 1, 7)]
    assert committed_batches(db, "j1") == [("q1", 0), ("q1", 1)]
    assert committed_batches(db, "other") == []
    text = caplog.text
    assert "job j1 query q1: batch 0 committed, 2 rows, epoch 7" in text
    assert "batch 1 already committed at" in text and "skipped" in text


def test_fresh_query_id_restarts_batch_ids(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1")
    ledger.check()
    assert ledger.commit_batch(writer([1]), None, 0, "q1", cov(0))
    assert ledger.commit_batch(writer([2]), None, 0, "q2", cov(0))  # a fresh checkpoint: same batch id, new query id
    assert committed_batches(db, "j1") == [("q1", 0), ("q2", 0)]
    assert rows(db) == [(0, 1), (0, 2)]


def test_failing_write_rolls_back_everything(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1")
    ledger.check()

    def write(cur: Any, _df: Any, batch_id: int) -> None:
        cur.execute("INSERT INTO out VALUES (?, ?)", (batch_id, 1))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ledger.commit_batch(write, None, 0, "q1", cov(0))
    assert rows(db) == []
    assert committed_batches(db, "j1") == []
    assert ledger.commit_batch(writer([5]), None, 0, "q1", cov(0))  # the retry commits
    assert rows(db) == [(0, 5)]


def test_fenced_driver_commits_nothing(db: Callable[[], sqlite3.Connection]) -> None:
    fence = Fence()
    ledger = Ledger(connect=db, job="j1", ctx=fence)
    ledger.check()

    def write(cur: Any, df: Any, batch_id: int) -> int:
        cur.execute("INSERT INTO out VALUES (?, ?)", (batch_id, 1))
        fence.fenced = True  # a newer driver took the lease while this one wrote
        return 1

    with pytest.raises(RuntimeError, match="fenced"):
        ledger.commit_batch(write, None, 0, "q1", cov(0))
    assert rows(db) == [] and committed_batches(db, "j1") == []
    with pytest.raises(RuntimeError, match="fenced"):  # and a fenced driver does not even write
        ledger.commit_batch(writer([1]), None, 1, "q1", cov(1))
    assert rows(db) == []


def test_a_driver_whose_lease_check_passed_is_still_refused_by_the_ledgers_fence_once_a_newer_driver_started(
        db: Callable[[], sqlite3.Connection]) -> None:
    """Issue 41, finding 7: the lease check asks the job store; a driver paused (or cut from the store) after it
    passed commits into the database all the same. The ledger's own fence, raised by the newer driver's check() and
    held in each commit's transaction, refuses it: nothing written, the newer driver commits the batch."""
    older = Ledger(connect=db, job="j1", epoch=1)
    older.check()
    assert older.commit_batch(writer([1]), None, 0, "q1", cov(0))
    newer = Ledger(connect=db, job="j1", epoch=2)
    newer.check()  # the newer driver's query is defined: the fence rises to 2
    assert rows(db, "SELECT job, epoch FROM ckpt_ledger_fence") == [("j1", 2)]
    with pytest.raises(FencedError, match=r"ledger ckpt_ledger of job j1 \(query q1 batch 1\): expected this driver "
                                          r"\(epoch 1\) to hold the job, found the ledger fenced at epoch 2 "
                                          r"\(ckpt_ledger_fence\)"):
        older.commit_batch(writer([99]), None, 1, "q1", cov(1))
    assert rows(db) == [(0, 1)] and committed_batches(db, "j1") == [("q1", 0)]
    with pytest.raises(FencedError, match=r"\(start\): expected this driver \(epoch 1\)"):
        older.check()  # an older driver's query start is refused too
    assert newer.commit_batch(writer([2]), None, 1, "q1", cov(1))
    assert rows(db) == [(0, 1), (1, 2)] and committed_batches(db, "j1") == [("q1", 0), ("q1", 1)]
    assert rows(db, "SELECT job, epoch FROM ckpt_ledger_fence") == [("j1", 2)]  # never lowered


class Unleased(Fence):
    """The runtime's JobContext while the build function runs: the lease is not taken yet, the epoch unknown."""

    def __init__(self) -> None:
        super().__init__()
        self.leased = False

    @property  # type: ignore[override]  # the stand-in's epoch is a property here, as JobContext's
    def epoch(self) -> int:
        if not self.leased:
            raise AssertionError("lease not acquired")
        return 7

    @epoch.setter
    def epoch(self, value: int) -> None:
        pass  # Fence.__init__ sets one; this stand-in's comes from the lease


def test_under_the_runtime_the_fence_rises_before_the_query_starts_not_in_the_build_function(
        db: Callable[[], sqlite3.Connection]) -> None:
    """The runtime runs the build function (where check() is called) before it takes the lease: check() must not ask
    for the epoch; it registers the fence's raise for the query's start (core/policy/streambatch.py), which the
    runtime runs once the lease is held and the grace waited out."""
    forget_before_query_start()
    ctx = Unleased()
    ledger = Ledger(connect=db, job="j1", ctx=ctx)
    try:
        ledger.check()  # would raise "lease not acquired" if it asked for the epoch
        assert rows(db, "SELECT job, epoch FROM ckpt_ledger_fence") == []
        ctx.leased = True
        run_before_query_start()
        assert rows(db, "SELECT job, epoch FROM ckpt_ledger_fence") == [("j1", 7)]
    finally:
        forget_before_query_start()


def test_the_ledgers_fence_is_per_job_and_absent_without_an_epoch(db: Callable[[], sqlite3.Connection]) -> None:
    Ledger(connect=db, job="other", epoch=5).check()
    plain = Ledger(connect=db, job="j1")  # no runtime, no epoch: not fenced
    plain.check()
    assert plain.commit_batch(writer([1]), None, 0, "q1", cov(0))
    first = Ledger(connect=db, job="j1", epoch=1)  # the first commit of a job raises its row from nothing
    assert first.commit_batch(writer([2]), None, 1, "q1", cov(1))
    assert rows(db, "SELECT job, epoch FROM ckpt_ledger_fence ORDER BY job") == [("j1", 1), ("other", 5)]


def test_zombie_race_one_wins(db: Callable[[], sqlite3.Connection]) -> None:
    """Two drivers run batch 0 at once: both find no ledger row, both write; exactly one commits."""
    ledger = Ledger(connect=db, job="j1")
    ledger.check()
    looked = threading.Barrier(2, timeout=30)
    results: dict[str, Any] = {}

    def driver(name: str, value: int) -> None:
        def write(cur: Any, _df: Any, batch_id: int) -> int:
            looked.wait()  # both passed the ledger lookup before either inserts
            cur.execute("INSERT INTO out VALUES (?, ?)", (batch_id, value))
            return 1

        try:
            results[name] = ledger.commit_batch(write, None, 0, "q1", cov(0))
        except Exception as err:  # the outcome is the assertion
            results[name] = err

    threads = [threading.Thread(target=driver, args=(n, v)) for n, v in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [n for n, r in results.items() if r is True]
    losers = [r for r in results.values() if r is not True]
    assert len(winners) == 1 and len(losers) == 1
    # SQLite serializes writers: the loser either hits the primary key (ConflictError) or the write lock.
    assert isinstance(losers[0], (ConflictError, sqlite3.OperationalError))
    assert rows(db) == [(0, {"a": 1, "b": 2}[winners[0]])]
    assert committed_batches(db, "j1") == [("q1", 0)]


def test_zombie_insert_hits_primary_key(db: Callable[[], sqlite3.Connection]) -> None:
    """The zombie looked before the winner committed, inserts after: the key violation rolls it back."""
    ledger = Ledger(connect=db, job="j1")
    ledger.check()

    def zombie_write(cur: Any, _df: Any, batch_id: int) -> int:
        cur.execute("INSERT INTO out VALUES (?, ?)", (batch_id, 99))
        # The winner commits batch 0 in between (SQLite: the zombie holds the write lock now, so the
        # winner's transaction is simulated by inserting its ledger row in this same transaction).
        cur.execute("INSERT INTO ckpt_ledger (job, query_id, batch_id, committed_at) VALUES ('j1', 'q1', 0, 'x')")
        return 1

    with pytest.raises(ConflictError, match="committed meanwhile by another driver"):
        ledger.commit_batch(zombie_write, None, 0, "q1", cov(0))
    assert rows(db) == [] and committed_batches(db, "j1") == []


def test_check_creates_once_and_accepts_existing(db: Callable[[], sqlite3.Connection]) -> None:
    Ledger(connect=db, job="j1").check()
    Ledger(connect=db, job="j1").check()  # idempotent
    assert rows(db, "SELECT count(*) FROM ckpt_ledger") == [(0,)]  # the key probe left nothing


@pytest.mark.parametrize(
    ("ddl", "match"),
    [
        ("CREATE TABLE ckpt_ledger (job TEXT, batch_id INTEGER, PRIMARY KEY (job, batch_id))", "missing"),
        ("CREATE TABLE ckpt_ledger (job TEXT, query_id TEXT, batch_id INTEGER, rows_written INTEGER, "
         "epoch INTEGER, committed_at TEXT)", "same \\(job, query_id, batch_id\\) was accepted"),
        ("CREATE TABLE ckpt_ledger (job TEXT, query_id TEXT, batch_id INTEGER, rows_written INTEGER, "
         "epoch INTEGER, committed_at TEXT, PRIMARY KEY (job, query_id))", "were refused"),
        ("CREATE TABLE ckpt_ledger (job TEXT, query_id TEXT, batch_id INTEGER, rows_written INTEGER, "
         "epoch INTEGER, committed_at TEXT, PRIMARY KEY (job, query_id, batch_id, epoch))", "was accepted"),
    ],
)
def test_incompatible_table_is_refused_and_nothing_written(
    db: Callable[[], sqlite3.Connection], ddl: str, match: str
) -> None:
    conn = db()
    conn.execute(ddl)
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match=match) as info:
        Ledger(connect=db, job="j1").check()
    assert "drop" in str(info.value)
    assert rows(db, "SELECT count(*) FROM ckpt_ledger") == [(0,)]


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a;drop table x", 'a"b', "a.b.c", "x" * 64, "a b"])
def test_invalid_table_names(name: str) -> None:
    with pytest.raises(ConfigError, match="is not allowed: expected an identifier"):
        Ledger(connect=lambda: None, job="j", table=name)


def test_quoted_names() -> None:
    assert quote_table("ckpt_ledger") == '"ckpt_ledger"'
    assert quote_table("ops.Ledger_2") == '"ops"."Ledger_2"'


def test_schema_qualified_table_on_sqlite(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1", table="main.ledger2")
    ledger.check()
    assert ledger.commit_batch(writer([1]), None, 0, "q", cov(0))
    assert committed_batches(db, "j1", "main.ledger2") == [("q", 0)]


def test_connection_failure_is_a_config_error_without_password() -> None:
    def connect() -> Any:
        raise OSError("could not connect to postgresql://app:s3cret@db:5432/x password=s3cret")

    with pytest.raises(ConfigError, match="cannot connect to the database") as info:
        Ledger(connect=connect, job="j").check()
    assert "s3cret" not in str(info.value)


def test_autocommit_connection_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="autocommit"):
        Ledger(connect=lambda: sqlite3.connect(tmp_path / "x.db", isolation_level=None), job="j").check()


def test_paramstyles() -> None:
    assert placeholders("qmark", (1, 2)) == (["?", "?"], (1, 2))
    assert placeholders("format", (1,)) == (["%s"], (1,))
    assert placeholders("pyformat", ("a", 2)) == (["%(p0)s", "%(p1)s"], {"p0": "a", "p1": 2})
    assert placeholders("named", (1,)) == ([":p0"], {"p0": 1})
    assert placeholders("numeric", (1, 2)) == ([":1", ":2"], (1, 2))
    with pytest.raises(ConfigError, match="paramstyle"):
        Ledger(connect=lambda: None, job="j", paramstyle="dollar")


@pytest.mark.parametrize("style", ["qmark", "named", "numeric"])
def test_explicit_paramstyle_on_sqlite(db: Callable[[], sqlite3.Connection], style: str) -> None:
    ledger = Ledger(connect=db, job="j1", paramstyle=style)
    ledger.check()
    assert ledger.commit_batch(writer([1]), None, 0, "q", cov(0))
    assert not ledger.commit_batch(writer([1]), None, 0, "q", cov(0))
    assert committed_batches(db, "j1", paramstyle=style) == [("q", 0)]


def test_redact() -> None:
    assert redact("host=db password=abc user=u") == "host=db password=*** user=u"
    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


def test_query_id_fallbacks() -> None:
    ledger = Ledger(connect=lambda: None, job="j", query_id="explicit")
    assert ledger.resolve_query_id(object()) == "explicit"
    with pytest.raises(ConfigError, match="query_id"):
        Ledger(connect=lambda: None, job="j").resolve_query_id(object())


def test_crash_points_bracket_the_commit(db: Callable[[], sqlite3.Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    """ledger.before-last-look and ledger.before-commit: rows and ledger row written, invisible to others;
    ledger.after-commit: visible."""
    from airflow_ckpt_provider.sinks import ledger as module

    seen: list[tuple[str, int | None, list[Any], list[tuple[str, int]]]] = []

    def spy(point: str, batch_id: int | None = None) -> None:
        seen.append((point, batch_id, rows(db), committed_batches(db, "j1")))

    monkeypatch.setattr(module, "crash_point", spy)
    ledger = Ledger(connect=db, job="j1")
    ledger.check()
    assert ledger.commit_batch(writer([4]), None, 3, "q", cov(3))
    assert seen == [("ledger.before-last-look", 3, [], []), ("ledger.before-commit", 3, [], []),
                    ("ledger.after-commit", 3, [(3, 4)], [("q", 3)])]
    seen.clear()
    assert not ledger.commit_batch(writer([4]), None, 3, "q", cov(3))  # a skipped replay passes no crash point
    assert seen == []


def test_postgres_fixture_fails_clearly_without_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support import pgserver

    monkeypatch.setattr("tests.support.pgserver.glob.glob", lambda _pattern: [])
    with pytest.raises(RuntimeError, match=r"no PostgreSQL server binaries.*scripts/bootstrap"):
        pgserver.find_bin_dir()


def test_fork_undoes_the_abandoned_batches_in_the_same_transaction(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1", undo=delete_batches("out", batch_column="batch", query_column=None))
    ledger.check()
    for b in range(4):
        assert ledger.commit_batch(writer([b * 10]), None, b, "q", cov(b))
    # Restored at batch 1: batch 2 comes back with other offsets.
    assert ledger.commit_batch(writer([21]), None, 2, "q", cov(2, timeline=1, previous_timeline=0))
    assert rows(db) == [(0, 0), (1, 10), (2, 21)]
    assert rows(db, "SELECT batch_id, timeline FROM ckpt_ledger ORDER BY 1") == [(0, 0), (1, 0), (2, 1)]
    assert rows(db, "SELECT batch_id, timeline, abandoned_by_timeline FROM ckpt_ledger_abandoned ORDER BY 1") == [
        (2, 0, 1), (3, 0, 1)]
    assert not ledger.commit_batch(writer([99]), None, 2, "q", cov(2, timeline=1, previous_timeline=0))  # replay
    assert ledger.commit_batch(writer([31]), None, 3, "q", cov(3, timeline=1))
    assert rows(db) == [(0, 0), (1, 10), (2, 21), (3, 31)]


def test_fork_fails_without_undo_and_changes_nothing(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1")
    ledger.check()
    for b in range(3):
        ledger.commit_batch(writer([b]), None, b, "q", cov(b))
    with pytest.raises(ConflictError, match=r"cannot remove their rows: expected Ledger\(undo=...\)"):
        ledger.commit_batch(writer([9]), None, 1, "q", cov(1, timeline=1, previous_timeline=0))
    assert rows(db) == [(0, 0), (1, 1), (2, 2)]
    assert rows(db, "SELECT COUNT(*) FROM ckpt_ledger_abandoned") == [(0,)]


def test_a_batch_following_an_abandoned_batch_is_refused(db: Callable[[], sqlite3.Connection]) -> None:
    ledger = Ledger(connect=db, job="j1", undo=delete_batches("out", batch_column="batch", query_column=None))
    ledger.check()
    for b in range(4):
        ledger.commit_batch(writer([b]), None, b, "q", cov(b))
    ledger.commit_batch(writer([21]), None, 2, "q", cov(2, timeline=1, previous_timeline=0))
    with pytest.raises(ConflictError, match="follows batch 3 of a timeline this sink abandoned"):
        ledger.commit_batch(writer([4]), None, 4, "q", cov(4))  # a zombie of timeline 0
    assert rows(db) == [(0, 0), (1, 1), (2, 21)]


def test_a_ledger_table_of_the_first_release_gains_the_new_columns(db: Callable[[], sqlite3.Connection]) -> None:
    conn = db()
    conn.execute("CREATE TABLE old_ledger (job VARCHAR(200) NOT NULL, query_id VARCHAR(64) NOT NULL, batch_id BIGINT "
                 "NOT NULL, rows_written BIGINT, epoch BIGINT, committed_at VARCHAR(40) NOT NULL, "
                 "PRIMARY KEY (job, query_id, batch_id))")
    conn.execute("INSERT INTO old_ledger VALUES ('j1', 'q', 0, 1, 1, 'then')")
    conn.commit()
    conn.close()
    ledger = Ledger(connect=db, job="j1", table="old_ledger")
    ledger.check()
    assert not ledger.commit_batch(writer([1]), None, 0, "q", cov(0))  # no coverage recorded: a replay, as before
    assert ledger.commit_batch(writer([2]), None, 1, "q", cov(1))
    assert rows(db, "SELECT batch_id, coverage IS NULL FROM old_ledger ORDER BY 1") == [(0, 1), (1, 0)]
