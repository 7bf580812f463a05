"""What an operator's Prometheus and Grafana need for the drivers' metrics (runtime/metrics.py): the scrape targets
read from the job store, the alert rules and the dashboard, rendered by ``ckpt metrics``.

Design notes: docs/metrics.md#design-notes-launchermonitoringpy."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.records.ownership import read_instances
from airflow_ckpt_provider.core.records.status import ACTIVE_STATES, read_status
from airflow_ckpt_provider.core.store.jobstore import JobStore, is_job_name
from airflow_ckpt_provider.core.store.storage import Storage

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")


@dataclass(frozen=True, kw_only=True)
class AlertSettings:
    """The thresholds of the rules; the defaults are the shipped file's (``ckpt metrics rules``)."""

    scrape_job: str = "ckpt-drivers"  # the Prometheus scrape job of the drivers' targets (for ``up``)
    service_scrape_job: str = "ckpt-service"  # the scrape job of the supervision service's instances
    hold: str = "2m"  # how long a condition holds before its alert fires
    snapshot_age_floor: float = 60.0  # seconds: the snapshot age alert never fires below this, whatever the interval
    lag_rising: str = "15m"
    restarts: int = 3  # this many restarts (drivers or queries) of one job ...
    restart_window: str = "15m"  # ... within this window: a crash loop

    def check(self) -> None:
        for name in ("hold", "lag_rising", "restart_window"):
            value = getattr(self, name)
            if not _DURATION.match(value):
                raise ConfigError(f"{name}: expected a Prometheus duration such as 30s, 2m or 1h, found {value!r}")
        if self.snapshot_age_floor < 0 or self.restarts < 1:
            raise ConfigError(f"expected a snapshot age floor >= 0 s and restarts >= 1, found "
                              f"{self.snapshot_age_floor} and {self.restarts}")


def _rule(name: str, expr: str, hold: str, severity: str, summary: str,  # noqa: PLR0917  # the rules read as a table
          description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": hold, "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description}}


def _grown(series: str, window: str) -> str:
    """How much ``series`` (counters) grew over ``window``, counting a series that appeared within it from 0: the
    clients export a labelled counter from its first increment, which ``increase()`` cannot see (it needs two
    samples). Counters here restart only with a new process, whose series carry a new epoch or instance."""
    return f"({series} - ({series} offset {window} or {series} * 0))"


def alert_rules(s: AlertSettings) -> dict[str, Any]:
    """The alert rules as Prometheus' rules file (a dict; ``rules_yaml`` writes it)."""
    s.check()
    since_snapshot = ("ckpt_last_batch_timestamp_seconds - max without (kind) "
                      "(ckpt_last_snapshot_timestamp_seconds)")
    allowed = f"clamp_min(3 * ckpt_checkpoint_interval_seconds, {s.snapshot_age_floor:g})"
    never = (f"(ckpt_last_batch_timestamp_seconds - ckpt_driver_start_timestamp_seconds > {allowed}) "
             "unless on (ckpt_job, epoch) ckpt_last_snapshot_timestamp_seconds")
    what_to_run = "`ckpt job status --job {{ $labels.ckpt_job }}` and `ckpt snapshot list --job {{ $labels.ckpt_job }}`"
    return {"groups": [{"name": "ckpt", "rules": [
        _rule("CkptSnapshotTooOld", f"({since_snapshot} > {allowed}) or ({never})", s.hold, "critical",
              "job {{ $labels.ckpt_job }}: no completed snapshot for 3 checkpoint intervals while batches complete",
              "Batches of epoch {{ $labels.epoch }} completed more than 3 checkpoint intervals after the newest "
              "completed snapshot: a restart now would replay them all. Look at the driver's log for snapshot "
              f"errors; run {what_to_run}."),
        _rule("CkptSnapshotFailing", "increase(ckpt_snapshot_failures_total[10m]) > 0", "0s", "warning",
              "job {{ $labels.ckpt_job }}: {{ $labels.kind }} snapshots failed in the last 10 minutes",
              "The driver of epoch {{ $labels.epoch }} could not complete a {{ $labels.kind }} snapshot; the "
              f"previous one stays the latest completed. Run {what_to_run}."),
        _rule("CkptLagRising", "ckpt_lag_records > 0 and deriv(ckpt_lag_records[10m]) > 0", s.lag_rising,
              "warning", "job {{ $labels.ckpt_job }}: Kafka lag rising for " + s.lag_rising,
              "The job reads slower than its sources grow (ckpt_lag_records). Rescale it "
              "(`ckpt job rescale`) or give it more executors."),
        _rule("CkptCrashLoop",
              f"(count by (ckpt_job) (max_over_time(ckpt_lease_epoch[{s.restart_window}])) > {s.restarts}) or "
              f"(sum by (ckpt_job) {_grown('ckpt_query_restarts_total', s.restart_window)} >= {s.restarts})",
              "0s", "critical",
              "job {{ $labels.ckpt_job }}: " + f"{s.restarts} or more restarts within {s.restart_window}",
              "Drivers or queries of the job keep restarting. Run `ckpt job status --job {{ $labels.ckpt_job }}` "
              "for the causes; a failure no restart fixes ends the job (FAILED) instead of looping."),
        _rule("CkptFencedDriverRunning",
              "count by (ckpt_job) (ckpt_job_state{state=~\"RUNNING|RESTARTING\"} == 1) > 1", s.hold, "critical",
              "job {{ $labels.ckpt_job }}: drivers of two epochs report running",
              "The older epoch's driver lost its lease (fenced) and has not stopped: it commits nothing, but holds "
              "its resources. Find its host in `ckpt job status --job {{ $labels.ckpt_job }}`."),
        _rule("CkptNoHeartbeat",
              "time() - ckpt_heartbeat_timestamp_seconds > 3 * ckpt_heartbeat_interval_seconds + 5", s.hold,
              "critical", "job {{ $labels.ckpt_job }}: the driver of epoch {{ $labels.epoch }} writes no heartbeat",
              "Its status is older than three heartbeats and 5 s: its supervisor counts it as lost. Run "
              "`ckpt job status --job {{ $labels.ckpt_job }}`."),
        _rule("CkptDriverDown", f"up{{job=\"{s.scrape_job}\"}} == 0", s.hold, "critical",
              "a ckpt driver's metrics endpoint {{ $labels.instance }} does not answer",
              "The job store still lists this driver as active, but it does not answer scrapes: it died or its "
              "host is cut off. Its supervisor restarts it; `ckpt metrics targets` drops it once it is ended."),
        _rule("CkptServiceGaveUp",
              _grown('ckpt_service_actions_total{action=~"gave-up|refused"}', "10m") + " > 0", "0s", "critical",
              "job {{ $labels.ckpt_job }}: the supervision service {{ $labels.action }} it",
              "Service instance {{ $labels.ckpt_instance }} no longer supervises the job: its supervisor kept dying "
              "(gave-up) or its deployment cannot start (refused). Run `ckpt service status` and `ckpt job status "
              "--job {{ $labels.ckpt_job }}`, fix the cause, then hand the job over again."),
        _rule("CkptServiceLeaseFailing",
              "increase(ckpt_service_lease_renewals_total{outcome=\"failed\"}[5m]) > 0", s.hold, "warning",
              "supervision service instance {{ $labels.ckpt_instance }} cannot renew its lease",
              "The job store refuses or does not answer its renewals: once its last renewal is older than its "
              "renew deadline it takes no step, and other instances take its jobs over. Check its host's way to the "
              "store."),
        _rule("CkptServiceDown", f"up{{job=\"{s.service_scrape_job}\"}} == 0", s.hold, "warning",
              "a supervision service instance's metrics endpoint {{ $labels.instance }} does not answer",
              "The instance died or its host is cut off: the other instances take its jobs over after its lease "
              "duration. Run `ckpt service status`."),
    ]}]}


def rules_yaml(s: AlertSettings) -> str:
    return ("# Alert rules for the drivers' metrics of airflow-ckpt-provider (docs/metrics.md), rendered by "
            "`ckpt metrics rules`.\n" + yaml.safe_dump(alert_rules(s), sort_keys=False, width=120))


#: How long an instance that went silent without stopping stays a target: CkptServiceDown fires for it meanwhile,
#: then it drops out (its jobs were taken over long before).
SILENT_TARGET = 900.0


def service_targets(root: Storage) -> list[dict[str, Any]]:
    """Prometheus file_sd entries for the supervision service's instances that serve metrics (their lease records
    name ``metrics_url``): those that did not stop, until SILENT_TARGET s after their last renewal."""
    def unreadable(key: str, err: CkptError) -> None:
        log.warning("service instance record %s unreadable, left out of the targets: %s", key, err)

    return [_target(record.metrics_url, ckpt_service_instance=record.instance, ckpt_service_host=record.host)
            for record, age in read_instances(root, unreadable=unreadable)
            if record.metrics_url is not None and not record.stopped and age <= record.lease_duration + SILENT_TARGET]


def _target(url: str, **labels: str) -> dict[str, Any]:
    """One file_sd entry: the endpoint's host:port, its labels, and its path where it is not /metrics."""
    parts = urlsplit(url)
    if parts.path and parts.path != "/metrics":
        labels["__metrics_path__"] = parts.path
    return {"targets": [parts.netloc], "labels": labels}


def scrape_targets(root: Storage) -> list[dict[str, Any]]:
    """Prometheus file_sd entries for the active drivers of every job under ``root`` that serve metrics (their
    status names ``metrics_url``); a job whose status cannot be read is logged and left out."""
    entries = []
    for job in (name for name in root.folders() if is_job_name(name)):  # one GET each: no job_names' HEADs first
        try:
            status = read_status(JobStore(root, job))
        except CkptError as err:
            log.warning("job %s: status unreadable, left out of the targets: %s", job, err)
            continue
        if status is None or status.metrics_url is None or status.state not in ACTIVE_STATES:
            continue
        entries.append(_target(status.metrics_url, ckpt_driver_host=status.host or ""))
    return entries


def dashboard() -> dict[str, Any]:
    """A Grafana dashboard (JSON model) of the same metrics, one row of panels per concern, a job variable."""
    panels: list[dict[str, Any]] = []
    charts = [
        ("Batches per second", "sum by (ckpt_job) (rate(ckpt_batches_total{ckpt_job=~\"$job\"}[5m]))", "ops"),
        ("Rows per second", "sum by (ckpt_job) (rate(ckpt_input_rows_total{ckpt_job=~\"$job\"}[5m]))", "rowsps"),
        ("Batch duration", "ckpt_last_batch_duration_seconds{ckpt_job=~\"$job\"}", "s"),
        ("Kafka lag (records)", "ckpt_lag_records{ckpt_job=~\"$job\"}", "short"),
        ("Kafka lag (seconds)", "ckpt_lag_seconds{ckpt_job=~\"$job\"}", "s"),
        ("State rows", "ckpt_state_rows{ckpt_job=~\"$job\"}", "short"),
        ("State memory", "ckpt_state_bytes{ckpt_job=~\"$job\"}", "bytes"),
        ("Time since the last snapshot",
         "time() - max without (kind) (ckpt_last_snapshot_timestamp_seconds{ckpt_job=~\"$job\"})", "s"),
        ("Snapshot duration", "ckpt_last_snapshot_duration_seconds{ckpt_job=~\"$job\"}", "s"),
        ("Snapshot size", "ckpt_last_snapshot_size_bytes{ckpt_job=~\"$job\"}", "bytes"),
        ("Snapshot bytes uploaded per second",
         "sum by (ckpt_job, kind) (rate(ckpt_snapshot_uploaded_bytes_total{ckpt_job=~\"$job\"}[5m]))", "Bps"),
        ("Restarts (15 min)", "sum by (ckpt_job, cause) (increase(ckpt_query_restarts_total{ckpt_job=~\"$job\"}[15m]))",
         "short"),
        ("Lease epoch", "max by (ckpt_job) (ckpt_lease_epoch{ckpt_job=~\"$job\"})", "short"),
        ("Store requests per second",
         "sum by (ckpt_job, operation) (rate(ckpt_store_requests_total{ckpt_job=~\"$job\"}[5m]))", "reqps"),
        ("Sink batches (15 min)",
         "sum by (ckpt_job, sink, outcome) (increase(ckpt_sink_batches_total{ckpt_job=~\"$job\"}[15m]))", "short"),
        ("Sink rows per second", "sum by (ckpt_job, sink) (rate(ckpt_sink_rows_total{ckpt_job=~\"$job\"}[5m]))",
         "rowsps"),
        ("Service: takeovers and relaunches (1 h)",
         "sum by (ckpt_job, action) (increase(ckpt_service_actions_total{ckpt_job=~\"$job\"}[1h])) or "
         "sum by (ckpt_job) (increase(ckpt_service_takeovers_total{ckpt_job=~\"$job\"}[1h]))", "short"),
    ]
    for i, (title, expr, unit) in enumerate(charts):
        panels.append({"id": i + 1, "type": "timeseries", "title": title,
                       "datasource": {"type": "prometheus", "uid": "${datasource}"},
                       "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": (i // 3) * 8},
                       "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                       "targets": [{"refId": "A", "expr": expr, "legendFormat": "{{ckpt_job}} {{kind}}{{cause}}"
                                    "{{operation}}{{sink}} {{outcome}}{{action}}"}]})
    return {"title": "ckpt: streaming jobs", "uid": "ckpt-streaming-jobs", "schemaVersion": 39, "version": 1,
            "tags": ["ckpt", "spark", "streaming"], "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {"name": "job", "type": "query", "label": "Job", "includeAll": True, "multi": True,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": {"query": "label_values(ckpt_batches_total, ckpt_job)", "refId": "jobs"},
                 "refresh": 2}]},
            "panels": panels}


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2)
