"""transformWithState's state schema files (format v3, as Spark 4.3 wrote them) and the changes an upgrade makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.snapshots.stateschema import (
    ColumnFamily,
    describe_changes,
    newest_schema_files,
    parse_schema_file,
)

FIXTURES = Path(__file__).parent.parent.parent / "fixtures" / "state-schema"


def test_a_schema_file_spark_wrote_and_its_avro_evolution_read_back() -> None:
    """0.schema: a ValueState ``count`` of ``n BIGINT`` keyed by ``k``; 1.schema: the same after the new code
    declared ``n BIGINT, m STRING`` (Avro encoding: value schema id 1)."""
    before = parse_schema_file((FIXTURES / "0.schema").read_bytes())
    after = parse_schema_file((FIXTURES / "1.schema").read_bytes())
    assert before == {"count": ColumnFamily("count", 0, (("k", "string"),), 0, (("n", "long"),))}
    assert after["count"].value == (("n", "long"), ("m", "string")) and after["count"].value_schema_id == 1
    assert describe_changes(7, before, after) == [
        "operator 7: state variable 'count' value schema 0 -> 1: added field m (string)"]
    assert describe_changes(7, before, before) == []


def test_variables_added_dropped_retyped_and_internal_families_skipped() -> None:
    def family(name: str, *value: tuple[str, str], sid: int = 0) -> ColumnFamily:
        return ColumnFamily(name, 0, (("k", "string"),), sid, value)

    before = {"count": family("count", ("n", "long"), ("x", "int")), "ids": family("ids", ("id", "long")),
              "$procTimers_keyToTimestamp": family("$procTimers_keyToTimestamp", ("t", "long"))}
    after = {"count": family("count", ("n", "string"), ("y", "int"), sid=1), "seen": family("seen", ("b", "boolean"))}
    assert describe_changes(3, before, after) == [
        "operator 3: state variable 'count' value schema 0 -> 1: added field y (int); removed field x (int); "
        "field n: long -> string",
        "operator 3: state variable 'ids' is no longer declared",
        "operator 3: new state variable 'seen', starting empty",
    ]


def test_the_newest_schema_file_per_operator_and_a_truncated_file_refused() -> None:
    keys = ["state/0/_stateSchema/default/0_aaaa-1", "state/0/_stateSchema/default/12_bbbb-2",
            "state/0/_stateSchema/default/3_cccc-3", "state/2/_stateSchema/default/5_dddd-4", "state/2/0/1.zip"]
    assert newest_schema_files(keys) == {0: "state/0/_stateSchema/default/12_bbbb-2",
                                         2: "state/2/_stateSchema/default/5_dddd-4"}
    with pytest.raises(ValueError, match="truncated at byte"):
        parse_schema_file((FIXTURES / "0.schema").read_bytes()[:40])
    with pytest.raises(ValueError, match="state schema file format 'v2'; this provider reads v3"):
        parse_schema_file(b"\x00\x02v2")
