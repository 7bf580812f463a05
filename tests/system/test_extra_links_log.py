"""``airflow dags test`` of operators that end without setting their extra links logs no "XCom not found": Airflow's
task runner reads every declared link's XCom when a task process ends (links.py). About 40 s (a sqlite migrate,
then the run); no job store server, no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.dagstest import dags_test

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

DAG = '''
from datetime import datetime

from airflow.sdk import DAG

from airflow_ckpt_provider.operators.job import StopStreamingJobOperator
from airflow_ckpt_provider.operators.snapshot import TriggerSavepointOperator

with DAG("ckpt_links", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    StopStreamingJobOperator(task_id="stop", job="orders", store_url=STORE)  # never ran: succeeds, no snapshot
    TriggerSavepointOperator(task_id="savepoint", job="orders", store_url=STORE)  # no driver to ask: fails
'''


@pytest.mark.full(proven_by="unit/test_links.py (every operator with links stores them empty first in execute) and "
                            "test_example_dags.py::test_keep_alive_dag_restarts_a_killed_driver_with_exact_counts "
                            "(no [error] line in its dags test logs)")
def test_operators_ending_without_a_link_log_no_missing_xcom(tmp_path: Path) -> None:
    run = dags_test(tmp_path, "ckpt_links.py", f"STORE = {str(tmp_path / 'store')!r}\n{DAG}", "ckpt_links",
                    env={"AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO"})
    log = run.stdout + run.stderr
    assert run.returncode != 0  # the savepoint task failed, as it must with no driver
    assert "nothing to stop" in log and "savepoint" in log
    assert [line for line in log.splitlines() if "XCom not found" in line] == []
