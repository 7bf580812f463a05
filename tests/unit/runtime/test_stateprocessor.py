"""The State Processor's pure parts: the Spark versions it reads with, and how a table names itself and is read."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.runtime.stateprocessor import StateTable, check_spark, find_table


def test_only_the_tested_spark_versions_read_state() -> None:
    check_spark("4.3.0")
    check_spark("4.3.2")
    with pytest.raises(ConfigError, match=r"tested with Spark 4\.3; found Spark 4\.2\.1\. .* pyspark 4\.3\.x"):
        check_spark("4.2.1")


def test_tables_name_their_store_join_side_or_state_variable_and_give_the_readers_options() -> None:
    agg = StateTable(0, "stateStoreSave", "default", 2)
    join = StateTable(4, "symmetricHashJoin", "left-keyToNumValues", 2)
    tws = StateTable(7, "transformWithStateInPySparkExec", "default", 3, "sessions", "MapState")
    assert [t.name for t in (agg, join, tws)] == ["0/default", "4/left", "7/default/sessions"]
    assert agg.options(12) == {"batchId": "12", "operatorId": "0", "storeName": "default"}
    assert join.options(12) == {"batchId": "12", "operatorId": "4", "joinSide": "left"}
    assert tws.options(12) == {"batchId": "12", "operatorId": "7", "stateVarName": "sessions"}
    timers = StateTable(6, "transformWithStateInPandasExec", "default", 2, "timers", "TimerState")
    assert (timers.name, timers.options(3)) == (
        "6/default/timers", {"batchId": "3", "operatorId": "6", "readRegisteredTimers": "true"})
    assert find_table([agg, join, tws], "4/left") is join
    with pytest.raises(ConfigError, match="no state table '4/right' in the snapshot; expected one of: 0/default, "
                                          "4/left, 7/default/sessions"):
        find_table([agg, join, tws], "4/right")
