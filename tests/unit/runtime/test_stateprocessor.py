"""The State Processor's pure parts: the Spark versions it reads with, how a table names itself and is read, and
how a key deletion is given, checked and reported."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.stateprocessor import (
    KeyDeletion,
    Rewrite,
    StateTable,
    StoreRewrite,
    check_spark,
    find_table,
)


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


def test_a_key_deletion_is_an_operator_and_a_predicate_and_refuses_anything_else() -> None:
    deletion = KeyDeletion.parse("3: key_user = 'u:17' ")
    assert (deletion.operator_id, deletion.where, str(deletion)) == (3, "key_user = 'u:17'", "3:key_user = 'u:17'")
    for bad in ("key_user = 'u-17'", "x:key_user = 1", "0:", "0:   "):
        with pytest.raises(ConfigError, match=r"expected OPERATOR:PREDICATE, an operator id and a Spark SQL "
                                              r"predicate over its key columns"):
            KeyDeletion.parse(bad)


def test_delete_keys_runs_only_on_a_checked_copy_and_not_with_a_rescale() -> None:
    base = {"job": "orders", "store": "/tmp/store", "checkpoint": "/tmp/ck"}
    with pytest.raises(ConfigError, match=r"--delete-keys goes with --check-restore .* `ckpt state delete`"):
        RuntimeConfig(**base, delete_keys="0:key_k = 1").check()
    with pytest.raises(ConfigError, match="--delete-keys and --rescale-to are separate steps"):
        RuntimeConfig(**base, delete_keys="0:key_k = 1", check_restore=True, rescale_to=4).check()
    with pytest.raises(ConfigError, match="expected OPERATOR:PREDICATE"):
        RuntimeConfig(**base, delete_keys="key_k = 1", check_restore=True).check()
    config = RuntimeConfig(**base, delete_keys="0:key_k = 1", check_restore=True)
    config.check()
    assert RuntimeConfig.from_args(config.to_args()).delete_keys == "0:key_k = 1"


def test_a_rewrite_describes_each_changed_store_and_counts_the_rows_removed() -> None:
    done = Rewrite(8, [StoreRewrite(0, "default", 10, 7), StoreRewrite(0, "left-keyToNumValues", 4, 4)])
    assert done.rows_removed == 3
    assert done.describe() == ("batch 8: operator 0 store default: 10 -> 7 rows; operator 0 store "
                               "left-keyToNumValues: 4 -> 4 rows")
    assert Rewrite(8).describe() == "batch 8: no operator's rows changed"
