"""OpenLineage facets of the operators that launch a job (submit, restart, upgrade).

Design notes: docs/airflow.md#design-notes-operatorslineagepy."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET, DatasetName, uri_dataset
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.start import read_start
from airflow_ckpt_provider.core.records.status import read_status
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.store.jobstore import check_snapshot_id
from airflow_ckpt_provider.kafka.offsets import kafka_inputs
from airflow_ckpt_provider.operators.base import JobOperator

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.store.jobstore import JobStore

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RestoredFrom:
    """The snapshot a driver restored at its start."""

    snapshot_id: str
    kind: str | None
    batch_id: int | None
    uri: str

    def to_dict(self) -> dict[str, Any]:
        return {"snapshotId": self.snapshot_id, "kind": self.kind, "batchId": self.batch_id, "uri": self.uri}


@dataclass(frozen=True)
class LaunchLineage:
    """What a launching task says about the job's lineage: the custom run facet's fields and the datasets."""

    job: str
    code_version: str | None = None
    restore: str | None = None  # as asked (latest-state, a snapshot id...), or as the launch recorded it
    epoch: int | None = None
    launch_id: str | None = None
    action: str | None = None  # how the driver started: restore, keep-live, fresh (deployments/<epoch>.json)
    restored_from: RestoredFrom | None = None
    inputs: tuple[DatasetName, ...] = ()
    outputs: tuple[DatasetName, ...] = ()
    unnamed_topics: tuple[str, ...] = ()  # Kafka topics read whose brokers are not known

    def run_facet(self) -> dict[str, Any]:
        """The custom run facet's fields (OpenLineage's camelCase)."""
        return {"job": self.job, "epoch": self.epoch, "codeVersion": self.code_version, "launchId": self.launch_id,
                "restore": self.restore, "startAction": self.action,
                "restoredFrom": self.restored_from.to_dict() if self.restored_from else None,
                "unnamedTopics": list(self.unnamed_topics)}


def observe_launch(store: JobStore) -> LaunchLineage:
    """The job's lineage as the job store tells it after a launch: spec/last.json, status.json and the
    deployments/ record of the status' epoch. Unreadable parts are left out (logged), never raised."""
    lineage = LaunchLineage(job=store.job)
    try:
        last = read_launch(store)
    except CkptError as err:
        log.warning("job %s: lineage without spec/last.json: %s", store.job, err)
        last = None
    if last is not None:
        lineage = LaunchLineage(job=store.job, code_version=last.deployment.code_version, restore=str(last.restore),
                                launch_id=last.launch_id)
    try:
        status = read_status(store)
    except CkptError as err:
        log.warning("job %s: lineage without status.json: %s", store.job, err)
        status = None
    if status is None:
        return lineage
    inputs, unnamed = kafka_inputs(status.offsets)
    start = read_start(store, status.epoch)  # None when missing or unreadable (logged)
    snapshot_id = start.snapshot if start else None
    return LaunchLineage(
        job=store.job, code_version=status.code_version or lineage.code_version,
        restore=(start.restore if start else None) or lineage.restore, epoch=status.epoch,
        launch_id=(start.launch_id if start else None) or lineage.launch_id,
        action=(start.action or None) if start else None,
        restored_from=_restored_from(store, snapshot_id) if isinstance(snapshot_id, str) else None,
        inputs=tuple(inputs), unnamed_topics=tuple(unnamed))


def _restored_from(store: JobStore, snapshot_id: str) -> RestoredFrom:
    """The snapshot's kind and batch from its manifest, else from its id (KIND-BATCH-TIME-RANDOM: it may have
    been disposed of since)."""
    uri = store.snapshot_uri(snapshot_id)
    try:
        manifest = load_manifest(store, snapshot_id)
        return RestoredFrom(snapshot_id, manifest.kind.value, manifest.batch_id, uri)
    except (CkptError, FileNotFoundError) as err:
        log.info("job %s: snapshot %s restored from is not readable (%s): kind and batch from its id", store.job,
                 snapshot_id, err)
    try:
        kind, batch = check_snapshot_id(snapshot_id).split("-")[:2]
        return RestoredFrom(snapshot_id, kind, int(batch), uri)
    except (CkptError, ValueError):
        return RestoredFrom(snapshot_id, None, None, uri)


def planned_launch(op: JobOperator) -> LaunchLineage:
    """Before the launch: what the task's arguments say (no IO)."""
    restore = getattr(op, "restore", None)
    mode = getattr(op, "upgrade_mode", None)
    return LaunchLineage(job=op.job, code_version=getattr(op, "code_version", None),
                         restore=str(restore) if restore is not None else (f"upgrade:{mode}" if mode else None))


# -- OpenLineage ---------------------------------------------------------------------------------------


def declared(objects: Iterable[Any]) -> list[Any]:
    """A task's ``inlets``/``outlets``: an object whose ``uri`` names a Kafka topic, an S3 or a file path (an
    Asset) as a DatasetName (Airflow converts only ``file`` Assets without the Amazon and Kafka providers), any
    other as it is, for the OpenLineage provider to convert (its Datasets, lineage Files and Tables, Assets)."""
    out: list[Any] = []
    for obj in objects:
        uri = getattr(obj, "uri", None)
        named = uri_dataset(uri) if isinstance(uri, str) else None
        out.append(named if named is not None else obj)
    return out


def to_operator_lineage(lineage: LaunchLineage, inlets: Iterable[Any] = (), outlets: Iterable[Any] = ()) -> Any:
    """``OperatorLineage`` of ``lineage`` plus the task's declared ``inlets``/``outlets`` (declared first;
    duplicates dropped). ImportError without the OpenLineage provider."""
    from airflow_ckpt_provider.operators import lineagefacets

    return lineagefacets.operator_lineage((RUN_FACET, lineage.run_facet()), [*declared(inlets), *lineage.inputs],
                                          [*declared(outlets), *lineage.outputs])


def facets_on_start(op: JobOperator) -> Any:
    """``get_openlineage_facets_on_start`` of a launching operator: None without the OpenLineage provider."""
    try:
        return to_operator_lineage(planned_launch(op), op.inlets, op.outlets)
    except ImportError as err:
        log.debug("job %s: no OpenLineage facets: %s", op.job, err)
        return None


def facets_on_complete(op: JobOperator) -> Any:
    """``get_openlineage_facets_on_complete``: what the job store says after the launch (also what the provider
    reports for a failed task: e.g. an upgrade rolled back, then the old code's driver)."""
    try:
        observed = observe_launch(op.job_store())
    except CkptError as err:  # the store is not reachable: the declared datasets only
        log.warning("job %s: lineage from the task's arguments only: %s", op.job, err)
        observed = planned_launch(op)
    try:
        return to_operator_lineage(observed, op.inlets, op.outlets)
    except ImportError as err:
        log.debug("job %s: no OpenLineage facets: %s", op.job, err)
        return None


def launch_env(op: JobOperator, deployment_env: Mapping[str, str]) -> dict[str, str]:
    """OpenLineage settings for the driver ``op`` launches, so that it sends RUNNING events to where this Airflow
    sends its own (docs/airflow.md#lineage): the provider's transport (unless the worker's environment or the
    deployment's ``env`` configures one), namespace and the task's run as the parent. Passed in the driver's
    environment, never recorded (a transport may hold an API key). {} without the provider; never raises."""
    from airflow.sdk import get_current_context

    from airflow_ckpt_provider.launcher.deploy import inherited_env

    try:
        ti = get_current_context()["ti"]
    except RuntimeError:  # not in a task run (a test calling execute()): no parent run
        ti = None
    try:
        from airflow.providers.openlineage import conf  # light; lineagefacets imports the provider's plugin

        if conf.is_disabled():
            return {}
        from airflow_ckpt_provider.operators import lineagefacets

        return lineagefacets.driver_env({**inherited_env(), **deployment_env}, ti)
    except ImportError as err:
        log.debug("job %s: no OpenLineage settings for the driver: %s", op.job, err)
    except Exception as err:  # the provider's configuration is broken: lineage must not stop the launch
        log.warning("job %s: the driver gets no OpenLineage settings, it sends no lineage events: %s: %s", op.job,
                    type(err).__name__, err)
    return {}


class LaunchingOperator(JobOperator):
    """An operator whose task launches the job's drivers (a submit, an operation): its OpenLineage facets, called by
    Airflow's OpenLineage provider when it is installed."""

    def get_openlineage_facets_on_start(self) -> Any:
        return facets_on_start(self)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return facets_on_complete(self)
