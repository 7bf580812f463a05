"""OpenLineage facets of the launching operators (operators/lineage.py): dataset naming, what the job store tells
after a launch, the facets through the real OpenLineage classes, and the operators without the provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset

from airflow_ckpt_provider import operators
from airflow_ckpt_provider.core.policy import lineagenames
from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET, DatasetName, RunRef
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, SPEC_LAST, JobStore
from airflow_ckpt_provider.kafka.offsets import kafka_inputs
from airflow_ckpt_provider.operators import lineage
from airflow_ckpt_provider.operators.job import SubmitStreamingJobOperator
from airflow_ckpt_provider.operators.lineage import LaunchLineage, RestoredFrom
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from airflow_ckpt_provider.operators.upgrade import UpgradeStreamingJobOperator
from airflow_ckpt_provider.runtime.lineage import LineageRun, configured_by
from tests.support.operatorfakes import (
    ORDERS_V1,
    ORDERS_V2,
    FakeLaunch,
    FakeTI,
    context,
    make_snapshots,
    record_deployment,
    report,
)

REPO = Path(__file__).resolve().parents[3]
#: status.json offsets of a driver with three sources: ckpt-kafka with commitGroupId (brokers known), ckpt-kafka
#: without (topics only), and a file source.
OFFSETS = {
    "0:PythonMicroBatchStream": {"orders": {"0": 12, "1": 9}, "$commit": {"group": "g", "servers": "b1:9092,b2:9092"}},
    "1:PythonMicroBatchStream": {"refunds": {"0": 3}},
    "2:FileStreamSource": {"logOffset": 3},
    "3:RateStreamSource": None,
}


def write_start(store: JobStore, epoch: int, **record: Any) -> None:
    """deployments/<epoch>.json as runtime/startup.py writes it."""
    body = {"epoch": epoch, "at": 1.0, "restore": "latest-state", "action": "fresh", "snapshot": None,
            "launch_id": "launch-0"} | record
    store.storage.write(f"{DEPLOYMENTS}{epoch:010d}.json", json.dumps(body).encode())


# -- naming (pure) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "expected"), [
    ("kafka://broker:9092/orders", ("kafka://broker:9092", "orders")),
    ("s3://bucket/out/orders/", ("s3://bucket", "out/orders")),
    ("s3a://bucket/out/orders", ("s3://bucket", "out/orders")),
    ("/data/out/../orders", ("file", "/data/orders")),
    ("file:///data/orders", ("file", "/data/orders")),
    ("file://host/data/orders", ("file://host", "/data/orders")),
    ("s3://bucket", None),  # no key: not a dataset
    ("postgres://db:5432/app", None),  # left to the OpenLineage provider's converters
])
def test_uri_dataset_follows_the_openlineage_naming(uri: str, expected: tuple[str, str] | None) -> None:
    assert lineagenames.uri_dataset(uri) == (DatasetName(*expected) if expected else None)


def test_kafka_dataset_is_named_by_the_first_bootstrap_server() -> None:
    assert lineagenames.kafka_dataset(" SASL_SSL://b1:9093, b2:9093", "t") == DatasetName("kafka://b1:9093", "t")


def test_kafka_inputs_come_from_the_sources_end_offsets() -> None:
    named, unnamed = kafka_inputs(OFFSETS)
    assert named == [DatasetName("kafka://b1:9092", "orders")]
    assert unnamed == ["refunds"]  # a source without commitGroupId: its offsets do not name the brokers


# -- what the job store tells after a launch ------------------------------------------------------


def test_observe_launch_names_the_snapshot_restored_from(store: JobStore, tmp_path: Path) -> None:
    _checkpoint, savepoint = make_snapshots(store, tmp_path, [Kind.CHECKPOINT, Kind.SAVEPOINT])
    record_deployment(store, launch_id="launch-7")
    report(store, epoch=4, code_version="v1", offsets=OFFSETS)
    write_start(store, 4, restore=savepoint, action="restore", snapshot=savepoint, launch_id="launch-7")

    observed = lineage.observe_launch(store)

    assert observed == LaunchLineage(
        job="orders", code_version="v1", restore=savepoint, epoch=4, launch_id="launch-7", action="restore",
        restored_from=RestoredFrom(savepoint, "savepoint", 1, store.snapshot_uri(savepoint)),
        inputs=(DatasetName("kafka://b1:9092", "orders"),), unnamed_topics=("refunds",))


def test_a_disposed_snapshot_is_named_from_its_id(store: JobStore) -> None:
    sid = "checkpoint-41-20261122T101500Z-abc123"
    report(store, epoch=2)
    write_start(store, 2, action="restore", snapshot=sid)
    assert lineage.observe_launch(store).restored_from == RestoredFrom(sid, "checkpoint", 41, store.snapshot_uri(sid))


def test_before_any_launch_only_the_job_is_known(store: JobStore) -> None:
    assert lineage.observe_launch(store) == LaunchLineage(job="orders")


def test_a_fresh_start_restored_nothing(store: JobStore) -> None:
    record_deployment(store)
    report(store, epoch=1)
    write_start(store, 1)
    observed = lineage.observe_launch(store)
    assert (observed.action, observed.restored_from, observed.inputs) == ("fresh", None, ())
    assert observed.run_facet() == {"job": "orders", "epoch": 1, "codeVersion": "v1", "launchId": "launch-0",
                                    "restore": "latest-state", "startAction": "fresh", "restoredFrom": None,
                                    "unnamedTopics": []}


def test_declared_assets_are_named_here_and_other_objects_passed_on() -> None:
    other = object()
    assert lineage.declared([Asset("kafka://b:9092/orders"), Asset("s3://bucket/out"), other]) == [
        DatasetName("kafka://b:9092", "orders"), DatasetName("s3://bucket", "out"), other]


# -- through the real OpenLineage classes ----------------------------------------------------------


def _names(datasets: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def test_operator_facets_with_the_openlineage_provider(store: JobStore, tmp_path: Path) -> None:
    pytest.importorskip("airflow.providers.openlineage")
    from openlineage.client.serde import Serde

    (savepoint,) = make_snapshots(store, tmp_path, [Kind.SAVEPOINT])
    op = SubmitStreamingJobOperator(
        task_id="submit", job="orders", job_file=ORDERS_V1, code_version="v1", restore=savepoint,
        inlets=[Asset("kafka://b1:9092/orders")],  # the same topic the driver reports: once
        outlets=[Asset("s3://lake/orders/totals")],
    )
    start = op.get_openlineage_facets_on_start()
    assert _names(start.inputs) == [("kafka://b1:9092", "orders")]
    assert _names(start.outputs) == [("s3://lake", "orders/totals")]
    assert Serde.to_dict(start.run_facets[RUN_FACET])["restore"] == savepoint

    record_deployment(store, launch_id="launch-9")
    report(store, epoch=5, code_version="v1", offsets=OFFSETS)
    write_start(store, 5, restore=savepoint, action="restore", snapshot=savepoint, launch_id="launch-9")
    done = op.get_openlineage_facets_on_complete(None)
    assert _names(done.inputs) == [("kafka://b1:9092", "orders")]
    assert _names(done.outputs) == [("s3://lake", "orders/totals")]
    facet = Serde.to_dict(done.run_facets[RUN_FACET])
    assert facet["_schemaURL"].startswith("https://openlineage.io/spec/")
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "job": "orders", "epoch": 5, "codeVersion": "v1", "launchId": "launch-9", "restore": savepoint,
        "startAction": "restore", "unnamedTopics": ["refunds"],
        "restoredFrom": {"snapshotId": savepoint, "kind": "savepoint", "batchId": 0,
                         "uri": store.snapshot_uri(savepoint)}}


def test_upgrade_and_restart_operators_have_the_facets_too(store: JobStore) -> None:
    pytest.importorskip("airflow.providers.openlineage")
    upgrade = UpgradeStreamingJobOperator(task_id="upgrade", job="orders", job_file=ORDERS_V2, code_version="v2")
    fields = upgrade.get_openlineage_facets_on_start().run_facets[RUN_FACET]
    assert (fields.codeVersion, fields.restore) == ("v2", "upgrade:savepoint")
    restart = RestartStreamingJobOperator(task_id="restart", job="orders")
    report(store, epoch=2, offsets=OFFSETS)
    assert _names(restart.get_openlineage_facets_on_complete(None).inputs) == [("kafka://b1:9092", "orders")]


# -- without the OpenLineage provider --------------------------------------------------------------


def test_no_facets_when_openlineage_cannot_be_imported(monkeypatch: pytest.MonkeyPatch, store: JobStore) -> None:
    for name in ("openlineage", "openlineage.client", "airflow.providers.openlineage",
                 "airflow.providers.openlineage.extractors", "airflow_ckpt_provider.operators.lineagefacets"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import raises ImportError
    monkeypatch.delattr(operators, "lineagefacets", raising=False)  # else `from operators import` finds it
    op = SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1)
    assert op.get_openlineage_facets_on_start() is None
    assert op.get_openlineage_facets_on_complete(None) is None


def test_the_operators_import_and_build_without_openlineage(tmp_path: Path) -> None:
    """A fresh interpreter where importing openlineage fails: the operators import, build, and have no facets."""
    script = textwrap.dedent("""
        import importlib.abc, sys

        # Airflow's provider discovery still loads the installed package's get_provider_info (an uninstalled
        # one has no entry point): everything else of it, and the OpenLineage client, cannot be imported.
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.startswith(("openlineage", "airflow.providers.openlineage.")) and not name.endswith(
                        ".get_provider_info"):
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, Block())
        from airflow_ckpt_provider.operators.job import SubmitStreamingJobOperator
        from airflow_ckpt_provider.operators.upgrade import UpgradeStreamingJobOperator
        op = SubmitStreamingJobOperator(task_id="t", job="orders", job_file="orders_v1.py")
        assert op.get_openlineage_facets_on_start() is None
        assert UpgradeStreamingJobOperator(task_id="u", job="orders", job_file="v2.py").job == "orders"
        assert not [m for m in sys.modules if m.startswith(("openlineage", "airflow_ckpt_provider.operators.lineagef"))]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
                               "AIRFLOW_HOME": str(tmp_path / "airflow")}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_the_openlineage_provider_extracts_through_the_operators_methods(store: JobStore) -> None:
    """The provider's own extraction (what its listener calls on success) picks these methods, not its fallback
    to inlets/outlets, and keeps the Kafka input and the run facet."""
    pytest.importorskip("airflow.providers.openlineage")
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    op = SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1,
                                    outlets=[Asset("kafka://b1:9092/totals")])
    report(store, epoch=3, offsets=OFFSETS)
    write_start(store, 3, action="restore", snapshot="savepoint-7-20261122T101500Z-abc123")
    manager = ExtractorManager()
    assert manager.get_extractor_class(op) is manager.default_extractor
    found = manager.extract_metadata(SimpleNamespace(run_id="r"), op, TaskInstanceState.SUCCESS, None)
    assert _names(found.inputs) == [("kafka://b1:9092", "orders")]
    assert _names(found.outputs) == [("kafka://b1:9092", "totals")]
    assert found.run_facets[RUN_FACET].restoredFrom["snapshotId"] == "savepoint-7-20261122T101500Z-abc123"


# -- the driver's OpenLineage settings (runtime/lineage.py sends its RUNNING events) ----------------------


class RunningTI(FakeTI):
    """A task instance with what the provider's lineage macros read of it."""

    dag_id, task_id, try_number, map_index = "orders_dag", "submit", 2, -1
    dag_run = SimpleNamespace(logical_date=datetime(2026, 11, 26, 7, 0, tzinfo=UTC), run_after=None, conf={},
                              clear_number=0)

    def get_template_context(self) -> dict[str, Any]:
        return {"dag_run": self.dag_run}


#: [openlineage] transport of the Airflow deployment: HTTP with an API key.
TRANSPORT = {"type": "http", "url": "http://marquez:5000", "auth": {"type": "api_key", "apiKey": "s3cr3t-key"}}


@pytest.fixture
def ol_conf(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OpenLineage setting in the environment but what the test sets; the provider's cached conf cleared."""
    from airflow.providers.openlineage import conf

    for name in [k for k in os.environ if k.startswith(("OPENLINEAGE", "AIRFLOW__OPENLINEAGE__"))]:
        monkeypatch.delenv(name)
    cached = [f for f in vars(conf).values() if hasattr(f, "cache_clear")]
    for f in cached:
        f.cache_clear()
    yield
    for f in cached:
        f.cache_clear()


def launch_in_task(op: Any, launches: FakeLaunch) -> dict[str, str]:
    """Run ``op`` as in a task run (the current context set), up to its deferral; the environment it launched with."""
    from airflow.sdk.exceptions import TaskDeferred
    from airflow.sdk.execution_time.context import set_current_context

    ctx = context(ti=RunningTI())
    with set_current_context(ctx), pytest.raises(TaskDeferred):
        op.execute(ctx)
    [env] = launches.unrecorded_envs
    return env


@pytest.mark.usefixtures("ol_conf")
def test_a_launch_gives_the_driver_the_providers_transport_and_the_task_as_parent(
        store: JobStore, launches: FakeLaunch, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(TRANSPORT))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "prod")
    env = launch_in_task(SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1), launches)
    task_run = OpenLineageAdapter.build_task_instance_run_id(  # the run id of the task's own lineage events
        dag_id="orders_dag", task_id="submit", try_number=2, logical_date=RunningTI.dag_run.logical_date, map_index=-1)
    dag_run = OpenLineageAdapter.build_dag_run_id(dag_id="orders_dag", logical_date=RunningTI.dag_run.logical_date,
                                                  clear_number=0)
    assert env == {"OPENLINEAGE__TRANSPORT": json.dumps(TRANSPORT), "OPENLINEAGE_NAMESPACE": "prod",
                   "OPENLINEAGE_PARENT_ID": f"prod/orders_dag.submit/{task_run}",
                   "OPENLINEAGE_ROOT_PARENT_ID": f"prod/orders_dag/{dag_run}"}
    # what the driver makes of it: the client's own configuration, and the parent run
    assert configured_by(env) == "OPENLINEAGE__TRANSPORT"
    assert LineageRun.of("orders", env, epoch=1).parent == RunRef("prod", "orders_dag.submit", task_run)
    # the API key reaches the driver's environment only: the launch record does not hold it
    assert "s3cr3t-key" not in store.storage.read(SPEC_LAST).decode()


@pytest.mark.usefixtures("ol_conf")
def test_a_transport_the_job_has_already_is_not_replaced(store: JobStore, launches: FakeLaunch,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(TRANSPORT))
    monkeypatch.setenv("OPENLINEAGE_URL", "http://other:5000")  # the worker's: the driver inherits it
    op = SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1,
                                    env={"OPENLINEAGE_NAMESPACE": "streaming"})
    env = launch_in_task(op, launches)
    assert sorted(env) == ["OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID"]
    assert env["OPENLINEAGE_PARENT_ID"].startswith("default/orders_dag.submit/")  # the task's events' namespace


@pytest.mark.usefixtures("ol_conf")
def test_nothing_for_the_driver_when_the_provider_is_not_configured(store: JobStore, launches: FakeLaunch) -> None:
    assert launch_in_task(SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1),
                          launches) == {}


def test_nothing_for_the_driver_without_the_provider(monkeypatch: pytest.MonkeyPatch, store: JobStore) -> None:
    monkeypatch.setitem(sys.modules, "airflow_ckpt_provider.operators.lineagefacets", None)
    monkeypatch.delattr(operators, "lineagefacets", raising=False)
    op = SubmitStreamingJobOperator(task_id="submit", job="orders", job_file=ORDERS_V1)
    assert lineage.launch_env(op, {}) == {}
