"""The OpenLineage classes behind operators/lineage.py.

Imported only by ``lineage.to_operator_lineage``, when Airflow's OpenLineage provider calls an operator's facet
methods, and by ``lineage.launch_env`` when an operator launches a driver: this is the one module that needs
``apache-airflow-providers-openlineage`` (not a dependency of this provider). The run facet's class is the
driver's too (runtime/lineageevent.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.providers.openlineage import conf
from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from airflow.providers.openlineage.plugins import macros
from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter
from openlineage.client.event_v2 import Dataset

from airflow_ckpt_provider.core.policy.lineagenames import NAMESPACE_ENV, PARENT_ENV, ROOT_PARENT_ENV
from airflow_ckpt_provider.runtime.lineage import configured_by
from airflow_ckpt_provider.runtime.lineageevent import CkptStreamingJobRunFacet


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


def driver_env(job_env: Mapping[str, str], ti: Any | None) -> dict[str, str]:
    """The OpenLineage settings a launched driver needs to send its RUNNING events (runtime/lineage.py), from this
    Airflow deployment's OpenLineage provider: its configuration (``config_conn_id``, ``config_path`` or
    ``transport``) as ``OPENLINEAGE__<KEY>`` variables unless ``job_env`` (what the driver will inherit) configures
    a transport already, its namespace, and the task instance ``ti`` as the parent run, with the run id the
    provider gives the task's own events (its ``lineage_parent_id`` macro). Called when the provider is enabled
    (``conf.is_disabled()`` false)."""
    env: dict[str, str] = {}
    if configured_by(job_env) is None:
        config = OpenLineageAdapter().get_openlineage_config() or {}
        env.update({f"OPENLINEAGE__{key.upper()}": json.dumps(value) for key, value in config.items()
                    if value not in (None, {}, [])})
    if not job_env.get(NAMESPACE_ENV):
        env[NAMESPACE_ENV] = conf.namespace()
    if ti is not None:
        env[PARENT_ENV] = macros.lineage_parent_id(ti)
        env[ROOT_PARENT_ENV] = macros.lineage_root_parent_id(ti)
    return env
