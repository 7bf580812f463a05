"""Where jobs run: the fields of a ``ckpt_spark`` connection (master, deploy mode, spark-submit, Spark conf, the
executors' Python), parsed and checked once for the Airflow hook (hooks/spark.py) and the Dagster resource
(dagster/resources.py).

In the launcher, not in core: the master is checked against the cluster managers spark-submit knows
(launcher/submit.py ``cluster_manager``), and the connection test runs spark-submit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.launcher.submit import cluster_manager, find_spark_submit

DEFAULT_MASTER = "local[2]"


@dataclass(frozen=True)
class SparkTarget:
    """The Spark side of a deployment: ``master`` (``local[2]``, ``yarn``, ``spark://h:p``, ``k8s://...``),
    ``deploy_mode``, ``spark_submit`` (None: found on PATH or in pyspark), ``conf`` (Spark settings) and
    ``python_env`` (the executors' Python: ``auto``, ``ship``, ``none`` or an archive; docs/cluster.md)."""

    master: str = DEFAULT_MASTER
    deploy_mode: str = "client"
    spark_submit: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    python_env: str = "auto"

    @classmethod
    def from_fields(cls, *, host: str | None = None, port: int | None = None, deploy_mode: str | None = None,
                    spark_submit: str | None = None, conf: Any = None, python_env: str | None = None,
                    where: str = "the Spark settings") -> SparkTarget:
        """The target from a connection's fields: ``host`` is the master (a ``spark://`` host takes ``port`` when it
        names none), ``conf`` a mapping or its JSON text. ConfigError naming ``where`` when a field is bad."""
        master = (host or DEFAULT_MASTER).strip()
        if master.startswith("spark://") and port and not urlparse(master).port:
            master = f"{master}:{port}"
        cluster_manager(master)  # refuses an unknown master with a clear message
        return cls(master=master, deploy_mode=deploy_mode or "client", spark_submit=spark_submit or None,
                   conf=conf_object(conf, where), python_env=python_env or "auto")

    def as_dict(self) -> dict[str, Any]:
        """``master``, ``deploy_mode``, ``spark_submit``, ``conf`` and ``python_env``."""
        return {"master": self.master, "deploy_mode": self.deploy_mode, "spark_submit": self.spark_submit,
                "conf": dict(self.conf), "python_env": self.python_env}

    def test(self) -> tuple[bool, str]:
        """spark-submit runs (``--version``); a standalone master's port accepts connections."""
        try:
            binary = find_spark_submit(self.spark_submit)
            # pyspark's spark-submit finds SPARK_HOME with a Python that has pyspark: this one unless told
            env = {"PYSPARK_PYTHON": sys.executable, **os.environ}
            done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=120, check=False,
                                  env=env)
            if done.returncode != 0:
                return False, f"{binary} --version exited with {done.returncode}: {done.stderr.strip()[-300:]}"
            if self.master.startswith("spark://"):
                first = urlparse(self.master.split(",")[0])
                with socket.create_connection((first.hostname or "", first.port or 7077), timeout=10):
                    pass
        except (CkptError, OSError, subprocess.TimeoutExpired) as err:
            return False, str(err)
        return True, f"spark-submit {binary} works; master {self.master}"


def conf_object(value: Any, where: str) -> dict[str, str]:
    """Spark settings from a mapping or its JSON text (None or '': none); ConfigError naming ``where``."""
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise ConfigError(f"{where}: extra 'conf' is not JSON ({err}); expected an object such "
                              'as {"spark.sql.shuffle.partitions": "4"}') from err
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: extra 'conf' must be a JSON object of Spark settings, "
                          f"found {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}
