"""JobOperator: waiting in the worker."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.operators.base import JobOperator
from tests.support.operatorfakes import (
    context,
)

# -- waiting in the worker --------------------------------------------------------------------------------------------


class Waiter(JobOperator):
    def done(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        return event


def test_waiting_in_the_worker_retries_storage_errors() -> None:
    from tests.unit.triggers.test_triggers import FlakyTrigger, FlakyWatch

    op = Waiter(task_id="w", job="orders", deferrable=False, poll_interval=0.01)
    watch = FlakyWatch(failures=2)
    assert op.wait(context(), trigger=FlakyTrigger(watch, timeout=5), method_name="done") == {"status": "done",
                                                                                             "polls": 3}
    never = FlakyWatch(failures=None)
    event = op.wait(context(), trigger=FlakyTrigger(never, timeout=0.05), method_name="done")
    assert event == {"status": "timeout", "message": "no outcome within 0 s: the store to answer"}
    assert never.polls > 1
    with pytest.raises(ConfigError, match="invalid job name"):  # other errors are not retried
        op.wait(context(), trigger=FlakyTrigger(FlakyWatch(None, ConfigError("invalid job name")), timeout=5),
                method_name="done")


# -- deferrable: Airflow's [operators] default_deferrable -------------------------------------------------------------


@pytest.mark.parametrize(("setting", "expected"), [(None, False), ("False", False), ("True", True)])
def test_deferrable_defaults_to_airflows_default_deferrable(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, expected: bool
) -> None:
    from tests.unit.operators.test_declarative import every_operator

    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")  # set by conftest.py: Airflow's default, False
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    assert {type(op).__name__: op.deferrable for op in every_operator()} == {
        "SubmitStreamingJobOperator": expected, "StopStreamingJobOperator": expected,
        "RestartStreamingJobOperator": expected, "TriggerSavepointOperator": expected,
        "DisposeSnapshotsOperator": expected, "UpgradeStreamingJobOperator": expected,
        "RescaleStreamingJobOperator": expected}
    assert Waiter(task_id="w", job="orders", deferrable=not expected).deferrable is (not expected)  # explicit wins


def test_deferrable_from_the_dags_default_args(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DAG

    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    with DAG("d", schedule=None, default_args={"deferrable": True}):
        assert Waiter(task_id="w", job="orders").deferrable is True
