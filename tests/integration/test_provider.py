"""The package is a registered Airflow provider with its connection type and fields."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_airflow_lists_the_provider_and_its_connection_type(tmp_path: Path) -> None:
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    airflow = str(Path(sys.executable).with_name("airflow"))
    providers = subprocess.run([airflow, "providers", "list"], env=env, capture_output=True, text=True,
                               timeout=120, check=True).stdout
    assert "airflow-ckpt-provider" in providers
    hooks = subprocess.run([airflow, "providers", "hooks"], env=env, capture_output=True, text=True,
                           timeout=120, check=True).stdout
    line = next(x for x in hooks.splitlines() if x.startswith("ckpt_store"))
    assert "airflow_ckpt_provider.hooks.job_store.JobStoreHook" in line


def test_connection_fields_are_declared_in_provider_info() -> None:
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    widgets = pm.connection_form_widgets
    assert {"extra__ckpt_store__store_url", "extra__ckpt_store__region_name",
            "extra__ckpt_store__aws_conn_id"} <= set(widgets)
    behaviour = pm.field_behaviours["ckpt_store"]
    assert behaviour["relabeling"]["host"] == "S3 endpoint URL"


def test_core_imports_without_airflow() -> None:
    code = ("import sys, importlib\n"
            "for m in ['snapshots','restore','gc','retention','checkpoint','storage','s3']:\n"
            "    importlib.import_module('airflow_ckpt_provider.core.' + m)\n"
            "import airflow_ckpt_provider.cli\n"
            "bad = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
