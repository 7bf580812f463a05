"""Restarts of a failed query inside the running driver, as Flink restarts a job's tasks in its JobManager.

Called by runtime/driver.py when its query stopped with a failure a restart may fix (runtime/failures.py),
or when the job store did not answer for longer than the lease's outage tolerance. The restart strategy
and the health rule are the job's (the supervisor has its own copies, for process restarts). Each restart:
RESTARTING in status.json with a ``Restart`` record, the strategy's delay waited with heartbeats, the lease
confirmed and the live checkpoint checked as at a start (waiting out a store outage), the query started
again; the first batch it completes is recorded in the restart (``resumed_batch``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from airflow_ckpt_provider.core.errors import CkptError, CredentialsError, StorageError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.policy.outage import Outage
from airflow_ckpt_provider.core.policy.restart import Health, describe_strategy
from airflow_ckpt_provider.core.records.lease import FencedError, Lease
from airflow_ckpt_provider.core.records.status import RESTARTS_KEPT, JobState, Restart, RestartOwner
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.controlhandler import fenced_exit
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_STOPPED
from airflow_ckpt_provider.runtime.failures import Failure, Recovery, classify
from airflow_ckpt_provider.runtime.reporting import DriverReporter
from airflow_ckpt_provider.runtime.startup import prepare_checkpoint

log = logging.getLogger(__name__)

TICK = 0.1  # seconds between looks at a stop signal while waiting
#: Seconds a restarted query is given to start (restore the state, plan its first batch) in ``expected_by``.
QUERY_START_ALLOWANCE = 60.0


class QueryRestarter:
    """Restarts the driver's query; ``restart()`` returns None once it runs again, else the driver's exit code.

    ``start_query`` starts the query again (the driver's writer); ``query_started`` is when the current run
    started (driver clock); ``stop_signal`` the signal the driver received, if any; ``drain_outcomes`` reports
    the snapshots that completed meanwhile.
    """

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        store: JobStore,
        live: Storage,
        lease: Lease,
        reporter: DriverReporter,
        outage: Outage,
        start_query: Callable[[], None],
        query_started: Callable[[], float],
        stop_signal: Callable[[], str | None],
        drain_outcomes: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.store = store
        self.live = live
        self.lease = lease
        self.reporter = reporter
        self.outage = outage
        self.start_query = start_query
        self.query_started = query_started
        self.stop_signal = stop_signal
        self.drain_outcomes = drain_outcomes
        self.clock = clock
        self.strategy = config.strategy()
        self.health = config.health()
        self.restarts: list[Restart] = []  # newest last; the last one may still await its first batch
        self.restart_times: list[float] = []  # when each restarted query started (driver clock), for the health rule

    def batch_completed(self, batch_id: int) -> dict[str, object]:
        """Status fields to write with a completed batch: the restart fields once a restarted query's first batch
        completed (it resumed), else none."""
        if not self.restarts or self.restarts[-1].resumed_batch is not None:
            return {}
        self.restarts[-1] = replace(self.restarts[-1], resumed_at=time.time(), resumed_batch=batch_id)
        return self.fields()

    def restart(self, cause: str) -> int | None:
        """Restart the query in this driver after the strategy's delay; None once it runs, else the exit code.

        The delay is waited with heartbeats (state RESTARTING, with who, the attempt and ``expected_by``); then
        the lease is confirmed and the live checkpoint checked as at a start, waiting while the job store is
        unreachable. A start that fails again counts as another restart.
        """
        job, epoch = self.config.job, self.lease.epoch
        while True:
            now = self.clock()
            ran = now - self.query_started()
            delay, why_not = self._delay(now, ran)
            if delay is None:
                log.error("job %s epoch %d: not restarting the query in this driver: %s; last failure: %s", job,
                          epoch, why_not, cause)
                self.reporter.report_final(JobState.FAILED, f"{why_not}; last failure: {cause}")
                return EXIT_FAILED  # a new driver process is the last resort (the supervisor's restart)
            restart = self._begin(cause, delay)
            code = self._wait(delay)
            if code is not None:
                return code
            code = self._confirm()
            if code is not None:
                return code
            try:
                self.start_query()
            except Exception as err:
                failure = classify(err)
                if failure.recovery is not Recovery.QUERY:
                    return self.reporter.end_failed(failure)
                cause = f"the restarted query did not start ({failure.what}): {failure.message}"
                continue
            self.restart_times.append(self.clock())
            log.info("job %s epoch %d: query restarted in this driver (attempt %d) from batch %s", job, epoch,
                     restart.attempt, restart.from_batch)
            self.reporter.report(JobState.RUNNING, f"running; query restarted after: {cause}", restart=None)
            return None

    def _delay(self, now: float, ran: float) -> tuple[float | None, str]:
        if self.health is not None:
            verdict = self.health.judge(self.restart_times, None, False, now)
            if verdict.health is Health.UNHEALTHY:
                return None, f"too many query restarts in this driver ({verdict.reason})"
        delay = self.strategy.on_failure(ran)
        if delay is None:
            return None, f"restart strategy exhausted ({describe_strategy(self.strategy)})"
        return delay, ""

    def _begin(self, cause: str, delay: float) -> Restart:
        status = self.reporter.status
        now = time.time()
        restart = Restart(RestartOwner.DRIVER, len(self.restarts) + 1, cause, delay, at=now,
                          expected_by=now + delay + QUERY_START_ALLOWANCE,
                          from_batch=status.batch_id if status else None)
        self.restarts.append(restart)
        log.warning("job %s epoch %d: query failed at batch %s (%s): restarting it in this driver in %.1f s "
                    "(attempt %d, %s)", self.config.job, self.lease.epoch, restart.from_batch, cause, delay,
                    restart.attempt, describe_strategy(self.strategy))
        self.reporter.report(JobState.RESTARTING, f"restarting the query: {cause}", restart=restart.to_dict(),
                             **self.fields())
        return restart

    def fields(self) -> dict[str, object]:
        """The status fields of this driver's restarts (``restarts``, ``restart_count``)."""
        kept = self.restarts[-RESTARTS_KEPT:]
        return {"restarts": [r.to_dict() for r in kept], "restart_count": len(self.restarts)}

    def _wait(self, seconds: float) -> int | None:
        """Wait ``seconds`` with heartbeats; a stop signal ends the driver (the checkpoint is intact)."""
        deadline = self.clock() + seconds
        next_beat = self.clock()
        while True:
            if self.stop_signal():
                return self._stopped(f"{self.stop_signal()} received while restarting")
            now = self.clock()
            if now >= deadline:
                return None
            if now >= next_beat:
                next_beat = now + self.config.heartbeat_interval
                self.reporter.update()
            self.drain_outcomes()
            time.sleep(min(TICK, max(0.0, deadline - now)))

    def _confirm(self) -> int | None:
        """Confirm the lease and check the live checkpoint as a start does, waiting out a store outage."""
        job = self.config.job
        next_beat = self.clock()
        waited = False
        while True:
            if self.stop_signal():
                return self._stopped(f"{self.stop_signal()} received while restarting")
            try:
                asked = self.lease.monotonic()
                self.lease.check()
                if 0 < self.lease.outage_tolerance <= self.lease.monotonic() - asked:
                    # A read the outage held confirms only as of when it was sent: too old to start on (the lease
                    # watch would stop the query at once). Read again, now that the store answers.
                    waited = True
                    continue
                if waited:
                    self._store_back()
                prepare_checkpoint(self.store, self.live, LATEST_STATE, epoch=self.lease.epoch,
                                   policy=self.config.time_travel, record=False)
                self.outage.ok()
                return None
            except FencedError as err:
                return fenced_exit(job, None, err)
            except CredentialsError as err:
                return self.reporter.end_failed(classify(err))
            except StorageError as err:  # the store is down: wait for it, with one line when it is back
                self.outage.failed(err)
                waited = True
            except CkptError as err:
                return self.reporter.end_failed(Failure(Recovery.NONE, EXIT_CONFIG, "the checkpoint cannot resume",
                                                str(err)))
            if self.clock() >= next_beat:
                next_beat = self.clock() + self.config.heartbeat_interval
                self.reporter.update()
            time.sleep(self.config.poll_interval)

    def _store_back(self) -> None:
        """The store answers again after this restart waited for it: RESTARTING is written at once, with the
        time the query is now expected by. A supervisor that could not read meanwhile judges the heartbeat again
        as soon as it can; the writes of the wait failed, and starting the query comes after more requests."""
        restart = self.restarts[-1]
        self.restarts[-1] = replace(restart, expected_by=time.time() + QUERY_START_ALLOWANCE)
        self.reporter.update(restart=self.restarts[-1].to_dict(), **self.fields())

    def _stopped(self, reason: str) -> int:
        log.info("job %s epoch %d: %s; the latest completed batch is resumed at the next start", self.config.job,
                 self.lease.epoch, reason)
        self.reporter.report_final(JobState.STOPPED, reason, restart=None)
        return EXIT_STOPPED
