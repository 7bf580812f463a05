"""The Dagster layer runs without Airflow, and the example Definitions load in Dagster."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

EXAMPLE = Path(__file__).parents[3] / "examples" / "dagster" / "definitions.py"


def test_the_dagster_layer_and_its_examples_import_without_loading_airflow(tmp_path: Path) -> None:
    code = ("import sys, importlib, pkgutil, runpy\n"
            "import airflow_ckpt_provider.dagster as root\n"
            "for info in pkgutil.walk_packages(root.__path__, root.__name__ + '.'):\n"
            "    importlib.import_module(info.name)\n"
            f"runpy.run_path({str(EXAMPLE)!r})\n"
            "bad = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env={"CKPT_STORE": str(tmp_path),
                                                                                "PATH": "/usr/bin:/bin"})


def test_the_example_definitions_load_with_every_job_sensor_and_check(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_STORE", str(tmp_path))
    defs = runpy.run_path(str(EXAMPLE))["defs"]
    dg.Definitions.validate_loadable(defs)
    jobs = {j.name for j in defs.resolve_all_job_defs()} - {"__ASSET_JOB"}
    assert jobs == {"ckpt_keep_alive", "ckpt_restart", "ckpt_savepoint_restore", "ckpt_upgrade_job",
                    "ckpt_on_savepoint", "ckpt_on_lag"}
    assert {s.name for s in defs.sensors} == {"orders_health", "orders_savepoints", "ckpt_orders_lag", "orders_output"}
    assert sorted((k.asset_key.to_user_string(), k.name) for k in defs.resolve_asset_graph().asset_check_keys) == [
        ("orders/output", "fresh"), ("orders/output", "lag")]
