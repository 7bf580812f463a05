"""The driver's metrics: one table of what is measured, read at each Prometheus scrape and each OTLP export.

Runs in the Spark driver's Python process. The driver's loop counts batches, snapshots and restarts here; the rest
is read from its last status (runtime/reporting.py) when asked. Off unless ``metrics_address`` or ``metrics_otlp``
is set. Design notes: docs/metrics.md#design-notes-runtimemetricspy."""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.settings import parse_address
from airflow_ckpt_provider.core.policy.streambatch import tell_outcomes_to
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store import requestcount
from airflow_ckpt_provider.runtime.batchevents import BatchEvent

log = logging.getLogger(__name__)

#: The labels of every series: the job (``ckpt_job``: Prometheus keeps ``job`` for its scrape job), the driver's
#: lease epoch and the code version it runs.
LABELS = ("ckpt_job", "epoch", "code_version")

Value = float | None | Mapping[str, float] | Mapping[tuple[str, ...], float]


@dataclass
class Counts:
    """What the driver's loop counts (one thread writes; a scrape reads whole numbers, never a torn record)."""

    batches: int = 0
    input_rows: int = 0
    batch_seconds: float = 0.0
    last_batch_seconds: float | None = None
    rows_per_second: float | None = None
    state_rows: int | None = None
    state_bytes: int | None = None
    snapshots: Counter[str] = field(default_factory=Counter)
    snapshot_seconds: dict[str, float] = field(default_factory=dict)
    # Every kind from 0: a failure must be an increase Prometheus sees (a series' first sample is not one).
    snapshot_failures: Counter[str] = field(default_factory=lambda: Counter({"checkpoint": 0, "savepoint": 0}))
    uploaded_bytes: Counter[str] = field(default_factory=Counter)
    last_snapshot_seconds: dict[str, float] = field(default_factory=dict)
    last_snapshot_bytes: dict[str, float] = field(default_factory=dict)
    last_snapshot_at: dict[str, float] = field(default_factory=dict)  # by kind, created_at (the restored one first)
    query_restarts: Counter[str] = field(default_factory=Counter)
    sink_batches: Counter[tuple[str, ...]] = field(default_factory=Counter)  # (sink, outcome)
    sink_rows: Counter[str] = field(default_factory=Counter)  # rows the sinks committed, by sink


@dataclass(frozen=True)
class Seen:
    """What one read sees: the counts and the driver's last status."""

    counts: Counts
    status: JobStatus | None
    settings: Mapping[str, float | None]
    restarted_for: str | None = None  # this driver is its supervisor's restart after that cause


S = TypeVar("S")


@dataclass(frozen=True)
class Metric(Generic[S]):
    """One metric: its name (Prometheus' form; a counter's without ``_total``), kind, help, unit, the labels of its
    values when it has several (``by``: one label, or several whose values are tuples), and how it is read."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    read: Callable[[S], Value]
    by: str | tuple[str, ...] = ()
    unit: str = ""

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels of its values (after ``LABELS``)."""
        return (self.by,) if isinstance(self.by, str) else self.by


def _status(attr: str) -> Callable[[Seen], Value]:
    return lambda s: (None if s.status is None or getattr(s.status, attr) is None
                      else float(getattr(s.status, attr)))


def _last_batch_at(s: Seen) -> Value:
    return None if s.status is None or s.status.batch_at is None else s.status.batch_at


def _states(s: Seen) -> Value:
    now = s.status.state if s.status is not None else None
    return {state.value: float(state is now) for state in JobState}


METRICS: tuple[Metric[Seen], ...] = (
    Metric("ckpt_batches", "counter", "batches this driver completed", lambda s: s.counts.batches),
    Metric("ckpt_input_rows", "counter", "rows the completed batches read", lambda s: s.counts.input_rows),
    Metric("ckpt_batch_seconds", "counter", "seconds the completed batches took (with ckpt_batches: the mean)",
           lambda s: s.counts.batch_seconds, unit="seconds"),
    Metric("ckpt_last_batch_duration_seconds", "gauge", "the last completed batch's duration (Spark's "
           "triggerExecution)", lambda s: s.counts.last_batch_seconds, unit="seconds"),
    Metric("ckpt_last_batch_id", "gauge", "the last completed batch's id", _status("batch_id")),
    Metric("ckpt_last_batch_timestamp_seconds", "gauge", "when the last batch completed (unix time)",
           _last_batch_at, unit="seconds"),
    Metric("ckpt_processed_rows_per_second", "gauge", "the last batch's rows per second (Spark's "
           "processedRowsPerSecond)", lambda s: s.counts.rows_per_second),
    Metric("ckpt_lag_records", "gauge", "Kafka records behind the latest offsets the last batch saw (0 once idle)",
           _status("lag")),
    Metric("ckpt_lag_seconds", "gauge", "how long ago the oldest Kafka record the last batch left behind arrived "
           "(interpolated between batches; 0 once idle)", _status("lag_seconds"), unit="seconds"),
    Metric("ckpt_state_rows", "gauge", "rows in the query's state stores after the last batch",
           lambda s: s.counts.state_rows),
    Metric("ckpt_state_bytes", "gauge", "memory the query's state stores used after the last batch",
           lambda s: s.counts.state_bytes, unit="bytes"),
    Metric("ckpt_snapshots", "counter", "snapshots this driver completed", lambda s: s.counts.snapshots, by="kind"),
    Metric("ckpt_snapshot_seconds", "counter", "seconds the completed snapshots took",
           lambda s: s.counts.snapshot_seconds, by="kind", unit="seconds"),
    Metric("ckpt_snapshot_failures", "counter", "snapshots that failed", lambda s: s.counts.snapshot_failures,
           by="kind"),
    Metric("ckpt_snapshot_uploaded_bytes", "counter", "bytes the snapshots uploaded (new files only)",
           lambda s: s.counts.uploaded_bytes, by="kind", unit="bytes"),
    Metric("ckpt_last_snapshot_duration_seconds", "gauge", "the last snapshot's duration",
           lambda s: s.counts.last_snapshot_seconds, by="kind", unit="seconds"),
    Metric("ckpt_last_snapshot_size_bytes", "gauge", "the last snapshot's size (all its files)",
           lambda s: s.counts.last_snapshot_bytes, by="kind", unit="bytes"),
    Metric("ckpt_last_snapshot_timestamp_seconds", "gauge", "when the newest completed snapshot was taken (unix "
           "time; at start, the one restored)", lambda s: s.counts.last_snapshot_at, by="kind", unit="seconds"),
    Metric("ckpt_checkpoint_interval_seconds", "gauge", "the job's checkpoint_interval (snapshots while batches "
           "complete; absent: never)", lambda s: s.settings.get("checkpoint_interval"), unit="seconds"),
    Metric("ckpt_heartbeat_interval_seconds", "gauge", "the job's heartbeat_interval (a driver silent for three "
           "and 5 s counts as lost)", lambda s: s.settings.get("heartbeat_interval"), unit="seconds"),
    Metric("ckpt_query_restarts", "counter", "restarts of the query inside this driver, by cause",
           lambda s: s.counts.query_restarts, by="cause"),
    Metric("ckpt_process_restart", "gauge", "1 when this driver is its supervisor's restart of the job's process, by "
           "the cause (the previous driver's exit); absent for any other start", lambda s: (
               None if s.restarted_for is None else {s.restarted_for: 1.0}), by="cause"),
    Metric("ckpt_lease_epoch", "gauge", "the driver's lease epoch (one more at every new driver)", _status("epoch")),
    Metric("ckpt_job_state", "gauge", "1 for the driver's state as reported, 0 for the others", _states, by="state"),
    Metric("ckpt_heartbeat_timestamp_seconds", "gauge", "when the driver last wrote its status (unix time)",
           _status("updated_at"), unit="seconds"),
    Metric("ckpt_driver_start_timestamp_seconds", "gauge", "when this driver started (unix time)",
           _status("started_at"), unit="seconds"),
    Metric("ckpt_store_requests", "counter", "the driver process's requests to the job store, by S3 operation",
           lambda s: {op: float(n) for op, n in requestcount.counts().items()}, by="operation"),
    Metric("ckpt_sink_batches", "counter", "batches the job's sinks committed, skipped as replays, aborted or "
           "refused as fenced, by sink and outcome", lambda s: s.counts.sink_batches, by=("sink", "outcome")),
    Metric("ckpt_sink_rows", "counter", "rows the job's sinks committed (where the sink counts them)",
           lambda s: s.counts.sink_rows, by="sink"),
)


def samples(metric: Metric[S], seen: S) -> Iterator[tuple[tuple[str, ...], float]]:
    """(the ``by`` labels' values, value) of one metric; nothing where it has no value yet."""
    value = metric.read(seen)
    if value is None:
        return
    if isinstance(value, Mapping):
        for key, v in sorted(value.items()):
            yield (key if isinstance(key, tuple) else (key,)), float(v)
    else:
        yield (), float(value)


class OutcomeTail:
    """The sinks' outcomes file (core/policy/streambatch.py ``sink_outcome``), read on from where the last read
    stopped: only whole lines are counted."""

    def __init__(self, job: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix=f"ckpt-sink-outcomes-{job}-", suffix=".jsonl")
        os.close(fd)
        self._offset = 0

    def read_into(self, counts: Counts) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError as err:
            log.warning("cannot read the sinks' outcomes in %s: %s", self.path, err)
            return
        whole = data[:data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            try:
                seen = json.loads(line)
                counts.sink_batches[(str(seen["sink"]), str(seen["outcome"]))] += 1
                if seen["outcome"] == "committed" and isinstance(seen.get("rows"), int):
                    counts.sink_rows[str(seen["sink"])] += seen["rows"]
            except (ValueError, KeyError, TypeError) as err:
                log.warning("a line of the sinks' outcomes in %s is not one: %r (%s)", self.path, line[:200], err)

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


class Exposed(Generic[S]):
    """A table of metrics read from one place (``seen``) with the same labels on every series (``labels``): served
    to Prometheus (``serve``) and exported over OTLP (``export``). The driver's (``DriverMetrics``) and the
    supervision service's (launcher/servicemetrics.py)."""

    table: tuple[Metric[S], ...]
    label_names: tuple[str, ...]
    service_name: str  # OTLP's service.name
    what: str  # whose metrics, in log lines

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []
        self.url: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        raise NotImplementedError

    @property
    def resource(self) -> dict[str, str]:
        """The OTLP resource's attributes besides ``service.name`` (known before the driver takes its lease)."""
        raise NotImplementedError

    def seen(self) -> S:
        raise NotImplementedError

    def _opening(self) -> None:
        """Before the first ``serve`` or ``export``."""

    def serve(self, address: str) -> str:
        """Serve ``/metrics`` on ``address`` (HOST or HOST:PORT; no port: a free one); its URL. ConfigError if this
        host cannot bind it."""
        from prometheus_client import CollectorRegistry, start_http_server

        host, port = parse_address(address)
        self._opening()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PrometheusCollector(self))
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as err:
            raise ConfigError(f"metrics_address: expected an address of this host to serve the metrics of {self.what} "
                              f"on, found {address!r} that cannot be bound ({err}); give one of this host's "
                              "addresses (127.0.0.1, 0.0.0.0) or none") from None

        def close() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)

        self._closers.append(close)
        bound = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound}/metrics"
        log.info("%s: metrics served at %s", self.what, self.url)
        return self.url

    def export(self, endpoint: str, interval: float) -> None:
        """Export to an OTLP/HTTP endpoint (``http://HOST:4318/v1/metrics``) every ``interval`` seconds."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._opening()
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint),
                                               export_interval_millis=interval * 1000)
        provider = MeterProvider(metric_readers=[reader], resource=Resource.create(
            {"service.name": self.service_name, **self.resource}))
        _register_otel(self, provider.get_meter("airflow_ckpt_provider"))
        self._closers.append(lambda: provider.shutdown(timeout_millis=5000))
        log.info("%s: metrics exported over OTLP to %s every %g s", self.what, endpoint, interval)

    def close(self) -> None:
        """Stop serving and flush the last export."""
        for close in reversed(self._closers):
            try:
                close()
            except Exception as err:  # a metrics backend's error must not change how the process ends
                log.warning("%s: closing its metrics: %s", self.what, err)
        self._closers.clear()


class DriverMetrics(Exposed[Seen]):
    """One driver's metrics: counted by its loop (``batch``, ``snapshot``, ``snapshot_failed``, ``query_restart``),
    served to Prometheus (``serve``) and exported over OTLP (``export``) from the same table."""

    table = METRICS
    label_names = LABELS
    service_name = "ckpt-driver"

    def __init__(self, job: str, code_version: str | None, *, epoch: Callable[[], int],
                 status: Callable[[], JobStatus | None], settings: Mapping[str, float | None] | None = None,
                 restarted_for: Callable[[], str | None] = lambda: None) -> None:
        super().__init__()
        self.job, self.code_version, self._epoch = job, code_version or "unknown", epoch
        self.what = f"the driver of job {job}"
        self.counts = Counts()
        self._status, self._restarted_for = status, restarted_for
        self._settings = dict(settings or {})
        self._lock = threading.Lock()
        self._sampled = (0, 0, 0.0)  # batches, rows, seconds at the last take_sample
        self._tail: OutcomeTail | None = None

    @property
    def outcomes(self) -> str | None:
        """The file the sinks count their outcomes in (the writer option ``ckpt.outcomes``), once metrics are on."""
        return self._tail.path if self._tail is not None else None

    def _opening(self) -> None:
        """Start counting what the sinks do with each batch: a file they append to (``OutcomeTail``)."""
        if self._tail is None:
            self._tail = OutcomeTail(self.job)
            tell_outcomes_to(self._tail.path)
            self._closers.append(self._stop_counting_sinks)

    def _stop_counting_sinks(self) -> None:
        tell_outcomes_to(None)
        if self._tail is not None:
            self._tail.remove()
            self._tail = None

    @property
    def resource(self) -> dict[str, str]:
        return {"ckpt.job": self.job}

    @property
    def labels(self) -> dict[str, str]:
        """The labels of every series (``LABELS``): the epoch is the lease's (known once the driver took it)."""
        return {"ckpt_job": self.job, "epoch": str(self._epoch()), "code_version": self.code_version}

    def seen(self) -> Seen:
        with self._lock:
            if self._tail is not None:
                self._tail.read_into(self.counts)
            counts = copy.deepcopy(self.counts)
        return Seen(counts, self._status(), self._settings, self._restarted_for())

    # -- what the driver's loop tells --------------------------------------------------------------------------

    def batch(self, event: BatchEvent) -> None:
        with self._lock:
            c = self.counts
            c.batches += 1
            c.input_rows += event.rows
            if event.seconds is not None:
                c.batch_seconds += event.seconds
                c.last_batch_seconds = event.seconds
            c.rows_per_second = event.rows_per_second
            c.state_rows, c.state_bytes = event.state_rows, event.state_bytes

    def snapshot(self, kind: str, *, seconds: float, size: int, uploaded: int, created_at: float) -> None:
        with self._lock:
            c = self.counts
            c.snapshots[kind] += 1
            c.snapshot_seconds[kind] = c.snapshot_seconds.get(kind, 0.0) + seconds
            c.uploaded_bytes[kind] += uploaded
            c.last_snapshot_seconds[kind] = seconds
            c.last_snapshot_bytes[kind] = float(size)
            c.last_snapshot_at[kind] = max(created_at, c.last_snapshot_at.get(kind, 0.0))

    def restored(self, kind: str, created_at: float) -> None:
        """The snapshot this driver started from: the newest completed one until it takes its own."""
        with self._lock:
            self.counts.last_snapshot_at.setdefault(kind, created_at)

    def snapshot_failed(self, kind: str) -> None:
        with self._lock:
            self.counts.snapshot_failures[kind] += 1

    def query_restart(self, cause: str) -> None:
        with self._lock:
            self.counts.query_restarts[cause] += 1

    def take_sample(self) -> tuple[int, int, float] | None:
        """The batches, rows and batch seconds since the last call (a status write's sample), None if no batch."""
        with self._lock:
            c = self.counts
            now = (c.batches, c.input_rows, c.batch_seconds)
            before, self._sampled = self._sampled, now
        if now[0] == before[0]:
            return None
        return now[0] - before[0], now[1] - before[1], now[2] - before[2]


class _PrometheusCollector(Generic[S]):
    """The table as Prometheus metric families, read at each scrape."""

    def __init__(self, metrics: Exposed[S]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        seen, base, names = self.metrics.seen(), self.metrics.labels, self.metrics.label_names
        for metric in self.metrics.table:
            family = (CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily)(
                metric.name, metric.help, labels=[*names, *metric.labels], unit="")
            for by, value in samples(metric, seen):
                family.add_metric([*(base[k] for k in names), *by], value)
            yield family


def _register_otel(metrics: Exposed[S], meter: Any) -> None:
    """Each metric of the table as an observable instrument of ``meter`` (counters cumulative)."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def callback(metric: Metric[S]) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(_: CallbackOptions) -> list[Observation]:
            base = dict(metrics.labels)
            return [Observation(value, {**base, **dict(zip(metric.labels, by, strict=True))})
                    for by, value in samples(metric, metrics.seen())]
        return observe

    for metric in metrics.table:
        make = meter.create_observable_counter if metric.kind == "counter" else meter.create_observable_gauge
        make(metric.name, callbacks=[callback(metric)], unit=metric.unit or "1", description=metric.help)
