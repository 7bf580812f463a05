"""CkptSparkHook: the Spark settings from the ckpt_spark connection."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.hooks.spark import CkptSparkHook

# -- CkptSparkHook ---------------------------------------------------------------------------------------------------


def spark_connection(monkeypatch: pytest.MonkeyPatch, **conn: Any) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", json.dumps({"conn_type": "ckpt_spark", **conn}))


@pytest.mark.parametrize("conf", [{"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": 4},
                                  json.dumps({"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": 4})],
                         ids=["object", "json-text"])
def test_spark_hook_settings_from_the_connection(monkeypatch: pytest.MonkeyPatch, conf: Any) -> None:
    spark_connection(monkeypatch, host="spark://h", port=7077,
                     extra={"conf": conf, "deploy_mode": "client", "spark_submit": "/opt/spark/bin/spark-submit"})
    assert CkptSparkHook().settings == {
        "master": "spark://h:7077", "deploy_mode": "client", "spark_submit": "/opt/spark/bin/spark-submit",
        "conf": {"spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "4"}, "python_env": "auto"}


def test_spark_hook_keeps_a_port_in_the_host_and_other_masters(monkeypatch: pytest.MonkeyPatch) -> None:
    spark_connection(monkeypatch, host="spark://h:7078", port=7077)
    assert CkptSparkHook().settings["master"] == "spark://h:7078"
    spark_connection(monkeypatch, host="yarn", port=7077, extra={"deploy_mode": "cluster", "python_env": "none"})
    assert (CkptSparkHook().settings["master"], CkptSparkHook().settings["deploy_mode"],
            CkptSparkHook().settings["python_env"]) == ("yarn", "cluster", "none")
    spark_connection(monkeypatch)
    assert CkptSparkHook().settings == {"master": "local[2]", "deploy_mode": "client", "spark_submit": None,
                                        "conf": {}, "python_env": "auto"}


@pytest.mark.parametrize(("conn", "message"), [
    ({"host": "mesos://m:5050"}, "unknown Spark master 'mesos://m:5050'"),
    ({"host": "local[2]", "extra": {"conf": "{not json"}}, "extra 'conf' is not JSON"),
    ({"host": "local[2]", "extra": {"conf": ["a=b"]}}, "extra 'conf' must be a JSON object .*found list"),
])
def test_spark_hook_refuses_bad_settings(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any], message: str) -> None:
    spark_connection(monkeypatch, **conn)
    with pytest.raises(ConfigError, match=message):
        _ = CkptSparkHook().settings


def test_spark_hook_without_the_default_connection_runs_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_CKPT_SPARK_DEFAULT", raising=False)
    assert CkptSparkHook().settings == {"master": "local[2]", "deploy_mode": "client", "spark_submit": None,
                                        "conf": {}, "python_env": "auto"}
    with pytest.raises(AirflowNotFoundException, match="my_spark"):
        _ = CkptSparkHook("my_spark").settings  # a connection named on purpose must exist
