"""The supervision service's metrics: what one instance owns and did (takeovers, starts, adoptions, relaunches,
operations, lease renewals), on the driver's table machinery (runtime/metrics.py ``Exposed``).

A driver's own metrics end with it; what happened around drivers (a host lost, a supervisor relaunched, a job taken
over from a silent instance) is seen only from outside, by the instance that acted. Off unless ``ckpt service run``
gets ``--metrics-address`` or ``--metrics-otlp``.
Design notes: docs/metrics.md#design-notes-launcherservicemetricspy."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_ckpt_provider.core.store import requestcount
from airflow_ckpt_provider.runtime.metrics import Exposed, Metric

#: The label of every series: the instance's name (Prometheus keeps ``instance`` for the scrape target).
SERVICE_LABELS = ("ckpt_instance",)


@dataclass
class ServiceCounts:
    """What one instance counted since it started."""

    owned: int = 0
    handed: int = 0
    takeovers: Counter[str] = field(default_factory=Counter)  # job
    actions: Counter[tuple[str, ...]] = field(default_factory=Counter)  # (job, action)
    operations: Counter[tuple[str, ...]] = field(default_factory=Counter)  # (job, kind)
    # From 0: a first failed renewal must be an increase Prometheus sees (a series' first sample is not one).
    renewals: Counter[str] = field(default_factory=lambda: Counter({"ok": 0, "failed": 0}))
    renewed_at: float | None = None
    started_at: float = field(default_factory=time.time)


SERVICE_METRICS: tuple[Metric[ServiceCounts], ...] = (
    Metric("ckpt_service_jobs_owned", "gauge", "handed jobs this instance owns", lambda c: c.owned),
    Metric("ckpt_service_jobs_handed", "gauge", "jobs handed to the service at this instance's last listing",
           lambda c: c.handed),
    Metric("ckpt_service_takeovers", "counter", "jobs this instance took over from an instance that went silent",
           lambda c: c.takeovers, by="ckpt_job"),
    Metric("ckpt_service_actions", "counter", "launches this instance started, drivers it adopted with a new "
           "supervisor, jobs it relaunched from their latest state (the old driver fenced by the new epoch), gave up "
           "on or refused, by job and action", lambda c: c.actions, by=("ckpt_job", "action")),
    Metric("ckpt_service_operations", "counter", "operations (upgrade, rescale, restart) this instance acted on or "
           "resumed", lambda c: c.operations, by=("ckpt_job", "kind")),
    Metric("ckpt_service_lease_renewals", "counter", "renewals of this instance's lease, by outcome",
           lambda c: c.renewals, by="outcome"),
    Metric("ckpt_service_lease_renewed_timestamp_seconds", "gauge", "when this instance last renewed its lease (unix "
           "time)", lambda c: c.renewed_at, unit="seconds"),
    Metric("ckpt_service_start_timestamp_seconds", "gauge", "when this instance started (unix time)",
           lambda c: c.started_at, unit="seconds"),
    Metric("ckpt_service_store_requests", "counter", "this instance's requests to the job store, by S3 operation",
           lambda c: {op: float(n) for op, n in requestcount.counts().items()}, by="operation"),
)


class ServiceMetrics(Exposed[ServiceCounts]):
    """One instance's metrics: counted by its loop, read at each scrape or export."""

    table = SERVICE_METRICS
    label_names = SERVICE_LABELS
    service_name = "ckpt-service"

    def __init__(self, instance: str, *, owned: Callable[[], int], handed: Callable[[], int]) -> None:
        super().__init__()
        self.instance, self.what = instance, f"supervision service instance {instance}"
        self._owned, self._handed = owned, handed
        self._lock = threading.Lock()
        self.counts = ServiceCounts()

    @property
    def labels(self) -> dict[str, str]:
        return {"ckpt_instance": self.instance}

    @property
    def resource(self) -> dict[str, str]:
        return {"ckpt.instance": self.instance}

    def seen(self) -> ServiceCounts:
        with self._lock:
            c = self.counts
            return ServiceCounts(self._owned(), self._handed(), Counter(c.takeovers), Counter(c.actions),
                                 Counter(c.operations), Counter(c.renewals), c.renewed_at, c.started_at)

    def took_over(self, job: str) -> None:
        with self._lock:
            self.counts.takeovers[job] += 1

    def acted(self, job: str, action: str) -> None:
        with self._lock:
            self.counts.actions[(job, action)] += 1

    def operated(self, job: str, kind: str) -> None:
        with self._lock:
            self.counts.operations[(job, kind)] += 1

    def renewed(self, ok: bool) -> None:
        with self._lock:
            self.counts.renewals["ok" if ok else "failed"] += 1
            if ok:
                self.counts.renewed_at = time.time()
