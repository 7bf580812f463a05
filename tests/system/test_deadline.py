"""A missed Deadline Alert under a real Airflow (api-server, scheduler, dag-processor, triggerer): the DAG's deadline
(5 s after the run was queued) passes while its task still runs; the scheduler finds it missed and the triggerer
awaits ``StreamingJobNotifier`` as the deadline's ``AsyncCallback``, which says what the job store knows about the
job (its state, epoch, latest savepoint) and what to run, and sends it through the next notifier named by its class
path (a deadline's kwargs are JSON). Exactly one alert, sent while the task still ran; the run still succeeds (a
deadline alerts, it does not fail the run). A local job store; no Spark. About 60 s."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.status import JobState
from tests.support.operatorfakes import alerting_store
from tests.system.airflow_server import AirflowServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]

DAG = '''
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

from airflow_ckpt_provider.notifications.job import StreamingJobNotifier

with DAG("ckpt_deadline", schedule=None, start_date=datetime(2026, 1, 1), deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(seconds=5),
        callback=AsyncCallback(StreamingJobNotifier, kwargs={
            "job": "orders", "what": "the keep-alive run is still going 5 s after it was queued",
            "then": {"classpath": "tests.support.filenotifier.FileNotifier",
                     "kwargs": {"text": "streaming job: {{ ckpt_alert }}", "path": SENT}}}))):

    @task
    def watch():
        time.sleep(WATCH_SECONDS)

    watch()
'''


def test_a_missed_deadline_sends_the_jobs_alert_from_the_triggerer_while_the_run_goes_on(tmp_path: Path) -> None:
    store, savepoint, store_conn = alerting_store(tmp_path, JobState.RUNNING)
    dags, sent = tmp_path / "dags", tmp_path / "sent.txt"
    dags.mkdir()
    (dags / "ckpt_deadline.py").write_text(f"WATCH_SECONDS = 30\nSENT = {str(sent)!r}\n{DAG}")
    env = {"AIRFLOW_CONN_CKPT_STORE_DEFAULT": store_conn, "PYTHONPATH": str(REPO)}  # the triggerer imports tests.
    with AirflowServer(dags, env=env) as airflow:
        airflow.wait_dag_parsed("ckpt_deadline")
        airflow.unpause("ckpt_deadline")
        response = airflow.trigger("ckpt_deadline", {}, run_id="deadline-missed")
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not sent.exists():
            time.sleep(0.5)
        assert sent.exists(), airflow.log_tails()
        assert airflow.task_states("ckpt_deadline", "deadline-missed") == {"watch": "running"}  # before its end
        assert airflow.wait_run("ckpt_deadline", "deadline-missed", timeout=120) == "success"
        queued = datetime.fromisoformat(airflow.api_json("GET", "/dags/ckpt_deadline/dagRuns/deadline-missed")[
            "queued_at"]).timestamp()
    lines = sent.read_text().splitlines()
    assert len(lines) == 1, lines  # one alert, sent once
    at, text = lines[0].split(" ", 1)
    print(f"alert sent {float(at) - queued:.1f} s after the run was queued (deadline 5 s)")
    where = f"--job orders --store {store.root.url}"
    assert re.fullmatch(
        rf"streaming job: job orders: the keep-alive run is still going 5 s after it was queued; RUNNING at epoch 4, "
        rf"heartbeat \d+ s ago, batch 120; latest completed snapshot {savepoint} \(batch 0, \d+ s old\); latest "
        rf"savepoint {savepoint} \(batch 0, \d+ s old\); run `ckpt job status {re.escape(where)}`; to restart it from "
        rf"its latest state: `ckpt job restart {re.escape(where)}` \(or the DAG's restart task\)", text), text
