"""The job driver: what Flink's JobManager does for a job, for one Structured Streaming query.

Design notes: docs/runtime.md#design-notes-runtimedriverpy."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, CredentialsError, StorageError, UnreachableError
from airflow_ckpt_provider.core.policy import gate
from airflow_ckpt_provider.core.policy.modes import RestoreSpec
from airflow_ckpt_provider.core.policy.outage import Outage
from airflow_ckpt_provider.core.policy.streambatch import (
    EPOCH_OPTION,
    OUTCOMES_OPTION,
    SinkOutcome,
    forget_before_query_start,
    run_before_query_start,
    sink_outcome,
    wants_durable_plans,
)
from airflow_ckpt_provider.core.records.control import (
    Ack,
    BellWatch,
    Outcome,
    Request,
    RequestAction,
    open_requests,
)
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV, read_launch
from airflow_ckpt_provider.core.records.lease import FencedError, Lease
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.snapshots.statestore import STATE_FORMAT_CONF, state_format_note
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage
from airflow_ckpt_provider.runtime.batchevents import BatchEvent, BatchListener
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.controldoor import ControlDoor, open_door
from airflow_ckpt_provider.runtime.controlhandler import ControlHandler, fenced_exit
from airflow_ckpt_provider.runtime.datasources import check_output_mode, register_data_sources
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_STOPPED,
)
from airflow_ckpt_provider.runtime.failures import Recovery, classify
from airflow_ckpt_provider.runtime.leasewatch import LeaseWatch
from airflow_ckpt_provider.runtime.lineage import LineageEmitter, start_emitter
from airflow_ckpt_provider.runtime.lostapp import release_lost_application
from airflow_ckpt_provider.runtime.metrics import DriverMetrics
from airflow_ckpt_provider.runtime.plangate import PlanGate
from airflow_ckpt_provider.runtime.queryrestart import QueryRestarter
from airflow_ckpt_provider.runtime.reporting import DriverReporter, snapshot_info
from airflow_ckpt_provider.runtime.snapshotter import SnapshotOutcome, Snapshotter
from airflow_ckpt_provider.runtime.sparkchecks import IDLE_POLL, check_executors, check_spark_python, job_session
from airflow_ckpt_provider.runtime.standby import StandbySlot, await_go, warm_up
from airflow_ckpt_provider.runtime.startup import plan_start, prepare_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)

TICK = 0.1  # seconds between looks at the query; detection and boundary waits are this fine


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
        """Raise FencedError if a newer driver took the job (then nothing must be committed); StorageError if
        the job store has not answered for longer than the lease's outage tolerance (the query restarts)."""
        self._lease.confirm()

    def lease_held(self) -> None:
        """Raise UnreachableError unless the lease was confirmed within its outage tolerance, without a request (the
        lease watch confirms it every poll): the last look inside a database transaction, whose locks a request held
        up by a cut from the job store would keep from a newer driver (docs/reliability.md, finding 10)."""
        if not self._lease.tolerating():
            age = self._lease.monotonic() - self._lease.confirmed_at
            raise UnreachableError(f"job {self.job} epoch {self.epoch}: the lease was last confirmed {age:.1f} s ago, "
                                   f"beyond its outage tolerance of {self._lease.outage_tolerance:.1f} s: nothing "
                                   "may commit until the job store confirms it")

    def fenced(self, fn: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
        """A foreachBatch function that refuses to write, and to let Spark commit, once fenced; what it did with each
        batch is counted as sink ``foreachBatch`` (its rows are the function's own business: not counted)."""

        def run(df: DataFrame, batch_id: int) -> None:
            try:
                self._lease.confirm()
                fn(df, batch_id)
                self._lease.confirm()  # the last look before Spark writes commits/<batch_id>
            except FencedError:
                sink_outcome("foreachBatch", SinkOutcome.FENCED, batch_id)
                raise
            except BaseException:
                sink_outcome("foreachBatch", SinkOutcome.ABORTED, batch_id)
                raise
            sink_outcome("foreachBatch", SinkOutcome.COMMITTED, batch_id)

        return run


JobBuilder = Callable[["SparkSession", JobContext], "DataStreamWriter"]


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
        self.live: Storage = open_storage(config.live_checkpoint, s3)
        # A store outage shorter than this is ridden out; a newer driver waits it out after taking the lease.
        self.lease = Lease(self.store, poll_interval=config.lease_seconds,
                           outage_tolerance=config.fence_grace - config.lease_seconds)
        self.events: queue.Queue[BatchEvent] = queue.Queue()
        self.outcomes: queue.Queue[SnapshotOutcome] = queue.Queue()
        self.store_outage = Outage(config.job, "the job store")
        # What the driver measures (runtime/metrics.py): served and exported only where its settings say.
        self.metrics = DriverMetrics(config.job, config.code_version, epoch=lambda: self.lease.epoch,
                                     status=lambda: self.reporter.status,
                                     settings={"checkpoint_interval": config.checkpoint_interval,
                                               "heartbeat_interval": config.heartbeat_interval},
                                     restarted_for=lambda: self.reporter.restarted_for)
        self.reporter = DriverReporter(config, self.store, self.lease, outage=self.store_outage,
                                       sampler=self.metrics.take_sample)
        self.query: StreamingQuery | None = None
        self.snapshotter: Snapshotter | None = None
        self.lineage: LineageEmitter | None = None  # OpenLineage RUNNING events (runtime/lineage.py), if configured
        self.watch: LeaseWatch | None = None  # stops the query once the lease is unconfirmed (runtime/leasewatch.py)
        self.plans: PlanGate | None = None  # stores each planned batch before the sink may commit it (plangate.py)
        self.door: ControlDoor | None = None  # where askers knock after a control request (runtime/controldoor.py)
        self._writer: DataStreamWriter | None = None
        self._signal: str | None = None
        self._new_batches = 0
        self._handled: set[str] = set()  # requests taken on (a savepoint is acked only when done)
        self.bell = BellWatch(self.store, clock=clock)  # when to list control/ (core/records/control.py)
        self._batch_reported = False  # this driver's first batch is reported at once, the others with a heartbeat
        self._query_started = clock()
        self._started = time.monotonic()
        self.standby = StandbySlot.from_env()  # started as a warm standby (runtime/standby.py): waits for the go
        self._idle_poll = "?"  # spark.sql.streaming.pollingDelay of the session, once it exists
        self.restarter = QueryRestarter(
            config, store=self.store, live=self.live, lease=self.lease, reporter=self.reporter,
            outage=self.store_outage, start_query=self._restart_query, query_started=lambda: self._query_started,
            stop_signal=lambda: self._signal, drain_outcomes=self._drain_outcomes, clock=clock,
        )

    # -- entry -------------------------------------------------------------------------------

    def run(self, spark_factory: Callable[[], SparkSession] | None = None) -> int:
        """Refuse bad input, build the query, take the lease, restore, run; returns the exit code.

        Everything that can be refused (the restore, the job's build function) is checked before the
        lease is taken: taking it fences the running driver, and an invalid start must not stop it.
        """
        job, spec = self.config.job, self.config.restore
        try:
            plan_start(self.store, self.live, spec, self.config.time_travel)
        except CredentialsError as err:  # the same secret is refused again after any restart
            log.error("job %s: cannot start: %s", job, err)
            return EXIT_DENIED
        except StorageError as err:
            log.error("job %s: cannot start: %s", job, err)
            return EXIT_FAILED
        except CkptError as err:
            log.error("job %s: cannot start: %s", job, err)
            return EXIT_CONFIG
        spark = spark_factory() if spark_factory else job_session(self.config)
        if self.standby is None:  # a standby does it at its go: the running driver's application is no lost one
            release_lost_application(spark, self.store)  # a dead predecessor's application holding the cluster's cores
        lacking = (check_spark_python(spark) or check_executors(spark, self.config.executor_timeout)
                   or self._open_door())
        if lacking:  # a restart would not fix either: refused before the lease, nothing written
            log.error("job %s: cannot start: %s", job, lacking)
            return EXIT_CONFIG
        register_data_sources(spark)  # the ckpt-kafka source and writer, the ckpt-files sink
        self._idle_poll = str(spark.conf.get(IDLE_POLL[0]))  # said in the query's start line (Spark's default if unset)
        spark.sparkContext.setLogLevel("WARN")
        forget_before_query_start()  # the build function registers this job's own (kafka_sink: lingering aborts)
        try:
            writer = self._writer = self.build(spark, JobContext(self.config, self.lease))
            check_output_mode(writer)
        except Exception as err:
            return self._build_failed(err)
        return self._run_built(spark, writer, spec)

    def _run_built(self, spark: SparkSession, writer: DataStreamWriter, spec: RestoreSpec) -> int:
        """The job built: a standby warms up and waits for its go (before the listener, which counts the job's own
        batches), then the start (``_start``)."""
        waited = self._await_go(spark) if self.standby is not None else None
        if waited is not None:
            self._close()  # the door
            return waited
        lacking = self._open_metrics()  # after a standby's go: a fixed port is the active driver's until then
        if lacking:  # refused before the lease, as the door
            log.error("job %s: cannot start: %s", self.config.job, lacking)
            self._close()
            return EXIT_CONFIG
        listener = BatchListener(self.events).as_spark_listener()
        spark.streams.addListener(listener)
        try:
            return self._start(spark, writer, spec)
        finally:
            self._close()
            spark.streams.removeListener(listener)

    def _await_go(self, spark: SparkSession) -> int | None:
        """A standby's wait (runtime/standby.py), its session and job built: None at the go, EXIT_STOPPED if its
        supervisor is gone meanwhile."""
        assert self.standby is not None
        warmed = warm_up(spark)
        log.info("job %s: standby ready %.1f s after its start (%s): waiting for its supervisor's go",
                 self.config.job, time.monotonic() - self._started, warmed)
        why_not = await_go(self.standby)
        if why_not:
            log.info("job %s: standby ends without taking over: %s", self.config.job, why_not)
            return EXIT_STOPPED
        log.info("job %s: standby taking over (go from its supervisor)", self.config.job)
        release_lost_application(spark, self.store)
        return None

    def _open_door(self) -> str:
        """Open the control door and name it in the lease to be taken; why not if this host cannot bind its address
        (refused before the lease: an invalid start must not fence the running driver)."""
        try:
            self.door = open_door(self.config.job, self.config.control_door)
        except ConfigError as err:
            return str(err)
        self.lease.door = self.door.url if self.door is not None else None
        self.reporter.answered = self.door.answered if self.door is not None else None
        return ""

    def _open_metrics(self) -> str:
        """Serve and export the driver's metrics where its settings say (runtime/metrics.py); why not if this host
        cannot bind the address (refused before the lease, as the door)."""
        try:
            if self.config.metrics_address is not None:
                self.metrics.serve(self.config.metrics_address)
            if self.config.metrics_otlp is not None:
                self.metrics.export(self.config.metrics_otlp, self.config.metrics_interval)
        except ConfigError as err:
            self.metrics.close()
            return str(err)
        return ""

    def _close(self) -> None:
        """Stop what the start opened: the door, the metrics, the lease watch, the plan gate, lineage, the snapshot
        thread."""
        if self.door is not None:
            self.door.close()
        self.metrics.close()
        if self.watch is not None:
            self.watch.close()
        if self.plans is not None:
            self.plans.close()
        if self.lineage is not None:
            self.lineage.close()
        if self.snapshotter is not None:
            for dropped in self.snapshotter.close():
                self.reporter.ack(str(dropped.request_id), RequestAction.SAVEPOINT, None,
                                  "the driver stopped before taking it")

    def _build_failed(self, err: Exception) -> int:
        from pyspark.errors import AnalysisException

        self._close()  # the door

        log.error("job %s: the job's build function failed: %s: %s", self.config.job, type(err).__name__, err,
                  exc_info=err)
        failure = classify(err)  # a refused output mode, refused credentials: their own exit codes
        if not failure.restartable:
            return failure.exit_code
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
            self.reporter.carry_over()  # before the first report replaces the previous driver's status
            self.reporter.report(JobState.STARTING, "lease taken", app_id=spark.sparkContext.applicationId,
                                 ui_url=spark.sparkContext.uiWebUrl, metrics_url=self.metrics.url)
            self._wait_for_grace(self.lease.grace(self.config.fence_grace))
            plan = prepare_checkpoint(self.store, self.live, spec, epoch=self.lease.epoch,
                                      policy=self.config.time_travel, code_version=self.config.code_version)
            self.reporter.report(JobState.STARTING, plan.reason,
                                 restored_from=plan.snapshot.snapshot_id if plan.snapshot else None)
            if plan.snapshot is not None:
                self.metrics.restored(plan.snapshot.kind.value, plan.snapshot.created.timestamp())
            self._tell_state_format(spark)
            self.lease.check()
            self.snapshotter = self._snapshotter(spark)
            self.plans = self._plan_gate(self.snapshotter)  # started: _start_query resets it before each start
            gate.open_gate()
            try:
                self._start_query(writer)
            except Exception as err:  # Spark refused the query (analysis, state schema) or could not start it
                return self.reporter.end_failed(classify(err))
            self.watch = LeaseWatch(job, self.lease, lambda: self.query, poll=self.config.lease_seconds).start()
            self.reporter.report(JobState.RUNNING, "running")
            self.lineage = start_emitter(job, self.config.lineage_interval, self.lease.epoch,
                                         lambda: _launched_by(self.store))
            return self._loop(self._control())
        except FencedError as err:
            return fenced_exit(job, self.query, err)
        except StorageError as err:
            log.error("job %s: %s", job, err)
            self.reporter.report_final(JobState.FAILED, f"job store error: {err}")
            return EXIT_DENIED if isinstance(err, CredentialsError) else EXIT_FAILED
        except CkptError as err:  # the checkpoint changed while the previous driver was stopping
            log.error("job %s: cannot start: %s", job, err)
            self.reporter.report_final(JobState.FAILED, f"cannot start: {err}")
            return EXIT_CONFIG

    def _start_query(self, writer: DataStreamWriter) -> None:
        job = self.config.job
        run_before_query_start()  # the sinks' own preparation (the ckpt-kafka sink aborts lingering transactions)
        if self.plans is not None:
            self.plans.reset()
        writer = writer.option("checkpointLocation", self.config.live_checkpoint)
        self.lease.read_before_next_commit()  # the query's first commit reads the lease (core/records/lease.py)
        if self.metrics.outcomes is not None:  # the sinks count what they did with each batch (runtime/metrics.py)
            writer = writer.option(OUTCOMES_OPTION, self.metrics.outcomes)
        self.query = writer.option(EPOCH_OPTION, str(self.lease.epoch)).queryName(job).start()
        self._query_started = self.clock()
        log.info("job %s epoch %d: query %s started (run %s), checkpoint %s, idle sources polled every %s", job,
                 self.lease.epoch, self.query.id, self.query.runId, self.config.live_checkpoint,
                 self._idle_poll)

    def _restart_query(self) -> None:
        assert self._writer is not None
        self._start_query(self._writer)

    def _control(self) -> ControlHandler:
        assert self.query is not None
        assert self.snapshotter is not None
        return ControlHandler(
            self.config, self.lease, live=self.live, query=self.query, snapshotter=self.snapshotter,
            reporter=self.reporter, drain_events=self._drain_events, drain_outcomes=self._drain_outcomes,
            clock=self.clock, tick=TICK,
        )

    def _tell_state_format(self, spark: SparkSession) -> None:
        """One warning when the job asks for a newer state checkpoint format than its checkpoint holds (Spark keeps
        the checkpoint's): why, and how to move. Only a log line: a commit it cannot read is the query's to refuse."""
        try:
            found, batch = SparkCheckpoint(self.live).state_format()
        except CkptError:
            return
        if note := state_format_note(spark.conf.get(STATE_FORMAT_CONF, None), found, batch):
            log.warning("job %s: %s", self.config.job, note)

    def _snapshotter(self, spark: SparkSession) -> Snapshotter:
        retention = RetentionPolicy(checkpoints_keep=self.config.keep_checkpoints,
                                    savepoints_max_count=self.config.keep_savepoints)
        return Snapshotter(
            self.store, self.live, retention=retention, fence=self._fence, on_done=self.outcomes.put,
            code_version=self.config.code_version, spark_version=spark.version,
            labels={"epoch": str(self.lease.epoch)}, outage=self.store_outage, nice=self.config.snapshot_nice,
            inline_max=self.config.snapshot_inline_bytes,
        )

    def _plan_gate(self, snapshotter: Snapshotter) -> PlanGate | None:
        """Durable plans where a sink asked for them (ckpt-kafka: where the live checkpoint is on this host's disk)."""
        if not wants_durable_plans(self.live.local_path("metadata") is not None):
            PlanGate.disable(self.live)
            return None
        return PlanGate(self.store, self.live, snapshotter, epoch=self.lease.epoch).start()

    def _wait_for_grace(self, seconds: float) -> None:
        """A driver we took the lease from may still be running: give it the time to notice."""
        if seconds > 0:
            log.info("job %s epoch %d: waiting %.1f s for the previous driver to notice it is fenced",
                     self.config.job, self.lease.epoch, seconds)
            time.sleep(seconds)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self, control: ControlHandler) -> int:
        assert self.query is not None
        assert self.snapshotter is not None
        cfg = self.config
        now = self.clock()
        next_poll, next_lease = now + cfg.poll_interval, now + cfg.lease_seconds
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
            now = self.clock()
            # The watch stopped the query (the lease unconfirmed beyond its tolerance while this loop waited on the
            # store, or a newer epoch): a look at the lease raises FencedError if lost, else it goes as below.
            lapsed = self.watch is not None and self.watch.take_lapsed()
            due, next_lease = (True, now + cfg.lease_seconds) if now >= next_lease else (lapsed, next_lease)
            lost = due and (not self._lease_held() or lapsed)  # the store is down too long
            if lost or not self.query.isActive:  # restart the query here, or end with the exit code
                code = self._lease_unconfirmed() if lost else self._recover(self.query.exception())
                if code is not None:
                    return code
                control = self._control()
                continue
            if self._signal:
                return control.cancel(None, f"{self._signal} received")
            if now >= next_poll or (self.door is not None and self.door.take_knock()):
                next_poll = now + cfg.poll_interval
                for request in self._requests():
                    code = control.handle(request)
                    if code is not None:
                        return code
            if next_savepoint is not None and now >= next_savepoint:
                next_savepoint = now + (cfg.savepoint_interval or 0)
                self.snapshotter.savepoint(Trigger.PERIODIC)
            if self.reporter.due():
                self.reporter.report(JobState.RUNNING, "running")
            if self.lineage is not None and self.reporter.status is not None and self.lineage.due():
                self.lineage.offer(self.reporter.status, time.time())
            self._pause()

    def _pause(self) -> None:
        """The loop's wait between looks (TICK); a knock at the door ends it, so a request is looked at at once."""
        if self.door is not None:
            self.door.knocked.wait(TICK)
        else:
            time.sleep(TICK)

    # -- in-driver restarts -----------------------------------------------------------------------

    def _recover(self, err: BaseException | None) -> int | None:
        """After the query stopped by itself: restart it here (None once it runs again), or the exit code."""
        self._drain_events()  # the batches completed before the failure: ``from_batch`` is the last of them
        try:  # a batch refused by the fence fails the query: that is a fenced driver, not a failed job
            self.lease.check()
        except FencedError as fenced:
            return fenced_exit(self.config.job, self.query, fenced)
        except StorageError:
            pass  # the restart confirms the lease before the query starts again
        failure = classify(err)
        if failure.recovery is not Recovery.QUERY:
            return self.reporter.end_failed(failure)
        if self.watch is not None:
            self.watch.take_lapsed()  # the restart confirms the lease before the query starts again
        self.metrics.query_restart(failure.what)
        return self.restarter.restart(f"{failure.what}: {failure.message}")

    def _lease_unconfirmed(self) -> int | None:
        """Nothing may commit unless the lease is confirmed: stop the query, restart it once the store answers
        and the lease is still ours (a newer driver may have taken it meanwhile)."""
        assert self.query is not None
        self.query.stop()
        self._drain_events()
        if self.watch is not None:
            self.watch.take_lapsed()  # a stop of the watch meanwhile is this one: handled by the restart below
        self.metrics.query_restart("the job store unreachable")
        return self.restarter.restart(f"the job store is unreachable for {self.store_outage.seconds():.0f} s: "
                                      "the lease cannot be confirmed")

    def _fence(self) -> None:
        """FencedError unless the lease is ours (before a snapshot's manifest, before retention): a confirmation younger
        than a lease interval stands, as for a batch's commit (``Lease.recent``); else a read."""
        self.lease.check_unless_recent()

    def _lease_held(self) -> bool:
        """Confirm the lease (FencedError if lost); False once it could not be read for longer than the lease's
        outage tolerance, since a newer driver waits only that long for this one to notice it is fenced. No read
        when the lease watch confirmed it this poll (``Lease.recent``)."""
        if self.lease.recent():
            return True
        try:
            self.lease.check()
        except StorageError as err:
            self.store_outage.failed(err)
            return self.lease.tolerating()
        self.store_outage.ok()
        return True

    def _drain_events(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event.idle:
                status = self.reporter.status
                if status is not None and not status.idle:  # caught up: one line, one write
                    log.info("job %s epoch %d: caught up, no new data", self.config.job, self.lease.epoch)
                    self.reporter.update(idle=True, data_waiting=False, lag=0 if status.lag is not None else None,
                                         lag_seconds=0.0 if status.lag_seconds is not None else None)
                continue
            self._new_batches += 1
            self.metrics.batch(event)
            log.info("job %s epoch %d batch %d: completed, %d rows", self.config.job, self.lease.epoch,
                     event.batch_id, event.rows)
            resumed = self.restarter.batch_completed(event.batch_id)
            status = self.reporter.status
            # Written now when a reader waits on it (the first batch of this driver, the first after a restart or
            # after being idle); otherwise with the next heartbeat: a status PUT per heartbeat, not per batch.
            prompt = not self._batch_reported or status is None or status.idle or bool(resumed)
            self._batch_reported = True
            (self.reporter.update if prompt else self.reporter.note)(
                batch_id=event.batch_id, batch_at=time.time(), offsets=event.offsets, lag=event.lag,
                lag_seconds=event.lag_seconds,
                data_waiting=event.data_waiting, idle=False, **resumed)

    def _drain_outcomes(self) -> None:
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return
            self._measure(outcome)
            if outcome.result is not None:
                info = snapshot_info(outcome.result)
                if outcome.job.kind is Kind.CHECKPOINT and outcome.job.request_id is None:
                    self.reporter.note(last_snapshot=info)  # a periodic checkpoint: with the next batch's report
                else:
                    self.reporter.update(last_snapshot=info)
            if outcome.job.request_id is not None:
                self.reporter.ack(outcome.job.request_id, RequestAction.SAVEPOINT, outcome.result, outcome.error)

    def _measure(self, outcome: SnapshotOutcome) -> None:
        kind = outcome.job.kind.value
        if outcome.result is None:
            self.metrics.snapshot_failed(kind)
            return
        m = outcome.result.manifest
        self.metrics.snapshot(kind, seconds=outcome.result.seconds, size=m.total_bytes,
                              uploaded=outcome.result.stats.bytes, created_at=m.created.timestamp())

    def _requests(self) -> list[Request]:
        try:
            if not self.bell.due():  # one GET; the listing only when the bell rang (or the sweep is due)
                return []
            found = open_requests(self.store, on_malformed=self._reject_malformed)
        except StorageError as err:
            self.store_outage.failed(err)
            return []
        fresh = [r for r in found if r.id not in self._handled]
        self._handled.update(r.id for r in fresh)
        return fresh

    def _reject_malformed(self, request_id: str, problem: str) -> None:
        self.reporter.answer(Ack(request_id, None, Outcome.REJECTED,
                                 f"rejected: {problem}; expected a request written by `ckpt job` (action "
                                 "savepoint, stop or cancel, and the driver's epoch)", self.lease.epoch, time.time()))

    def _on_signal(self, name: str) -> None:
        self._signal = name

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


def _launched_by(store: JobStore) -> str | None:
    """Who launched this driver's launch (spec/last.json), for its lineage events; None if not known."""
    mine = os.environ.get(LAUNCH_ENV)
    try:
        last = read_launch(store) if mine else None
    except StorageError:
        return None
    return last.launched_by if last is not None and last.launch_id == mine else None


def _on_signal(name: str, handler: Callable[[str], None]) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(getattr(signal, name), lambda _signum, _frame: handler(name))
