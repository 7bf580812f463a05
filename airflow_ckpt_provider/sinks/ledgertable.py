"""The ledger's tables: columns and DDL, created, upgraded and checked; the ledger row's insert and reads.

``<table>`` holds one row per committed batch, keyed by (job, query id, batch id); ``<table>_abandoned``
keeps the rows of batches a fork abandoned; ``<table>_fence`` the highest lease epoch per job. Runs where
the ledger runs (the Spark driver program), through any DB-API 2 connection (sinks/dbapi.py); the commit
protocol itself is sinks/ledger.py.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.sinks.dbapi import integrity_error, placeholders, quote_table
from airflow_ckpt_provider.sinks.timelines import Observed, Shown, Timelines

log = logging.getLogger(__name__)

#: The ledger's columns, in the order of the INSERT; (job, query_id, batch_id) is the primary key.
COLUMNS = ("job", "query_id", "batch_id", "rows_written", "epoch", "committed_at", "coverage", "timeline")
KEY = ("job", "query_id", "batch_id")
#: Columns added after the first release: check() adds them to an older ledger table.
_ADDED = {"coverage": "VARCHAR(64)", "timeline": "BIGINT"}
#: The ledger's column definitions; the abandoned table has the same columns and no key.
_COLUMNS_SQL = (
    "job VARCHAR(200) NOT NULL, query_id VARCHAR(64) NOT NULL, batch_id BIGINT NOT NULL, rows_written BIGINT, "
    "epoch BIGINT, committed_at VARCHAR(40) NOT NULL, coverage VARCHAR(64), timeline BIGINT"
)
_DDL = "CREATE TABLE IF NOT EXISTS {table} (" + _COLUMNS_SQL + ", PRIMARY KEY (job, query_id, batch_id))"
#: Ledger rows of abandoned timelines, kept for inspection (no key: a batch may be abandoned twice).
_ABANDONED_DDL = ("CREATE TABLE IF NOT EXISTS {table} (" + _COLUMNS_SQL
                  + ", abandoned_at VARCHAR(40) NOT NULL, abandoned_by_timeline BIGINT NOT NULL)")

#: The fence: per job the highest lease epoch of a driver whose query started or that committed.
_FENCE_DDL = ("CREATE TABLE IF NOT EXISTS {table} (job VARCHAR(200) NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL, "
              "raised_at VARCHAR(40) NOT NULL)")


def now_iso() -> str:
    """Now in UTC, ISO 8601 with microseconds: when a batch was committed or abandoned."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class LedgerTable:
    """A ledger table and its ``<table>_abandoned`` and ``<table>_fence`` companions, with their names quoted for
    SQL."""

    name: str
    quoted: str
    abandoned: str
    quoted_abandoned: str
    fence: str
    quoted_fence: str

    @classmethod
    def named(cls, table: str) -> LedgerTable:
        """The tables of ledger ``table``; ConfigError if the name is not a (schema-qualified) identifier."""
        abandoned, fence = f"{table}_abandoned", f"{table}_fence"
        return cls(table, quote_table(table), abandoned, quote_table(abandoned), fence, quote_table(fence))

    def prepare(self, conn: Any, style: str, job: str) -> None:
        """Create the tables if absent, add the columns an older ledger lacks, check columns and key."""
        cur = conn.cursor()
        cur.execute(_DDL.format(table=self.quoted))
        cur.execute(_ABANDONED_DDL.format(table=self.quoted_abandoned))
        cur.execute(_FENCE_DDL.format(table=self.quoted_fence))
        conn.commit()
        self._add_columns(conn, cur, job)
        self._check_columns(conn, cur)
        self._check_key(conn, cur, style)

    def _columns(self, conn: Any, cur: Any) -> list[str]:
        try:
            cur.execute(f"SELECT * FROM {self.quoted} WHERE 1 = 0")  # noqa: S608 - validated, quoted identifier
            return [str(d[0]).lower() for d in cur.description or ()]
        finally:
            conn.rollback()

    def _add_columns(self, conn: Any, cur: Any, job: str) -> None:
        """Add the columns a ledger table of an earlier release lacks (what each batch covered, its timeline)."""
        found = self._columns(conn, cur)
        added = [c for c in _ADDED if c not in found]
        if not added or not {"job", "query_id", "batch_id"} <= set(found):
            return  # nothing to add, or not a ledger at all: _check_columns says so
        for column in added:
            cur.execute(f"ALTER TABLE {self.quoted} ADD COLUMN {column} {_ADDED[column]}")
        conn.commit()
        log.info("job %s: ledger table %s upgraded: added columns %s", job, self.name, ", ".join(added))

    def _check_columns(self, conn: Any, cur: Any) -> None:
        found = self._columns(conn, cur)
        missing = [c for c in COLUMNS if c not in found]
        if missing:
            raise ConfigError(
                f"ledger table {self.name} has an incompatible schema: expected columns {list(COLUMNS)} with "
                f"primary key {KEY}, found columns {found} (missing {missing}); drop it, or pass table= a new name"
            )

    def _check_key(self, conn: Any, cur: Any, style: str) -> None:
        """Probe the key by behaviour, portably: rows differing in one key column must insert, a duplicate
        (job, query_id, batch_id) must violate; everything is rolled back."""
        probe, other = f"__ckpt_probe_{uuid.uuid4().hex}", uuid.uuid4().hex
        rows = [(probe, "q", 0, 1, 1, None, 0), (probe, "q", 1, 2, 2, None, 0), (probe, other, 0, 3, 3, None, 0)]
        integrity = integrity_error(conn)
        problem = ""
        try:
            for row in rows:
                self.insert(cur, style, row)
            try:
                self.insert(cur, style, (probe, "q", 0, 4, 4, None, 0))
                problem = "a second row with the same (job, query_id, batch_id) was accepted"
            except integrity:
                pass
        except integrity as err:
            problem = f"rows differing only in batch_id or query_id were refused ({type(err).__name__})"
        finally:
            conn.rollback()
        if problem:
            raise ConfigError(
                f"ledger table {self.name} has an incompatible key: expected the primary key {KEY}, found that "
                f"{problem}; drop the table (or pass table= a new name) and let check() create it"
            )

    def hold_fence(self, cur: Any, style: str, job: str, epoch: int) -> int | None:
        """Raise the job's fence to ``epoch`` in the open transaction and hold its row until the transaction ends;
        the fence's epoch if it is higher (this driver was replaced: nothing may commit), else None.

        The UPDATE locks the row whatever it changes: a newer driver's raise waits for this transaction, so a
        commit either precedes the raise or sees it (PostgreSQL re-reads the row after the wait)."""
        marks, params = placeholders(style, (epoch, epoch, now_iso(), job, epoch))
        cur.execute(f"UPDATE {self.quoted_fence} SET epoch = {marks[0]}, raised_at = CASE WHEN epoch < {marks[1]} "  # noqa: S608 - quoted identifier; values are parameters
                    f"THEN {marks[2]} ELSE raised_at END WHERE job = {marks[3]} AND epoch <= {marks[4]}", params)
        if cur.rowcount == 1:
            return None
        marks, params = placeholders(style, (job,))
        cur.execute(f"SELECT epoch FROM {self.quoted_fence} WHERE job = {marks[0]}", params)  # noqa: S608 - quoted identifier; values are parameters
        row = cur.fetchone()
        if row is not None:  # MySQL counts only changed rows: an equal epoch is held all the same
            return int(row[0]) if int(row[0]) > epoch else None
        marks, params = placeholders(style, (job, epoch, now_iso()))
        cur.execute(f"INSERT INTO {self.quoted_fence} (job, epoch, raised_at) VALUES ({', '.join(marks)})", params)  # noqa: S608 - quoted identifier; values are parameters
        return None

    def insert(self, cur: Any, style: str,
                row: tuple[str, str, int, int | None, int | None, str | None, int]) -> None:
        """Insert a ledger row (job, query_id, batch_id, rows_written, epoch, coverage, timeline), committed now."""
        job, query_id, batch_id, rows, epoch, coverage, timeline = row
        marks, params = placeholders(style, (job, query_id, batch_id, rows, epoch, now_iso(), coverage, timeline))
        # S608 below: table names quoted by quote_table; values are parameters
        cur.execute(f"INSERT INTO {self.quoted} ({', '.join(COLUMNS)}) VALUES ({', '.join(marks)})", params)  # noqa: S608

    def observe(self, cur: Any, style: str, job: str, query_id: str,
                batch_id: int) -> tuple[Observed, int, tuple[Any, ...] | None]:
        """What the ledger holds of batches N and N-1, and its timelines: the ``Observed`` the timeline
        decision reads, the current timeline and batch N's row (committed_at, rows_written, coverage) or None."""
        marks, params = placeholders(style, (job, query_id, batch_id - 1, batch_id))
        cur.execute(
            # S608 below: table names quoted by quote_table; values are parameters
            f"SELECT batch_id, committed_at, rows_written, coverage FROM {self.quoted} "  # noqa: S608
            f"WHERE job = {marks[0]} AND query_id = {marks[1]} AND batch_id IN ({marks[2]}, {marks[3]})", params)
        rows = {int(r[0]): tuple(r[1:]) for r in cur.fetchall()}
        marks, params = placeholders(style, (job, query_id))
        where = f"WHERE job = {marks[0]} AND query_id = {marks[1]}"
        # S608 below: table names quoted by quote_table; values are parameters
        cur.execute(f"SELECT MAX(timeline) FROM {self.quoted} {where}", params)  # noqa: S608
        current = int(cur.fetchone()[0] or 0)
        # S608 below: table names quoted by quote_table; values are parameters
        cur.execute(f"SELECT MAX(timeline) FROM {self.quoted_abandoned} {where}", params)  # noqa: S608
        newest = max(current, int(cur.fetchone()[0] or 0))
        at, before = rows.get(batch_id), rows.get(batch_id - 1)
        abandoned_before: tuple[str, ...] = ()
        if before is None and batch_id > 0:
            marks, params = placeholders(style, (job, query_id, batch_id - 1))
            # S608 below: table names quoted by quote_table; values are parameters
            cur.execute(f"SELECT coverage FROM {self.quoted_abandoned} "  # noqa: S608
                        f"WHERE job = {marks[0]} AND query_id = {marks[1]} AND batch_id = {marks[2]}", params)
            abandoned_before = tuple(str(r[0]) for r in cur.fetchall() if r[0])
        seen = Observed(Timelines(), None if at is None else Shown(at[2]), None if before is None else Shown(before[2]),
                        next_timeline=newest + 1, abandoned_before=abandoned_before)
        return seen, current, at

    def batches_from(self, cur: Any, style: str, job: str, query_id: str, batch_id: int) -> list[int]:
        """The batches of the query the ledger holds from ``batch_id`` on, ascending."""
        where, params = _from_batch(style, job, query_id, batch_id)
        # S608 below: table names quoted by quote_table; values are parameters
        cur.execute(f"SELECT batch_id FROM {self.quoted} {where}", params)  # noqa: S608
        return sorted(int(r[0]) for r in cur.fetchall())

    def abandon(self, cur: Any, style: str, job: str, query_id: str, batch_id: int, *, timeline: int) -> None:
        """Move the query's ledger rows from ``batch_id`` on to the abandoned table (fork to ``timeline``)."""
        marks_move, params_move = placeholders(style, (now_iso(), timeline, job, query_id, batch_id))
        cur.execute(
            # S608 below: table names quoted by quote_table; values are parameters
            f"INSERT INTO {self.quoted_abandoned} ({', '.join(COLUMNS)}, abandoned_at, abandoned_by_timeline) "  # noqa: S608
            f"SELECT {', '.join(COLUMNS)}, {marks_move[0]}, {marks_move[1]} FROM {self.quoted} "
            f"WHERE job = {marks_move[2]} AND query_id = {marks_move[3]} AND batch_id >= {marks_move[4]}", params_move)
        where, params = _from_batch(style, job, query_id, batch_id)
        # S608 below: table names quoted by quote_table; values are parameters
        cur.execute(f"DELETE FROM {self.quoted} {where}", params)  # noqa: S608


def _from_batch(style: str, job: str, query_id: str, batch_id: int) -> tuple[str, Any]:
    """The WHERE clause, and its parameters, of the query's ledger rows from ``batch_id`` on."""
    marks, params = placeholders(style, (job, query_id, batch_id))
    return f"WHERE job = {marks[0]} AND query_id = {marks[1]} AND batch_id >= {marks[2]}", params
