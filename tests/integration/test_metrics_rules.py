"""The shipped alert rules (`ckpt metrics rules`, launcher/monitoring.py) under Debian's `promtool test rules`: each
alert fires on the series a sick job's driver serves, with its labels and its text, and stays quiet on a healthy one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_ckpt_provider.launcher.monitoring import AlertSettings, alert_rules, rules_yaml

pytestmark = pytest.mark.integration


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool (Debian's prometheus package) is missing: scripts/bootstrap installs it as root"
    return found

DRIVER = {"ckpt_job": "orders", "epoch": "4", "code_version": "v2", "instance": "10.0.0.5:9464", "job": "ckpt-drivers"}


SERVICE = {"ckpt_instance": "svc-a", "instance": "10.0.0.6:9465", "job": "ckpt-service"}


def service_series(name: str, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in {**SERVICE, **labels}.items())
    return f"{name}{{{inner}}}"


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {**DRIVER, **labels}
    inner = ",".join(f'{k}="{v}"' for k, v in all_labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def expected(rules: dict[str, Any], alert: str, **labels: str) -> dict[str, Any]:
    """The alert as promtool must see it: its labels, and its annotations with the labels filled in."""
    rule = next(r for r in rules["groups"][0]["rules"] if r["alert"] == alert)
    every = {**labels, **rule["labels"]}

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: every[m.group(1)], text)

    return {"exp_labels": every, "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()}}


def run_promtool(tmp_path: Path, settings: AlertSettings,
                 tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ckpt.rules.yml").write_text(rules_yaml(settings))
    (tmp_path / "ckpt.test.yml").write_text(yaml.safe_dump({
        "rule_files": ["ckpt.rules.yml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", "ckpt.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)


def test_promtool_checks_the_shipped_rules_file(tmp_path: Path) -> None:
    rules = tmp_path / "ckpt.rules.yml"
    rules.write_text(rules_yaml(AlertSettings()))
    done = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "SUCCESS: 10 rules found" in done.stdout, done.stdout + done.stderr


def test_each_alert_fires_on_a_sick_jobs_series_and_stays_quiet_on_a_healthy_one(tmp_path: Path) -> None:
    settings = AlertSettings(hold="2m", snapshot_age_floor=60, lag_rising="10m", restarts=3, restart_window="15m")
    rules = alert_rules(settings)
    driver = dict(DRIVER)
    job_only = {"ckpt_job": "orders"}
    tests = [
        {   # Snapshots every minute, then none after minute 5 while batches go on each minute (interval 60 s: 3
            # intervals are 180 s). At minute t the last batch is 60 t - 300 s past the last snapshot: beyond 180 s
            # from 9m on (pending), held for 2m: firing at 11m.
            "interval": "1m",
            "input_series": [
                series("ckpt_last_batch_timestamp_seconds", "0+60x20"),
                series("ckpt_last_snapshot_timestamp_seconds", "0+60x5 300x15", kind="checkpoint"),
                series("ckpt_checkpoint_interval_seconds", "60x20"),
                series("ckpt_driver_start_timestamp_seconds", "0x20"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "CkptSnapshotTooOld", "exp_alerts": []},
                {"eval_time": "9m", "alertname": "CkptSnapshotTooOld", "exp_alerts": []},
                {"eval_time": "11m", "alertname": "CkptSnapshotTooOld",
                 "exp_alerts": [expected(rules, "CkptSnapshotTooOld", **driver)]},
            ],
        },
        {   # A fresh driver that never completed a snapshot while batches completed for 5 minutes.
            "interval": "1m",
            "input_series": [
                series("ckpt_last_batch_timestamp_seconds", "0+60x10"),
                series("ckpt_checkpoint_interval_seconds", "60x10"),
                series("ckpt_driver_start_timestamp_seconds", "0x10"),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "CkptSnapshotTooOld", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "CkptSnapshotTooOld",
                 "exp_alerts": [expected(rules, "CkptSnapshotTooOld", **driver)]},
            ],
        },
        {   # Four drivers (epochs 4-7) in 15 minutes is three restarts more than one; two drivers are not.
            "interval": "1m",
            "input_series": [
                series("ckpt_lease_epoch", "4x3 _x20", epoch="4", instance="h:1"),
                series("ckpt_lease_epoch", "_x3 5x3 _x20", epoch="5", instance="h:2"),
                series("ckpt_lease_epoch", "_x6 6x3 _x20", epoch="6", instance="h:3"),
                series("ckpt_lease_epoch", "_x9 7x20", epoch="7", instance="h:4"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "CkptCrashLoop", "exp_alerts": []},
                {"eval_time": "11m", "alertname": "CkptCrashLoop",
                 "exp_alerts": [expected(rules, "CkptCrashLoop", **job_only)]},
            ],
        },
        {   # Three query restarts inside one driver within 15 minutes (the series appears at the first: from 0).
            "interval": "1m",
            "input_series": [series("ckpt_query_restarts_total", "_ _ 1 1 2 2 3 3 3 3", cause="the query failed")],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "CkptCrashLoop", "exp_alerts": []},
                {"eval_time": "8m", "alertname": "CkptCrashLoop",
                 "exp_alerts": [expected(rules, "CkptCrashLoop", **job_only)]},
            ],
        },
        {   # The fenced driver of epoch 4 still reports RUNNING beside epoch 5's.
            "interval": "1m",
            "input_series": [
                series("ckpt_job_state", "1x10", state="RUNNING"),
                series("ckpt_job_state", "_x3 1x7", state="RUNNING", epoch="5", instance="h:5"),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "CkptFencedDriverRunning", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "CkptFencedDriverRunning",
                 "exp_alerts": [expected(rules, "CkptFencedDriverRunning", **job_only)]},
            ],
        },
        {   # Heartbeats every minute until 3m (interval 30 s: 95 s of silence is too much).
            "interval": "1m",
            "input_series": [
                series("ckpt_heartbeat_timestamp_seconds", "0+60x3 180x10"),
                series("ckpt_heartbeat_interval_seconds", "30x13"),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "CkptNoHeartbeat", "exp_alerts": []},
                {"eval_time": "7m", "alertname": "CkptNoHeartbeat",
                 "exp_alerts": [expected(rules, "CkptNoHeartbeat", **driver)]},
            ],
        },
        {   # A checkpoint snapshot failed at minute 3.
            "interval": "1m",
            "input_series": [series("ckpt_snapshot_failures_total", "0 0 0 1 1 1", kind="checkpoint")],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "CkptSnapshotFailing", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "CkptSnapshotFailing",
                 "exp_alerts": [expected(rules, "CkptSnapshotFailing", **driver, kind="checkpoint")]},
            ],
        },
        {   # Lag grows by 100 records a minute for 20 minutes; a steady lag does not alert.
            "interval": "1m",
            "input_series": [
                series("ckpt_lag_records", "100+100x25"),
                series("ckpt_lag_records", "500x25", ckpt_job="steady"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "CkptLagRising", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "CkptLagRising",
                 "exp_alerts": [expected(rules, "CkptLagRising", **driver)]},
            ],
        },
        {   # The endpoint stops answering at minute 2.
            "interval": "1m",
            "input_series": [{"series": 'up{instance="10.0.0.5:9464",job="ckpt-drivers"}', "values": "1 1 0x8"}],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "CkptDriverDown", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "CkptDriverDown", "exp_alerts": [
                    expected(rules, "CkptDriverDown", instance="10.0.0.5:9464", job="ckpt-drivers")]},
            ],
        },
        {   # A service instance relaunches the job's lost supervisor three times, then gives up at minute 6.
            "interval": "1m",
            "input_series": [
                {"series": service_series("ckpt_service_actions_total", ckpt_job="orders", action="relaunched"),
                 "values": "0 1 2 3 3 3 3 3 3 3"},
                {"series": service_series("ckpt_service_actions_total", ckpt_job="orders", action="gave-up"),
                 "values": "_ _ _ _ _ _ 1 1 1 1"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "CkptServiceGaveUp", "exp_alerts": []},
                {"eval_time": "7m", "alertname": "CkptServiceGaveUp", "exp_alerts": [
                    expected(rules, "CkptServiceGaveUp", **SERVICE, ckpt_job="orders", action="gave-up")]},
            ],
        },
        {   # Its renewals fail from minute 3 on (the store is cut off), and it stops answering scrapes at minute 6.
            "interval": "1m",
            "input_series": [
                {"series": service_series("ckpt_service_lease_renewals_total", outcome="failed"),
                 "values": "0 0 0 30 60 90 120 150 180 210"},
                {"series": 'up{instance="10.0.0.6:9465",job="ckpt-service"}', "values": "1 1 1 1 1 1 0 0 0 0 0"},
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "CkptServiceLeaseFailing", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "CkptServiceLeaseFailing", "exp_alerts": [
                    expected(rules, "CkptServiceLeaseFailing", **SERVICE, outcome="failed")]},
                {"eval_time": "7m", "alertname": "CkptServiceDown", "exp_alerts": []},
                {"eval_time": "9m", "alertname": "CkptServiceDown", "exp_alerts": [
                    expected(rules, "CkptServiceDown", instance="10.0.0.6:9465", job="ckpt-service")]},
            ],
        },
    ]
    done = run_promtool(tmp_path, settings, tests)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_a_rule_setting_that_is_no_duration_is_refused_naming_it() -> None:
    from airflow_ckpt_provider.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"hold: expected a Prometheus duration such as 30s, 2m or 1h, found '2 min'"):
        alert_rules(AlertSettings(hold="2 min"))
