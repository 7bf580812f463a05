"""In-driver query restarts across a job store outage: what status.json says while the store comes back."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_ckpt_provider.core.errors import UnreachableError
from airflow_ckpt_provider.core.records.lease import Lease
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, RestartOwner, read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.queryrestart import QUERY_START_ALLOWANCE, QueryRestarter
from airflow_ckpt_provider.runtime.reporting import DriverReporter


class Outage:
    """The store's reads and writes fail while ``lease_reads_failing`` > 0; each failed lease read counts down."""

    def __init__(self, store: JobStore) -> None:
        self.lease_reads_failing = 0
        self.last_failure_at = 0.0
        storage = store.storage
        real_versioned, real_read, real_write = storage.read_versioned, storage.read, storage.write

        def read_versioned(key: str):  # type: ignore[no-untyped-def]  # mirrors Storage.read_versioned
            if self.lease_reads_failing > 0:
                self.lease_reads_failing -= 1
                self.last_failure_at = time.time()
                raise UnreachableError(f"read {key}: cannot reach S3 endpoint")
            return real_versioned(key)

        def read(key: str) -> bytes:
            self._fail(f"read {key}")
            return real_read(key)

        def write(key: str, data: bytes) -> None:
            self._fail(f"write {key}")
            real_write(key, data)

        storage.read_versioned = read_versioned  # type: ignore[method-assign]  # the fault, in a unit test
        storage.read = read  # type: ignore[method-assign]  # the fault, in a unit test
        storage.write = write  # type: ignore[method-assign]  # the fault, in a unit test

    def _fail(self, what: str) -> None:
        if self.lease_reads_failing > 0:
            raise UnreachableError(f"{what}: cannot reach S3 endpoint")


def test_a_restart_that_waited_for_the_store_writes_restarting_with_a_new_expected_by_before_the_query_starts(
    store: JobStore, tmp_path: Path,
) -> None:
    """A supervisor that could not read status.json during the outage judges the heartbeat again once it can:
    the driver's first write when the store is back is RESTARTING (a restart in progress, due by a time counted
    from now), not the RUNNING of before the outage, whose heartbeat has gone stale meanwhile."""
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "checkpoint"),
                           poll_interval=0.05, heartbeat_interval=0.01, restart_strategy="fixed-delay",
                           restart_attempts=3, restart_delay=0.01)
    lease = Lease(store)
    lease.acquire()
    reporter = DriverReporter(config, store, lease)
    reporter.report(JobState.RUNNING, "running", batch_id=7)
    outage = Outage(store)
    seen: list[JobStatus | None] = []
    restarter = QueryRestarter(
        config, store=store, live=LocalStorage(tmp_path / "checkpoint"), lease=lease, reporter=reporter,
        outage=reporter.outage, start_query=lambda: seen.append(read_status(store)), query_started=lambda: 0.0,
        stop_signal=lambda: None, drain_outcomes=lambda: None,
    )

    outage.lease_reads_failing = 3
    assert restarter.restart("the job store is unreachable for 3 s: the lease cannot be confirmed") is None

    assert outage.lease_reads_failing == 0
    [at_start] = seen
    assert at_start is not None and at_start.state is JobState.RESTARTING
    restart = at_start.current_restart()
    assert restart is not None
    assert (restart.by, restart.attempt, restart.from_batch) == (RestartOwner.DRIVER, 1, 7)
    assert restart.expected_by >= outage.last_failure_at + QUERY_START_ALLOWANCE  # counted from the store's return
    assert at_start.restart_count == 1
    final = read_status(store)
    assert final is not None and final.state is JobState.RUNNING and final.restart is None

