"""Deterministic stateful streaming workloads for tests and benchmarks (real PySpark, local[2]).

Every workload reads a directory of JSON-lines input files with ``maxFilesPerTrigger=1`` and runs
with ``trigger(availableNow=True)``, so input file i is exactly batch i and a run ends by itself.
Results go to a JSON sink (one file per batch id, replaced on replay, so a replayed batch is
idempotent) that plain Python reads back; ``expected()`` computes the exact final result from the
same input generator, without Spark.

    spark = spark_session()
    wl = WORKLOADS["aggregation"]
    for i in range(3):
        write_input(input_dir, i)
    run_to_completion(spark, wl, input_dir=..., checkpoint_dir=..., output_dir=..., provider="rocksdb")
    assert wl.read_result(output_dir) == wl.expected(3)

pyspark is imported inside functions: importing this module costs nothing (unit tests, benchmarks).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_STATE = "org.apache.spark.sql.execution.streaming.state."
_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

#: State store configurations, applied to the session just before a query starts. Spark records the
#: provider class in the offsets log at the first batch and restores it on every restart (a later
#: session value is ignored); the changelog flag is NOT recorded and applies per run.
PROVIDERS: dict[str, dict[str, str]] = {
    "hdfs": {_PROVIDER: _STATE + "HDFSBackedStateStoreProvider"},
    "rocksdb": {_PROVIDER: _STATE + "RocksDBStateStoreProvider", _CHANGELOG: "false"},
    "rocksdb-changelog": {_PROVIDER: _STATE + "RocksDBStateStoreProvider", _CHANGELOG: "true"},
}

#: The input schema: key, a value unique per row and increasing with the file index, a dedup id
#: that repeats across files, and a category.
SCHEMA = "k STRING, v LONG, id LONG, cat STRING"
KEYS = ("k0", "k1", "k2", "k3")
CATEGORIES = ("a", "b", "c")
ROWS_PER_FILE = 6
_MTIME_BASE = 1_790_000_000  # 2026-09: recent enough for the file source's maxFileAge (7 days, relative)


# --------------------------------------------------------------------------------------------
# Session and input
# --------------------------------------------------------------------------------------------


def spark_session(app_name: str = "ckpt-tests", **conf: str) -> SparkSession:
    """The embedded default's local Spark (127.0.0.1 only), sized for tests."""
    from airflow_ckpt_provider.embedded import local_spark

    settings = {
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **conf,
    }
    spark: SparkSession = local_spark(app_name, **settings)
    return spark


def input_rows(i: int, seed: int = 0) -> list[dict[str, Any]]:
    """The rows of input file ``i``: deterministic from (seed, i)."""
    rng = random.Random(seed * 1_000_003 + i)
    return [
        {
            "k": rng.choice(KEYS),
            "v": i * 100 + j,
            "id": rng.randrange(20),
            "cat": rng.choice(CATEGORIES),
        }
        for j in range(ROWS_PER_FILE)
    ]


def write_input(input_dir: str | os.PathLike[str], i: int, seed: int = 0) -> Path:
    """Write input file ``i`` atomically (the file source must never see a partial file)."""
    directory = Path(input_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{i:05d}.json"
    text = "".join(json.dumps(row) + "\n" for row in input_rows(i, seed))
    _atomic_write(path, text)
    # The file source takes files in modification-time order; files written within the same
    # millisecond would come in any order. One second apart per index keeps file i in batch i.
    os.utime(path, (_MTIME_BASE + i, _MTIME_BASE + i))
    return path


def _atomic_write(path: Path, text: str) -> None:
    # A dot-prefixed temp name: Spark's file source ignores hidden files.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Sink: one JSON file per batch id, readable without Spark
# --------------------------------------------------------------------------------------------


def json_sink(output_dir: str | os.PathLike[str]) -> Callable[[DataFrame, int], None]:
    """A foreachBatch function writing ``<batch>.json``; a replayed batch replaces its file."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = sorted((r.asDict() for r in batch.collect()), key=lambda r: json.dumps(r, sort_keys=True))
        _atomic_write(directory / f"{batch_id:06d}.json", json.dumps(rows, sort_keys=True))

    return write




def read_batches(output_dir: str | os.PathLike[str]) -> list[tuple[int, list[dict[str, Any]]]]:
    """Every batch the sink wrote, as (batch id, rows), in batch order."""
    directory = Path(output_dir)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [(int(f.stem), json.loads(f.read_text())) for f in files]


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One stateful query, how to read its final result, and its exact expected result."""

    name: str
    output_mode: str
    transform: Callable[[DataFrame], DataFrame]
    result: Callable[[list[tuple[int, list[dict[str, Any]]]]], Any]
    expect: Callable[[list[list[dict[str, Any]]]], Any]
    providers: tuple[str, ...] = tuple(PROVIDERS)

    def read_result(self, output_dir: str | os.PathLike[str]) -> Any:
        """The final result the sink holds."""
        return self.result(read_batches(output_dir))

    def expected(self, files: int, seed: int = 0) -> Any:
        """The exact final result after input files 0..files-1, each processed exactly once."""
        return self.expect([input_rows(i, seed) for i in range(files)])


def _aggregation(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return df.groupBy("k").agg(F.count("*").alias("count"), F.sum("v").alias("sum"))


def _aggregation_result(batches: list[tuple[int, list[dict[str, Any]]]]) -> dict[str, tuple[int, int]]:
    # Update mode: each batch emits the keys it changed; the last emission per key is final.
    final: dict[str, tuple[int, int]] = {}
    for _batch, rows in batches:
        for row in rows:
            final[row["k"]] = (row["count"], row["sum"])
    return final


def _aggregation_expected(files: list[list[dict[str, Any]]]) -> dict[str, tuple[int, int]]:
    final: dict[str, tuple[int, int]] = {}
    for row in (r for rows in files for r in rows):
        count, total = final.get(row["k"], (0, 0))
        final[row["k"]] = (count + 1, total + row["v"])
    return final


def _dedup(df: DataFrame) -> DataFrame:
    return df.dropDuplicates(["id"]).select("id")


def _dedup_result(batches: list[tuple[int, list[dict[str, Any]]]]) -> list[tuple[int, int]]:
    # (id, batch that emitted it): an id emitted twice (state lost or replayed) shows up twice.
    return sorted((row["id"], batch) for batch, rows in batches for row in rows)


def _dedup_expected(files: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    first: dict[int, int] = {}
    for i, rows in enumerate(files):
        for row in rows:
            first.setdefault(row["id"], i)
    return sorted(first.items())


def _tws(df: DataFrame) -> DataFrame:
    return df.groupBy("k").transformWithStateInPandas(
        statefulProcessor=_processor_class()(),
        outputStructType="k STRING, count LONG, last STRING, cats STRING",
        outputMode="Update",
        timeMode="None",
    )


def _processor_class() -> type:
    """The StatefulProcessor: running count (ValueState), last 3 values (ListState), per-category
    counts (MapState). A class local to a function: cloudpickle ships it to Spark's Python workers
    by value (they cannot import the tests package), and this module imports without pyspark."""
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no py.typed; pandas-stubs is not installed
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class RunningStats(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "c LONG")
            self.last = handle.getListState("last", "v LONG")
            self.cats = handle.getMapState("cats", "cat STRING", "n LONG")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            batch = pd.concat(list(rows))
            count = _first(self.count.get()) + len(batch)
            last = [r[0] for r in self.last.get()]
            # Sort within the batch: row order inside a group is not something to rely on.
            last = (last + sorted(int(v) for v in batch["v"]))[-3:]
            for cat, n in batch["cat"].value_counts().items():
                self.cats.updateValue((cat,), (_first(self.cats.getValue((cat,))) + int(n),))
            self.count.update((count,))
            self.last.put([(v,) for v in last])
            cats = {c: _first(self.cats.getValue((c,))) for c in CATEGORIES if self.cats.containsKey((c,))}
            yield pd.DataFrame(
                {
                    "k": [key[0]],
                    "count": [count],
                    "last": [json.dumps(last)],
                    "cats": [json.dumps(cats, sort_keys=True)],
                }
            )

        def close(self) -> None:
            pass

    return RunningStats


def _first(value: tuple[Any, ...] | None) -> int:
    """The single field of a state value, 0 when the state is unset."""
    return int(value[0]) if value else 0


def _tws_result(batches: list[tuple[int, list[dict[str, Any]]]]) -> dict[str, tuple[int, list[int], dict[str, int]]]:
    final: dict[str, tuple[int, list[int], dict[str, int]]] = {}
    for _batch, rows in batches:
        for row in rows:
            final[row["k"]] = (row["count"], json.loads(row["last"]), json.loads(row["cats"]))
    return final


def _tws_expected(files: list[list[dict[str, Any]]]) -> dict[str, tuple[int, list[int], dict[str, int]]]:
    final: dict[str, tuple[int, list[int], dict[str, int]]] = {}
    for rows in files:
        for key in sorted({r["k"] for r in rows}):
            mine = [r for r in rows if r["k"] == key]
            count, last, cats = final.get(key, (0, [], {}))
            last = (last + sorted(r["v"] for r in mine))[-3:]
            cats = dict(cats)
            for r in mine:
                cats[r["cat"]] = cats.get(r["cat"], 0) + 1
            final[key] = (count + len(mine), last, dict(sorted(cats.items())))
    return final


WORKLOADS: dict[str, Workload] = {
    "aggregation": Workload("aggregation", "update", _aggregation, _aggregation_result, _aggregation_expected),
    "dedup": Workload("dedup", "append", _dedup, _dedup_result, _dedup_expected),
    # transformWithState needs column families: Spark 4.3 rejects the HDFS-backed provider with
    # UNSUPPORTED_FEATURE.STORE_BACKEND_NOT_SUPPORTED_FOR_TWS.
    "tws": Workload("tws", "update", _tws, _tws_result, _tws_expected, ("rocksdb", "rocksdb-changelog")),
}


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def run_to_completion(
    spark: SparkSession,
    workload: Workload,
    *,
    input_dir: str | os.PathLike[str],
    checkpoint_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    provider: str,
    timeout: int = 300,
    extra_conf: dict[str, str] | None = None,
) -> None:
    """Run ``workload`` until every input file is processed (one batch per file); raise on failure."""
    if provider not in workload.providers:
        raise ValueError(f"workload {workload.name} does not run on provider {provider}")
    query = _start(spark, workload, input_dir, checkpoint_dir, output_dir,
                   conf={**PROVIDERS[provider], **(extra_conf or {})}, trigger={"availableNow": True})
    try:
        if not query.awaitTermination(int(timeout)):
            raise TimeoutError(f"{workload.name} on {provider} did not finish within {timeout} s")
    finally:
        if query.isActive:
            query.stop()


def _start(
    spark: SparkSession,
    workload: Workload,
    input_dir: str | os.PathLike[str],
    checkpoint_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    conf: dict[str, str],
    trigger: dict[str, Any],
) -> Any:
    """Start ``workload`` over the input directory (one file per batch) into the JSON sink."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(os.fspath(input_dir))
    writer = (
        workload.transform(stream)
        .writeStream.outputMode(workload.output_mode)
        .foreachBatch(json_sink(output_dir))
        .option("checkpointLocation", os.fspath(checkpoint_dir))
        .trigger(**trigger)
    )
    # The query clones the session conf when it starts, so the provider applies to this query only.
    for key, value in conf.items():
        spark.conf.set(key, value)
    return writer.start()


@contextmanager
def running_query(
    spark: SparkSession,
    workload: Workload,
    *,
    input_dir: Path,
    checkpoint_dir: Path,
    output_dir: Path,
    provider: str,
    files: int,
    every: float = 0.3,
) -> Iterator[None]:
    """Run ``workload`` continuously while a feeder adds input files 1..files-1, one every ``every`` s."""
    write_input(input_dir, 0)
    query = _start(spark, workload, input_dir, checkpoint_dir, output_dir,
                   conf=PROVIDERS[provider], trigger={"processingTime": "50 milliseconds"})
    stop = threading.Event()

    def feed() -> None:
        for i in range(1, files):
            if stop.wait(every):
                return
            write_input(input_dir, i)

    feeder = threading.Thread(target=feed, name="input-feeder")
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join()
        query.stop()


def new_batches(checkpoint_dir: Path, *, timeout: float = 120.0) -> Iterator[int]:
    """Each batch id as it completes in ``checkpoint_dir`` (polled), until ``timeout`` seconds pass."""
    from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
    from airflow_ckpt_provider.core.store.storage import LocalStorage

    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        latest = SparkCheckpoint(LocalStorage(checkpoint_dir)).latest_completed_batch()
        if latest is not None and latest not in seen:
            seen.add(latest)
            yield latest
        time.sleep(0.02)
