"""``airflow dags test`` of a task that fails with ``StreamingJobNotifier`` as its failure callback: Airflow calls it,
and the next notifier (one with a templated text, as Slack's) sends the alert that names the job, its state, its
latest completed snapshot and what to run. A local job store with a status and a savepoint; no Spark. About 40 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.status import JobState
from tests.support.dagstest import dags_test
from tests.support.operatorfakes import alerting_store

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

DAG = '''
from datetime import datetime

from airflow.sdk import DAG, task
from airflow.sdk.bases.notifier import BaseNotifier

from airflow_ckpt_provider.notifications.job import StreamingJobNotifier


class FileNotifier(BaseNotifier):
    """Sends its templated text by appending it to a file (as Slack's notifier sends its text)."""

    template_fields = ("text",)

    def __init__(self, text):
        super().__init__()
        self.text = text

    def notify(self, context):
        with open(SENT, "a") as out:
            out.write(self.text + "\\n")


with DAG("ckpt_alerting", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    @task(on_failure_callback=StreamingJobNotifier(job="orders", then=FileNotifier("streaming job: {{ ckpt_alert }}")))
    def restart():
        raise RuntimeError("the driver FAILED")

    restart()
'''


def test_a_failed_tasks_callback_sends_the_jobs_alert_through_the_next_notifier(tmp_path: Path) -> None:
    store, savepoint, store_conn = alerting_store(tmp_path, JobState.FAILED)
    sent = tmp_path / "sent.txt"
    run = dags_test(tmp_path, "ckpt_alerting.py", f"SENT = {str(sent)!r}\n{DAG}", "ckpt_alerting",
                    env={"AIRFLOW_CONN_CKPT_STORE_DEFAULT": store_conn})
    assert run.returncode != 0, run.stdout[-3000:]  # the task failed
    lines = sent.read_text().splitlines() if sent.exists() else []
    assert len(lines) == 1, (lines, run.stdout[-3000:] + run.stderr[-3000:])
    where = f"--job orders --store {store.root.url}"
    assert lines[0].startswith("streaming job: job orders: task restart of DAG ckpt_alerting (run ")
    assert (") failed: the driver FAILED; FAILED at epoch 4, heartbeat " in lines[0]
            and f"; latest completed snapshot {savepoint} (batch 0, " in lines[0]
            and f"; latest savepoint {savepoint} (batch 0, " in lines[0]
            and lines[0].endswith(f"run `ckpt job status {where}`; to restart it from its latest state: "
                                  f"`ckpt job restart {where}` (or the DAG's restart task)")), lines[0]
