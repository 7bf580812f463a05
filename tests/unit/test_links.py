"""The extra links (Spark UI, snapshot) and what makes an address browsable."""

from __future__ import annotations

import contextlib

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
    # ignore[arg-type] on the next 2 lines: no task instance key; the patched get_value ignores it
    assert SparkUILink().get_link(op, ti_key=None) == UI  # type: ignore[arg-type]
    assert SnapshotLink().get_link(op, ti_key=None) == ""  # type: ignore[arg-type]


# -- every declared link is stored before the task can end or defer -------------------------------------------------


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


@pytest.mark.usefixtures("store")  # the default store connection: job "orders" never ran, no Spark connection
def test_an_operator_that_fails_at_once_has_stored_every_link_empty() -> None:
    """Airflow's task runner reads every declared link's XCom when the task process ends (finalize): one never
    stored is logged as "XCom not found". Each operator here fails (or ends) at its first look at the job."""
    from airflow_ckpt_provider.operators.base import JobOperator
    from tests.unit.operators.test_declarative import every_operator

    ops = every_operator()
    linked = {type(op) for op in ops if op.operator_extra_links}
    assert linked == {cls for cls in _subclasses(JobOperator) if cls.operator_extra_links}  # no operator missed
    stored = {}
    for op in ops:
        ctx = context()
        with contextlib.suppress(Exception):  # failing before any link is set is the case under test
            op.execute(ctx)
        stored[type(op).__name__] = ctx["ti"].xcoms
    assert stored == {
        "SubmitStreamingJobOperator": {"_link_SparkUILink": ""},  # no Spark connection
        "StopStreamingJobOperator": {"_link_SnapshotLink": ""},  # nothing to stop: succeeds without a snapshot
        "RestartStreamingJobOperator": {"_link_SparkUILink": "", "_link_SnapshotLink": ""},  # no deployment
        "TriggerSavepointOperator": {"_link_SnapshotLink": ""},  # no driver to ask
        "DisposeSnapshotsOperator": {},  # no links
        "UpgradeStreamingJobOperator": {"_link_SparkUILink": "", "_link_SnapshotLink": ""},  # no deployment
        "RescaleStreamingJobOperator": {"_link_SparkUILink": "", "_link_SnapshotLink": ""},  # no deployment
    }

