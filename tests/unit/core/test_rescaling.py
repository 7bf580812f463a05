"""Whether a snapshot's state can be repartitioned, decided from what its manifest recorded (no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.stepsettings import MAX_PARTITIONS, parse_partitions
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.snapshots.manifest import RESCALED_FROM, Kind, Manifest, Trigger
from airflow_ckpt_provider.core.snapshots.rescaling import snapshot_problem, stopped_source
from airflow_ckpt_provider.core.snapshots.statestore import HDFS, ROCKSDB

ROCKSDB_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def manifest(*operators: dict[str, Any], partitions: int = 2, snapshot_id: str = "savepoint-7-x", batch_id: int = 7,
             trigger: Trigger = Trigger.STOP, labels: dict[str, str] | None = None) -> Manifest:
    return Manifest(job="orders", snapshot_id=snapshot_id, kind=Kind.SAVEPOINT, trigger=trigger, batch_id=batch_id,
                    created_at="2026-11-26T10:00:00.000+00:00", query_id="q", checkpoint="/c", files=(),
                    operators=list(operators), labels=labels or {},
                    conf={"spark.sql.shuffle.partitions": str(partitions),
                          "spark.sql.streaming.stateStore.providerClass": ROCKSDB_CLASS})


def op(operator_id: int = 0, provider: str = ROCKSDB, name: str | None = "stateStoreSave",
       partitions: int = 2) -> dict[str, Any]:
    return {"operator_id": operator_id, "name": name, "partitions": partitions, "store_names": ["default"],
            "provider": provider, "changelog": False}


@pytest.mark.parametrize("value", ["5", 5, " 12 "])
def test_partitions_are_whole_numbers(value: object) -> None:
    assert parse_partitions(value) == int(str(value).strip())


@pytest.mark.parametrize("value", ["0", -1, "2.5", "five", "", None, MAX_PARTITIONS + 1, "1e3"])
def test_other_partition_counts_say_what_was_expected_and_found(value: object) -> None:
    with pytest.raises(ValueError, match=rf"partitions: expected a whole number from 1 to {MAX_PARTITIONS}, "
                                         rf"found {value!r}"):
        parse_partitions(value)


def test_rocksdb_state_with_metadata_can_be_repartitioned_to_another_count() -> None:
    assert snapshot_problem(manifest(op(), op(1, name="dedupe")), 5) is None


def test_the_same_count_is_refused_as_nothing_to_do() -> None:
    assert snapshot_problem(manifest(op()), 2) == (
        "the state already has 2 partitions (batch 7); expected another count. Nothing to do")


def test_the_count_comes_from_the_offsets_log_not_the_operators_metadata() -> None:
    # After a repartition 2 -> 5 the operators' metadata still says 2; the offsets log says 5.
    assert snapshot_problem(manifest(op(partitions=2), partitions=5), 5) is not None
    assert snapshot_problem(manifest(op(partitions=2), partitions=5), 2) is None


def test_a_stateless_query_has_nothing_to_repartition() -> None:
    problem = snapshot_problem(manifest(), 5)
    assert problem is not None and problem.startswith("the query has no state at batch 7")
    assert "change it in the job's conf and restart" in problem


def test_hdfs_backed_state_is_refused_with_the_provider_to_start_with() -> None:
    problem = snapshot_problem(manifest(op(), op(1, provider=HDFS)), 5)
    assert problem is not None and "HDFS-backed state store (Spark's default; operators [1])" in problem
    assert f"providerClass={ROCKSDB_CLASS} from its first batch" in problem


def test_operators_without_metadata_are_refused() -> None:
    problem = snapshot_problem(manifest(op(name=None)), 5)
    assert problem is not None and problem.startswith("operators [0] have no operator metadata")


def stopped(state: JobState = JobState.STOPPED, snapshot: str | None = "savepoint-7-x", batch_id: int = 7) -> JobStatus:
    last = {"id": snapshot, "kind": "savepoint", "batch_id": 7} if snapshot else None
    return JobStatus(job="orders", state=state, epoch=3, updated_at=0.0, started_at=0.0, batch_id=batch_id,
                     last_snapshot=last)


def test_a_job_stopped_with_a_savepoint_is_rescaled_from_it() -> None:
    source = manifest(op())
    start = stopped_source(stopped(), [source], 5)
    assert (start.source, start.rescaled) == (source, None)
    assert start.describe(5) == ("job orders is stopped with savepoint savepoint-7-x (batch 7, 2 partitions): "
                                 "rescaling it from there")


def test_a_rescale_that_saved_the_repartitioned_savepoint_and_died_goes_on_from_it() -> None:
    source = manifest(op())
    rescaled = manifest(op(), partitions=5, snapshot_id="savepoint-8-r", batch_id=8, trigger=Trigger.RESCALE,
                        labels={RESCALED_FROM: "savepoint-7-x"})
    other = manifest(op(), partitions=3, snapshot_id="savepoint-8-o", batch_id=8, trigger=Trigger.RESCALE,
                     labels={RESCALED_FROM: "savepoint-7-x"})
    start = stopped_source(stopped(), [source, other, rescaled], 5)
    assert (start.source, start.rescaled) == (source, rescaled)
    assert "already repartitioned into 5 partitions as savepoint-8-r" in start.describe(5)
    assert stopped_source(stopped(), [source, other, rescaled], 4).rescaled is None  # another count: repartition


@pytest.mark.parametrize("status", [
    stopped(snapshot=None),  # cancelled: no final savepoint
    stopped(batch_id=9),  # the savepoint is older than the batch it stopped at
    stopped(state=JobState.FAILED),
    None,
], ids=["cancelled", "older-savepoint", "failed", "no-status"])
def test_a_job_stopped_otherwise_is_refused_as_its_state_may_be_newer(status: JobStatus | None) -> None:
    with pytest.raises(ConfigError, match="did not stop with a savepoint, so its latest state may be newer than "
                                          "every savepoint"):
        stopped_source(status, [manifest(op())], 5)


def test_a_stopped_jobs_savepoint_with_the_same_count_or_disposed_is_refused() -> None:
    with pytest.raises(ConfigError, match="savepoint savepoint-7-x: the state already has 2 partitions"):
        stopped_source(stopped(), [manifest(op())], 2)
    with pytest.raises(ConfigError, match="which the job store no longer holds"):
        stopped_source(stopped(), [], 5)
