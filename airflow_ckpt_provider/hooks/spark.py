"""CkptSparkHook: where jobs run (spark-submit, master, deploy mode, default Spark settings), from a connection."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.launcher.sparktarget import DEFAULT_MASTER, SparkTarget

__all__ = ["CkptSparkHook"]


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
        return self.target.as_dict()

    @cached_property
    def target(self) -> SparkTarget:
        """The connection's fields, parsed (launcher/sparktarget.py, shared with the Dagster resource)."""
        try:
            conn = self.get_connection(self.ckpt_spark_conn_id)
        except AirflowNotFoundException:
            if self.ckpt_spark_conn_id != self.default_conn_name:
                raise
            self.log.info("no connection %s: running jobs on %s", self.ckpt_spark_conn_id, DEFAULT_MASTER)
            return SparkTarget()
        extra = conn.extra_dejson
        return SparkTarget.from_fields(
            host=conn.host, port=conn.port, deploy_mode=extra.get("deploy_mode"),
            spark_submit=extra.get("spark_submit"), conf=extra.get("conf"), python_env=extra.get("python_env"),
            where=f"connection {self.ckpt_spark_conn_id}")

    def test_connection(self) -> tuple[bool, str]:
        """spark-submit runs (``--version``); a standalone master's port accepts connections."""
        try:
            target = self.target
        except CkptError as err:
            return False, str(err)
        return target.test()
