"""CkptResource: the job store and the Spark settings, the fields of the ``ckpt_store`` and ``ckpt_spark`` Airflow
connections as one Dagster resource.

Dagster's config system checks the types and the names of the fields before a run starts (a number for
``store_url``, a misspelt field, a ``deploy_mode`` outside client/cluster). What only this package can judge (a
store URL without a bucket, an unknown master, an endpoint that is no http(s) URL) is checked by the same code
as the connections' (core/store/storeconfig.py, launcher/sparktarget.py) when the resource is built: in
``Definitions`` when it is built there, else at the start of the run, before any op does anything.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

import dagster as dg
from pydantic import Field, field_validator

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.store.storeconfig import StoreConfig, check_store
from airflow_ckpt_provider.launcher.sparktarget import DEFAULT_MASTER, SparkTarget

T = TypeVar("T")


def _checked(check: Callable[[], object], value: T) -> T:
    """``value`` if ``check()`` passes; a ValueError (what pydantic and Dagster report) with its message if not.
    A ``dg.EnvVar`` is the variable's name: it is checked once Dagster resolved it, when the run builds the
    resource again from the values."""
    if isinstance(value, dg.EnvVar) or not isinstance(value, str | None):  # a wrong type: pydantic says so
        return value
    try:
        check()
    except CkptError as err:
        raise ValueError(f"{err}. Fix the ckpt resource's config") from err
    return value


class DeployMode(StrEnum):
    """Where the Spark driver runs: on the host of the op (client) or in the cluster. Dagster's config enums take
    member names: the names are the spellings."""

    client = "client"
    cluster = "cluster"


class CkptResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # generic over the resource it makes (itself)
    """The job store (``store_url`` and how to reach S3) and where jobs run (``master``, ``deploy_mode``,
    ``spark_submit``, ``spark_conf``, ``python_env``): the ``ckpt_store`` and ``ckpt_spark`` connections' fields;
    ``py_files`` and ``files`` ship with every job's launch, before the submit op's own.

    Give secrets with ``dg.EnvVar("AWS_SECRET_ACCESS_KEY")``: Dagster then shows the variable's name, never its
    value. Without keys, boto3's usual chain (the environment, a profile, an instance role) is used.
    """

    store_url: str = Field(description="The job store: s3://BUCKET/PREFIX, file:///PATH or a local directory")
    endpoint_url: str | None = Field(default=None, description="The S3 endpoint (http://HOST:PORT); none: AWS")
    region_name: str | None = Field(default=None, description="The S3 region")
    access_key_id: str | None = Field(default=None, description="The S3 access key id")
    secret_access_key: str | None = Field(default=None, description="The S3 secret key (use dg.EnvVar)")
    session_token: str | None = Field(default=None, description="An S3 session token (use dg.EnvVar)")
    master: str = Field(default=DEFAULT_MASTER, description="local[N], spark://HOST:PORT, yarn or k8s://https://...")
    deploy_mode: DeployMode = Field(default=DeployMode.client, description="client or cluster")
    spark_submit: str | None = Field(default=None, description="spark-submit to run; none: pyspark's or PATH's")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Spark settings of every job's launch")
    python_env: str = Field(default="auto", description="The executors' Python: auto, ship, none or an archive")
    py_files: list[str] = Field(default_factory=list,
                                description="Python modules of every job (.py, .zip, .egg), shipped to its driver and "
                                            "executors with the provider's code (spark-submit --py-files)")
    files: list[str] = Field(default_factory=list, description="Data files of every job (spark-submit --files)")

    # The connections' own checks, one field at a time (so the error names the field, and shows no other
    # field's value: a secret stays out of it).
    @field_validator("store_url", mode="before")
    @classmethod
    def _check_store_url(cls, value: object) -> object:
        return _checked(lambda: StoreConfig.from_fields(store_url=str(value), where="the ckpt resource"), value)

    @field_validator("endpoint_url", mode="before")
    @classmethod
    def _check_endpoint(cls, value: object) -> object:
        return _checked(lambda: S3Options(endpoint_url=str(value or "") or None), value)

    @field_validator("master", mode="before")
    @classmethod
    def _check_master(cls, value: object) -> object:
        return _checked(lambda: SparkTarget.from_fields(host=str(value), where="the ckpt resource"), value)

    def store_config(self) -> StoreConfig:
        return StoreConfig.from_fields(
            store_url=self.store_url, where="the ckpt resource", endpoint_url=self.endpoint_url,
            region=self.region_name, access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
            session_token=self.session_token)

    def s3_options(self) -> S3Options | None:
        return self.store_config().s3

    def job_store(self, job: str) -> JobStore:
        """The store of ``job``; ConfigError for a name that is not a job name."""
        return self.store_config().job_store(job)

    def spark_target(self) -> SparkTarget:
        return SparkTarget.from_fields(host=self.master, deploy_mode=self.deploy_mode.value,
                                       spark_submit=self.spark_submit, conf=dict(self.spark_conf),
                                       python_env=self.python_env, where="the ckpt resource")

    def test_connection(self, *, spark: bool = False) -> tuple[bool, str]:
        """List the job store (one request: endpoint, credentials, bucket); with ``spark``, run spark-submit
        --version and reach a standalone master too."""
        ok, message = check_store(self.store_config())
        if not ok or not spark:
            return ok, message
        spark_ok, spark_message = self.spark_target().test()
        return spark_ok, f"{message}; {spark_message}"

    def describe(self) -> dict[str, Any]:
        """For logs: where the store and Spark are, secrets left out."""
        s3 = self.s3_options()
        return {"store_url": self.store_url, **(s3.redacted() if s3 else {}), "master": self.master,
                "deploy_mode": self.deploy_mode.value}
