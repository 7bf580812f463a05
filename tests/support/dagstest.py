"""``airflow dags test`` of one DAG file in a throwaway Airflow home (a sqlite database migrated first): for the
system tests that need a real task runner but no API server (about 20-40 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def dags_test(work: Path, dag_file: str, text: str, dag_id: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Write ``text`` as ``dag_file`` into ``work/dags``, migrate ``work/home``'s database, run ``airflow dags test
    dag_id`` (its output in the result); ``env`` on top of this process's."""
    dags = work / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / dag_file).write_text(text)
    full = {**os.environ, "AIRFLOW_HOME": str(work / "home"), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **(env or {})}

    def airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "airflow", *args], env=full, capture_output=True, text=True,
                              timeout=240, check=False)

    migrated = airflow("db", "migrate")
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    return airflow("dags", "test", dag_id)
