"""Every operator is declarative: template fields are attributes, construction does no I/O, the connection is
looked up at execute."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.policy.settings import JobSettings, names
from airflow_ckpt_provider.operators.base import JobOperator
from airflow_ckpt_provider.operators.job import (
    StopStreamingJobOperator,
    SubmitStreamingJobOperator,
)
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from airflow_ckpt_provider.operators.snapshot import DisposeSnapshotsOperator, TriggerSavepointOperator
from airflow_ckpt_provider.operators.upgrade import RescaleStreamingJobOperator, UpgradeStreamingJobOperator
from tests.support.operatorfakes import (
    context,
)

# -- declarative construction -------------------------------------------------------------------------------


def every_operator(conn_id: str = "ckpt_store_default") -> list[JobOperator]:
    common: dict[str, Any] = {"job": "orders", "ckpt_store_conn_id": conn_id}
    return [
        SubmitStreamingJobOperator(task_id="submit", job_file="j.py", ckpt_spark_conn_id=conn_id, **common),
        StopStreamingJobOperator(task_id="stop", **common),
        RestartStreamingJobOperator(task_id="restart", **common),
        TriggerSavepointOperator(task_id="savepoint", **common),
        DisposeSnapshotsOperator(task_id="dispose", **common),
        UpgradeStreamingJobOperator(task_id="upgrade", job_file="j2.py", **common),
        RescaleStreamingJobOperator(task_id="rescale", partitions=8, **common),
    ]


@pytest.mark.parametrize("op", every_operator(), ids=lambda op: type(op).__name__)
def test_every_template_field_is_an_attribute(op: JobOperator) -> None:
    assert op.template_fields[:2] == ("job", "store_url")
    missing = [name for name in op.template_fields if not hasattr(op, name)]
    assert missing == []


def test_template_fields_and_extra_links() -> None:
    ops = {type(op).__name__: op for op in every_operator()}
    assert ops["SubmitStreamingJobOperator"].template_fields == (
        "job", "store_url", "job_file", "code_version", "restore", "env", "conf", "py_files", "files",
        *(name for name in names(JobSettings) if name != "poll_interval"),  # every setting but JobOperator's own
        "supervision")
    assert ops["SubmitStreamingJobOperator"].template_fields[9:12] == (
        "checkpoint", "checkpoint_interval", "savepoint_interval")
    assert ops["UpgradeStreamingJobOperator"].template_fields == (
        "job", "store_url", "job_file", "code_version", "upgrade_mode", "allow_non_restored_state", "verify_batches",
        "partitions", "py_files", "files", "delete_keys", "update_values")
    assert ops["RescaleStreamingJobOperator"].template_fields == ops["UpgradeStreamingJobOperator"].template_fields
    assert ops["RestartStreamingJobOperator"].template_fields == ("job", "store_url", "restore", "stop_mode",
                                                                  "supervision")
    assert ops["StopStreamingJobOperator"].template_fields == ("job", "store_url", "mode")
    assert ops["DisposeSnapshotsOperator"].template_fields == ("job", "store_url", "snapshot_ids")
    links = {name: [link.name for link in op.operator_extra_links] for name, op in ops.items()}
    assert links == {
        "SubmitStreamingJobOperator": ["Spark UI"],
        "StopStreamingJobOperator": ["Snapshot location"],
        "RestartStreamingJobOperator": ["Spark UI", "Snapshot location"],  # a savepoint stop: its snapshot
        "TriggerSavepointOperator": ["Snapshot location"],
        "DisposeSnapshotsOperator": [],
        "UpgradeStreamingJobOperator": ["Spark UI", "Snapshot location"],
        "RescaleStreamingJobOperator": ["Spark UI", "Snapshot location"],
    }


def test_construction_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lookup(cls: type, conn_id: str) -> Any:
        pytest.fail(f"connection {conn_id} looked up while the operator was constructed")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(no_lookup))
    for op in every_operator("no_such_connection"):
        assert "store_hook" not in op.__dict__  # the hook is a cached property, built at execute
        assert op.ckpt_store_conn_id == "no_such_connection"


def test_the_connection_is_looked_up_at_execute() -> None:
    stop = StopStreamingJobOperator(task_id="stop", job="orders", ckpt_store_conn_id="no_such_connection")
    with pytest.raises(AirflowNotFoundException, match="no_such_connection"):
        stop.execute(context())
