"""The system tests' Airflow harness explains a failure without a server: a task's log from the files in the
Airflow home when the REST API cannot serve it, Airflow 3's structured log records rendered as text."""

from __future__ import annotations

import json
from pathlib import Path

from tests.system.airflow_server import AirflowServer, render_log_line


def test_a_structured_record_reads_as_one_line() -> None:
    record = {"timestamp": "2026-11-25T07:57:32.07Z", "level": "error", "logger": "task", "event": "boom",
              "error_detail": "x"}
    assert render_log_line(record) == "2026-11-25T07:57:32.07Z error task boom error_detail=x"
    assert render_log_line(json.dumps(record)) == render_log_line(record)
    assert render_log_line("plain text") == "plain text"


def test_the_task_log_falls_back_to_the_files_in_the_airflow_home(tmp_path: Path) -> None:
    server = AirflowServer(tmp_path / "dags", home=tmp_path / "home")
    server.home = tmp_path / "home"  # as start() sets it; no server runs, so the API cannot answer
    folder = server.home / "logs" / "dag_id=d" / "run_id=r" / "task_id=t"
    folder.mkdir(parents=True)
    (folder / "attempt=1.log").write_text(json.dumps({"timestamp": "T1", "level": "info", "event": "deferring"}))
    (folder / "attempt=1.log.trigger.7.log").write_text(json.dumps({"level": "info", "event": "held 25.0 s"}))
    (folder / "attempt=2.log").write_text("not this try")
    text = server.task_log("d", "r", "t", 1)
    assert text.splitlines()[0].startswith("(GET /dags/d/dagRuns/r/taskInstances/t/logs/1 failed")
    assert "T1 info deferring" in text and "info held 25.0 s" in text and "attempt=1.log.trigger.7.log" in text
    assert "not this try" not in text
    assert "(no log files in" in server.task_log("d", "r", "other", 1)
