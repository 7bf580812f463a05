"""The connections' fields, parsed once for the Airflow hooks and the Dagster resource: the job store
(core/store/storeconfig.py) and where jobs run (launcher/sparktarget.py); and the in-process wait
(core/watches/base.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.store.storeconfig import StoreConfig, check_store
from airflow_ckpt_provider.core.watches.base import wait_for
from airflow_ckpt_provider.launcher.sparktarget import SparkTarget


def test_store_fields_become_the_url_and_s3_options_with_empty_values_unset() -> None:
    config = StoreConfig.from_fields(store_url="s3://b/jobs", where="x", endpoint_url="http://127.0.0.1:8333",
                                     region="", access_key_id="AK", secret_access_key="SK")
    assert config.s3 == S3Options(endpoint_url="http://127.0.0.1:8333", access_key_id="AK", secret_access_key="SK")
    assert config.job_store("orders").url == "s3://b/jobs/orders"


@pytest.mark.parametrize(("url", "expected"), [
    (None, "connection c has no store_url: set it to s3://BUCKET/PREFIX or a local directory"),
    ("s3:///jobs", "invalid S3 URL 's3:///jobs': expected s3://BUCKET/PREFIX"),
])
def test_store_fields_without_a_usable_url_are_refused_naming_where(url: str | None, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        StoreConfig.from_fields(store_url=url, where="connection c")


def test_the_store_check_lists_a_local_directory(tmp_path: Path) -> None:
    assert check_store(StoreConfig(str(tmp_path))) == (True, f"job store {tmp_path} is reachable")


def test_spark_fields_append_the_port_to_a_standalone_master_and_parse_conf_text() -> None:
    target = SparkTarget.from_fields(host="spark://h", port=7077, conf='{"spark.x": 4}', where="w")
    assert target.as_dict() == {"master": "spark://h:7077", "deploy_mode": "client", "spark_submit": None,
                                "conf": {"spark.x": "4"}, "python_env": "auto"}
    assert SparkTarget.from_fields().master == "local[2]"


class Script:
    """A watch whose polls answer in turn (an exception is raised), with a fake clock the sleeps advance."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.now, self.slept = list(answers), 0.0, 0

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, Exception):
            raise answer
        return answer

    def waiting_for(self) -> str:
        return "something"

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1


def test_the_wait_retries_a_store_read_error_and_returns_the_event() -> None:
    watch = Script(None, StorageError("down"), {"status": "completed"})
    assert wait_for(watch, timeout=10, poll_interval=1, sleep=watch.sleep, clock=lambda: watch.now) == {
        "status": "completed"}
    assert watch.slept == 2


def test_the_wait_ends_with_a_timeout_event_saying_what_it_last_saw() -> None:
    watch = Script()
    event = wait_for(watch, timeout=3, poll_interval=1, sleep=watch.sleep, clock=lambda: watch.now)
    assert event == {"status": "timeout", "message": "no outcome within 3 s: something"}
    assert watch.slept == 3
