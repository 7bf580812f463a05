"""launcher/monitoring.py service_targets: which supervision service instances Prometheus scrapes (records written to
a real local store)."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_ckpt_provider.core.records.ownership import InstanceRecord, instance_key
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.launcher.monitoring import SILENT_TARGET, service_targets


def write(root: LocalStorage, name: str, *, url: str | None, stopped: bool = False, age: float = 1.0) -> None:
    now = time.time()
    record = InstanceRecord(instance=name, host=f"host-{name}", pid=1, started_at=now - 1000, renewed_at=now - age,
                            sequence=3, renew_every=2.0, lease_duration=12.0, stopped=stopped, metrics_url=url)
    root.write(instance_key(name), record.to_bytes())


def test_live_and_recently_silent_instances_serving_metrics_are_targets_the_stopped_and_long_silent_are_not(
        tmp_path: Path) -> None:
    root = LocalStorage(tmp_path)
    write(root, "live", url="http://10.0.0.6:9465/metrics")
    write(root, "silent", url="http://10.0.0.7:40123/metrics", age=300.0)  # CkptServiceDown fires for it meanwhile
    write(root, "gone", url="http://10.0.0.8:9465/metrics", age=12.0 + SILENT_TARGET + 60)
    write(root, "stopped", url="http://10.0.0.9:9465/metrics", stopped=True)
    write(root, "quiet", url=None)  # serves no metrics
    write(root, "pathed", url="http://10.0.0.10:9465/custom")
    assert sorted(service_targets(root), key=lambda t: t["targets"][0]) == [
        {"targets": ["10.0.0.10:9465"], "labels": {"ckpt_service_instance": "pathed",
                                                   "ckpt_service_host": "host-pathed", "__metrics_path__": "/custom"}},
        {"targets": ["10.0.0.6:9465"], "labels": {"ckpt_service_instance": "live", "ckpt_service_host": "host-live"}},
        {"targets": ["10.0.0.7:40123"], "labels": {"ckpt_service_instance": "silent",
                                                   "ckpt_service_host": "host-silent"}},
    ]
