"""runtime/metrics.py: what the driver counts, how the table reads its status, the Prometheus families and the
endpoint's address (real prometheus_client; the driver's status is a record made here)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.settings import parse_address
from airflow_ckpt_provider.core.policy.streambatch import SinkOutcome, sink_outcome
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.runtime.batchevents import BatchEvent, _measures
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.metrics import METRICS, DriverMetrics, samples


def status(**changes: object) -> JobStatus:
    base = {"job": "orders", "state": JobState.RUNNING, "epoch": 3, "updated_at": 1000.0, "started_at": 900.0,
            "batch_id": 7, "batch_at": 990.0, "lag": 12}
    return JobStatus(**{**base, **changes})  # type: ignore[arg-type]  # the test's own records


def driver_metrics(now: JobStatus | None = None) -> DriverMetrics:
    return DriverMetrics("orders", "v2", epoch=lambda: 3, status=lambda: now,
                         settings={"checkpoint_interval": 60.0, "heartbeat_interval": 30.0})


def read(metrics: DriverMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = metrics.url
    assert url is not None
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


LABELS = (("ckpt_job", "orders"), ("code_version", "v2"), ("epoch", "3"))


def test_batches_snapshots_and_restarts_are_counted_and_served_with_the_jobs_labels() -> None:
    metrics = driver_metrics(status())
    metrics.batch(BatchEvent(0, {}, False, 40, seconds=0.5, rows_per_second=80.0, state_rows=10, state_bytes=2048))
    metrics.batch(BatchEvent(1, {}, False, 60, seconds=1.5, rows_per_second=40.0, state_rows=12, state_bytes=4096))
    metrics.restored("savepoint", 500.0)
    metrics.snapshot("checkpoint", seconds=0.25, size=1000, uploaded=300, created_at=995.0)
    metrics.snapshot("checkpoint", seconds=0.75, size=1100, uploaded=100, created_at=998.0)
    metrics.snapshot_failed("savepoint")
    metrics.query_restart("the query failed")
    metrics.serve("127.0.0.1")
    try:
        seen = read(metrics)
    finally:
        metrics.close()
    assert seen[("ckpt_batches_total", LABELS)] == 2
    assert seen[("ckpt_input_rows_total", LABELS)] == 100
    assert seen[("ckpt_batch_seconds_total", LABELS)] == 2.0
    assert seen[("ckpt_last_batch_duration_seconds", LABELS)] == 1.5
    assert seen[("ckpt_processed_rows_per_second", LABELS)] == 40.0
    assert (seen[("ckpt_state_rows", LABELS)], seen[("ckpt_state_bytes", LABELS)]) == (12, 4096)
    checkpoint, savepoint = (*LABELS, ("kind", "checkpoint")), (*LABELS, ("kind", "savepoint"))
    assert seen[("ckpt_snapshots_total", tuple(sorted(checkpoint)))] == 2
    assert seen[("ckpt_snapshot_seconds_total", tuple(sorted(checkpoint)))] == 1.0
    assert seen[("ckpt_snapshot_uploaded_bytes_total", tuple(sorted(checkpoint)))] == 400
    assert seen[("ckpt_last_snapshot_size_bytes", tuple(sorted(checkpoint)))] == 1100
    assert seen[("ckpt_last_snapshot_timestamp_seconds", tuple(sorted(checkpoint)))] == 998.0
    assert seen[("ckpt_last_snapshot_timestamp_seconds", tuple(sorted(savepoint)))] == 500.0  # the restored one
    assert seen[("ckpt_snapshot_failures_total", tuple(sorted(savepoint)))] == 1
    assert seen[("ckpt_query_restarts_total", tuple(sorted((*LABELS, ("cause", "the query failed")))))] == 1
    # From the driver's last status:
    assert seen[("ckpt_last_batch_id", LABELS)] == 7
    assert seen[("ckpt_last_batch_timestamp_seconds", LABELS)] == 990.0
    assert seen[("ckpt_lag_records", LABELS)] == 12
    assert seen[("ckpt_lease_epoch", LABELS)] == 3
    assert seen[("ckpt_heartbeat_timestamp_seconds", LABELS)] == 1000.0
    assert seen[("ckpt_checkpoint_interval_seconds", LABELS)] == 60.0
    states = {dict(k[1])["state"]: v for k, v in seen.items() if k[0] == "ckpt_job_state"}
    assert states == {s.value: float(s is JobState.RUNNING) for s in JobState}


def test_before_the_first_status_and_batch_only_what_is_known_is_served() -> None:
    metrics = driver_metrics(None)
    seen = {m.name: list(samples(m, metrics.seen())) for m in METRICS}
    assert seen["ckpt_batches"] == [((), 0.0)]
    assert seen["ckpt_last_batch_id"] == [] and seen["ckpt_lag_records"] == [] and seen["ckpt_state_rows"] == []
    assert seen["ckpt_last_snapshot_timestamp_seconds"] == []
    assert seen["ckpt_job_state"] == [((s.value,), 0.0) for s in sorted(JobState, key=lambda s: s.value)]


def test_a_restored_snapshot_never_hides_a_newer_one_taken_since() -> None:
    metrics = driver_metrics(status())
    metrics.snapshot("checkpoint", seconds=0.1, size=1, uploaded=1, created_at=900.0)
    metrics.restored("checkpoint", 100.0)
    assert metrics.seen().counts.last_snapshot_at == {"checkpoint": 900.0}


def test_the_epoch_label_is_the_leases_at_each_read() -> None:
    epochs = iter([4, 5])
    metrics = DriverMetrics("orders", None, epoch=lambda: next(epochs), status=lambda: None)
    assert metrics.labels == {"ckpt_job": "orders", "epoch": "4", "code_version": "unknown"}
    assert metrics.labels["epoch"] == "5"


@pytest.mark.parametrize(("given", "expected"), [
    ("127.0.0.1", ("127.0.0.1", 0)), ("127.0.0.1:9464", ("127.0.0.1", 9464)), ("0.0.0.0:0", ("0.0.0.0", 0)),
    ("[::1]:9464", ("::1", 9464)), ("[::1]", ("::1", 0)), ("driver-host", ("driver-host", 0)),
])
def test_metrics_address_forms(given: str, expected: tuple[str, int]) -> None:
    assert parse_address(given) == expected


@pytest.mark.parametrize("given", ["127.0.0.1:port", ":9464", "127.0.0.1:70000", "[::1]:x", "", "/tmp/metrics"])
def test_a_bad_metrics_address_is_refused_saying_what_was_expected(given: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics_address: expected HOST or HOST:PORT .* found"):
        parse_address(given)


def test_an_address_this_host_cannot_bind_is_refused_with_what_to_give() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = driver_metrics(status())
        with pytest.raises(ConfigError, match=rf"metrics_address: expected an address of this host .* found "
                                              rf"'127.0.0.1:{port}' that cannot be bound"):
            metrics.serve(f"127.0.0.1:{port}")
    assert metrics.url is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"metrics_otlp": "127.0.0.1:4318"}, r"metrics_otlp: expected an OTLP/HTTP URL .* found '127.0.0.1:4318'"),
    ({"metrics_interval": 0}, r"metrics_interval must be > 0 seconds, found 0"),
    ({"metrics_address": "host:port"}, r"metrics_address: expected HOST or HOST:PORT"),
])
def test_bad_metrics_settings_are_refused_before_the_driver_starts(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RuntimeConfig(job="orders", store="/tmp/store", **changes).check()  # type: ignore[arg-type]  # bad on purpose


def test_a_batchs_measures_come_from_its_progress() -> None:
    ops = [SimpleNamespace(numRowsTotal=10, memoryUsedBytes=100), SimpleNamespace(numRowsTotal=5, memoryUsedBytes=50)]
    progress = SimpleNamespace(durationMs={"triggerExecution": 1500}, processedRowsPerSecond=25.0, stateOperators=ops)
    assert _measures(progress) == {"seconds": 1.5, "rows_per_second": 25.0, "state_rows": 15, "state_bytes": 150}
    empty = SimpleNamespace(durationMs={}, processedRowsPerSecond=float("nan"), stateOperators=[])
    assert _measures(empty) == {"seconds": None, "rows_per_second": None, "state_rows": None, "state_bytes": None}


def test_what_the_sinks_did_with_each_batch_is_counted_by_sink_and_outcome_from_their_file() -> None:
    metrics = driver_metrics(status())
    assert metrics.outcomes is None  # metrics off: no file, the sinks count nothing
    sink_outcome("ledger", SinkOutcome.COMMITTED, 0, 5)  # nowhere to count: dropped
    metrics.serve("127.0.0.1")
    try:
        path = metrics.outcomes
        assert path is not None and Path(path).exists()
        # A sink's commit worker (another process) is given the file in its writer options ...
        sink_outcome("ckpt-kafka", SinkOutcome.COMMITTED, 0, 40, path=path)
        sink_outcome("ckpt-kafka", SinkOutcome.SKIPPED, 0, 0, path=path)
        sink_outcome("ckpt-kafka", SinkOutcome.ABORTED, 1, path=path)
        sink_outcome("ckpt-kafka", SinkOutcome.COMMITTED, 1, 60, path=path)
        # ... a foreachBatch sink in the driver's own process finds it where the metrics told it.
        sink_outcome("ledger", SinkOutcome.FENCED, 2)
        with open(path, "ab") as f:
            f.write(b'{"sink": "ledger", "outcome": "comm')  # a line still being written is not counted yet
        first = read(metrics)
        with open(path, "ab") as f:
            f.write(b'itted", "batch": 3, "rows": 7}\n')
        second = read(metrics)
    finally:
        metrics.close()

    def batches(seen: dict[tuple[str, tuple[tuple[str, str], ...]], float], sink: str, outcome: str) -> float:
        return seen.get(("ckpt_sink_batches_total", tuple(sorted((*LABELS, ("outcome", outcome), ("sink", sink))))),
                        0.0)

    assert [batches(first, "ckpt-kafka", o) for o in ("committed", "skipped", "aborted", "fenced")] == [2, 1, 1, 0]
    assert (batches(first, "ledger", "fenced"), batches(first, "ledger", "committed")) == (1, 0)
    assert first[("ckpt_sink_rows_total", tuple(sorted((*LABELS, ("sink", "ckpt-kafka")))))] == 100
    assert batches(second, "ledger", "committed") == 1
    assert second[("ckpt_sink_rows_total", tuple(sorted((*LABELS, ("sink", "ledger")))))] == 7
    assert metrics.outcomes is None and not Path(path).exists()  # closed: the file is gone, nothing counts there


def test_the_otlp_export_is_set_up_before_the_lease_is_taken_and_labels_each_export_with_its_epoch() -> None:
    from tests.support.prometheus import OtlpReceiver

    taken: list[int] = []

    def epoch() -> int:  # as the driver's lease: no epoch before it is acquired
        if not taken:
            raise AssertionError("lease not acquired")
        return taken[0]

    receiver = OtlpReceiver()
    metrics = DriverMetrics("orders", "v2", epoch=epoch, status=status)
    try:
        metrics.export(receiver.url, 3600)  # the driver opens its metrics before it takes the lease
        taken.append(3)
    finally:
        metrics.close()  # the last export, with the lease's epoch
        receiver.stop()
    assert receiver.values[("ckpt_lease_epoch", ())] == 3
    assert {"ckpt_job": "orders", "epoch": "3", "code_version": "v2"}.items() <= receiver.attributes[-1].items()
