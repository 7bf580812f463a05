"""The OpenLineage classes behind operators/lineage.py.

Imported only by ``lineage.to_operator_lineage``, when Airflow's OpenLineage provider calls an operator's
facet methods: this is the one module that needs ``apache-airflow-providers-openlineage`` (not a dependency
of this provider).
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from attrs import define
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import RunFacet


@define
class CkptStreamingJobRunFacet(RunFacet):
    """The streaming job a task launched: its driver's epoch, code version, launch id, and the snapshot its state
    was restored from (``restoredFrom``: snapshotId, kind, batchId, uri; None for a fresh start or a resume from
    the live checkpoint). ``unnamedTopics``: Kafka topics it reads whose brokers the job store does not know."""

    job: str
    epoch: int | None = None
    codeVersion: str | None = None  # OpenLineage names fields in camelCase
    launchId: str | None = None
    restore: str | None = None
    startAction: str | None = None
    restoredFrom: dict[str, Any] | None = None
    unnamedTopics: list[str] | None = None

    # Not secrets: keep the OpenLineage provider's redaction off them.
    _additional_skip_redact: ClassVar[list[str]] = ["job", "epoch", "codeVersion", "launchId", "restore",
                                                     "startAction", "restoredFrom", "unnamedTopics"]


def _dataset(item: Any) -> Dataset | None:
    """A ``(namespace, name)`` pair named by operators/lineage.py, else what the OpenLineage provider converts
    (Datasets, lineage Files and Tables, Assets of the schemes it knows)."""
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(part, str) for part in item):
        return Dataset(namespace=item[0], name=item[1])
    converted: Dataset | None = ExtractorManager.convert_to_ol_dataset(item)
    return converted


def _datasets(items: list[Any]) -> list[Dataset]:
    """Converted, without duplicates (by namespace and name), in order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for item in items:
        d = _dataset(item)
        if d is not None and (d.namespace, d.name) not in seen:
            seen.add((d.namespace, d.name))
            out.append(d)
    return out


def operator_lineage(run_facet: tuple[str, dict[str, Any]], inputs: list[Any],
                     outputs: list[Any]) -> OperatorLineage[Dataset, CkptStreamingJobRunFacet]:
    """``OperatorLineage`` with the custom run facet ``(key, fields)`` and these inputs and outputs."""
    key, fields = run_facet
    return OperatorLineage(inputs=_datasets(inputs), outputs=_datasets(outputs),
                           run_facets={key: CkptStreamingJobRunFacet(**fields)})
