"""What the Dagster layer's unit tests share: job ``orders`` in a local store, the resource on it, and a way to
run one op in-process with real Dagster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.dagster import CKPT_RESOURCE, CkptResource


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> JobStore:
    return JobStore(LocalStorage(root), "orders")


@pytest.fixture
def ckpt(root: Path) -> CkptResource:
    return CkptResource(store_url=str(root), spark_conf={"spark.ui.enabled": "false"})


def run_op(op: dg.OpDefinition, ckpt: CkptResource, config: dict[str, Any], inputs: dict[str, Any] | None = None,
           instance: dg.DagsterInstance | None = None) -> dg.ExecuteInProcessResult:
    """``op`` alone in a job, executed in this process (on ``instance``, to read its logs after); failures are in
    the result, not raised."""
    job = dg.GraphDefinition(name=f"one_{op.name}", node_defs=[op]).to_job(resource_defs={CKPT_RESOURCE: ckpt})
    run_config: dict[str, Any] = {"ops": {op.name: {"config": config}}}
    if inputs:
        run_config["ops"][op.name]["inputs"] = {k: {"value": v} for k, v in inputs.items()}
    return job.execute_in_process(run_config=run_config, raise_on_error=False, instance=instance)


def failure(result: dg.ExecuteInProcessResult) -> str:
    """The description of the step's dg.Failure (what the UI shows)."""
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = event.step_failure_data.error
    assert error is not None
    return str(error.message) + "".join(str(c.message) for c in _causes(error))


def _causes(error: Any) -> list[Any]:
    found = []
    while getattr(error, "cause", None) is not None:
        error = error.cause
        found.append(error)
    return found
