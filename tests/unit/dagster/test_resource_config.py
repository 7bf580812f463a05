"""Bad resource and op config fails through Dagster's config validation with what was expected, what was found
and what to fix; nothing is launched or written. Real Dagster, in-process execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import ValidationError

from airflow_ckpt_provider.dagster import CKPT_RESOURCE, CkptResource, trigger_savepoint

SAVEPOINT = dg.GraphDefinition(name="savepoint", node_defs=[trigger_savepoint]).to_job()


def run(resource: Any, op_config: dict[str, Any] | None = None, resource_config: dict[str, Any] | None = None,
        ) -> dg.ExecuteInProcessResult:
    run_config: dict[str, Any] = {"ops": {"trigger_savepoint": {"config": op_config or {"job": "orders"}}}}
    if resource_config is not None:
        run_config["resources"] = {CKPT_RESOURCE: {"config": resource_config}}
    defs = dg.Definitions(jobs=[SAVEPOINT], resources={CKPT_RESOURCE: resource})
    return defs.get_job_def("savepoint").execute_in_process(run_config=run_config, raise_on_error=False)


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    events = [e for e in result.all_events if e.is_failure or e.event_type_value == "RESOURCE_INIT_FAILURE"]
    # ignore[union-attr] below: its if clause keeps only the events that have an error
    return "\n".join(str(e.event_specific_data.error) for e in events  # type: ignore[union-attr]
                     if getattr(e.event_specific_data, "error", None) is not None)


@pytest.mark.parametrize(("config", "expected"), [
    ({"store_url": 3}, 'Invalid scalar at path root:resources:ckpt:config:store_url. Value "3" of type '
                       "\"<class 'int'>\" is not valid for expected type \"String\""),
    ({}, 'Missing required config entry "store_url" at path root:resources:ckpt:config'),
    ({"store_url": "/s", "deploy_mode": "remote"}, "Value at path root:resources:ckpt:config:deploy_mode not in "
                                                   "enum type DeployMode got remote"),
    ({"store_url": "/s", "spark_conf": ["a=b"]}, "root:resources:ckpt:config:spark_conf"),
    ({"store_url": "/s", "stor_url": "/t"}, 'Received unexpected config entry "stor_url" at path '
                                            "root:resources:ckpt:config"),
])
def test_a_resource_config_of_the_wrong_shape_is_refused_before_the_run_starts(config: dict[str, Any],
                                                                                 expected: str) -> None:
    with pytest.raises(dg.DagsterInvalidConfigError) as refused:
        run(CkptResource.configure_at_launch(), resource_config=config)
    assert expected in str(refused.value)


@pytest.mark.parametrize(("fields", "field", "expected"), [
    ({"store_url": "s3:///jobs"}, "store_url", "invalid S3 URL 's3:///jobs': expected s3://BUCKET/PREFIX"),
    ({"store_url": "gs://b/jobs"}, "store_url", "unsupported storage URL 'gs://b/jobs': expected s3://BUCKET/PREFIX"),
    ({"store_url": "/s", "endpoint_url": "127.0.0.1:8333"}, "endpoint_url",
     "invalid S3 endpoint URL '127.0.0.1:8333': expected http://HOST:PORT or https://HOST"),
    ({"store_url": "/s", "master": "mesos://m:5050"}, "master",
     "unknown Spark master 'mesos://m:5050': expected local[N], spark://HOST:PORT, yarn or k8s://https://HOST:PORT"),
])
def test_a_resource_value_only_the_connections_can_judge_is_refused_where_the_resource_is_built(
    fields: dict[str, Any], field: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        CkptResource(**fields, secret_access_key="not-shown-secret")
    text = str(refused.value)
    assert f"{field}\n" in text and expected in text and "Fix the ckpt resource's config" in text
    assert "not-shown-secret" not in text  # each field is checked alone: no other value is echoed


def test_a_bad_value_given_at_launch_fails_the_run_at_resource_init_before_any_op(tmp_path: Path) -> None:
    result = run(CkptResource.configure_at_launch(), resource_config={"store_url": str(tmp_path), "master": "mesos://m"})
    assert not result.success
    assert "unknown Spark master 'mesos://m'" in failure_text(result)
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"] == []
    assert list(tmp_path.iterdir()) == []  # nothing written to the store


def test_a_bad_value_in_an_env_var_is_refused_once_dagster_resolves_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_TEST_MASTER", "mesos://m")
    resource = CkptResource(store_url=str(tmp_path), master=dg.EnvVar("CKPT_TEST_MASTER"))  # a name: not judged yet
    result = run(resource)
    assert not result.success
    assert "unknown Spark master 'mesos://m'" in failure_text(result)


def test_an_op_config_of_the_wrong_type_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    with pytest.raises(dg.DagsterInvalidConfigError) as refused:
        run(CkptResource(store_url=str(tmp_path)), op_config={"job": "orders", "timeout": "soon"})
    assert ('Invalid scalar at path root:ops:trigger_savepoint:config:timeout. Value "soon" of type '
            "\"<class 'str'>\" is not valid for expected type \"Float\"") in str(refused.value)


@pytest.mark.parametrize(("op_config", "expected"), [
    ({"job": "orders/../x"}, "invalid job name 'orders/../x'"),
    ({"job": "orders", "poll_interval": 0}, "poll_interval\n  Input should be greater than 0"),
])
def test_an_op_config_value_the_op_judges_fails_the_step_before_it_writes_anything(
    tmp_path: Path, op_config: dict[str, Any], expected: str
) -> None:
    result = run(CkptResource(store_url=str(tmp_path)), op_config=op_config)
    assert not result.success
    assert expected in failure_text(result)
    assert list(tmp_path.iterdir()) == []


def test_the_connection_test_lists_a_local_store(tmp_path: Path) -> None:
    assert CkptResource(store_url=str(tmp_path)).test_connection() == (True, f"job store {tmp_path} is reachable")
