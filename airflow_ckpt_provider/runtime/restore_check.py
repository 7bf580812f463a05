"""The restore check in the Spark driver: does Spark restore the job's state into the new query?

Design notes: docs/runtime.md#design-notes-runtimerestore_checkpy."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import CkptError, StorageError
from airflow_ckpt_provider.core.policy import gate
from airflow_ckpt_provider.core.policy.faults import crash_point
from airflow_ckpt_provider.core.policy.modes import RestoreMode
from airflow_ckpt_provider.core.policy.stateedit import KeyDeletion, StateEdit, describe_edit
from airflow_ckpt_provider.core.records.lease import Lease, LeaseRecord
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.ckptfiles import parse_log_entry
from airflow_ckpt_provider.core.snapshots.manifest import (
    KEYS_DELETED,
    PARTITIONS_BEFORE,
    RESCALED_FROM,
    REWRITTEN_FROM,
    ROWS_CHANGED,
    ROWS_REMOVED,
    VALUES_SET,
    Kind,
    Manifest,
    Trigger,
)
from airflow_ckpt_provider.core.snapshots.rescaling import current_partitions, repartition_problem
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots.scratch import make_scratch, sweep_scratch
from airflow_ckpt_provider.core.snapshots.stateschema import (
    ENCODING_CONF,
    Schemas,
    evolution_hint,
    newest_schema_files,
    parse_schema_file,
    schema_changes,
)
from airflow_ckpt_provider.core.snapshots.statestore import STATE_FORMAT_CONF
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, S3Options, Storage, open_storage
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.restore_check_verdict import (
    OPERATORS_MISMATCH,
    CheckOutcome,
    RestoreCheck,
    drop_log_after,
    judge,
    operators_in_error,
    operators_run,
    plan_empty_batch,
    snapshot_operators,
    source_changes,
    spark_error,
    state_files,
)
from airflow_ckpt_provider.runtime.sparkchecks import check_executors, check_spark_python, job_session
from airflow_ckpt_provider.runtime.startup import StartAction, plan_start
from airflow_ckpt_provider.runtime.staterewrite import Rewrite, edit_transform, rewrite_state

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from airflow_ckpt_provider.runtime.driver import JobBuilder

log = logging.getLogger(__name__)

#: The local scratch copies of restore checks and repartitions: ``<temp dir>/ckpt-restore-check-<job>-*``.
SCRATCH_PREFIX = "ckpt-restore-check-"

# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------


class RestoreChecker:
    """One restore check of ``job_file`` against the state ``config.restore`` names; ``run()`` prints
    the verdict line and returns the exit code (restore_check_verdict.EXIT_CODES)."""

    def __init__(self, config: RuntimeConfig, job_file: str, *, out: TextIO | None = None) -> None:
        self.config = config
        self.job_file = job_file
        self.name = Path(job_file).name
        self.out = out or sys.stdout
        self.started = time.monotonic()
        self.report: RestoreCheck | None = None  # the verdict, once run() gave it
        self.rewrite: Rewrite | None = None  # --delete-keys, --update-values: what the rewrite of the copy did
        self.new_sources: list[str] | None = None  # the source ids of the new query, once its batch ran
        s3 = S3Options.from_env(config.endpoint_url, config.region)
        self.s3 = s3
        self.store = JobStore.open(config.store, config.job, s3)

    def run(self, spark_factory: Callable[[], SparkSession] | None = None) -> int:
        scratch, cleanup = self._scratch()
        try:
            report = self._check(scratch, spark_factory)
        except StorageError as err:
            report = RestoreCheck(CheckOutcome.INCONCLUSIVE, f"restore check: storage error, no verdict: {err}")
        except CkptError as err:
            report = RestoreCheck(CheckOutcome.BAD_INPUT, f"restore check: {err}")
        except Exception as err:  # Spark did not start, py4j lost the JVM: no verdict, but still a report
            log.exception("job %s: restore check failed", self.config.job)
            report = RestoreCheck(CheckOutcome.INCONCLUSIVE, f"restore check failed, no verdict: "
                                  f"{type(err).__name__}: {spark_error(err)[0]}")
        finally:
            cleanup()
        report = replace(report, seconds=round(time.monotonic() - self.started, 1))
        (log.info if report.compatible else log.error)("job %s: restore check: %s: %s", self.config.job,
                                                       report.outcome.value, report.reason)
        print(report.to_line(), file=self.out, flush=True)
        self.report = report
        return report.exit_code

    def _check(self, scratch: Storage, spark_factory: Callable[[], SparkSession] | None) -> RestoreCheck:
        build = self._load()
        manifest, note = self._choose(scratch)
        rescale = self.config.rescale_to
        edit = self.config.state_edit()
        if manifest is None:  # no state: compatible with any code, and nothing to rescale or edit
            if rescale is None and edit is None:
                return RestoreCheck(CheckOutcome.COMPATIBLE, note)
            what = f"rescale to {rescale} partitions" if edit is None else describe_edit(edit)
            return RestoreCheck(CheckOutcome.BAD_INPUT, f"{what}: {note}")
        with _quiet("airflow_ckpt_provider.core.snapshots.restore"):  # its time-travel warning is about real restores
            restore_snapshot(self.store, manifest.snapshot_id, scratch)
        spark = spark_factory() if spark_factory else job_session(self.config)
        lacking = check_spark_python(spark) or check_executors(spark, self.config.executor_timeout)
        if lacking:  # the same the job's driver refuses: no verdict about the state
            return RestoreCheck(CheckOutcome.INCONCLUSIVE, reason=lacking)
        failure, partitions = self._transform(spark, scratch, manifest, rescale, edit)
        if failure is not None:
            return replace(failure, snapshot_id=manifest.snapshot_id, batch_id=manifest.batch_id,
                           state_partitions=manifest.state_partitions)
        last = manifest.batch_id + (rescale is not None or edit is not None)  # the repartition's or rewrite's
        batch = plan_empty_batch(scratch, last)
        listed = [o.key for o in scratch.list("state/")]
        before, schemas = state_files(listed), _schemas(scratch, listed)
        log.info("job %s: restore check: %s%s; running batch %d of %s on a copy at %s with no data",
                 self.config.job, manifest.snapshot_id, f" ({note})" if note else "", batch, self.job_file,
                 scratch.url)
        failure = self._run_batch(build, spark, scratch)
        found: dict[str, Any] = {"snapshot_id": manifest.snapshot_id, "batch_id": manifest.batch_id,
                                 "state_partitions": partitions}
        if failure is not None:
            hint = evolution_hint(schemas, _encoding(scratch, last)) if failure.error_class in SCHEMA_REFUSALS \
                else None
            return replace(failure, **found, snapshot_operators=tuple(snapshot_operators(manifest)),
                           reason=f"{failure.reason}; {hint}" if hint else failure.reason)
        if not scratch.exists(f"commits/{batch}"):
            report = RestoreCheck(
                CheckOutcome.INCONCLUSIVE, **found,
                reason=f"Spark stopped the check query without an error and without committing batch {batch}; "
                "no verdict. Run the check again and look at the driver's output",
            )
        else:
            listed = [o.key for o in scratch.list("state/")]
            report = judge(manifest, self.name, operators_run(before, listed),
                           allow_non_restored=self.config.allow_non_restored_state)
            changes = tuple(schema_changes(schemas, _schemas(scratch, listed)))
            if changes:
                report = replace(report, state_schema_changes=changes, reason=(
                    f"{report.reason}; transformWithState state schemas evolve: {'; '.join(changes)}"))
            sources = source_changes(_named_sources(scratch, last), self.new_sources)
            if sources:
                report = replace(report, source_changes=sources, reason=f"{report.reason}; {'; '.join(sources)}")
            report = replace(report, state_partitions=partitions)
        if rescale is not None and report.compatible:
            report = self._rescaled(report, scratch, manifest, last)
        if edit is not None and report.compatible:
            assert self.rewrite is not None  # _edit rewrote the copy
            report = self._rewritten(report, scratch, manifest, last, edit) if self.config.save_edited else replace(
                report, reason=f"{report.reason}; {describe_edit(edit)}: {self.rewrite.describe()} (a check: nothing "
                "saved)")
        return replace(report, reason=f"{report.reason}; {note}") if note else report

    def _transform(self, spark: SparkSession, scratch: Storage, manifest: Manifest, rescale: int | None,
                   edit: StateEdit | None) -> tuple[RestoreCheck | None, int | None]:
        """The copy's state repartitioned into ``rescale`` partitions, or edited (keys deleted, values changed),
        into its next batch (config.check refuses both at once): a refusal's verdict, and the state's partitions."""
        if rescale is not None:
            return self._repartition(spark, scratch, manifest, rescale)
        if edit is not None:
            return self._edit(spark, scratch, manifest, edit), manifest.state_partitions
        return None, manifest.state_partitions

    def _repartition(self, spark: SparkSession, scratch: Storage, manifest: Manifest,
                     partitions: int) -> tuple[RestoreCheck | None, int | None]:
        """Spark's offline repartition of the restored copy into ``partitions``: a failure's verdict (nothing
        was asked of Spark if the state cannot be repartitioned, core/snapshots/rescaling.py), and the new count."""
        what = f"rescale of snapshot {manifest.snapshot_id} (batch {manifest.batch_id})"
        view = SparkCheckpoint(scratch).view(manifest.batch_id)
        if view.next_offsets is not None:
            if self.config.save_rescaled:
                return RestoreCheck(CheckOutcome.BAD_INPUT, (
                    f"{what}: the snapshot holds batch {manifest.batch_id + 1} planned but not committed (offsets/"
                    f"{manifest.batch_id + 1}); Spark repartitions only after a committed batch "
                    "(STATE_REPARTITION_INVALID_CHECKPOINT.LAST_BATCH_FAILED). Let the job run that batch, take a "
                    "savepoint (stop with savepoint), and rescale from it")), None
            drop_log_after(scratch, manifest.batch_id)  # a check only: the copy's pending batch is not needed
        problem = repartition_problem(view, partitions)
        if problem:
            return RestoreCheck(CheckOutcome.BAD_INPUT, f"{what} to {partitions} partitions refused: {problem}"), None
        before = current_partitions(view)
        # Spark refuses a session asking for another state checkpoint format than the checkpoint's, after it logged
        # the repartition batch (STATE_REWRITER_INVALID_CHECKPOINT.STATE_CHECKPOINT_FORMAT_VERSION_MISMATCH); the
        # checkpoint's own format is the one every later run keeps anyway.
        spark.conf.set(STATE_FORMAT_CONF, str(view.state_format))
        log.info("job %s: repartitioning the state of %s from %s to %d partitions on a copy at %s", self.config.job,
                 manifest.snapshot_id, before, partitions, scratch.url)
        started = time.monotonic()
        try:
            spark._streamingCheckpointManager.repartition(scratch.url, partitions, True)
        except Exception as err:  # Spark's refusal: Py4JJavaError with an error condition, IllegalArgumentException
            message, condition = spark_error(err)
            return RestoreCheck(CheckOutcome.INCOMPATIBLE, error_class=condition, reason=(
                f"{what}: Spark refused to repartition the state from {before} to {partitions} partitions: "
                f"{message}. The job keeps its {before} partitions; see docs/rescaling.md for what Spark "
                "repartitions")), None
        # tests: the rescale's process killed with its copy repartitioned (the check's, or the save's)
        crash_point("rescale.repartitioned" if self.config.save_rescaled else "rescale.check.repartitioned")
        after = SparkCheckpoint(scratch).view()
        found = current_partitions(after)
        if after.batch_id != manifest.batch_id + 1 or found != partitions:
            return RestoreCheck(CheckOutcome.INCONCLUSIVE, (
                f"{what}: Spark's repartition returned, but the copy is at batch {after.batch_id} with {found} "
                f"partitions; expected batch {manifest.batch_id + 1} with {partitions}. No verdict")), None
        log.info("job %s: repartitioned the state of %s from %s to %d partitions in %.1f s (batch %d, %d files, "
                 "%d bytes)", self.config.job, manifest.snapshot_id, before, partitions, time.monotonic() - started,
                 after.batch_id, len(after.files), sum(f.size for f in after.files))
        return None, partitions

    def _rescaled(self, report: RestoreCheck, scratch: Storage, manifest: Manifest, batch: int) -> RestoreCheck:
        """With --save-rescaled: the repartitioned copy at its repartition batch, as a savepoint of its own
        (trigger rescale), once the check's batch proved that the job runs on it."""
        if not self.config.save_rescaled:
            return report
        from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot

        result = create_snapshot(
            self.store, scratch, kind=Kind.SAVEPOINT, trigger=Trigger.RESCALE, batch_id=batch, write_ahead=False,
            code_version=self.config.code_version or manifest.code_version, spark_version=manifest.spark_version,
            labels={RESCALED_FROM: manifest.snapshot_id, PARTITIONS_BEFORE: str(manifest.state_partitions)},
            on_step=lambda step: crash_point(f"rescale.save.{step}"),  # tests: killed while saving (no manifest)
            inline_max=self.config.snapshot_inline_bytes,
        )
        saved = result.manifest
        log.info("job %s: rescaled savepoint %s (batch %d, %s partitions, from %s with %s)", self.config.job,
                 saved.snapshot_id, saved.batch_id, saved.state_partitions, manifest.snapshot_id,
                 manifest.state_partitions)
        return replace(report, rescaled_snapshot_id=saved.snapshot_id, reason=(
            f"{report.reason}; saved as savepoint {saved.snapshot_id} (batch {saved.batch_id}, "
            f"{saved.state_partitions} partitions)"))

    def _edit(self, spark: SparkSession, scratch: Storage, manifest: Manifest,
              edit: StateEdit) -> RestoreCheck | None:
        """``edit`` of the restored copy's state into its next batch (runtime/staterewrite.py); a refusal's verdict,
        or None once the copy holds the rewritten batch."""
        what = f"{describe_edit(edit)} in snapshot {manifest.snapshot_id} (batch {manifest.batch_id})"
        if SparkCheckpoint(scratch).view(manifest.batch_id).next_offsets is not None:
            return RestoreCheck(CheckOutcome.BAD_INPUT, (
                f"{what}: the snapshot holds batch {manifest.batch_id + 1} planned but not committed; its data would "
                "be read again after the rewritten batch. Take a savepoint with stop with savepoint (no planned "
                "batch) and edit that one"))
        log.info("job %s: %s on a copy at %s", self.config.job, what, scratch.url)
        started = time.monotonic()
        if isinstance(edit, KeyDeletion):
            self.rewrite = rewrite_state(spark, scratch, manifest.batch_id, {edit.operator_id: edit_transform(edit)})
            touched, verb = self.rewrite.rows_removed, "delete"
        else:
            self.rewrite = rewrite_state(spark, scratch, manifest.batch_id, changes={edit.table: edit_transform(edit)})
            touched, verb = self.rewrite.rows_changed, "change"
        log.info("job %s: rewrote the state of %s in %.1f s: %s", self.config.job, manifest.snapshot_id,
                 time.monotonic() - started, self.rewrite.describe())
        if touched == 0:
            return RestoreCheck(CheckOutcome.BAD_INPUT, (
                f"{what}: expected at least one state row to {verb}, found none ({self.rewrite.describe()}): the "
                f"predicate selects no row, or the values are already so. Look at the rows with `ckpt state read "
                f"{manifest.snapshot_id} --table ...`; no savepoint was written"))
        return None

    def _rewritten(self, report: RestoreCheck, scratch: Storage, manifest: Manifest, batch: int,
                   edit: StateEdit) -> RestoreCheck:
        """The edited copy at its rewrite batch, as a new savepoint, once the check's batch proved that the job
        runs on it."""
        from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot

        assert self.rewrite is not None
        labels = {REWRITTEN_FROM: manifest.snapshot_id}
        if isinstance(edit, KeyDeletion):
            labels |= {KEYS_DELETED: str(edit), ROWS_REMOVED: str(self.rewrite.rows_removed)}
        else:
            labels |= {VALUES_SET: str(edit), ROWS_CHANGED: str(self.rewrite.rows_changed)}
        result = create_snapshot(
            self.store, scratch, kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL, batch_id=batch, write_ahead=False,
            code_version=self.config.code_version or manifest.code_version, spark_version=manifest.spark_version,
            labels=labels, inline_max=self.config.snapshot_inline_bytes,
        )
        saved = result.manifest
        log.info("job %s: savepoint %s (batch %d) is %s after %s: %s", self.config.job, saved.snapshot_id,
                 saved.batch_id, manifest.snapshot_id, describe_edit(edit), self.rewrite.describe())
        return replace(report, rewritten_snapshot_id=saved.snapshot_id, reason=(
            f"{report.reason}; {describe_edit(edit)}: {self.rewrite.describe()}; saved as savepoint "
            f"{saved.snapshot_id} (batch {saved.batch_id})"))

    def _choose(self, scratch: Storage) -> tuple[Manifest | None, str]:
        """The snapshot a start with ``config.restore`` would restore, and a note for the reason.

        Planned against the empty scratch location: the newest restorable snapshot of the lineage (or
        the one named). A start would keep an intact live checkpoint that is newer instead; its state
        has the schema of the snapshots before it, so the newest snapshot stands for it.
        """
        spec = self.config.restore
        plan, _ = plan_start(self.store, scratch, spec)
        live = self._live_batch()
        if plan.action is StartAction.RESTORE:
            assert plan.snapshot is not None
            m = plan.snapshot
            note = ""
            if live is not None and live > m.batch_id and spec.mode is RestoreMode.LATEST_STATE:
                note = (f"the live checkpoint is at batch {live}, newer than every snapshot: checked the newest "
                        f"snapshot, {m.kind.value} {m.snapshot_id} (batch {m.batch_id}), as its state has the "
                        "same operators and schemas")
            return m, note
        if spec.mode is RestoreMode.NONE:
            return None, "restore strategy none: the new code starts without state; there is nothing to restore"
        if live is not None:
            raise CkptError(
                f"no snapshot of job {self.config.job} to check against: the live checkpoint "
                f"{self.config.checkpoint} has state (batch {live}) but the job store holds no snapshot of it; "
                "take one (`ckpt job savepoint`) and check again"
            )
        return None, f"job {self.config.job} has no state yet (no snapshot, no live checkpoint): the new code " \
                     "starts without state; there is nothing to restore"

    def _live_batch(self) -> int | None:
        """The live checkpoint's latest completed batch (its commits/ listing only), None if unknown."""
        try:
            return SparkCheckpoint(open_storage(self.config.live_checkpoint, self.s3)).latest_completed_batch()
        except CkptError as err:
            log.info("job %s: restore check: the live checkpoint cannot be read (%s)", self.config.job, err)
            return None

    def _load(self) -> JobBuilder:
        from airflow_ckpt_provider.runtime.jobfile import load_builder

        try:
            return load_builder(self.job_file)
        except CkptError:
            raise
        except Exception as err:  # the job file itself is broken: there is nothing to check
            log.exception("job %s: loading %s failed", self.config.job, self.job_file)
            if isinstance(err, ModuleNotFoundError) and err.name:
                from airflow_ckpt_provider.runtime.failures import missing_module_message

                raise CkptError(f"the job file {self.job_file} does not load: "
                                f"{missing_module_message(err.name, 'in the driver')}") from err
            raise CkptError(f"the job file {self.job_file} does not load: {type(err).__name__}: {err}") from err

    def _run_batch(self, build: JobBuilder, spark: SparkSession, scratch: Storage) -> RestoreCheck | None:
        """Build the new query, swap its sink for noop, run the empty batch; a failure's verdict or None."""
        from pyspark.errors import AnalysisException

        from airflow_ckpt_provider.kafka.source import CkptKafkaDataSource
        from airflow_ckpt_provider.runtime.driver import JobContext

        # The source only: register() would also install the listener that commits the consumer group's
        # offsets after a batch, and the check's batch must not move the running job's group back.
        spark.dataSource.register(CkptKafkaDataSource)
        spark.sparkContext.setLogLevel("WARN")
        try:
            writer = build(spark, JobContext(self.config, _check_lease(self.store)))
        except Exception as err:
            log.error("job %s: the job's build function failed: %s: %s", self.config.job, type(err).__name__, err,
                      exc_info=err)
            deterministic = isinstance(err, (CkptError, AnalysisException, SyntaxError, ImportError, NameError,
                                             TypeError))
            message, condition = spark_error(err)
            return RestoreCheck(
                CheckOutcome.INCOMPATIBLE if deterministic else CheckOutcome.INCONCLUSIVE, error_class=condition,
                reason=f"the build function of {self.name} failed: {type(err).__name__}: {message}",
            )
        gate.close_gate()  # belt and braces: the source offers no new data (the check's own gate)
        try:
            return self._await(_noop(writer, scratch.url, self.config.job))
        except Exception as err:  # start() refused the query (analysis), or awaiting it failed
            message, condition = spark_error(err)
            return self._refused(message, condition)
        finally:
            gate.open_gate()

    def _await(self, writer: DataStreamWriter) -> RestoreCheck | None:
        from pyspark.errors import StreamingQueryException

        query = writer.start()
        try:
            finished = query.awaitTermination(max(1, round(self.config.check_timeout)))
        except StreamingQueryException:
            finished = True
        if not finished:
            query.stop()
            return RestoreCheck(
                CheckOutcome.INCONCLUSIVE,
                reason=f"the check's batch did not finish within {self.config.check_timeout:g} s; no verdict. "
                "Give the check more time (the batch loads the whole state), or check the driver's output",
            )
        failure = query.exception()
        if failure is None:
            self.new_sources = _source_ids(query)
            return None
        return self._refused(*spark_error(failure))

    def _refused(self, message: str, condition: str | None) -> RestoreCheck:
        reason = (f"{self.name} cannot restore the state: Spark refused to run the new query on it: {message}. "
                  "Keep the running version; make the new code keep the state's operators and schemas, or start "
                  "it without state (--restore none)")
        found = operators_in_error(message) if condition == OPERATORS_MISMATCH else None
        if found is None:
            return RestoreCheck(CheckOutcome.INCOMPATIBLE, reason, error_class=condition)
        held, ran = found
        if self.config.allow_non_restored_state:
            reason += ("; --allow-non-restored-state cannot help: Spark itself refuses a query whose stateful "
                       "operators differ from those in the state's metadata")
        return RestoreCheck(
            CheckOutcome.INCOMPATIBLE, reason, error_class=condition, new_operators=tuple(sorted(ran)),
            non_restored_operators=tuple(op for op in sorted(held) if ran.get(op) != held[op]),
        )

    def _scratch(self) -> tuple[Storage, Callable[[], None]]:
        """An empty location for the copy, next to the live checkpoint's kind, and how to delete it.

        Local for a local live checkpoint; otherwise a sibling of it on the same file system (executors
        of a cluster write state files there, so it must be where they can reach). A local copy is marked with
        this process's pid (core/snapshots/scratch.py): the copies of checks killed before they deleted theirs are
        removed here first.
        """
        location = self.config.live_checkpoint.rstrip("/")
        if urlparse(location).scheme in ("", "file"):
            sweep_scratch(SCRATCH_PREFIX, self.config.job)  # copies of killed checks, of any job of this host
            root = make_scratch(f"{SCRATCH_PREFIX}{self.config.job}-", self.config.job)
            return LocalStorage(root / "checkpoint"), lambda: shutil.rmtree(root, ignore_errors=True)
        storage = open_storage(f"{location}-restore-check-{uuid.uuid4().hex[:8]}", self.s3)

        def delete() -> None:
            try:
                storage.delete([o.key for o in storage.list()])
            except StorageError as err:
                log.warning("job %s: could not delete the restore check's copy %s: %s", self.config.job,
                            storage.url, err)

        return storage, delete


def _noop(writer: DataStreamWriter, location: str, job: str) -> DataStreamWriter:
    """The user's writer with Spark's noop sink and one batch (Trigger.Once runs the logged batch only).

    ``format`` replaces whatever sink the writer had (foreachBatch, foreach, a format); the output mode,
    the query's DataFrame and its options stay.
    """
    return (writer.format("noop").option("checkpointLocation", location).queryName(f"{job}-restore-check")
            .trigger(once=True))


#: Spark's refusals of a state schema the new query declares.
SCHEMA_REFUSALS = ("STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE")


def _schemas(scratch: Storage, keys: list[str]) -> Schemas:
    """The newest state schema file of each transformWithState operator among the copy's ``keys``, parsed (an
    unreadable one is left out: Spark's own check still runs)."""
    found: Schemas = {}
    for op, key in newest_schema_files(keys).items():
        try:
            found[op] = (key, parse_schema_file(scratch.read(key)))
        except ValueError as err:
            log.warning("restore check: cannot read the state schema file %s (%s); comparing without it", key, err)
    return found


def _encoding(scratch: Storage, batch: int) -> str | None:
    """The state encoding (unsaferow, avro) the copy's offsets log fixed for the query."""
    try:
        conf = parse_log_entry(scratch.read(f"offsets/{batch}"), kind="offsets").metadata.get("conf") or {}
    except (StorageError, ValueError, UnicodeDecodeError):
        return None
    value = conf.get(ENCODING_CONF)
    return None if value is None else str(value)


def _check_lease(store: JobStore) -> Lease:
    """A lease the check never takes: epoch 0, so a build function can read ``ctx.epoch``; a sink that
    checks it would be fenced (the check replaces the sink, so none does)."""
    lease = Lease(store)
    lease.record = LeaseRecord(job=store.job, epoch=0, owner=f"restore-check:{lease.owner}", host="", pid=0,
                               acquired_at=0.0, released=True)
    return lease


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)



def _named_sources(scratch: Storage, batch: int) -> dict[str, str | None] | None:
    """The sources of offset log v2 entry ``batch`` by name with their offsets; None for an offset log v1."""
    entry = parse_log_entry(scratch.read(f"offsets/{batch}"), kind="offsets")
    return None if entry.source_ids is None else dict(zip(entry.source_ids, entry.offsets, strict=True))


def _source_ids(query: Any) -> list[str] | None:
    """The source ids a micro-batch query ran with (its names, with source evolution), None if Spark does not say."""
    try:
        return str(query._jsq.streamingQuery().sourceIdMap().keys().mkString("\n")).split("\n")
    except Exception as err:  # a continuous query, or a Spark without the map: no comparison, not a failure
        log.info("the check's query does not name its sources (%s): sources are not compared", err)
        return None
