"""The extra links (Spark UI, snapshot) and what makes an address browsable."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.links import SnapshotLink, SparkUILink, browsable
from tests.support.operatorfakes import (
    UI,
    context,
    submit_op,
)

# -- links -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "endpoint", "link"), [
    ("s3://bucket/jobs/orders/snapshots/sp-1", None,
     "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=jobs/orders/snapshots/sp-1/"),
    ("s3a://bucket/jobs/orders/snapshots/sp-1/", None,
     "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=jobs/orders/snapshots/sp-1/"),
    ("s3://bucket/jobs/orders/snapshots/sp-1", "http://seaweed:8333/",
     "http://seaweed:8333/bucket/jobs/orders/snapshots/sp-1/manifest.json"),
    ("/data/jobs/orders/snapshots/sp-1", None, "file:///data/jobs/orders/snapshots/sp-1"),
    ("file:///data/jobs/orders/snapshots/sp-1", "http://ignored:1", "file:///data/jobs/orders/snapshots/sp-1"),
])
def test_browsable(uri: str, endpoint: str | None, link: str) -> None:
    assert browsable(uri, endpoint) == link


def test_links_persist_under_their_xcom_key() -> None:
    ctx = context()
    SparkUILink.persist(ctx, UI)
    SnapshotLink.persist_snapshot(ctx, "s3://b/jobs/orders/snapshots/sp-1", "http://s3:8333")
    assert ctx["ti"].xcoms == {"_link_SparkUILink": UI,
                               "_link_SnapshotLink": "http://s3:8333/b/jobs/orders/snapshots/sp-1/manifest.json"}


def test_links_without_a_url_persist_an_empty_one() -> None:
    ctx = context()
    SparkUILink.persist(ctx, None)  # an empty link is hidden; a missing XCom is logged as an error
    SnapshotLink.persist_snapshot(ctx, None, "http://s3:8333")
    assert ctx["ti"].xcoms == {"_link_SparkUILink": "", "_link_SnapshotLink": ""}


def test_get_link_reads_the_xcom(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    stored = {"_link_SparkUILink": UI}
    monkeypatch.setattr(XCom, "get_value", lambda *, ti_key, key: stored.get(key))
    op = submit_op()
    assert SparkUILink().get_link(op, ti_key=None) == UI  # type: ignore[arg-type]
    assert SnapshotLink().get_link(op, ti_key=None) == ""  # type: ignore[arg-type]
