"""CkptSparkHook: where jobs run (spark-submit, master, deploy mode, default Spark settings), from a connection."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import cached_property
from typing import Any
from urllib.parse import urlparse

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.launcher.submit import cluster_manager, find_spark_submit

DEFAULT_MASTER = "local[2]"


class CkptSparkHook(BaseHook):
    """The Spark side of a deployment. Host is the master (``local[2]``, ``yarn``, ``spark://h``, ``k8s://...``;
    the port is appended to a ``spark://`` host); extra: ``deploy_mode``, ``spark_submit``, ``conf`` (a JSON
    object of Spark settings), ``python_env`` (the executors' Python: ``auto``, ``ship``, ``none`` or an
    archive; docs/cluster.md). Without the default connection, jobs run on ``local[2]``."""

    conn_name_attr = "ckpt_spark_conn_id"
    default_conn_name = "ckpt_spark_default"
    conn_type = "ckpt_spark"
    hook_name = "Spark for checkpointed streaming jobs"

    def __init__(self, ckpt_spark_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.ckpt_spark_conn_id = ckpt_spark_conn_id

    @cached_property
    def settings(self) -> dict[str, Any]:
        """``master``, ``deploy_mode``, ``spark_submit``, ``conf`` and ``python_env`` of the connection."""
        try:
            conn = self.get_connection(self.ckpt_spark_conn_id)
        except AirflowNotFoundException:
            if self.ckpt_spark_conn_id != self.default_conn_name:
                raise
            self.log.info("no connection %s: running jobs on %s", self.ckpt_spark_conn_id, DEFAULT_MASTER)
            return {"master": DEFAULT_MASTER, "deploy_mode": "client", "spark_submit": None, "conf": {},
                    "python_env": "auto"}
        extra = conn.extra_dejson
        master = (conn.host or DEFAULT_MASTER).strip()
        if master.startswith("spark://") and conn.port and not urlparse(master).port:
            master = f"{master}:{conn.port}"
        cluster_manager(master)  # refuses an unknown master with a clear message
        return {
            "master": master,
            "deploy_mode": extra.get("deploy_mode") or "client",
            "spark_submit": extra.get("spark_submit") or None,
            "conf": _conf(extra.get("conf"), self.ckpt_spark_conn_id),
            "python_env": extra.get("python_env") or "auto",
        }

    def test_connection(self) -> tuple[bool, str]:
        """spark-submit runs (``--version``); a standalone master's port accepts connections."""
        try:
            settings = self.settings
            binary = find_spark_submit(settings["spark_submit"])
            # pyspark's spark-submit finds SPARK_HOME with a Python that has pyspark: this one unless told
            env = {"PYSPARK_PYTHON": sys.executable, **os.environ}
            done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=120, check=False,
                                  env=env)
            if done.returncode != 0:
                return False, f"{binary} --version exited with {done.returncode}: {done.stderr.strip()[-300:]}"
            master = settings["master"]
            if master.startswith("spark://"):
                first = urlparse(master.split(",")[0])
                with socket.create_connection((first.hostname or "", first.port or 7077), timeout=10):
                    pass
        except (CkptError, OSError, subprocess.TimeoutExpired) as err:
            return False, str(err)
        return True, f"spark-submit {binary} works; master {master}"


def _conf(value: Any, conn_id: str) -> dict[str, str]:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise ConfigError(f"connection {conn_id}: extra 'conf' is not JSON ({err}); expected an object such "
                              'as {"spark.sql.shuffle.partitions": "4"}') from err
    if not isinstance(value, dict):
        raise ConfigError(f"connection {conn_id}: extra 'conf' must be a JSON object of Spark settings, "
                          f"found {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}
