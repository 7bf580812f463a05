"""The state matrix: every stateful operator through every lifecycle step, in one state checkpoint format
(tests/integration/test_state_matrix_v1.py and _v2.py, one module each so that xdist runs them side by side).

One job (tests/jobs/state_matrix.py) holds them all in one query: dropDuplicates, dropDuplicatesWithinWatermark,
a windowed aggregation, session windows, a stream-stream join, applyInPandasWithState (event-time timeout),
transformWithStateInPandas (ValueState, event-time timers) and transformWithState (ListState, MapState with
TTL); eight operators, RocksDB state, over ckpt-kafka (tansu) into the exactly-once ``ckpt-files`` sink on
SeaweedFS. Format v1 without changelog checkpointing; format v2 with it (Spark 4.3's recommended pairing). The
records (tests/support/statematrix.py) arrive in five parts, and the job lives through, in order:

1. a supervised run of the first part whose driver is killed with kill -9 (its supervisor restarts it from the
   live checkpoint), the second part read by the restarted driver (--full: killed twice more while it reads it),
   then stop with savepoint, whose state the State Processor reads (every operator's, exact);
2. an incompatible upgrade (dedup keyed on (id, k)) refused by the restore check, a compatible one (a stateless
   filter) accepted, and the upgraded code started with ``--restore latest-state`` on a live checkpoint whose
   newest state file is truncated: it falls back to the savepoint and reads the third part; stop with savepoint;
3. a rescale from 2 to 3 state partitions (Spark's offline repartition on a copy, saved as a savepoint), the
   fourth part on 3 partitions; stop with savepoint;
4. time travel: the savepoint before the rescale restored, the fourth part read again from there, then the fifth.

The sink's rows are then exactly those of one uninterrupted run (each operator's, computed from the records),
its timeline shows the one fork, the snapshots of format v2 hold Spark's unique-id files (v1's none), and after
the abandoned timeline's snapshots are disposed and gc'd every kept snapshot verifies byte for byte.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.status import JobStatus
from airflow_ckpt_provider.core.snapshots.catalog import dispose_snapshot, load_manifest, verify_snapshot
from airflow_ckpt_provider.core.snapshots.gc import collect_garbage
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, Trigger
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.restore_check_verdict import RestoreCheck
from airflow_ckpt_provider.sinks.filelayout import read_committed
from airflow_ckpt_provider.sinks.filemaintenance import verify_sink
from tests.support import statematrix
from tests.support.runtimejob import ROCKSDB, JobEnv, Run, kill_driver

JOB = Path(__file__).parent.parent / "jobs" / "state_matrix.py"
TIMEOUT = 180.0
CHECK_TIMEOUT = 240.0
COUNT = 160  # records before the copies and the flush record
MAX_OFFSETS = 40  # records per batch
FORMATS = {
    "v1": (ROCKSDB,),
    "v2": (ROCKSDB, "spark.sql.streaming.stateStore.checkpointFormatVersion=2",
           "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true"),
}
FAST_RESTARTS = ("--restart-strategy", "fixed-delay", "--restart-attempts", "3", "--restart-delay", "0.5")
OPERATORS = 8
#: A format v2 state file: ``<version>_<unique id>.zip`` or ``.changelog`` (RocksDBFileManager).
UNIQUE_ID_FILE = re.compile(r"^state/\d+/\d+/(?:[^/]+/)?\d+_[0-9a-f-]{36}\.(?:zip|changelog)$")


class MatrixJob:
    """The matrix job of one format: its records (produced a part at a time), runs, checks and sink."""

    def __init__(self, env: JobEnv, fmt: str, runs: list[Run]) -> None:
        self.env, self.runs, self.conf = env, runs, FORMATS[fmt]
        self.checkpoint = env.work / "checkpoint"
        self.sink = f"s3://{env.bucket}/out"
        self.s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region,
                            access_key_id=env.s3.access_key, secret_access_key=env.s3.secret_key)
        self.records = statematrix.records(COUNT)
        size = -(-len(self.records) // 5)
        self.parts = [self.records[i:i + size] for i in range(0, len(self.records), size)]
        self.produced = 0

    def settings(self, variant: str) -> dict[str, str]:
        return {"CKPT_MATRIX_SINK": self.sink, "CKPT_MATRIX_VARIANT": variant}

    def produce(self, part: int) -> None:
        """Part ``part`` of the records, record i of the whole into partition i % 3, in order."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.env.kafka.bootstrap_servers, "acks": "all",
                             "enable.idempotence": True, "batch.num.messages": 1, "linger.ms": 0})
        try:
            for record in self.parts[part]:
                producer.produce(self.env.topic, key=str(record["id"]).encode(), value=json.dumps(record).encode(),
                                 partition=self.produced % 3)
                self.produced += 1
            assert producer.flush(30) == 0, "records still queued after 30 s"
        finally:
            del producer

    def read_all(self, status: JobStatus) -> bool:
        """The status' last completed batch read every record produced (each of the query's sources)."""
        ends = [sum(int(o) for o in (offsets or {}).get(self.env.topic, {}).values())
                for offsets in status.offsets.values() if isinstance(offsets, dict)]
        return bool(ends) and all(e == self.produced for e in ends)

    def start(self, name: str, restore: str, variant: str, *args: str) -> Run:
        conf = [arg for setting in self.conf for arg in ("--conf", setting)]
        run = self.env.run(name, self.checkpoint, *conf, "--checkpoint-interval", "none", "--restore", restore,
                           *args, max_offsets=MAX_OFFSETS, job_file=JOB, extra_env=self.settings(variant))
        self.runs.append(run)
        return run

    def stop(self, name: str, run: Run, done: Callable[[], bool] | None = None) -> Manifest:
        """Once the run read every record produced (and ``done``): stop with savepoint, its manifest."""
        return self.env.stop_when(name, run, self.read_all, done, TIMEOUT)

    def check(self, savepoint: str, variant: str, partitions: int | None = None) -> RestoreCheck:
        return self.env.check_step(JOB, self.checkpoint, savepoint, conf=self.conf, partitions=partitions,
                                   env=self.env.env(MAX_OFFSETS, self.settings(variant)), timeout=CHECK_TIMEOUT)

    def rows(self) -> Counter[statematrix.Row]:
        found = read_committed(self.sink, self.s3).to_pylist()
        return Counter((r["op"], r["key"], r["value"]) for r in found)


def newest_state_file(savepoint: Manifest) -> str:
    """The file of the newest state version of operator 0, partition 0 in the savepoint (a zip or a changelog)."""
    files = [f.path for f in savepoint.files if re.fullmatch(r"state/0/0/\d+(_[0-9a-f-]+)?\.(zip|changelog)", f.path)]
    return max(files, key=lambda path: int(path.rsplit("/", 1)[1].split(".")[0].split("_")[0]))


def assert_state_read(env: JobEnv, savepoint: Manifest, read: list[statematrix.Record], *, edit: bool) -> None:
    """The State Processor reads every operator's state of the savepoint, and what it holds is what the records
    read so far leave: every id in both dedup stores, each k's count and id sum in applyInPandasWithState, each k's
    count in transformWithStateInPandas with one timer, and each k's ids and sk counts in transformWithState. With
    ``edit``, it then edits copies of it (``assert_state_edit``)."""
    from airflow_ckpt_provider.embedded import local_spark
    from airflow_ckpt_provider.runtime.stateprocessor import read_state, snapshot_copy, state_tables

    keyed = [r for r in read if not r["dup"] and r["k"] != "flush"]
    spark = local_spark("ckpt-state-matrix")
    try:
        with snapshot_copy(env.store(), savepoint.snapshot_id) as (manifest, copy):
            tables = {t.name: t for t in state_tables(spark, copy)}
            rows = {name: [r.asDict() for r in read_state(spark, copy, manifest.batch_id, t).collect()]
                    for name, t in tables.items()}
        if edit:
            assert_state_edit(spark, env, savepoint, rows)
    finally:
        spark.stop()
    assert sorted(tables) == ["0/default", "1/default", "2/default", "3/default", "4/left", "4/right", "5/default",
                              "6/default/count", "6/default/timers", "7/default/ids", "7/default/sessions",
                              "7/default/timers"], sorted(tables)
    assert sorted(r["key_id"] for r in rows["0/default"]) == sorted({r["id"] for r in read})
    by_k: dict[str, list[statematrix.Record]] = {}
    for r in keyed:
        by_k.setdefault(r["k"], []).append(r)
    assert {r["key_k"]: (r["value_groupState_count"], r["value_groupState_total"]) for r in rows["5/default"]} == {
        k: (len(mine), sum(r["id"] for r in mine)) for k, mine in by_k.items()}
    assert {r["key_k"]: r["value_n"] for r in rows["6/default/count"]} == {k: len(m) for k, m in by_k.items()}
    assert sorted(r["key_k"] for r in rows["6/default/timers"]) == sorted(by_k)
    assert sorted(r["list_element_id"] for r in rows["7/default/ids"]) == sorted(r["id"] for r in keyed)
    assert Counter({(r["key_k"], r["user_map_key_sk"]): r["user_map_value_value_n"] for r in rows["7/default/sessions"]}
                   ) == Counter((r["k"], r["sk"]) for r in keyed)


#: The edit's value changes: a table and its value column that gets 1000 added where the victim key is.
CHANGED = {"2/default": "value_count", "5/default": "value_groupState_count", "6/default/count": "value_n"}


def assert_state_edit(spark: Any, env: JobEnv, savepoint: Manifest, rows: dict[str, list[dict[str, Any]]]) -> None:
    """Every operator kind through the State Processor's writing side on a copy of the savepoint: one key (the
    value of the first key column of the operator's first row) deleted from each of the eight operators at once;
    then, on another copy, 1000 added to a value of an aggregation, applyInPandasWithState's state and a ValueState.
    Read back, every table holds exactly its rows before without the deleted key, or with the one value changed."""
    from pyspark.sql import functions as F

    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.runtime.stateprocessor import read_state, snapshot_copy, state_tables
    from airflow_ckpt_provider.runtime.staterewrite import rewrite_state

    def first_key(table: str) -> tuple[str, Any]:
        column = next(c for c in rows[table][0] if c.startswith("key_"))
        return column, rows[table][0][column]

    victims = {op: first_key(next(t for t in sorted(rows) if t.startswith(f"{op}/"))) for op in range(OPERATORS)}

    def without(column: str, value: Any) -> Callable[[Any], Any]:
        def keep(frame: Any) -> Any:
            return frame.filter(~F.coalesce(F.col(column) == F.lit(value), F.lit(False)))
        return keep

    def read_all(copy: str, batch: int) -> dict[str, list[dict[str, Any]]]:
        return {t.name: [r.asDict() for r in read_state(spark, copy, batch, t).collect()]
                for t in state_tables(spark, copy)}

    with snapshot_copy(env.store(), savepoint.snapshot_id) as (manifest, copy):
        done = rewrite_state(spark, LocalStorage(copy), manifest.batch_id,
                             {op: without(*victim) for op, victim in victims.items()})
        after = read_all(copy, done.batch_id)
    for table, before in rows.items():
        column, value = victims[int(table.split("/")[0])]
        kept = [r for r in before if r[column] != value]
        assert len(kept) < len(before) or table.endswith("timers"), (table, column, value)
        assert _canon(after[table]) == _canon(kept), (table, column, value)
    assert done.rows_removed > 0 and done.batch_id == manifest.batch_id + 1, done.describe()

    column, value = victims[5]  # a k: the same in the three tables changed
    with snapshot_copy(env.store(), savepoint.snapshot_id) as (manifest, copy):
        done = rewrite_state(spark, LocalStorage(copy), manifest.batch_id, changes={
            table: (lambda frame, c=changed: frame.withColumn(c, F.when(F.col("key_k") == F.lit(value), F.col(c) + 1000)
                                                               .otherwise(F.col(c))))
            for table, changed in CHANGED.items()})
        after = read_all(copy, done.batch_id)
    for table, before in rows.items():
        changed = CHANGED.get(table)
        want = [{**r, changed: r[changed] + 1000} if changed and r["key_k"] == value else r for r in before]
        assert _canon(after[table]) == _canon(want), table
    assert done.rows_changed == sum(1 for t in CHANGED for r in rows[t] if r["key_k"] == value), done.describe()


def _canon(rows: list[dict[str, Any]]) -> list[str]:
    """Rows comparable as a multiset, whatever partition or order they are read in."""
    return sorted(json.dumps({k: v for k, v in r.items() if k != "partition_id"}, sort_keys=True, default=str)
                  for r in rows)


def run_matrix(env: JobEnv, runs: list[Run], fmt: str, *, kills: int, edit: bool) -> None:
    """The whole lifecycle of the matrix job in state checkpoint format ``fmt`` (v1 or v2), ``kills`` kill -9s of
    the first run's driver, with the State Processor's edits of the first savepoint when ``edit``; asserts every
    outcome."""
    job = MatrixJob(env, fmt, runs)
    seconds: dict[str, float] = {}
    started = time.monotonic()

    # 1. kill -9 of the driver once it read the first part; its supervisor restarts it from the live checkpoint,
    # and the restarted driver reads the second part.
    job.produce(0)
    run = job.start("first", "latest-state", "v1", "--supervise", "--poll", "1", *FAST_RESTARTS)
    first = env.wait_status("the first part read", job.read_all, TIMEOUT, run)
    kill_driver(first)
    status = env.wait_status("the driver restarted", lambda s: s.epoch > first.epoch, TIMEOUT, run)
    job.produce(1)
    for _ in range(kills - 1):  # a batch of the second part committed (or all of it), then the next kill
        status = env.wait_status("a batch after the restart", lambda s, e=status.epoch: s.epoch == e and (
            s.batch_id or 0) > first.batch_id, TIMEOUT, run)
        kill_driver(status)
        status = env.wait_status("the driver restarted", lambda s, e=status.epoch: s.epoch > e, TIMEOUT, run)
    sp1 = job.stop("first", run)
    assert len(sp1.operators) == OPERATORS, sp1.operators
    v2_files = [f.path for f in sp1.files if UNIQUE_ID_FILE.match(f.path)]
    assert bool(v2_files) == (fmt == "v2"), f"format {fmt}: unique-id state files {v2_files[:5]}"
    assert_state_read(env, sp1, job.records[:job.produced], edit=edit)
    seconds["kill, stop"] = time.monotonic() - started

    # 2. Upgrades: the incompatible one refused before anything runs, the compatible one restored.
    step = time.monotonic()
    with ThreadPoolExecutor(2) as pool:  # two upgrades checked side by side, as two DAGs may
        checks = [pool.submit(job.check, sp1.snapshot_id, variant) for variant in ("incompatible", "v2")]
        refused, accepted = (c.result() for c in checks)
    assert refused.outcome is CheckOutcome.INCOMPATIBLE, refused
    assert refused.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", refused  # the dedup's key (id, k)
    assert accepted.outcome is CheckOutcome.COMPATIBLE, accepted
    # The upgraded code starts with --restore latest-state on a live checkpoint whose newest state file is
    # truncated: the start finds it broken and falls back to the newest snapshot, the savepoint it stopped with.
    broken = newest_state_file(sp1)
    (job.checkpoint / broken).write_bytes((job.checkpoint / broken).read_bytes()[:10])
    job.produce(2)
    upgraded = job.start("upgraded", "latest-state", "v2")
    sp2 = job.stop("upgraded", upgraded)
    assert sp2.batch_id > sp1.batch_id and sp2.state_partitions == 2, sp2
    fallback = [ln for ln in upgraded.ckpt_lines() if "FALLBACK: the live checkpoint" in ln]
    assert len(fallback) == 1 and broken in fallback[0] and sp1.snapshot_id in fallback[0], upgraded.tail()
    seconds["upgrades"] = time.monotonic() - step

    # 3. Rescale 2 -> 3 through Spark's repartition on a copy; the fourth part on 3 partitions.
    step = time.monotonic()
    verdict = job.check(sp2.snapshot_id, "v2", partitions=3)
    assert verdict.outcome is CheckOutcome.COMPATIBLE and verdict.rescaled_snapshot_id is not None, verdict
    rescaled = load_manifest(env.store(), verdict.rescaled_snapshot_id)
    assert (rescaled.trigger, rescaled.state_partitions, rescaled.batch_id) == (Trigger.RESCALE, 3, sp2.batch_id + 1)
    job.produce(3)
    sp3 = job.stop("rescaled", job.start("rescaled", rescaled.snapshot_id, "v2"))
    assert sp3.state_partitions == 3 and len(sp3.operators) == OPERATORS, sp3
    seconds["rescale"] = time.monotonic() - step

    # 4. Time travel: back to the savepoint before the rescale; the fourth part again, then the fifth.
    step = time.monotonic()
    job.produce(4)
    want = statematrix.expected(job.records)
    final = job.stop("travelled", job.start("travelled", sp2.snapshot_id, "v2"),
                     done=lambda: sum(job.rows().values()) >= sum(want.values()))
    seconds["time travel"] = time.monotonic() - step

    got = job.rows()
    missing, extra = want - got, got - want
    assert not missing and not extra, (f"{sum(got.values())} rows, expected {sum(want.values())}: missing "
                                       f"{sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    assert {op for op, _, _ in got} == {"dedup", "dedup_ww", "window", "session", "join", "pandas_state",
                                        "tws_pandas", "tws_rows"}
    report = verify_sink(job.sink, job.s3)
    assert report.ok and sum(len(f) for f in report.forks.values()) == 1, (report.problems, report.forks)

    # The abandoned timeline's snapshots disposed and collected; every kept snapshot verifies byte for byte.
    store = env.store()
    for snapshot in (rescaled, sp3):
        dispose_snapshot(store, snapshot.snapshot_id, force=True)
    collected = collect_garbage(store, min_age_s=0)
    assert collected.deferred is None and collected.deleted_objects > 0, collected
    for kept in (sp1, sp2, final):
        checked = verify_snapshot(store, kept.snapshot_id)
        assert checked.ok, checked.problems
    assert final.kind is Kind.SAVEPOINT and final.state_partitions == 2
    print(f"format {fmt}: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
          + f", total {time.monotonic() - started:.0f} s")
