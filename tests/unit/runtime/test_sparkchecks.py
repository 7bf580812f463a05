"""What the driver checks before the lease (runtime/sparkchecks.py): Spark's Python, and a first executor."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt_provider.runtime.sparkchecks import (
    EXECUTOR_LOSS,
    check_executors,
    executor_loss_defaults,
    missing_module,
)
from tests.support.supervisorfakes import START, FakeClock


def test_a_python_is_checked_for_the_modules_spark_s_workers_need() -> None:
    assert missing_module(sys.executable, ("json", "pyarrow")) is None
    assert missing_module(sys.executable, ("json", "ckpt_no_such_module")) == "ckpt_no_such_module"
    missing = missing_module("/nonexistent/bin/python", ("json",))
    assert missing is not None and missing.startswith("anything: the interpreter does not run")


@dataclass
class FakeSpark:
    """A SparkSession as check_executors sees it: its master, its conf and the executors registered per look."""

    master: str
    registered: list[int]
    conf: dict[str, str] = field(default_factory=dict)

    @property
    def sparkContext(self) -> Any:
        return self

    def getConf(self) -> Any:
        return self

    def get(self, key: str, default: str) -> str:
        return self.conf.get(key, default)

    @property
    def _jsc(self) -> Any:
        return self

    def sc(self) -> Any:
        return self

    def statusTracker(self) -> Any:
        return self

    def getExecutorInfos(self) -> list[int]:
        count = self.registered.pop(0) if len(self.registered) > 1 else self.registered[0]
        return [0] * (count + 1)  # the driver counts as one


def test_the_driver_waits_for_a_first_executor_and_then_goes_on() -> None:
    clock = FakeClock()
    assert check_executors(FakeSpark("spark://h:7077", [0, 0, 1]), 60, clock=clock, sleep=clock.sleep) is None
    assert clock.now - START == 1.0  # two looks at nothing, half a second apart


def test_no_executor_within_the_timeout_names_what_one_executor_asks_and_what_to_do() -> None:
    clock = FakeClock()
    spark = FakeSpark("spark://h:7077", [0], {"spark.executor.memory": "4g"})
    message = check_executors(spark, 8, clock=clock, sleep=clock.sleep)
    assert message is not None and message.startswith("no executor registered with spark://h:7077 within 8 s")
    assert "spark.executor.memory=4g" in message and "raise --executor-timeout" in message
    assert clock.now - START == 8.0


def test_local_masters_and_dynamic_allocation_are_not_waited_for() -> None:
    assert check_executors(FakeSpark("local[2]", [0]), 60) is None
    dynamic = FakeSpark("yarn", [0], {"spark.dynamicAllocation.enabled": "true"})
    assert check_executors(dynamic, 60) is None  # executors come when tasks wait


def test_pyspark_s_numpy_converters_ask_only_about_numpy_objects_and_convert_them_as_before() -> None:
    """In a fresh interpreter (as a driver starts): the wrapped converters answer a call's usual arguments without
    importing pyspark.testing.utils (and pandas with it); a numpy array and scalar still go to pyspark's
    converters, which take them as before."""
    import subprocess

    code = """if True:
        import sys
        from airflow_ckpt_provider.runtime.sparkchecks import defer_numpy_converters
        assert defer_numpy_converters() == 2 and defer_numpy_converters() == 0  # once
        from py4j import protocol
        wrapped = [c for c in protocol.INPUT_CONVERTER if type(c).__name__ == "_OnlyWithNumpy"]
        for arg in ("spark.master", 3, 2.5, [1, 2], {"a": 1}, None, b"x"):
            assert not any(c.can_convert(arg) for c in wrapped), arg
        assert "pyspark.testing.utils" not in sys.modules and "pandas" not in sys.modules
        import numpy as np
        assert [c.can_convert(np.array([1, 2])) for c in wrapped] == [True, False]  # the array converter first
        assert [c.can_convert(np.int64(5)) for c in wrapped] == [False, True]
        assert not any(c.can_convert(np.zeros((2, 2))) for c in wrapped)  # pyspark takes 1-D arrays only
        assert wrapped[1].convert(np.int64(5), None) == 5
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_cluster_driver_declares_a_silent_executor_lost_after_40_s_unless_the_job_set_spark_s_timeouts() -> None:
    given: set[str] = set()
    assert executor_loss_defaults("spark://10.213.41.20:7077", given.__contains__) == EXECUTOR_LOSS
    assert dict(EXECUTOR_LOSS) == {"spark.storage.blockManagerHeartbeatTimeoutMs": "40s",
                                   "spark.network.timeoutInterval": "5s", "spark.shuffle.io.connectionTimeout": "40s"}
    assert executor_loss_defaults("yarn", given.__contains__) == EXECUTOR_LOSS
    assert executor_loss_defaults("local[2]", given.__contains__) == ()  # one process: no executor to lose
    for key in ("spark.network.timeout", "spark.executor.heartbeatInterval", "spark.network.timeoutInterval",
                "spark.storage.blockManagerHeartbeatTimeoutMs", "spark.shuffle.io.connectionTimeout"):
        assert executor_loss_defaults("spark://m:7077", {key}.__contains__) == (), key  # the job's own rules win
