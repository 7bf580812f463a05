"""The job driver: what Flink's JobManager does for a job, for one Structured Streaming query.

Runs in the Spark driver's Python process. It takes the lease, restores, starts the user's query,
then loops: batch events (status, checkpoint snapshots), the lease (fencing), control requests
(savepoint, stop, cancel), heartbeats and timed savepoints. ``run()`` returns the exit code.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core import gate
from airflow_ckpt_provider.core.control import Ack, Action, Outcome, Request, open_requests, write_ack
from airflow_ckpt_provider.core.deployments import LAUNCH_ENV, read_launch
from airflow_ckpt_provider.core.errors import CkptError, StorageError
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.lease import FencedError, Lease
from airflow_ckpt_provider.core.manifest import Kind, Trigger
from airflow_ckpt_provider.core.retention import RetentionPolicy
from airflow_ckpt_provider.core.snapshots import SnapshotResult
from airflow_ckpt_provider.core.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.storage import S3Options, Storage, open_storage
from airflow_ckpt_provider.runtime.config import RestoreSpec, RuntimeConfig, TimeTravel
from airflow_ckpt_provider.runtime.datasources import check_output_mode, register_data_sources
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_FENCED, EXIT_STOPPED
from airflow_ckpt_provider.runtime.snapshotter import SnapshotJob, SnapshotOutcome, Snapshotter
from airflow_ckpt_provider.runtime.startup import plan_start, prepare_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)

TICK = 0.1  # seconds between looks at the query; detection and boundary waits are this fine
STOP_BOUNDARY_TIMEOUT = 600.0


class JobContext:
    """What the user's build function gets besides the SparkSession: the job, its epoch, fencing."""

    def __init__(self, config: RuntimeConfig, lease: Lease) -> None:
        self.config = config
        self.job = config.job
        self._lease = lease

    @property
    def epoch(self) -> int:
        """This driver's lease epoch: sinks can use it to fence writes of older drivers."""
        return self._lease.epoch

    def check_lease(self) -> None:
        """Raise FencedError if a newer driver took the job (then nothing must be committed)."""
        self._lease.check()

    def fenced(self, fn: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
        """A foreachBatch function that refuses to write, and to let Spark commit, once fenced."""

        def run(df: DataFrame, batch_id: int) -> None:
            self._lease.check()
            fn(df, batch_id)
            self._lease.check()  # the last look before Spark writes commits/<batch_id>

        return run


JobBuilder = Callable[["SparkSession", JobContext], "DataStreamWriter"]


@dataclass(frozen=True)
class BatchEvent:
    """A batch completed; ``batch_id`` -1: a trigger found no new data (Spark's QueryIdleEvent)."""

    batch_id: int
    offsets: dict[str, Any]
    data_waiting: bool
    rows: int

    @property
    def idle(self) -> bool:
        return self.batch_id < 0


class _Listener:
    """Forwards batch progress to the driver loop (listener calls must return quickly)."""

    def __init__(self, events: queue.Queue[BatchEvent]) -> None:
        self.events = events

    def as_spark_listener(self) -> Any:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        events = self.events

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                offsets, waiting = {}, False
                for i, s in enumerate(p.sources):
                    end = _json(s.endOffset)
                    offsets[_source_name(i, s.description)] = end
                    latest = _json(s.latestOffset)
                    waiting = waiting or (latest is not None and latest != end)
                events.put(BatchEvent(int(p.batchId), offsets, waiting, int(p.numInputRows)))

            def onQueryIdle(self, event: Any) -> None:  # posted at most every noDataProgressEventInterval
                events.put(BatchEvent(-1, {}, False, 0))

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()


def _timeline_refusal(failure: str) -> str | None:
    """The sink's own message if ``failure`` is a batch refused for its timeline (sinks/timelines.REFUSED)."""
    from airflow_ckpt_provider.sinks.timelines import REFUSED

    for line in failure.splitlines():
        if REFUSED in line:
            return line[line.index(REFUSED) + len(REFUSED):].strip()
    return None


def _source_name(index: int, description: str) -> str:
    """A stable name for a source: Spark's description without the JVM object hash."""
    return f"{index}:{re.sub(r'@[0-9a-f]+$', '', description).rsplit('.', 1)[-1]}"


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


class JobDriver:
    """Run one job until it is stopped, canceled, fenced or fails; ``run()`` returns the exit code."""

    def __init__(
        self, config: RuntimeConfig, build: JobBuilder, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.build = build
        self.clock = clock
        s3 = S3Options.from_env(config.endpoint_url, config.region)
        self.store = JobStore.open(config.store, config.job, s3)
        self.live: Storage = open_storage(config.checkpoint, s3)
        self.lease = Lease(self.store, poll_interval=config.poll_interval)
        self.events: queue.Queue[BatchEvent] = queue.Queue()
        self.outcomes: queue.Queue[SnapshotOutcome] = queue.Queue()
        self.started_at = time.time()
        self.status: JobStatus | None = None
        self.query: StreamingQuery | None = None
        self.snapshotter: Snapshotter | None = None
        self._signal: str | None = None
        self._new_batches = 0
        self._handled: set[str] = set()  # requests taken on (a savepoint is acked only when done)
        self._lease_confirmed = clock()

    # -- entry -------------------------------------------------------------------------------

    def run(self, spark_factory: Callable[[], SparkSession] | None = None) -> int:
        """Refuse bad input, build the query, take the lease, restore, run; returns the exit code.

        Everything that can be refused (the restore, the job's build function) is checked before the
        lease is taken: taking it fences the running driver, and an invalid start must not stop it.
        """
        job, spec = self.config.job, self.config.restore_spec()
        try:
            plan_start(self.store, self.live, spec, TimeTravel.parse(self.config.time_travel))
        except StorageError as err:
            log.error("job %s: cannot start: %s", job, err)
            return EXIT_FAILED
        except CkptError as err:
            log.error("job %s: cannot start: %s", job, err)
            return EXIT_CONFIG
        spark = (spark_factory or _default_spark)()
        register_data_sources(spark)  # the ckpt-kafka source and writer, the ckpt-files sink
        spark.sparkContext.setLogLevel("WARN")
        try:
            writer = self.build(spark, JobContext(self.config, self.lease))
            check_output_mode(writer)
        except Exception as err:
            return self._build_failed(err)
        listener = _Listener(self.events).as_spark_listener()
        spark.streams.addListener(listener)
        try:
            return self._start(spark, writer, spec)
        finally:
            if self.snapshotter is not None:
                for dropped in self.snapshotter.close():
                    self._ack(str(dropped.request_id), Action.SAVEPOINT, None, "the driver stopped before taking it")
            spark.streams.removeListener(listener)

    def _build_failed(self, err: Exception) -> int:
        from pyspark.errors import AnalysisException

        log.error("job %s: the job's build function failed: %s: %s", self.config.job, type(err).__name__, err,
                  exc_info=err)
        # The same code fails the same way after a restart; anything else (a metastore hiccup) may not.
        deterministic = isinstance(err, (CkptError, AnalysisException, SyntaxError, ImportError, NameError, TypeError))
        return EXIT_CONFIG if deterministic else EXIT_FAILED

    def _start(self, spark: SparkSession, writer: DataStreamWriter, spec: RestoreSpec) -> int:
        job = self.config.job
        superseded = _superseded(self.store)
        if superseded:  # an upgrade's rollback or a restart launched another deployment meanwhile
            log.warning("job %s: not taking the lease: %s", job, superseded)
            return EXIT_FENCED
        try:
            self.lease.acquire()
            self._report(JobState.STARTING, "lease taken", app_id=spark.sparkContext.applicationId,
                         ui_url=spark.sparkContext.uiWebUrl)
            self._wait_for_grace(self.lease.grace(self.config.fence_grace))
            plan = prepare_checkpoint(self.store, self.live, spec, epoch=self.lease.epoch,
                                      policy=TimeTravel.parse(self.config.time_travel))
            self._report(JobState.STARTING, plan.reason,
                         restored_from=plan.snapshot.snapshot_id if plan.snapshot else None)
            self.lease.check()
            self._lease_confirmed = self.clock()
            self.snapshotter = self._snapshotter(spark)
            gate.open_gate()
            self.query = writer.option("checkpointLocation", self.config.checkpoint).queryName(job).start()
            log.info("job %s epoch %d: query %s started (run %s), checkpoint %s", job, self.lease.epoch,
                     self.query.id, self.query.runId, self.config.checkpoint)
            self._report(JobState.RUNNING, "running")
            return self._loop()
        except FencedError as err:
            return self._fenced(err)
        except StorageError as err:
            log.error("job %s: %s", job, err)
            self._report_final(JobState.FAILED, f"job store error: {err}")
            return EXIT_FAILED
        except CkptError as err:  # the checkpoint changed while the previous driver was stopping
            log.error("job %s: cannot start: %s", job, err)
            self._report_final(JobState.FAILED, f"cannot start: {err}")
            return EXIT_CONFIG

    def _snapshotter(self, spark: SparkSession) -> Snapshotter:
        retention = RetentionPolicy(checkpoints_keep=self.config.keep_checkpoints,
                                    savepoints_max_count=self.config.keep_savepoints)
        return Snapshotter(
            self.store, self.live, retention=retention, fence=self._fence, on_done=self.outcomes.put,
            code_version=self.config.code_version, spark_version=spark.version,
            labels={"epoch": str(self.lease.epoch)},
        )

    def _wait_for_grace(self, seconds: float) -> None:
        """A driver we took the lease from may still be running: give it the time to notice."""
        if seconds > 0:
            log.info("job %s epoch %d: waiting %.1f s for the previous driver to notice it is fenced",
                     self.config.job, self.lease.epoch, seconds)
            time.sleep(seconds)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> int:
        assert self.query is not None
        assert self.snapshotter is not None
        cfg = self.config
        now = self.clock()
        next_poll = now + cfg.poll_interval
        next_beat = now + cfg.heartbeat_interval
        next_savepoint = now + cfg.savepoint_interval if cfg.savepoint_interval else None
        last_checkpoint = now
        for name in ("SIGTERM", "SIGINT"):
            _on_signal(name, self._on_signal)
        while True:
            self._drain_events()
            if self._new_batches and cfg.checkpoint_interval is not None and (
                self.clock() - last_checkpoint >= cfg.checkpoint_interval
            ):
                self.snapshotter.checkpoint_now()
                self._new_batches, last_checkpoint = 0, self.clock()
            self._drain_outcomes()
            if not self.query.isActive:
                return self._failed()
            now = self.clock()
            if self._signal:
                return self._cancel(None, f"{self._signal} received")
            if now >= next_poll:
                next_poll = now + cfg.poll_interval
                if not self._lease_held(now):
                    return self._failed("cannot confirm the lease: the job store is unreachable")
                for request in self._requests():
                    code = self._handle(request)
                    if code is not None:
                        return code
            if next_savepoint is not None and now >= next_savepoint:
                next_savepoint = now + (cfg.savepoint_interval or 0)
                self.snapshotter.savepoint(Trigger.PERIODIC)
            if now >= next_beat:
                next_beat = now + cfg.heartbeat_interval
                self._report(JobState.RUNNING, "running")
            time.sleep(TICK)

    def _state(self) -> JobState:
        return self.status.state if self.status else JobState.RUNNING

    def _reason(self) -> str:
        return self.status.reason if self.status else "running"

    def _fence(self) -> None:
        self.lease.check()

    def _lease_held(self, now: float) -> bool:
        """Confirm the lease (FencedError if lost); False once it could not be read for too long,
        since a newer driver waits only ``fence_grace`` for this one to notice it is fenced."""
        try:
            self.lease.check()
        except StorageError as err:
            log.warning("job %s: cannot read the lease: %s", self.config.job, err)
            return now - self._lease_confirmed < self.config.fence_grace - self.config.poll_interval
        self._lease_confirmed = now
        return True

    def _drain_events(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event.idle:
                if self.status is not None and not self.status.idle:  # caught up: one line, one write
                    log.info("job %s epoch %d: caught up, no new data", self.config.job, self.lease.epoch)
                    self._report(self._state(), self._reason(), idle=True, data_waiting=False)
                continue
            self._new_batches += 1
            log.info("job %s epoch %d batch %d: completed, %d rows", self.config.job, self.lease.epoch,
                     event.batch_id, event.rows)
            self._report(self._state(), self._reason(), batch_id=event.batch_id, offsets=event.offsets,
                         data_waiting=event.data_waiting, idle=False)

    def _drain_outcomes(self) -> None:
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return
            if outcome.result is not None:
                self._report(self._state(), self._reason(), last_snapshot=_snapshot_info(outcome.result))
            if outcome.job.request_id is not None:
                self._ack(outcome.job.request_id, Action.SAVEPOINT, outcome.result, outcome.error)

    def _requests(self) -> list[Request]:
        try:
            found = open_requests(self.store, on_malformed=self._reject_malformed)
        except StorageError as err:
            log.warning("job %s: cannot read control requests, will retry: %s", self.config.job, err)
            return []
        fresh = [r for r in found if r.id not in self._handled]
        self._handled.update(r.id for r in fresh)
        return fresh

    def _reject_malformed(self, request_id: str, problem: str) -> None:
        self._write_ack(Ack(request_id, None, Outcome.REJECTED,
                            f"rejected: {problem}; expected a request written by `ckpt job` (action savepoint, "
                            "stop or cancel, and the driver's epoch)", self.lease.epoch, time.time()))

    # -- control requests --------------------------------------------------------------------

    def _handle(self, request: Request) -> int | None:
        assert self.snapshotter is not None
        epoch = self.lease.epoch
        log.info("job %s epoch %d: control request %s (%s) from %s", self.config.job, epoch, request.id,
                 request.action.value, request.requested_by)
        if request.epoch != epoch:
            self._ack(request.id, request.action, None,
                      f"rejected: the request was for the driver of epoch {request.epoch}, this driver runs epoch "
                      f"{epoch}; check `ckpt job status` and send it again", Outcome.REJECTED)
            return None
        if request.action is Action.SAVEPOINT:  # answered when the snapshot completed or failed
            self.snapshotter.savepoint(Trigger.MANUAL, request.id)
            return None
        if request.action is Action.STOP:
            return self._stop_with_savepoint(request)
        return self._cancel(request, "canceled on request")

    def _stop_with_savepoint(self, request: Request) -> int | None:
        """Finish the batch in flight, plan no new one, take a final savepoint, exit 0."""
        assert self.query is not None
        assert self.snapshotter is not None
        job, epoch = self.config.job, self.lease.epoch
        self._report(JobState.STOPPING, f"stop with savepoint ({request.id})")
        if not gate.close_gate():
            log.warning("job %s: no admission gate (CKPT_GATE_FILE unset): stopping at the next batch boundary "
                        "as seen from the driver; a batch planned in that instant is replayed after restore", job)
        try:
            if not self._wait_for_boundary(STOP_BOUNDARY_TIMEOUT):
                self._report(JobState.RUNNING, "running")
                self._ack(request.id, request.action, None,
                          f"the batch in flight did not complete within {STOP_BOUNDARY_TIMEOUT:.0f} s; the job keeps "
                          "running: check its progress, or cancel it", Outcome.FAILED)
                return None
            failure = self.query.exception() if not self.query.isActive else None
            self.query.stop()
        finally:
            gate.open_gate()
        self._drain_events()
        if failure is not None:
            self._ack(request.id, request.action, None, f"the query failed while stopping: {failure}", Outcome.FAILED)
            return self._failed()
        offsets, commits = _last_entry(self.live, "offsets/"), _last_entry(self.live, "commits/")
        if offsets != commits:  # e.g. a no-data batch a watermark planned: it is replayed after a restore
            log.warning("job %s: stopped with offsets/%s not committed (last commit %s); a restore replays it",
                        job, offsets, commits)
        if not self.snapshotter.drain(timeout=300):
            log.warning("job %s: a background snapshot still runs after 300 s; taking the final savepoint anyway", job)
        self._drain_outcomes()
        try:
            result = self.snapshotter.take(SnapshotJob(Kind.SAVEPOINT, Trigger.STOP, request.id))
        except FencedError as err:
            return self._fenced(err)
        except CkptError as err:
            # The query is stopped at a completed batch: the live checkpoint is intact and a restart resumes.
            self._report_final(JobState.STOPPED, f"stopped; final savepoint failed: {err}")
            self._ack(request.id, request.action, None, f"stopped, but the final savepoint failed: {err}",
                      Outcome.FAILED)
            return EXIT_STOPPED
        log.info("job %s epoch %d: stopped with savepoint %s at batch %d", job, epoch,
                 result.manifest.snapshot_id, result.manifest.batch_id)
        # Status first, then the ack: whoever waits for the ack (an upgrade) may start the next driver.
        self._report_final(JobState.STOPPED, f"stopped with savepoint {result.manifest.snapshot_id}",
                           last_snapshot=_snapshot_info(result), batch_id=result.manifest.batch_id)
        self._ack(request.id, request.action, result, None)
        return EXIT_STOPPED

    def _wait_for_boundary(self, timeout: float) -> bool:
        """True once no trigger runs and every offsets entry has its commit (heartbeats go on)."""
        assert self.query is not None
        deadline = self.clock() + timeout
        next_beat = self.clock() + self.config.heartbeat_interval
        while self.clock() < deadline:
            if not self.query.isActive:
                return True
            if not self.query.status["isTriggerActive"] and _last_entry(self.live, "offsets/") == _last_entry(
                self.live, "commits/"
            ):
                return True
            self._drain_events()
            if self.clock() >= next_beat:
                next_beat = self.clock() + self.config.heartbeat_interval
                self._report(self._state(), self._reason())
            time.sleep(TICK)
        return False

    def _cancel(self, request: Request | None, reason: str) -> int:
        """Stop now: a batch in flight is dropped and replayed after a restart."""
        assert self.query is not None
        self._report(JobState.STOPPING, reason)
        self.query.stop()
        self._drain_events()
        batch = _last_entry(self.live, "commits/")
        log.info("job %s epoch %d: %s; the latest completed batch is %s", self.config.job, self.lease.epoch,
                 reason, batch)
        self._report_final(JobState.STOPPED, reason)
        if request is not None:
            self._write_ack(Ack(request.id, request.action, Outcome.COMPLETED,
                                f"canceled; the latest completed batch is {batch}", self.lease.epoch, time.time(),
                                batch_id=batch))
        return EXIT_STOPPED

    def _failed(self, why: str | None = None) -> int:
        assert self.query is not None
        try:  # a batch refused by the fence fails the query: that is a fenced driver, not a failed job
            self.lease.check()
        except FencedError as err:
            return self._fenced(err)
        except StorageError:
            pass
        if why is not None:
            self.query.stop()
            message = why
        else:
            failure = self.query.exception()
            message = str(failure).strip().splitlines()[0] if failure else "the query stopped without an exception"
            refused = _timeline_refusal(str(failure or ""))
            if refused:  # a restart replans the same batch and the sink refuses it again: fail fast
                log.error("job %s epoch %d: a sink refused the batch: %s", self.config.job, self.lease.epoch, refused)
                self._report_final(JobState.FAILED, f"a sink refused the batch: {refused}")
                return EXIT_CONFIG
        log.error("job %s epoch %d: query failed: %s", self.config.job, self.lease.epoch, message)
        self._report_final(JobState.FAILED, f"query failed: {message}")
        return EXIT_FAILED

    def _fenced(self, err: FencedError) -> int:
        log.error("job %s: %s", self.config.job, err)
        if self.query is not None and self.query.isActive:
            self.query.stop()
        return EXIT_FENCED  # the status belongs to the newer driver now: leave it alone

    # -- reporting ---------------------------------------------------------------------------

    def _ack(self, request_id: str, action: Action, result: SnapshotResult | None, error: str | None,
             outcome: Outcome | None = None) -> None:
        m = result.manifest if result else None
        self._write_ack(Ack(
            request_id, action, outcome or (Outcome.COMPLETED if m else Outcome.FAILED),
            error or f"{m.kind.value if m else ''} {m.snapshot_id if m else ''} at batch {m.batch_id if m else ''}",
            self.lease.epoch, time.time(), snapshot_id=m.snapshot_id if m else None,
            snapshot_uri=result.uri if result else None, batch_id=m.batch_id if m else None,
        ))

    def _write_ack(self, ack: Ack) -> None:
        log.info("job %s epoch %d: request %s %s: %s", self.config.job, ack.epoch, ack.id, ack.outcome.value,
                 ack.message)
        try:
            write_ack(self.store, ack)
        except StorageError as err:
            log.error("job %s: cannot write the ack of request %s: %s", self.config.job, ack.id, err)

    def _report(self, state: JobState, reason: str, **changes: Any) -> None:
        """Write status.json; a failed write is logged, never fatal (the next heartbeat retries)."""
        base = self.status or JobStatus(
            job=self.config.job, state=state, epoch=self.lease.epoch, updated_at=0.0, started_at=self.started_at,
            pid=os.getpid(), host=socket.gethostname(), code_version=self.config.code_version,
            heartbeat_interval=self.config.heartbeat_interval,
        )
        self.status = replace(base, state=state, reason=reason, updated_at=time.time(), **changes)
        try:
            write_status(self.store, self.status)
        except StorageError as err:
            log.warning("job %s: cannot write status, will retry: %s", self.config.job, err)

    def _report_final(self, state: JobState, reason: str, **changes: Any) -> None:
        self._report(state, reason, **changes)
        if self.lease.record is not None and not self.lease.release():
            log.warning("job %s: the lease was no longer ours at exit", self.config.job)

    def _on_signal(self, name: str) -> None:
        self._signal = name


def _snapshot_info(result: SnapshotResult) -> dict[str, Any]:
    m = result.manifest
    return {"id": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id, "uri": result.uri,
            "created_at": m.created_at}


def _superseded(store: JobStore) -> str:
    """Why this driver's launch (``CKPT_LAUNCH_ID``, set by launcher/deploy.py) is no longer the job's latest,
    recorded in spec/last.json; '' if it is, or the driver was not launched that way."""
    mine = os.environ.get(LAUNCH_ENV)
    if not mine:
        return ""
    try:
        last = read_launch(store)
    except StorageError:
        return ""
    if last is None or last.launch_id == mine:
        return ""
    return f"launch {mine} was superseded by launch {last.launch_id} ({last.launched_by})"


def _last_entry(storage: Storage, prefix: str) -> int | None:
    """The highest batch id logged under ``offsets/`` or ``commits/``."""
    ids = [int(name) for o in storage.list(prefix) if (name := o.key[len(prefix):]).isdigit()]
    return max(ids, default=None)


def _on_signal(name: str, handler: Callable[[str], None]) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(getattr(signal, name), lambda _signum, _frame: handler(name))


def _default_spark() -> SparkSession:
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()
