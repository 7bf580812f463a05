"""What a driver reports in status.json, and when it writes it."""

from __future__ import annotations

from pathlib import Path

from airflow_ckpt_provider.core.records.lease import Lease
from airflow_ckpt_provider.core.records.status import JobState, read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.reporting import DriverReporter


def test_a_noted_change_is_written_with_the_next_report_not_on_its_own(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lease = Lease(store)
    lease.acquire()
    reporter = DriverReporter(RuntimeConfig(job="orders", store=str(tmp_path / "store")), store, lease)
    snapshot = {"id": "checkpoint-3-20261127T140000Z-abc123", "kind": "checkpoint", "batch_id": 3}
    reporter.note(last_snapshot=snapshot)  # nothing reported yet: written at once
    first = read_status(store)
    assert first is not None and first.last_snapshot == snapshot and first.state is JobState.RUNNING
    writes: list[str] = []
    real = store.storage.write

    def write(key: str, data: bytes) -> None:
        writes.append(key)
        real(key, data)

    store.storage.write = write  # type: ignore[method-assign]  # a test spy on one instance
    newer = {**snapshot, "id": "checkpoint-4-20261127T140001Z-def456", "batch_id": 4}
    reporter.note(last_snapshot=newer)
    kept = read_status(store)
    assert writes == [] and kept is not None and kept.last_snapshot == snapshot
    reporter.update(batch_id=5)  # the next batch's report carries it
    status = read_status(store)
    assert status is not None and status.batch_id == 5 and status.last_snapshot == newer and len(writes) == 1


def test_a_report_is_due_a_heartbeat_after_the_last_or_half_of_it_after_a_noted_batch(tmp_path: Path) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lease = Lease(store)
    lease.acquire()
    reporter = DriverReporter(RuntimeConfig(job="orders", store=str(tmp_path / "store"), heartbeat_interval=30.0),
                              store, lease)
    now = [1000.0]
    reporter.clock = lambda: now[0]
    reporter.update()  # reported at 1000
    now[0] = 1029.9
    assert not reporter.due()  # idle: one heartbeat per 30 s
    now[0] = 1030.0
    assert reporter.due()
    reporter.update()
    reporter.note(batch_id=7)  # a completed batch: within half a heartbeat, not at once
    now[0] = 1044.9
    assert not reporter.due()
    now[0] = 1045.0
    assert reporter.due()
    reporter.update()
    status = read_status(store)
    assert status is not None and status.batch_id == 7
    now[0] = 1074.9
    assert not reporter.due()  # nothing noted since: the next is a heartbeat


def test_each_write_after_batches_adds_one_sample_and_the_newest_240_are_kept(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.records.status import SAMPLES_KEPT
    from airflow_ckpt_provider.runtime.batchevents import BatchEvent
    from airflow_ckpt_provider.runtime.metrics import DriverMetrics

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    lease = Lease(store)
    lease.acquire()
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"))
    reporter: DriverReporter
    metrics = DriverMetrics("orders", None, epoch=lambda: lease.epoch, status=lambda: reporter.status)
    reporter = DriverReporter(config, store, lease, sampler=metrics.take_sample)
    reporter.update()  # no batch yet: no sample
    metrics.batch(BatchEvent(0, {}, False, 10, seconds=1.0))
    metrics.batch(BatchEvent(1, {}, False, 30, seconds=2.0))
    reporter.update(batch_id=1, lag=5)
    reporter.update()  # a heartbeat without batches: no sample
    status = read_status(store)
    assert status is not None
    assert [(s.batch_id, s.batches, s.rows, s.seconds, s.lag) for s in status.samples] == [(1, 2, 40, 1.5, 5)]
    for batch in range(2, 2 + SAMPLES_KEPT + 5):
        metrics.batch(BatchEvent(batch, {}, False, 1, seconds=0.5))
        reporter.update(batch_id=batch)
    status = read_status(store)
    assert status is not None and len(status.samples) == SAMPLES_KEPT
    assert status.samples[-1].batch_id == SAMPLES_KEPT + 6 and status.samples[0].batch_id == 7


def test_a_new_driver_keeps_its_predecessors_samples_so_the_charts_span_drivers(tmp_path: Path) -> None:
    from airflow_ckpt_provider.runtime.batchevents import BatchEvent
    from airflow_ckpt_provider.runtime.metrics import DriverMetrics

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"))

    def driver() -> tuple[DriverReporter, DriverMetrics]:
        lease = Lease(store)
        lease.acquire()
        reporter: DriverReporter
        metrics = DriverMetrics("orders", None, epoch=lambda: lease.epoch, status=lambda: reporter.status)
        reporter = DriverReporter(config, store, lease, sampler=metrics.take_sample)
        return reporter, metrics

    first, counted = driver()
    first.carry_over()  # no status yet: nothing to carry
    counted.batch(BatchEvent(0, {}, False, 10, seconds=1.0))
    first.update(batch_id=0)
    second, counted = driver()
    second.carry_over()
    second.update()  # its first report: the predecessor's sample stays
    counted.batch(BatchEvent(1, {}, False, 20, seconds=3.0))
    second.update(batch_id=1)
    status = read_status(store)
    assert status is not None and status.epoch == 2
    assert [(s.batch_id, s.rows, s.seconds) for s in status.samples] == [(0, 10, 1.0), (1, 20, 3.0)]


def test_a_driver_started_after_its_supervisor_announced_a_restart_knows_the_cause(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.records.status import JobStatus, Restart, RestartOwner, write_status
    from airflow_ckpt_provider.runtime.metrics import METRICS, DriverMetrics, samples

    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"))
    cause = "exit code 137: killed (SIGKILL: out of memory, or kill -9)"
    write_status(store, JobStatus(job="orders", state=JobState.RESTARTING, epoch=3, updated_at=1.0, started_at=0.0,
                                  restart=Restart(RestartOwner.SUPERVISOR, 1, cause, 1.0, 1.0, 60.0).to_dict()))
    lease = Lease(store)
    lease.acquire()
    reporter = DriverReporter(config, store, lease)
    reporter.carry_over()
    assert reporter.restarted_for == cause
    metrics = DriverMetrics("orders", None, epoch=lambda: 4, status=lambda: None,
                            restarted_for=lambda: reporter.restarted_for)
    [metric] = [m for m in METRICS if m.name == "ckpt_process_restart"]
    assert list(samples(metric, metrics.seen())) == [((cause,), 1.0)]
    # The restarted driver runs, then stops; the next driver is a start, not a restart.
    write_status(store, JobStatus(job="orders", state=JobState.STOPPED, epoch=4, updated_at=2.0, started_at=1.5))
    after = DriverReporter(config, store, lease)
    after.carry_over()
    assert after.restarted_for is None
