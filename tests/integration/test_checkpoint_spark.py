"""The checkpoint model against real Spark 4.3 checkpoints: a copy of exactly view().files resumes exactly.

Every query runs with trigger(availableNow=True) and maxFilesPerTrigger=1: input file i is batch i.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.snapshots.checkpoint import BatchView, SparkCheckpoint
from airflow_ckpt_provider.core.snapshots.ckptfiles import relocate
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support import sparkjobs
from tests.support.sparkjobs import PROVIDERS, WORKLOADS, Workload, read_batches, run_to_completion, write_input

pytestmark = pytest.mark.integration

ALL_CASES = [(w, p) for w in WORKLOADS for p in PROVIDERS]
LOGS = {"metadata", "commits/2", "offsets/1", "offsets/2", "sources/0/0", "sources/0/1", "sources/0/2"}
# State files (besides SSTs) that load version 3 (= batch 2 + 1) of each partition's store.
STATE_FILES = {
    "hdfs": ["1.delta", "2.delta", "3.delta"],
    "rocksdb": ["3.zip"],
    "rocksdb-changelog": ["1.changelog", "2.changelog", "3.changelog"],
}
# transformWithState creates its column families in version 1, which forces a RocksDB snapshot.
TWS_CHANGELOG_FILES = ["1.zip", "2.changelog", "3.changelog"]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # The state store maintenance thread (snapshots, purging) takes its interval from the first
    # store an executor loads and keeps it for the SparkContext's life: set it for the whole module.
    session = sparkjobs.spark_session(
        "ckpt-checkpoint-model-tests", **{"spark.sql.streaming.stateStore.maintenanceInterval": "200ms"}
    )
    yield session
    session.stop()


def copy_view(view: BatchView, source: Path, target: Path) -> None:
    """Materialize exactly the view's files (no .crc files), relocating absolute paths."""
    for f in view.files:
        data = relocate(f.path, (source / f.path).read_bytes(), target.as_uri())
        (target / f.path).parent.mkdir(parents=True, exist_ok=True)
        (target / f.path).write_bytes(data)


def zip_ssts(zip_file: Path) -> set[str]:
    """The SSTs/ files a RocksDB checkpoint zip's metadata lists."""
    with zipfile.ZipFile(io.BytesIO(zip_file.read_bytes())) as zf:
        meta = json.loads(zf.read("metadata").decode().split("\n", 1)[1])
    return {f"SSTs/{f['dfsSstFileName']}" for f in meta["sstFiles"]}


def expected_state(ckpt: Path, workload: str, provider: str) -> set[str]:
    names = TWS_CHANGELOG_FILES if (workload, provider) == ("tws", "rocksdb-changelog") else STATE_FILES[provider]
    files: set[str] = set()
    for p in (0, 1):
        files |= {f"state/0/{p}/{n}" for n in names}
        files |= {f"state/0/{p}/{s}" for n in names if n.endswith(".zip") for s in zip_ssts(ckpt / f"state/0/{p}/{n}")}
    return files


def run_batches(spark: Any, wl: Workload, tmp: Path, provider: str, files: range, **conf: str) -> Path:
    for i in files:
        write_input(tmp / "in", i)
    ckpt = tmp / "ckpt"
    run_to_completion(
        spark, wl, input_dir=tmp / "in", checkpoint_dir=ckpt, output_dir=tmp / "out", provider=provider, extra_conf=conf
    )
    return ckpt


def restore_and_resume(spark: Any, wl: Workload, tmp: Path, provider: str, view: BatchView, files: int) -> Path:
    """Copy the view to a fresh place, drop the original, add input up to ``files``, run to the end."""
    ckpt, moved = tmp / "ckpt", tmp / "elsewhere" / "ckpt"
    copy_view(view, ckpt, moved)
    # The module's session keeps the state stores' maintenance thread: with changelog checkpointing it may still be
    # uploading a snapshot zip (its .tmp files come and go) while the original is deleted.
    shutil.rmtree(ckpt, ignore_errors=True)
    for i in range(files):
        if not (tmp / "in" / f"part-{i:05d}.json").exists():
            write_input(tmp / "in", i)
    run_to_completion(spark, wl, input_dir=tmp / "in", checkpoint_dir=moved, output_dir=tmp / "out", provider=provider)
    return moved


@pytest.mark.parametrize(("workload", "provider"), ALL_CASES)
def test_view_of_three_batches_restores_exactly(spark: Any, tmp_path: Path, workload: str, provider: str) -> None:
    wl = WORKLOADS[workload]
    if provider not in wl.providers:
        # Spark 4.3 refuses transformWithState on the HDFS-backed store (no column families).
        with pytest.raises(Exception, match="STORE_BACKEND_NOT_SUPPORTED_FOR_TWS"):
            run_batches(spark, dataclasses.replace(wl, providers=(provider,)), tmp_path, provider, range(1))
        return
    ckpt = run_batches(spark, wl, tmp_path, provider, range(3))
    checkpoint = SparkCheckpoint(LocalStorage(ckpt))
    assert checkpoint.latest_completed_batch() == 2

    view = checkpoint.view()
    files = {f.path for f in view.files}
    assert view.batch_id == 2
    assert view.next_offsets is None
    assert view.offsets == ['{"logOffset":2}']
    assert {f for f in files if not f.startswith("state/")} == LOGS
    metadata = {f for f in files if "/_metadata/" in f or "/_stateSchema/" in f}
    assert {f for f in files if f.startswith("state/")} - metadata == expected_state(ckpt, workload, provider)
    assert all(f.size == (ckpt / f.path).stat().st_size for f in view.files)
    [op] = view.operators
    assert (op.operator_id, op.partitions, op.provider) == (0, 2, provider.split("-", maxsplit=1)[0])
    assert op.changelog == (provider == "rocksdb-changelog")
    assert checkpoint.validate() == []

    moved = restore_and_resume(spark, wl, tmp_path, provider, view, files=5)
    assert SparkCheckpoint(LocalStorage(moved)).latest_completed_batch() == 4
    assert wl.read_result(tmp_path / "out") == wl.expected(5)


@pytest.mark.parametrize("write_ahead", [True, False])
def test_older_batch_restores_with_or_without_the_write_ahead_entry(
    spark: Any, tmp_path: Path, write_ahead: bool
) -> None:
    wl, provider = WORKLOADS["aggregation"], "rocksdb-changelog"
    ckpt = run_batches(spark, wl, tmp_path, provider, range(3))
    view = SparkCheckpoint(LocalStorage(ckpt)).view(1, write_ahead=write_ahead)
    logs = {f.path for f in view.files if not f.path.startswith("state/")}
    if write_ahead:  # offsets/2 is batch 1's successor: Spark re-runs batch 2 with exactly it
        assert view.next_offsets == ['{"logOffset":2}']
        assert logs == {"metadata", "commits/1", "offsets/1", "offsets/2", "sources/0/0", "sources/0/1", "sources/0/2"}
    else:  # Spark plans batch 2 anew and reads offsets/0 to check the log
        assert view.next_offsets is None
        assert logs == {"metadata", "commits/1", "offsets/0", "offsets/1", "sources/0/0", "sources/0/1"}
    restore_and_resume(spark, wl, tmp_path, provider, view, files=5)
    assert [b for b, _ in read_batches(tmp_path / "out")] == [0, 1, 2, 3, 4]
    assert wl.read_result(tmp_path / "out") == wl.expected(5)


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb-changelog"])
def test_snapshots_and_purged_files_after_maintenance(spark: Any, tmp_path: Path, provider: str) -> None:
    wl = WORKLOADS["aggregation"]
    conf = {
        "spark.sql.streaming.minBatchesToRetain": "2",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    }
    for i in range(6):  # one run per batch, with time for the maintenance thread in between
        ckpt = run_batches(spark, wl, tmp_path, provider, range(i, i + 1), **conf)
        time.sleep(0.5)
    assert sorted(p.name for p in (ckpt / "commits").iterdir() if not p.name.startswith(".")) == ["3", "4", "5"]
    view = SparkCheckpoint(LocalStorage(ckpt)).view(verify=True)
    state = {
        f.path.rsplit("/", 1)[-1] for f in view.files if f.path.startswith("state/0/0/") and "/SSTs/" not in f.path
    }
    snapshot = ".snapshot" if provider == "hdfs" else ".zip"
    assert any(name.endswith(snapshot) for name in state), f"maintenance wrote no snapshot: {state}"
    assert {"offsets/4", "offsets/5", "commits/5"} <= {f.path for f in view.files}

    restore_and_resume(spark, wl, tmp_path, provider, view, files=8)
    assert wl.read_result(tmp_path / "out") == wl.expected(8)


def test_views_of_a_running_query_are_consistent(spark: Any, tmp_path: Path) -> None:
    wl, provider, files = WORKLOADS["aggregation"], "rocksdb-changelog", 10
    inputs, ckpt = tmp_path / "in", tmp_path / "ckpt"
    views: dict[int, BatchView] = {}
    with sparkjobs.running_query(spark, wl, input_dir=inputs, checkpoint_dir=ckpt, output_dir=tmp_path / "out",
                                 provider=provider, files=files, every=0.4):
        for _batch in sparkjobs.new_batches(ckpt):
            view = SparkCheckpoint(LocalStorage(ckpt)).view()  # while Spark writes the next batch
            copy_view(view, ckpt, tmp_path / "views" / str(view.batch_id))
            views[view.batch_id] = view
            if len(views) >= files:
                break
    assert len(views) >= 3, f"only {sorted(views)} batches were seen"
    for batch, view in views.items():
        copy = SparkCheckpoint(LocalStorage(tmp_path / "views" / str(batch)))
        assert copy.latest_completed_batch() == batch
        assert copy.validate() == [], batch
        assert copy.view().files == view.files


FORMAT_V2 = "spark.sql.streaming.stateStore.checkpointFormatVersion"


@pytest.mark.parametrize(("workload", "provider"), [
    ("aggregation", "rocksdb"), ("aggregation", "rocksdb-changelog"), ("tws", "rocksdb-changelog")])
def test_a_format_v2_view_holds_the_committed_unique_ids_files_and_restores_exactly(
        spark: Any, tmp_path: Path, workload: str, provider: str) -> None:
    """State checkpoint format v2 (issue 45): commits/N names the unique id of each store's version N+1; the view
    holds that version's files by their ids (a zip, or the changelog and the lineage it starts with back to a zip or
    version 1) with their .crc companions, and a copy resumes exactly, still in format v2."""
    wl = WORKLOADS[workload]
    try:
        ckpt = run_batches(spark, wl, tmp_path, provider, range(3), **{FORMAT_V2: "2"})
    finally:
        spark.conf.unset(FORMAT_V2)  # the module's session: later tests run format v1
    assert (ckpt / "commits/2").read_text().startswith("v2\n")
    committed = {b: json.loads((ckpt / f"commits/{b}").read_text().split("\n", 1)[1])["stateUniqueIds"]["0"]
                 for b in range(3)}
    view = SparkCheckpoint(LocalStorage(ckpt)).view()
    assert view.batch_id == 2
    files = {f.path for f in view.files}
    for p in (0, 1):
        names = [f.rsplit("/", 1)[1] for f in files if f.startswith(f"state/0/{p}/") and f.count("/") == 3]
        main = sorted(n for n in names if not n.endswith(".crc"))
        assert sorted(n for n in names if n.endswith(".crc")) == sorted(f"{n}.crc" for n in main)
        chosen = {(int(n.split("_", 1)[0]), n.split("_", 1)[1].rsplit(".", 1)[0]) for n in main}
        # Each chosen version's id is the one the commit before it names: version v by commits/v-1.
        assert chosen == {(v, committed[v - 1][p][0]) for v, _ in chosen}
        assert (3, committed[2][p][0]) in chosen
        if provider == "rocksdb":  # a zip per version: version 3's alone
            assert main == [f"3_{committed[2][p][0]}.zip"]
    moved = restore_and_resume(spark, wl, tmp_path, provider, view, files=5)
    assert SparkCheckpoint(LocalStorage(moved)).latest_completed_batch() == 4
    assert wl.read_result(tmp_path / "out") == wl.expected(5)
    assert (moved / "commits/4").read_text().startswith("v2\n")  # the restored checkpoint stays in format v2


@pytest.mark.parametrize("fmt", [
    pytest.param("1", marks=pytest.mark.full(
        proven_by="integration/test_state_matrix_v1.py (the State Processor reads every table of a format v1 "
                  "savepoint of eight operators, each exact)")),
    "2"])
def test_the_state_processor_reads_every_key_of_a_snapshot_exactly_in_format_v1_and_v2(
        spark: Any, tmp_path: Path, fmt: str) -> None:
    """The State Processor's reading side (issue 45): a savepoint of an aggregation (RocksDB with changelog
    checkpointing) read after its checkpoint is gone: one table, every key with its count and sum as columns, the
    same rows exported as JSON; the copy it read is removed after. The CLI (format v2) writes CSV, refuses an unknown
    table, and writes the sample the job page shows."""
    from airflow_ckpt_provider.core.records.statesample import latest_sample
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.runtime.stateprocessor import (
        SCRATCH_PREFIX,
        export_state,
        read_state,
        snapshot_copy,
        state_tables,
    )

    wl = WORKLOADS["aggregation"]
    try:
        ckpt = run_batches(spark, wl, tmp_path, "rocksdb-changelog", range(3), **{FORMAT_V2: fmt})
        store = JobStore.open(str(tmp_path / "store"), "agg")
        snapshot_id = create_snapshot(store, LocalStorage(ckpt)).manifest.snapshot_id
        shutil.rmtree(ckpt, ignore_errors=True)  # the maintenance thread may still write .tmp files (above)
        with snapshot_copy(store, snapshot_id) as (manifest, copy):
            tables = state_tables(spark, copy)
            assert [(t.name, t.operator, t.partitions) for t in tables] == [("0/default", "stateStoreSave", 2)]
            frame = read_state(spark, copy, manifest.batch_id, tables[0])
            rows = frame.collect()
            exported = export_state(frame, "json", str(tmp_path / "state-json"))
        assert not Path(copy).exists() and SCRATCH_PREFIX in copy
    finally:
        spark.conf.unset(FORMAT_V2)  # the module's session: later tests run format v1
    assert frame.columns == ["operator_id", "table", "key_k", "value_count", "value_sum", "partition_id"]
    assert {r.key_k: (r.value_count, r.value_sum) for r in rows} == wl.expected(3)
    assert exported == len(rows) == len(wl.expected(3))
    written = [json.loads(line) for f in sorted((tmp_path / "state-json").glob("part-*.json"))
               for line in f.read_text().splitlines()]
    assert {r["key_k"]: (r["value_count"], r["value_sum"]) for r in written} == wl.expected(3)
    if fmt == "2":  # the CLI once, in its own process and Spark session: a table to CSV, an unknown table refused
        ckpt_state = [sys.executable, "-m", "airflow_ckpt_provider.cli", "state", "read", snapshot_id,
                      "--store", str(tmp_path / "store"), "--job", "agg"]
        done = subprocess.run([*ckpt_state, "--table", "0/default", "--format", "csv", "--output",
                               str(tmp_path / "state-csv")], check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        wrote = f"wrote {len(rows)} rows of state table 0/default (stateStoreSave) of snapshot {snapshot_id}"
        assert wrote in done.stdout, done.stdout
        lines = [ln for f in sorted((tmp_path / "state-csv").glob("part-*.csv")) for ln in f.read_text().splitlines()]
        header = "operator_id,table,key_k,value_count,value_sum,partition_id"
        assert {ln for ln in lines if ln != header} == {
            f"0,0/default,{r.key_k},{r.value_count},{r.value_sum},{r.partition_id}" for r in rows}
        refused = subprocess.run([*ckpt_state, "--table", "3/default"], check=False, capture_output=True, text=True,
                                 timeout=300)
        assert refused.returncode == 1
        assert "no state table '3/default' in the snapshot; expected one of: 0/default" in refused.stderr
        # The sample the Streaming Jobs page shows: written to the job store by `ckpt state sample`.
        sampled = subprocess.run([*ckpt_state[:4], "sample", *ckpt_state[5:], "--rows", "3"], check=False,
                                 capture_output=True, text=True, timeout=300)
        assert sampled.returncode == 0, sampled.stderr[-2000:]
        sample = latest_sample(store)
        assert sample is not None and (sample.snapshot_id, sample.batch_id) == (snapshot_id, manifest.batch_id)
        (table,) = sample.tables
        assert (table.name, table.columns, table.rows_total) == (
            "0/default", ["key_k", "value_count", "value_sum", "partition_id"], len(rows))
        assert len(table.rows) == 3 and all(
            wl.expected(3)[k] == (int(n), int(total)) for k, n, total, _ in table.rows), table.rows


def test_a_key_deleted_and_a_value_changed_in_format_v2_savepoints_restore_exactly_the_source_untouched(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The State Processor's rewriting side (issue 45) on a transformWithState job (a ValueState per key in a column
    family of its own; RocksDB, state format v2): `ckpt state delete`, in its own process, deletes one key into a NEW
    savepoint once the restore check of the job file passed on it; the source savepoint still holds every key; a
    value change of another key (the check in this process) makes a third savepoint; the job restored from it and
    fed one more file counts the deleted key from zero, the changed key on from its new count and every other key on
    from its count. A predicate that selects no key, a transform that changes the schema or returns rows it was not
    given, is refused, with no savepoint written."""
    from collections import Counter

    from pyspark.sql import functions as F

    from airflow_ckpt_provider.core.errors import ConfigError
    from airflow_ckpt_provider.core.policy.modes import RestoreSpec
    from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
    from airflow_ckpt_provider.core.policy.stateedit import ValueUpdate
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot, list_snapshots, load_manifest
    from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.runtime.config import RuntimeConfig
    from airflow_ckpt_provider.runtime.restore_check import RestoreChecker
    from airflow_ckpt_provider.runtime.stateprocessor import read_state, snapshot_copy, state_tables
    from airflow_ckpt_provider.runtime.staterewrite import rewrite_state
    from tests.jobs import tws_evolve

    def counts(files: range) -> Counter[str]:
        return Counter(str(r["k"]) for i in files for r in sparkjobs.input_rows(i))

    def state_of(store: JobStore, snapshot_id: str) -> dict[str, int]:
        with snapshot_copy(store, snapshot_id) as (manifest, copy):
            (count,) = [t for t in state_tables(spark, copy) if t.name == "0/default/count"]
            return {r.key_k: r.value_n for r in read_state(spark, copy, manifest.batch_id, count).collect()}

    monkeypatch.setenv("CKPT_EVOLVE_INPUT", str(tmp_path / "in"))
    conf = {**sparkjobs.PROVIDERS["rocksdb"], FORMAT_V2: "2"}

    def run(checkpoint: Path) -> None:
        tws_evolve.query(spark, "n BIGINT").option("checkpointLocation", str(checkpoint)).trigger(
            availableNow=True).start().awaitTermination()

    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        for i in range(2):
            write_input(tmp_path / "in", i)
        run(tmp_path / "ckpt")
        store = JobStore.open(str(tmp_path / "store"), "evolve")
        source = create_snapshot(store, LocalStorage(tmp_path / "ckpt")).manifest.snapshot_id
        before = counts(range(2))
        victim = sorted(before)[0]
        done = subprocess.run(
            [sys.executable, "-m", "airflow_ckpt_provider.cli", "state", "delete", source, "--store",
             str(tmp_path / "store"), "--job", "evolve", "--operator", "0", "--where", f"key_k = '{victim}'",
             "--job-file", tws_evolve.__file__, "--json"], check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        said = json.loads(done.stdout)
        assert (said["outcome"], said["rows_removed"]) == ("compatible", 1), said
        rewritten = said["rewritten_snapshot_id"]
        manifest = load_manifest(store, rewritten)
        assert (manifest.batch_id, manifest.labels["rewritten_from"], manifest.labels["keys_deleted"]) == (
            load_manifest(store, source).batch_id + 1, source, f"0:key_k = '{victim}'")
        assert state_of(store, source) == dict(before)  # the source is never touched
        assert state_of(store, rewritten) == {k: n for k, n in before.items() if k != victim}

        changed = sorted(before)[1]
        update = ValueUpdate("0/default/count", f"key_k = '{changed}'", {"value_n": "value_n + 1000"})
        checker = RestoreChecker(RuntimeConfig(
            job="evolve", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "live"),
            restore=RestoreSpec.parse(rewritten), check_restore=True, update_values=str(update),
            save_edited=True),
            tws_evolve.__file__, out=io.StringIO())
        checker.run(spark_factory=lambda: spark)
        assert checker.report is not None and checker.report.outcome is CheckOutcome.COMPATIBLE, checker.report
        assert checker.rewrite is not None and (checker.rewrite.rows_changed, checker.rewrite.rows_removed) == (1, 0)
        updated = checker.report.rewritten_snapshot_id
        assert updated is not None and load_manifest(store, updated).labels["rows_changed"] == "1"
        now = {k: n + (1000 if k == changed else 0) for k, n in before.items() if k != victim}
        assert state_of(store, updated) == now
        saved = {m.snapshot_id for m in list_snapshots(store)}
        nobody = RestoreChecker(RuntimeConfig(
            job="evolve", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "live"),
            restore=RestoreSpec.parse(updated), check_restore=True, delete_keys="0:key_k = 'nobody'",
            save_edited=True), tws_evolve.__file__, out=io.StringIO())
        nobody.run(spark_factory=lambda: spark)  # a predicate that selects nothing: refused, no savepoint
        assert nobody.report is not None and nobody.report.outcome is CheckOutcome.BAD_INPUT, nobody.report
        assert "expected at least one state row to delete, found none" in nobody.report.reason
        assert {m.snapshot_id for m in list_snapshots(store)} == saved

        restore_snapshot(store, updated, LocalStorage(tmp_path / "restored"))
        write_input(tmp_path / "in", 2)
        run(tmp_path / "restored")
        resumed = {r.key.k: r.value.n for r in spark.read.format("statestore").option("stateVarName", "count")
                   .load(str(tmp_path / "restored")).collect()}
        third = counts(range(2, 3))
        assert resumed == {k: now.get(k, 0) + third[k] for k in before | third}

        with snapshot_copy(store, source) as (m, copy), pytest.raises(ConfigError, match=(
                r"returned other columns than it was given: expected struct<key_k:string,partition_key:.*found "
                r".*,x:int>")):
            rewrite_state(spark, LocalStorage(copy), m.batch_id, {0: lambda rows: rows.withColumn("x", F.lit(1))})
        with snapshot_copy(store, source) as (m, copy), pytest.raises(ConfigError, match=(
                rf"returned {len(before)} rows it was not given: expected a subset")):
            rewrite_state(spark, LocalStorage(copy), m.batch_id, {0: lambda rows: rows.unionAll(rows)})
    finally:
        for key in conf:
            spark.conf.unset(key)


def test_the_restore_check_names_the_sources_an_upgrade_adds_and_drops_in_an_offset_log_v2(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark 4.2's source evolution (offset log v2, sources recorded by name): a job reading named sources a and b
    is upgraded to read a and c. Spark accepts it; the restore check says so and names what changes: c is read from
    its start, b's position is dropped."""
    from airflow_ckpt_provider.core.policy.modes import RestoreSpec
    from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.runtime.config import RuntimeConfig
    from airflow_ckpt_provider.runtime.restore_check import RestoreChecker
    from tests.jobs import named_sources

    monkeypatch.setenv("CKPT_NAMED_INPUT", str(tmp_path / "in"))
    for name in "abc":
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "0.json").write_text(json.dumps({"k": name}) + "\n")
    conf = {"spark.sql.streaming.offsetLog.formatVersion": "2",
            "spark.sql.streaming.queryEvolution.enableSourceEvolution": "true"}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        named_sources.query(spark, "a,b").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(
            availableNow=True).start().awaitTermination()
        assert (tmp_path / "ckpt/offsets/0").read_text().splitlines()[2:] == ['a:{"logOffset":0}',
                                                                              'b:{"logOffset":0}']
        store = JobStore.open(str(tmp_path / "store"), "named")
        snapshot_id = create_snapshot(store, LocalStorage(tmp_path / "ckpt")).manifest.snapshot_id
        monkeypatch.setenv("CKPT_NAMED_SOURCES", "a,c")
        checker = RestoreChecker(RuntimeConfig(job="named", store=str(tmp_path / "store"),
                                               checkpoint=str(tmp_path / "live"),
                                               restore=RestoreSpec.parse(snapshot_id), check_restore=True),
                                 named_sources.__file__, out=io.StringIO())
        checker.run(spark_factory=lambda: spark)
    finally:
        for key in conf:
            spark.conf.unset(key)
    report = checker.report
    assert report is not None and report.outcome is CheckOutcome.COMPATIBLE, report
    assert report.source_changes == (
        "source 'c' added: Spark reads it from its starting offsets (its own options say where; nothing of it is "
        "in the state)",
        "source 'b' no longer read: its position {\"logOffset\":0} is dropped, and reading it again later starts "
        "it over")
    assert "source 'c' added" in report.reason and "source 'b' no longer read" in report.reason


@pytest.mark.parametrize("encoding", ["avro", "unsaferow"])
def test_the_restore_check_names_what_an_upgrade_changes_in_transformwithstate_state_schemas(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str) -> None:
    """A ValueState ``count`` of ``n BIGINT`` gains a field ``m STRING`` in the new code: with Avro encoding Spark
    evolves it and the check says what changed; with unsaferow Spark refuses, and the check says why and what to do.
    The check runs in this process (RestoreChecker with the module's session) on a savepoint in a local job store."""
    from airflow_ckpt_provider.core.policy.modes import RestoreSpec
    from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.runtime.config import RuntimeConfig
    from airflow_ckpt_provider.runtime.restore_check import RestoreChecker
    from tests.jobs import tws_evolve

    job_file = Path(tws_evolve.__file__)
    monkeypatch.setenv("CKPT_EVOLVE_INPUT", str(tmp_path / "in"))
    write_input(tmp_path / "in", 0)
    conf = {**sparkjobs.PROVIDERS["rocksdb"], "spark.sql.streaming.stateStore.encodingFormat": encoding}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        tws_evolve.query(spark, "n BIGINT").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(
            availableNow=True).start().awaitTermination()
        store = JobStore.open(str(tmp_path / "store"), "evolve")
        snapshot_id = create_snapshot(store, LocalStorage(tmp_path / "ckpt")).manifest.snapshot_id
        write_input(tmp_path / "in", 1)
        monkeypatch.setenv("CKPT_EVOLVE_SCHEMA", "n BIGINT, m STRING")
        config = RuntimeConfig(job="evolve", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "live"),
                               restore=RestoreSpec.parse(snapshot_id), check_restore=True)
        checker = RestoreChecker(config, str(job_file), out=io.StringIO())
        checker.run(spark_factory=lambda: spark)
    finally:
        for key in conf:
            spark.conf.unset(key)
    report = checker.report
    assert report is not None
    if encoding == "avro":
        assert report.outcome is CheckOutcome.COMPATIBLE, report
        assert report.state_schema_changes == (
            "operator 0: state variable 'count' value schema 0 -> 1: added field m (string)",)
        assert "transformWithState state schemas evolve: operator 0: state variable 'count'" in report.reason
    else:
        assert (report.outcome, report.error_class) == (
            CheckOutcome.INCOMPATIBLE, "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"), report
        assert "evolve (fields added, removed, widened) only with Avro encoding, and this state is encoded as " \
               "unsaferow" in report.reason
        assert report.state_schema_changes == ()
