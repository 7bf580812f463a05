"""The OpenLineage classes of a streaming job: its custom run facet and the driver's RUNNING event.

Imports ``openlineage.client`` (openlineage-python, not a dependency of this provider): imported only when
it is installed, by runtime/lineage.py once the driver's environment configures OpenLineage, and by
operators/lineagefacets.py when Airflow's OpenLineage provider asks the operators for their facets.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from attrs import define
from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet, job_type_job, parent_run

from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET


@define
class CkptStreamingJobRunFacet(RunFacet):
    """The streaming job of a run (key ``ckpt_streamingJob``): its driver's epoch, code version, launch id, and the
    snapshot its state was restored from (``restoredFrom``: snapshotId, kind, batchId, uri; None for a fresh start
    or a resume from the live checkpoint). ``unnamedTopics``: Kafka topics it reads whose brokers are not known.
    The driver's RUNNING events add ``batchId`` (the last completed batch), ``restarts`` (query restarts in this
    driver) and ``launchedBy``; the launching task's events add ``restore`` and ``startAction``."""

    job: str
    epoch: int | None = None
    codeVersion: str | None = None  # OpenLineage names fields in camelCase
    launchId: str | None = None
    restore: str | None = None
    startAction: str | None = None
    restoredFrom: dict[str, Any] | None = None
    unnamedTopics: list[str] | None = None
    batchId: int | None = None
    restarts: int | None = None
    launchedBy: str | None = None

    # Not secrets: keep the OpenLineage provider's redaction off them.
    _additional_skip_redact: ClassVar[list[str]] = ["job", "epoch", "codeVersion", "launchId", "restore",
                                                     "startAction", "restoredFrom", "unnamedTopics", "batchId",
                                                     "restarts", "launchedBy"]


def running_event(report: Any) -> RunEvent:
    """The RUNNING event of a ``runtime.lineage.RunningReport`` (typed Any: this module is imported lazily)."""
    facets: dict[str, RunFacet] = {RUN_FACET: CkptStreamingJobRunFacet(**report.facet)}
    if report.parent is not None:
        root = report.root or report.parent
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=report.parent.run_id),
            job=parent_run.Job(namespace=report.parent.namespace, name=report.parent.name),
            root=parent_run.Root(run=parent_run.RootRun(runId=root.run_id),
                                 job=parent_run.RootJob(namespace=root.namespace, name=root.name)))
    job_type = job_type_job.JobTypeJobFacet(processingType="STREAMING", integration="SPARK", jobType="JOB")
    return RunEvent(
        eventType=RunState.RUNNING, eventTime=datetime.fromtimestamp(report.at, UTC).isoformat(),
        run=Run(runId=report.run_id, facets=facets),
        job=Job(namespace=report.namespace, name=report.job_name, facets={"jobType": job_type}),
        inputs=[InputDataset(namespace=d.namespace, name=d.name) for d in report.inputs], outputs=[])
