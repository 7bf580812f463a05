"""Operator extra links: the running job's Spark UI and the location of a snapshot.

Design notes: docs/airflow.md#design-notes-linkspy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey


class _StoredLink(BaseOperatorLink):
    link_name: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return self.link_name

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value: Any = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return str(value) if value else ""

    @classmethod
    def persist(cls, context: Context, url: str | None) -> None:
        """Store the link's URL for this task instance ("" when there is none: the UI hides an empty link,
        and a missing XCom would be logged as an error when Airflow collects the links)."""
        context["ti"].xcom_push(key=cls().xcom_key, value=url or "")


class SparkUILink(_StoredLink):
    """The Spark UI of the job's running driver (from its heartbeat)."""

    link_name = "Spark UI"


class SnapshotLink(_StoredLink):
    """Where a snapshot is (its manifest), e.g. s3://bucket/jobs/orders/snapshots/<id>."""

    link_name = "Snapshot location"

    @classmethod
    def persist_snapshot(cls, context: Context, uri: str | None, endpoint_url: str | None = None) -> None:
        cls.persist(context, browsable(uri, endpoint_url) if uri else "")


def persist_empty_links(context: Context, operator: BaseOperator) -> None:
    """Store an empty URL for each of ``operator``'s stored links, before anything can fail or defer."""
    for link in operator.operator_extra_links:
        if isinstance(link, _StoredLink):
            link.persist(context, "")


def browsable(uri: str, endpoint_url: str | None = None) -> str:
    """A snapshot URI as a link: the AWS console on AWS, the manifest's URL on another S3 endpoint
    (SeaweedFS, MinIO), ``file://`` for a local store."""
    if not uri.startswith(("s3://", "s3a://")):
        return uri if "://" in uri else f"file://{uri}"
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    prefix = prefix.rstrip("/")
    if endpoint_url:
        return f"{endpoint_url.rstrip('/')}/{bucket}/{prefix}/manifest.json"
    return f"https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={prefix}/"
