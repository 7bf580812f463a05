"""Can a checkpoint's state be repartitioned offline, and to what? Pure checks, before Spark is asked.

Spark 4.3's offline repartition (``StreamingCheckpointManager.repartition``) rewrites a STOPPED query's
state into N partitions as a new batch N+1 that reads no input. Several of its refusals come only after
it has written ``offsets/N+1`` (an unsupported store provider, a stateless query, missing operator
metadata), which leaves a checkpoint Spark refuses to restart on. So the provider asks the same questions
first, read-only, on the snapshot's view; Spark's own refusal is the last word for the rest (operators it
does not support, state variable types). Facts and sources: docs/rescaling.md. No pyspark import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.snapshots.checkpoint import BatchView
from airflow_ckpt_provider.core.snapshots.manifest import RESCALED_FROM, Kind, Manifest
from airflow_ckpt_provider.core.snapshots.statestore import ROCKSDB, StateOperator, state_partitions


def current_partitions(view: BatchView) -> int | None:
    """The partitions the state has at the view's batch (None: a stateless query)."""
    if not view.operators:
        return None
    return state_partitions(view.conf) or max(op.partitions for op in view.operators)


def snapshot_problem(manifest: Manifest, partitions: int) -> str | None:
    """:func:`repartition_problem` on what a snapshot's manifest recorded (no Spark, no download)."""
    operators = [StateOperator.from_json(op) for op in manifest.operators]
    return _problem(operators, manifest.state_partitions, manifest.batch_id, partitions)


def repartition_problem(view: BatchView, partitions: int) -> str | None:
    """Why Spark cannot (or need not) repartition this view's state to ``partitions``; None if it can.

    The text says what was expected, what was found and what to do.
    """
    return _problem(view.operators, current_partitions(view), view.batch_id, partitions)


def _problem(operators: Sequence[StateOperator], current: int | None, batch_id: int, partitions: int) -> str | None:
    if not operators:
        return (f"the query has no state at batch {batch_id}: there is nothing to repartition. A stateless "
                "query takes spark.sql.shuffle.partitions at every start: change it in the job's conf and restart")
    if current == partitions:
        return (f"the state already has {partitions} partitions (batch {batch_id}); expected another count. "
                "Nothing to do")
    others = [op.operator_id for op in operators if op.provider != ROCKSDB]
    if others:
        return (f"the state is in the HDFS-backed state store (Spark's default; operators "
                f"{others}); Spark 4.3 repartitions "
                "RocksDB state only (STATE_REPARTITION_INVALID_CHECKPOINT.UNSUPPORTED_PROVIDER). A job whose state "
                "must be rescaled needs spark.sql.streaming.stateStore.providerClass="
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider from its first batch: a "
                "store provider cannot change on existing state")
    unnamed = [op.operator_id for op in operators if op.name is None]
    if unnamed:
        return (f"operators {unnamed} have no operator metadata (state/<op>/_metadata/metadata, written by Spark "
                ">= 3.5); Spark's repartition needs it (STATE_REWRITER_INVALID_CHECKPOINT.MISSING_OPERATOR_METADATA). "
                "Run the job on Spark >= 3.5 for one batch and take a new savepoint, then rescale")
    return None


@dataclass(frozen=True)
class StoppedSource:
    """Where the rescale of a stopped job starts: the savepoint it stopped with, and that savepoint already
    repartitioned into the asked count by an earlier rescale that did not finish (None: repartition it)."""

    source: Manifest
    rescaled: Manifest | None

    def describe(self, partitions: int) -> str:
        s = self.source
        if self.rescaled is not None:
            return (f"job {s.job} stopped with savepoint {s.snapshot_id}, already repartitioned into {partitions} "
                    f"partitions as {self.rescaled.snapshot_id} by a rescale that did not finish: starting it on that "
                    "one")
        return (f"job {s.job} is stopped with savepoint {s.snapshot_id} (batch {s.batch_id}, {s.state_partitions} "
                "partitions): rescaling it from there")


def stopped_source(status: JobStatus | None, savepoints: Sequence[Manifest], partitions: int) -> StoppedSource:
    """Decide where a stopped job's rescale starts (observe, decide: the caller acts). A job that stopped with a
    savepoint (stop with savepoint; also what a rescale whose own process died after the stop leaves) starts from
    it, or from its repartitioned copy if a rescale saved one (died after saving it). ConfigError for a job that
    stopped otherwise (cancelled, failed: its latest state may be newer than every savepoint), and for a savepoint
    that cannot be repartitioned (the same count, no state, HDFS-backed)."""
    final = status.last_snapshot if status is not None and status.state is JobState.STOPPED else None
    if status is None or final is None or final.get("kind") != Kind.SAVEPOINT.value or \
            final.get("batch_id") != status.batch_id:
        state = status.state.value if status is not None else "no status"
        raise ConfigError(
            f"the job is not running ({state}) and did not stop with a savepoint, so its latest state may be newer "
            "than every savepoint; expected a running job or one stopped with a savepoint. Start it (it restores its "
            "latest state), then rescale, or restore a savepoint with `ckpt run --restore`")
    source = next((m for m in savepoints if m.snapshot_id == final.get("id")), None)
    if source is None:
        raise ConfigError(f"the job stopped with savepoint {final.get('id')}, which the job store no longer holds "
                          "(disposed?); start the job from a savepoint it holds, then rescale")
    done = [m for m in savepoints if m.labels.get(RESCALED_FROM) == source.snapshot_id
            and m.state_partitions == partitions]
    if done:
        return StoppedSource(source, done[-1])
    problem = snapshot_problem(source, partitions)
    if problem:
        raise ConfigError(f"savepoint {source.snapshot_id}: {problem}")
    return StoppedSource(source, None)
