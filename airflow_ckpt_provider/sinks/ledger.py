"""A ledger for foreachBatch: exactly-once writes into a transactional database through DB-API 2.

Design notes: docs/sink-ledger.md#design-notes-sinksledgerpy."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.streambatch import (
    QUERY_ID_PROPERTY,
    SinkOutcome,
    before_query_start,
    sink_outcome,
)
from airflow_ckpt_provider.core.records.lease import FencedError
from airflow_ckpt_provider.core.snapshots.checkpoint import id_ranges
from airflow_ckpt_provider.core.snapshots.coverage import Coverage, checkpoint_storage, read_coverage
from airflow_ckpt_provider.sinks.dbapi import (
    IDENTIFIER,
    STYLES,
    detect_paramstyle,
    driver_module,
    integrity_error,
    placeholders,
    quote_table,
    redact,
)
from airflow_ckpt_provider.sinks.ledgertable import LedgerTable
from airflow_ckpt_provider.sinks.timelines import REFUSED, Action, decide

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class Fencing(Protocol):
    """What the ledger needs of the runtime's JobContext: the epoch and the lease check."""

    @property
    def epoch(self) -> int: ...
    def check_lease(self) -> None: ...
    def lease_held(self) -> None: ...


Connect = Callable[[], Any]
#: The user's write: inserts batch rows through the cursor; may return the number of rows written.
Write = Callable[[Any, "DataFrame", int], "int | None"]
#: The user's undo: removes the rows that batches ``batch_ids`` of query ``query_id`` wrote (a fork
#: abandons them), through the cursor of the transaction that commits the new timeline's first batch.
Undo = Callable[[Any, str, list[int]], None]


def delete_batches(table: str, *, batch_column: str = "batch_id", query_column: str | None = "query_id",
                   paramstyle: str = "qmark") -> Undo:
    """An ``undo`` for append-only output tables whose rows carry their batch id (and query id).

    Without ``query_column`` the rows of every query with those batch ids are deleted: fine for a job
    that never starts on a fresh checkpoint (whose batch ids restart at 0). ``paramstyle``: the DB-API
    driver's (qmark for sqlite3, format for psycopg).
    """
    quoted = quote_table(table)
    for column in (batch_column, query_column):
        if column is not None and not IDENTIFIER.fullmatch(column):
            raise ConfigError(f"column name {column!r} is not an identifier: expected letters, digits and '_'")

    def undo(cur: Any, query_id: str, batch_ids: list[int]) -> None:
        for batch_id in batch_ids:
            values: tuple[Any, ...] = (batch_id,) if query_column is None else (batch_id, query_id)
            marks, params = placeholders(paramstyle, values)
            where = f'"{batch_column}" = {marks[0]}' + (f' AND "{query_column}" = {marks[1]}' if query_column else "")
            cur.execute(f"DELETE FROM {quoted} WHERE {where}", params)  # noqa: S608 - validated, quoted identifiers

    return undo


class Ledger:
    """Exactly-once foreachBatch writes into a transactional database, keyed by (job, query id, batch id).

    ``connect``: zero-argument factory of a DB-API 2 connection (not in autocommit mode); one connection per
    batch, closed after it. ``ctx`` (the runtime's JobContext) or ``fence`` fences an old driver: checked
    before the write and right before COMMIT. ``query_id``: used when Spark's query id cannot be read
    from the batch (Spark Connect). ``paramstyle``: overrides the driver module's. ``undo``: removes the
    rows of abandoned batches when a restore went back in time (without it such a restore is refused
    at its first replanned batch, nothing written). ``checkpoint``: the query's checkpoint location,
    whose offsets log tells a replay from a replanned batch (default: the runtime's, else Spark's).
    """

    def __init__(
        self,
        connect: Connect,
        job: str,
        table: str = "ckpt_ledger",
        *,
        ctx: Fencing | None = None,
        epoch: int | None = None,
        fence: Callable[[], None] | None = None,
        query_id: str | None = None,
        paramstyle: str | None = None,
        undo: Undo | None = None,
        checkpoint: str | None = None,
    ) -> None:
        if not job:
            raise ConfigError("Ledger needs a non-empty job name (the runtime's ctx.job)")
        if paramstyle is not None and paramstyle not in STYLES:
            raise ConfigError(f"paramstyle {paramstyle!r} is not a DB-API paramstyle: expected one of {STYLES}")
        self.connect = connect
        self.job = job
        self.table = table
        self.tables = LedgerTable.named(table)
        self.ctx = ctx
        self._epoch = epoch
        self._fence = fence
        self.query_id = query_id
        self.paramstyle = paramstyle
        self.undo = undo
        self.checkpoint = checkpoint

    @property
    def epoch(self) -> int | None:
        """The epoch recorded with each batch: the explicit one, else the runtime's lease epoch."""
        if self._epoch is not None:
            return self._epoch
        return self.ctx.epoch if self.ctx is not None else None

    def fence(self) -> None:
        """Raise (FencedError from the runtime) if this driver must no longer write."""
        if self.ctx is not None:
            self.ctx.check_lease()
        if self._fence is not None:
            self._fence()

    def _last_look(self) -> None:
        """The look before COMMIT, inside the open transaction: the runtime's lease as the lease watch last confirmed
        it (no request to the job store: one held up by a cut would hold this transaction's locks, and keep a newer
        driver waiting on them, until the cut heals), then the database's own fence (``_hold_fence``)."""
        if self.ctx is not None:
            self.ctx.lease_held()
        if self._fence is not None:
            self._fence()

    # -- setup ---------------------------------------------------------------------------------

    def _open(self) -> Any:
        try:
            conn = self.connect()
        except Exception as err:
            raise ConfigError(
                f"ledger {self.table} of job {self.job}: cannot connect to the database: {type(err).__name__}: "
                f"{redact(str(err).strip())}; check the connect factory (host, database, credentials) and that "
                "the database is up"
            ) from None  # not chained: the driver's own message may carry the DSN's password
        get_autocommit = getattr(conn, "get_autocommit", None)  # MySQL drivers: a method, not an attribute
        if getattr(conn, "autocommit", False) is True or (callable(get_autocommit) and get_autocommit()) or (
            driver_module(conn) is sys.modules.get("sqlite3") and getattr(conn, "isolation_level", "") is None
        ):
            conn.close()
            raise ConfigError(
                f"ledger {self.table} of job {self.job}: the connection is in autocommit mode: expected a "
                "transactional connection (the rows and the ledger row must commit together); do not set "
                "autocommit=True / isolation_level=None"
            )
        return conn

    def _style(self, conn: Any) -> str:
        return self.paramstyle or detect_paramstyle(conn)

    def check(self) -> None:
        """Create the ledger table if absent; ConfigError (nothing written) if it is incompatible.

        Call it when the query is defined (the build function): bad input fails before any batch runs.
        """
        conn = self._open()
        try:
            self.tables.prepare(conn, self._style(conn), self.job)
        finally:
            conn.close()
        log.info("job %s: ledger table %s is ready", self.job, self.table)
        if self.ctx is not None:  # the build function runs before the lease is taken: the fence rises at the start
            before_query_start(f"ledger:{self.job}:{self.table}", self.raise_fence)
        elif self._epoch is not None:
            self.raise_fence()

    def raise_fence(self) -> None:
        """Raise the ledger's fence to this driver's epoch in a transaction of its own (FencedError if a newer driver
        raised it higher): under the runtime, right before each start of the query, once the lease is held and its
        grace waited out, so that no older driver commits from then on."""
        conn = self._open()
        try:
            self._hold_fence(conn.cursor(), self._style(conn), "start")
            conn.commit()
        finally:
            conn.close()
        if self.epoch is not None:
            log.info("job %s: ledger %s fenced at epoch %d: commits of older drivers are refused", self.job,
                     self.table, self.epoch)

    def _hold_fence(self, cur: Any, style: str, what: str) -> None:
        """Raise the ledger's fence (``<table>_fence``) to this driver's epoch within the open transaction, or raise
        FencedError if a newer driver raised it higher: the lease check asks the job store, this asks the database
        the rows go to, in the transaction that commits them (docs/reliability.md, finding 7). No epoch (no ckpt
        runtime, none given): not fenced."""
        if self.epoch is None:
            return
        newer = self.tables.hold_fence(cur, style, self.job, self.epoch)
        if newer is not None:
            raise FencedError(
                f"ledger {self.table} of job {self.job} ({what}): expected this driver (epoch {self.epoch}) to hold "
                f"the job, found the ledger fenced at epoch {newer} ({self.tables.fence}): a newer driver runs the "
                "job, this one is fenced and commits nothing. If the job's store was recreated (its epochs started "
                f"again at 1), stop every driver of the job and delete the job's row from {self.tables.fence}")

    # -- the protocol --------------------------------------------------------------------------

    def foreach_batch(self, write: Write) -> Callable[[DataFrame, int], None]:
        """A foreachBatch function: ``write``'s rows and the ledger row in one transaction; replays skipped."""

        def run(df: DataFrame, batch_id: int) -> None:
            query_id = self.resolve_query_id(df)
            coverage = read_coverage(checkpoint_storage(self.resolve_checkpoint(df, query_id)), batch_id)
            self.fence()  # a fenced driver does not even compute the batch (its state stores would commit)
            cached = _compute(df)
            try:
                if not self.commit_batch(write, df, batch_id, query_id, coverage) and not cached:
                    # A skipped replay must still run the batch: Spark 4 commits the state stores of a
                    # stateful query only when its plan runs, and fails the batch otherwise
                    # (STATE_STORE_COMMIT_VALIDATION_FAILED). The noop sink runs it and writes nothing.
                    df.write.format("noop").mode("overwrite").save()
            finally:
                if cached:
                    df.unpersist()

        return run

    def resolve_checkpoint(self, df: Any, query_id: str) -> str:
        """The query's checkpoint location: the explicit one, the runtime's, else Spark's resolved root."""
        if self.checkpoint:
            return self.checkpoint
        config = getattr(self.ctx, "config", None)
        if config is not None and getattr(config, "checkpoint", None):
            return str(config.checkpoint)
        try:
            root = _checkpoint_root(df.sparkSession, query_id)
        except Exception as err:  # Spark Connect, or an internal API that moved
            raise ConfigError(
                f"ledger {self.table} of job {self.job}: cannot find the checkpoint location of query {query_id} "
                f"({type(err).__name__}: {err}): pass Ledger(checkpoint=...) the writer's checkpointLocation"
            ) from err
        return root[len("file:"):] if root.startswith("file:") else root

    def resolve_query_id(self, df: Any) -> str:
        """Spark's query id of the running batch (local property on the driver's batch thread), else
        the explicit ``query_id``, else the only active query's id."""
        spark = getattr(df, "sparkSession", None)
        try:
            qid = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY) if spark is not None else None
        except Exception:  # Spark Connect has no SparkContext
            qid = None
        if qid:
            return str(qid)
        if self.query_id:
            return self.query_id
        try:
            active = spark.streams.active if spark is not None else []
        except Exception:  # a DataFrame without a session: fall through to the error below
            active = []
        if len(active) == 1:
            return str(active[0].id)
        raise ConfigError(
            f"ledger {self.table} of job {self.job}: cannot read the Spark query id of this batch (local property "
            f"{QUERY_ID_PROPERTY} unset, {len(active)} active queries): pass Ledger(query_id=...) with a value that "
            "changes whenever the checkpoint location is fresh (e.g. read from the checkpoint's metadata file)"
        )

    def commit_batch(self, write: Write, df: Any, batch_id: int, query_id: str, coverage: Coverage) -> bool:
        """Run one batch's transaction; True if committed, False if the ledger says it already was.

        Fenced (``ctx``/``fence``) before anything, and again right before COMMIT (the lease as last confirmed, no
        request, and the database's own fence): a fenced driver neither writes, nor commits, nor lets Spark commit a
        skipped replay. A batch that comes back with other content forks: the later batches' rows are undone in the
        same transaction. A batch that does not follow the ledger's batch before it is refused.
        """
        self.fence()
        conn = self._open()
        forked: list[int] = []
        try:
            style = self._style(conn)
            cur = conn.cursor()
            seen, current, found = self.tables.observe(cur, style, self.job, query_id, batch_id)
            decision = decide(coverage, seen)
            if decision.action is Action.SKIP:
                conn.rollback()
                log.info("job %s query %s: batch %d already committed at %s (%s rows, timeline %s, offsets %s): "
                         "skipped", self.job, query_id, batch_id, found[0] if found else "?",
                         found[1] if found else "?", current, coverage.short())
                sink_outcome("ledger", SinkOutcome.SKIPPED, batch_id, 0)
                return False
            if decision.action is Action.REFUSE:
                raise ConflictError(f"{REFUSED} ledger {self.table} of job {self.job} query {query_id}: batch "
                                    f"{batch_id} refused, nothing written: {decision.reason}")
            timeline = current
            if decision.action is Action.FORK:
                timeline = seen.next_timeline
                forked = self._fork(cur, style, query_id, batch_id, timeline=timeline, why=decision.reason)
            result = write(cur, df, batch_id)
            rows = result if isinstance(result, int) and not isinstance(result, bool) else None
            try:
                row = (self.job, query_id, batch_id, rows, self.epoch, coverage.digest, timeline)
                self.tables.insert(cur, style, row)
            except integrity_error(conn) as err:
                raise ConflictError(
                    f"job {self.job} query {query_id}: batch {batch_id} was committed meanwhile by another driver "
                    "(ledger primary key violated): this attempt's rows are rolled back; a second driver of the "
                    "same job is running: check the job's lease"
                ) from err
            crash_point("ledger.before-last-look", batch_id)  # the rows and the ledger row written, not committed
            self._last_look()  # a fenced driver commits nothing
            self._hold_fence(cur, style, f"query {query_id} batch {batch_id}")  # and the database's own fence
            crash_point("ledger.before-commit", batch_id)
            conn.commit()
        except BaseException as failed:
            try:
                conn.rollback()
            except Exception as err:  # the original error matters more
                log.warning("job %s: rollback of batch %d failed: %s", self.job, batch_id, redact(str(err)))
            sink_outcome("ledger", SinkOutcome.FENCED if isinstance(failed, FencedError) else SinkOutcome.ABORTED,
                         batch_id)
            raise
        finally:
            conn.close()
        if forked:
            log.warning("job %s query %s: TIMELINE %d starts at batch %d: %s; the rows of batches %s were removed "
                        "(undo) in the same transaction and their ledger rows moved to %s", self.job, query_id,
                        timeline, batch_id, decision.reason, id_ranges(forked), self.tables.abandoned)
        log.info("job %s query %s: batch %d committed, %s rows, epoch %s, timeline %d, offsets %s", self.job,
                 query_id, batch_id, rows if rows is not None else "?", self.epoch, timeline, coverage.short())
        sink_outcome("ledger", SinkOutcome.COMMITTED, batch_id, rows)
        crash_point("ledger.after-commit", batch_id)
        return True

    def _fork(self, cur: Any, style: str, query_id: str, batch_id: int, *, timeline: int, why: str) -> list[int]:
        """Undo the batches from ``batch_id`` on and move their ledger rows to the abandoned table."""
        batches = self.tables.batches_from(cur, style, self.job, query_id, batch_id)
        if self.undo is None:
            raise ConflictError(
                f"{REFUSED} ledger {self.table} of job {self.job} query {query_id}: {why}. The ledger holds "
                f"batches {id_ranges(batches)} of the abandoned timeline and cannot remove their rows: expected "
                "Ledger(undo=...) (e.g. delete_batches(TABLE)); found none, so nothing was written. Pass undo, "
                "or restore onto a new output table and ledger"
            )
        self.undo(cur, query_id, batches)
        self.tables.abandon(cur, style, self.job, query_id, batch_id, timeline=timeline)
        return batches


def _checkpoint_root(spark: Any, query_id: str) -> str:
    """The resolved checkpoint root of running query ``query_id`` (internal API of StreamExecution).

    foreachBatch hands over a clone of the query's session, whose query manager does not know the
    query: the session that started it is looked for among the clone and Spark's default session.
    """
    jvm = spark.sparkContext._jvm
    default = jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
    for manager in (spark._jsparkSession.streams(), default.get().streams() if default.isDefined() else None):
        query = manager.get(query_id) if manager is not None else None
        if query is not None:
            return str(query.streamingQuery().resolvedCheckpointRoot())
    raise LookupError(f"no session of this driver runs query {query_id}")


def committed_batches(connect: Connect, job: str, table: str = "ckpt_ledger",
                      *, paramstyle: str | None = None) -> list[tuple[str, int]]:
    """The (query_id, batch_id) pairs the ledger holds for ``job``, sorted."""
    quoted = quote_table(table)
    conn = connect()
    try:
        marks, params = placeholders(paramstyle or detect_paramstyle(conn), (job,))
        cur = conn.cursor()
        # S608 below: table name quoted by quote_table; the job is a parameter
        cur.execute(f"SELECT query_id, batch_id FROM {quoted} WHERE job = {marks[0]}", params)  # noqa: S608
        found = sorted((str(q), int(b)) for q, b in cur.fetchall())
        conn.rollback()
        return found
    finally:
        conn.close()


def _compute(df: Any) -> bool:
    """Compute the batch and cache it before its transaction opens (True), so that the transaction lasts as long as
    the writes, not as long as the batch's Spark job: a transaction held open through a slow batch (a lost executor's
    task waits a minute for its retry) holds its locks and runs into the server's idle-in-transaction timeout
    (docs/reliability.md, scenario 3, finding 13). False for what is not a Spark DataFrame."""
    if not hasattr(df, "persist"):
        return False
    df.persist()
    df.count()  # runs the whole plan: the stateful operators commit their state stores here
    return True
