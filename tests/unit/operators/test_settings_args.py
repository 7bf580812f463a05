"""The job's settings as SubmitStreamingJobOperator arguments, and the modes' arguments: parsed when the DAG is
parsed unless templated, old spellings warn as Airflow's provider deprecations."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import DAG

from airflow_ckpt_provider.core.policy.modes import KillPolicy, RestartStrategyName, StopMode, UpgradeMode
from airflow_ckpt_provider.core.policy.settings import JobSettings, names
from airflow_ckpt_provider.operators.job import NOT_ARGUMENTS, StopStreamingJobOperator, SubmitStreamingJobOperator
from tests.support.operatorfakes import submit_op, upgrade_op
from tests.support.settingvalues import non_defaults


def test_every_job_setting_is_an_argument_that_reaches_the_deployment() -> None:
    values = {k: v for k, v in non_defaults(JobSettings).items() if k not in NOT_ARGUMENTS}
    deployment = submit_op(**values).deployment()
    assert {name: getattr(deployment, name) for name in values} == values
    assert deployment.poll_interval == JobSettings().poll_interval  # the operator's poll_interval is its own
    assert submit_op(poll_interval=0.5).deployment().poll_interval == JobSettings().poll_interval


def test_templated_settings_are_read_as_their_type_once_rendered() -> None:
    op = submit_op(savepoint_interval="{{ params.every }}", time_travel="{{ params.travel }}")
    # ignore[attr-defined] below: the operator sets its settings with setattr
    assert op.savepoint_interval == "{{ params.every }}"  # type: ignore[attr-defined]
    op.savepoint_interval, op.time_travel = "30", "refuse"  # type: ignore[attr-defined]  # as Airflow renders
    d = op.deployment()
    assert (d.savepoint_interval, d.time_travel) == (30.0, "refuse")


def test_literal_settings_are_parsed_when_the_dag_is_parsed() -> None:
    op = submit_op(savepoint_interval="30", restart_strategy="failure-rate")
    assert op.savepoint_interval == 30.0  # type: ignore[attr-defined]  # the operator sets its settings with setattr
    assert op.restart_strategy is RestartStrategyName.FAILURE_RATE  # type: ignore[attr-defined]  # set with setattr


def test_settings_come_from_default_args_too() -> None:
    op = submit_op(default_args={"savepoint_interval": 60, "keep_checkpoints": 5})
    assert (op.deployment().savepoint_interval, op.deployment().keep_checkpoints) == (60.0, 5)


@pytest.mark.parametrize(("make", "attribute", "member"), [
    (lambda: submit_op(on_kill_policy="stop_with_savepoint"), "on_kill_policy", KillPolicy.STOP_WITH_SAVEPOINT),
    (lambda: submit_op(on_kill_policy="leave_running"), "on_kill_policy", KillPolicy.LEAVE_RUNNING),
    (lambda: submit_op(restart_strategy="fixed_delay"), "restart_strategy", RestartStrategyName.FIXED_DELAY),
    (lambda: StopStreamingJobOperator(task_id="stop", job="orders", mode="SAVEPOINT"), "mode", StopMode.SAVEPOINT),
    (lambda: upgrade_op(upgrade_mode="last_state"), "upgrade_mode", UpgradeMode.LAST_STATE),
])
def test_old_spellings_still_work_with_a_provider_deprecation_warning(make: Any, attribute: str,
                                                                      member: Any) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"is deprecated: use '{member.value}'"):
        op = make()
    assert getattr(op, attribute) is member


def test_templated_modes_wait_for_execute() -> None:
    op = StopStreamingJobOperator(task_id="stop", job="orders", mode="{{ params.mode }}")
    assert op.mode == "{{ params.mode }}"
    assert submit_op(restore="{{ params.restore }}").restore == "{{ params.restore }}"
    assert submit_op(restore="LATEST_SAVEPOINT").restore == "latest-savepoint"  # literal: in its one spelling


def test_settings_are_parameters_airflow_sees() -> None:  # default_args, partial()/expand(), help()
    params = inspect.signature(SubmitStreamingJobOperator.__init__).parameters
    assert [name for name in names(JobSettings) if name not in params] == list(NOT_ARGUMENTS)
    assert params["savepoint_interval"].default is None and params["keep_checkpoints"].default == 3
    with DAG("mapped"):
        mapped = SubmitStreamingJobOperator.partial(task_id="submit", job="orders", job_file="orders.py",
                                                    savepoint_interval=60).expand(keep_checkpoints=[1, 2])
    assert mapped.partial_kwargs["savepoint_interval"] == 60


def test_a_deprecation_points_at_the_dag_file() -> None:
    with pytest.warns(AirflowProviderDeprecationWarning) as caught:
        StopStreamingJobOperator(task_id="stop", job="orders", mode="SAVEPOINT")
    assert [w.filename for w in caught] == [__file__]
