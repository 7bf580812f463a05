"""The State Processor's pure parts: the Spark versions it reads with, how a table names itself and is read, and
how a key deletion is given, checked and reported."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.stateedit import KeyDeletion, ValueUpdate
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.stateprocessor import StateTable, check_spark, find_table
from airflow_ckpt_provider.runtime.staterewrite import Rewrite, StoreRewrite


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


def test_a_state_edit_runs_only_on_a_checked_copy_alone_and_not_with_a_rescale() -> None:
    base = {"job": "orders", "store": "/tmp/store", "checkpoint": "/tmp/ck"}
    with pytest.raises(ConfigError, match=r"--delete-keys and --update-values go with --check-restore .* `ckpt state "
                                          r"delete\|update`"):
        RuntimeConfig(**base, delete_keys="0:key_k = 1").check()
    with pytest.raises(ConfigError, match=r"--delete-keys and --update-values are separate edits"):
        RuntimeConfig(**base, delete_keys="0:key_k = 1", update_values="{}", check_restore=True).check()
    with pytest.raises(ConfigError, match=r"an edit of the state .* and --rescale-to are separate steps"):
        RuntimeConfig(**base, delete_keys="0:key_k = 1", check_restore=True, rescale_to=4).check()
    with pytest.raises(ConfigError, match="expected OPERATOR:PREDICATE"):
        RuntimeConfig(**base, delete_keys="key_k = 1", check_restore=True).check()
    config = RuntimeConfig(**base, delete_keys="0:key_k = 1", check_restore=True)
    config.check()
    assert RuntimeConfig.from_args(config.to_args()).delete_keys == "0:key_k = 1"


def test_a_rewrite_describes_each_changed_store_and_counts_the_rows_removed() -> None:
    done = Rewrite(8, [StoreRewrite(0, "default", 10, 7), StoreRewrite(0, "left-keyToNumValues", 4, 4, 2)])
    assert (done.rows_removed, done.rows_changed) == (3, 2)
    assert done.describe() == ("batch 8: operator 0 store default: 10 -> 7 rows; operator 0 store "
                               "left-keyToNumValues: 4 -> 4 rows, 2 values changed")
    assert Rewrite(8).describe() == "batch 8: no operator's rows changed"


def test_a_value_update_is_a_table_a_predicate_and_value_columns_and_refuses_keys() -> None:
    update = ValueUpdate.parse('{"table": "0/default", "where": "key_k = \'a\'", "set": {"value_count": "0"}}')
    assert (update.table, update.where, dict(update.values)) == ("0/default", "key_k = 'a'", {"value_count": "0"})
    assert ValueUpdate.parse(str(update)) == update
    for bad in ("{}", "not json", '{"table": "0/default", "where": "x", "set": {}}', '["0/default"]'):
        with pytest.raises(ConfigError, match=r"expected JSON \{\"table\": \"0/default\", \"where\": PREDICATE"):
            ValueUpdate.parse(bad)
    with pytest.raises(ConfigError, match=r"expected value columns \(value_\.\.\.\), found key_k; keys are deleted"):
        ValueUpdate.parse('{"table": "0/default", "where": "true", "set": {"key_k": "\'b\'"}}')
