"""The package is a registered Airflow provider with its connection type and fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ckpt_provider.embedded import EmbeddedS3

pytestmark = pytest.mark.integration


#: The four CLI commands in one interpreter, each through ``airflow``'s console-script entry point with its own argv
#: and stdout (one start of Airflow, ~10 s of imports, instead of four).
_CLI_COMMANDS = """if True:
    import contextlib, io, json, sys
    from airflow.__main__ import main
    out = {}
    for name, argv in json.loads(sys.argv[1]).items():
        sys.argv = ["airflow", *argv]
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            main()
        out[name] = buf.getvalue()
    print(json.dumps(out))
"""


def test_airflow_lists_the_provider_and_its_connection_type(tmp_path: Path) -> None:
    commands = {"providers": ["providers", "list"], "hooks": ["providers", "hooks"], "links": ["providers", "links"],
                "plugins": ["plugins", "-o", "json"]}
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    done = subprocess.run([sys.executable, "-c", _CLI_COMMANDS, json.dumps(commands)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "airflow-ckpt-provider" in out["providers"]
    line = next(x for x in out["hooks"].splitlines() if x.startswith("ckpt_store"))
    assert "airflow_ckpt_provider.hooks.job_store.JobStoreHook" in line
    line = next(x for x in out["hooks"].splitlines() if x.startswith("ckpt_spark"))
    assert "airflow_ckpt_provider.hooks.spark.CkptSparkHook" in line
    assert "airflow_ckpt_provider.links.SparkUILink" in out["links"]
    assert "airflow_ckpt_provider.links.SnapshotLink" in out["links"]
    listed = out["plugins"]
    plugins = {p["name"]: p for p in json.loads(listed[listed.index("["):])}
    page = plugins["ckpt_streaming_jobs"]  # once: the entry point only, never also as a provider plugin
    assert [(a["url_prefix"], a["name"]) for a in page["fastapi_apps"]] == [("/ckpt-jobs", "Streaming jobs")]
    assert [(v["name"], v["href"], v["destination"], v["url_route"]) for v in page["external_views"]] == [
        ("Streaming jobs", "ckpt-jobs/", "nav", "streaming-jobs")]


def test_connection_fields_are_declared_in_provider_info() -> None:
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    widgets = pm.connection_form_widgets
    assert {"extra__ckpt_store__store_url", "extra__ckpt_store__region_name",
            "extra__ckpt_store__aws_conn_id"} <= set(widgets)
    behaviour = pm.field_behaviours["ckpt_store"]
    assert behaviour["relabeling"]["host"] == "S3 endpoint URL"
    assert {"extra__ckpt_spark__deploy_mode", "extra__ckpt_spark__spark_submit",
            "extra__ckpt_spark__conf"} <= set(widgets)
    assert pm.field_behaviours["ckpt_spark"]["relabeling"]["host"] == "Master URL"


def test_every_module_outside_the_airflow_layer_imports_without_airflow() -> None:
    """Every module of core, kafka, sinks, runtime, launcher, cli, embedded and demo, walked (so none is
    forgotten), imports in a fresh interpreter without loading Airflow: what the Spark driver and ``ckpt`` need."""
    code = ("import sys, importlib, pkgutil\n"
            "for pkg in ['core', 'kafka', 'sinks', 'runtime', 'launcher', 'cli', 'embedded', 'demo']:\n"
            "    root = importlib.import_module('airflow_ckpt_provider.' + pkg)\n"
            "    for info in pkgutil.walk_packages(root.__path__, root.__name__ + '.'):\n"
            "        if not info.name.endswith('.__main__'):\n"
            "            importlib.import_module(info.name)\n"
            "bad = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_job_store_hook_test_connection(s3_server: EmbeddedS3, bucket: str, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    from airflow_ckpt_provider.hooks.job_store import JobStoreHook

    def conn(secret: str) -> str:
        extra = {"store_url": f"s3://{bucket}/jobs", "region_name": "us-east-1"}
        return json.dumps({"conn_type": "ckpt_store", "host": s3_server.endpoint_url,
                           "login": s3_server.access_key, "password": secret, "extra": extra})

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_GOOD_STORE", conn(s3_server.secret_key))
    monkeypatch.setenv("AIRFLOW_CONN_BAD_STORE", conn("wrong-secret-value"))
    ok, message = JobStoreHook("good_store").test_connection()
    assert ok, message
    ok, message = JobStoreHook("bad_store").test_connection()
    assert not ok
    assert "refused the credentials" in message
    assert "wrong-secret-value" not in message
    store = JobStoreHook("good_store").job_store("orders")
    assert store.url == f"s3://{bucket}/jobs/orders"


def test_spark_hook_test_connection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_ckpt_provider.hooks.spark import CkptSparkHook

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_LOCAL_SPARK", json.dumps({"conn_type": "ckpt_spark", "host": "local[2]",
                                                               "extra": {"conf": {"spark.ui.enabled": "false"}}}))
    ok, message = CkptSparkHook("local_spark").test_connection()
    assert ok, message
    assert "master local[2]" in message
    monkeypatch.setenv("AIRFLOW_CONN_NO_MASTER", json.dumps({"conn_type": "ckpt_spark", "host": "spark://127.0.0.1",
                                                             "port": 1}))
    ok, message = CkptSparkHook("no_master").test_connection()
    assert not ok
    assert "refused" in message.lower()
