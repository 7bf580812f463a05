"""JobStoreHook: the job store (S3 or local) described by an Airflow connection."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.storage import S3Options, Storage, open_storage


class JobStoreHook(BaseHook):
    """Opens job stores; credentials come from this connection or from a referenced AWS connection."""

    conn_name_attr = "ckpt_store_conn_id"
    default_conn_name = "ckpt_store_default"
    conn_type = "ckpt_store"
    hook_name = "Checkpoint job store (S3 or local)"

    def __init__(self, ckpt_store_conn_id: str = default_conn_name, store_url: str | None = None) -> None:
        super().__init__()
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self._store_url = store_url

    @cached_property
    def _conn(self) -> Connection | None:
        """The connection; None when it does not exist but ``store_url`` was given (credentials from the env)."""
        try:
            return self.get_connection(self.ckpt_store_conn_id)
        except AirflowNotFoundException:
            if self._store_url:
                return None
            raise

    @cached_property
    def _extra(self) -> dict[str, Any]:
        return dict(self._conn.extra_dejson) if self._conn else {}

    @property
    def store_url(self) -> str:
        url = self._store_url or self._extra.get("store_url")
        if not url:
            raise ConfigError(
                f"connection {self.ckpt_store_conn_id!r} has no store_url: set it to s3://BUCKET/PREFIX "
                "or a local directory, or pass store_url to the hook"
            )
        return str(url)

    @cached_property
    def s3_options(self) -> S3Options:
        conn = self._conn
        if conn is None:
            return S3Options.from_env()
        aws_conn_id = self._extra.get("aws_conn_id")
        if aws_conn_id:
            aws = self.get_connection(str(aws_conn_id))
            aws_extra = aws.extra_dejson
            return S3Options(
                endpoint_url=aws_extra.get("endpoint_url") or conn.host or None,
                region=aws_extra.get("region_name") or self._extra.get("region_name"),
                access_key_id=aws.login or None,
                secret_access_key=aws.password or None,
                session_token=aws_extra.get("aws_session_token"),
            )
        return S3Options(
            endpoint_url=conn.host or None,
            region=self._extra.get("region_name"),
            access_key_id=conn.login or None,
            secret_access_key=conn.password or None,
        )

    def storage(self) -> Storage:
        return open_storage(self.store_url, self.s3_options)

    def job_store(self, job: str) -> JobStore:
        return JobStore(self.storage(), job)

    def test_connection(self) -> tuple[bool, str]:
        """List the store root (one request): checks endpoint, credentials and bucket."""
        try:
            self.storage().list("ckpt-connection-test/")
        except CkptError as err:
            return False, str(err)
        return True, f"job store {self.store_url} is reachable"
