"""The ckpt-files sink with real Spark, on a local directory and on SeaweedFS S3.

The source is Spark's file source over JSON-lines files (tests/support/sparkjobs.write_input), one file per
batch with ``trigger(availableNow=True)``: batch i holds exactly the rows of input file i.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.store.storage import S3Options, open_storage
from airflow_ckpt_provider.embedded import EmbeddedS3
from airflow_ckpt_provider.sinks.filelayout import (
    COMMITS,
    committed_batches,
    read_committed,
    read_pandas,
    read_spark,
)
from airflow_ckpt_provider.sinks.filemaintenance import verify_sink
from tests.integration.conftest import sink_session
from tests.support import sparkjobs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark(s3_server: EmbeddedS3) -> Iterator[Any]:
    """One session for the module; Python workers get the S3 env (os.environ and spark.executorEnv)."""
    with sink_session(s3_server, "ckpt-test-file-sink") as session:
        yield session


@pytest.fixture(params=["local", "s3"])
def sink_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "sink")
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/out/orders"


def _s3(server: EmbeddedS3) -> S3Options:
    return S3Options(endpoint_url=server.endpoint_url, region=server.region,
                     access_key_id=server.access_key, secret_access_key=server.secret_key)


def _query(spark: Any, input_dir: Path, checkpoint: Path, options: dict[str, str], mode: str = "append") -> Any:
    stream = spark.readStream.schema(sparkjobs.SCHEMA).option("maxFilesPerTrigger", 1).json(str(input_dir))
    writer = stream.writeStream.format("ckpt-files").outputMode(mode).option("checkpointLocation", str(checkpoint))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.trigger(availableNow=True).start()


def _run(spark: Any, input_dir: Path, checkpoint: Path, options: dict[str, str]) -> None:
    query = _query(spark, input_dir, checkpoint, options)
    try:
        assert query.awaitTermination(240), "query did not finish in 240 s"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None, query.exception()


def _expected(files: range) -> list[tuple[Any, ...]]:
    return [(r["k"], r["v"], r["id"], r["cat"], i) for i in files for r in sparkjobs.input_rows(i)]


def _rows(table: Any) -> list[tuple[Any, ...]]:
    d = table.to_pydict()
    return sorted(zip(d["k"], d["v"], d["id"], d["cat"], d["batch"], strict=True), key=lambda r: (r[4], r[1]))


def test_batches_replay_and_fresh_checkpoint(spark: Any, sink_url: str, tmp_path: Path, s3_server: EmbeddedS3) -> None:
    s3 = _s3(s3_server)
    inp, ckpt = tmp_path / "in", tmp_path / "ckpt"
    for i in range(3):
        sparkjobs.write_input(inp, i)
    opts = {"path": sink_url, "job": "orders", "compression": "zstd"}
    _run(spark, inp, ckpt, opts)

    manifests = committed_batches(sink_url, s3)
    assert [m.batch_id for m in manifests] == [0, 1, 2]
    assert len({m.query_id for m in manifests}) == 1
    assert _rows(read_committed(sink_url, s3, batch_id_column="batch")) == _expected(range(3))
    assert len(read_pandas(sink_url, s3)) == 3 * sparkjobs.ROWS_PER_FILE
    assert sorted(tuple(r) for r in read_spark(spark, sink_url, s3).collect()) == sorted(
        r[:4] for r in _expected(range(3)))
    assert verify_sink(sink_url, s3, checksums=True).ok

    # Replay of the committed batch 2: Spark re-runs it (same query id, same batch id), the sink
    # finds its manifest and makes nothing of the new attempt visible.
    (ckpt / "commits" / "2").unlink()
    (ckpt / "commits" / ".2.crc").unlink(missing_ok=True)
    _run(spark, inp, ckpt, opts)
    assert [m.batch_id for m in committed_batches(sink_url, s3)] == [0, 1, 2]
    assert _rows(read_committed(sink_url, s3, batch_id_column="batch")) == _expected(range(3))
    report = verify_sink(sink_url, s3, checksums=True)
    assert report.ok, report.problems
    assert report.orphans == []  # the replayed attempt's files were deleted by its commit

    # A fresh checkpoint on the same path: a new query id, batch ids restart at 0 and are not skipped.
    fresh = tmp_path / "ckpt2"
    shutil.rmtree(inp)
    for i in range(3, 5):
        sparkjobs.write_input(inp, i)
    _run(spark, inp, fresh, opts)
    manifests = committed_batches(sink_url, s3)
    assert [m.batch_id for m in manifests] == [0, 1, 2, 0, 1]
    assert len({m.query_id for m in manifests}) == 2
    table = read_committed(sink_url, s3, query_id_column="q")
    assert sorted(table.column("v").to_pylist()) == sorted(r[1] for r in _expected(range(5)))
    assert verify_sink(sink_url, s3).ok


def _start_error(writer: Any, checkpoint: Path) -> str:
    """The error that fails the query as it starts, before its first batch writes anything.

    Spark 4.3 builds a Python sink's writer (``streamWriter``) when the first batch is planned, in the
    query's thread (offsets/0 is already logged), so the error ends the query through
    awaitTermination, not through start() itself; batch 0 never completes.
    """
    try:
        query = writer.start()
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    except Exception as err:  # Spark wraps the Python error in its own exception types
        assert not (checkpoint / "commits" / "0").exists(), "a batch completed although the sink refused"
        return str(err)
    raise AssertionError(f"the query accepted bad input and ended with {query.exception()}")


def _refused(spark: Any, tmp_path: Path, opts: dict[str, str]) -> str:
    inp = tmp_path / f"in-{uuid.uuid4().hex[:6]}"
    sparkjobs.write_input(inp, 0)
    stream = spark.readStream.schema(sparkjobs.SCHEMA).json(str(inp))
    ckpt = tmp_path / f"c-{inp.name}"
    writer = stream.writeStream.format("ckpt-files").option("checkpointLocation", str(ckpt))
    for k, v in opts.items():
        writer = writer.option(k, v)
    return _start_error(writer.trigger(availableNow=True), ckpt)


def test_bad_input_fails_the_query_at_start_and_writes_nothing(spark: Any, tmp_path: Path, bucket: str,
                                                     s3_server: EmbeddedS3) -> None:
    s3 = _s3(s3_server)
    other = f"s3://{bucket}/other"
    open_storage(other, s3).write("_ckpt_sink.json", b'{"format": "ckpt-files", "version": 1, "job": "billing"}')
    msg = _refused(spark, tmp_path, {"path": other, "job": "orders"})
    assert "belongs to job 'billing'" in msg
    assert [o.key for o in open_storage(other, s3).list()] == ["_ckpt_sink.json"]

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-0.parquet").write_bytes(b"x")
    assert "has no _ckpt_sink.json" in _refused(spark, tmp_path, {"path": str(foreign), "job": "orders"})
    assert sorted(p.name for p in foreign.iterdir()) == ["part-0.parquet"]

    empty = tmp_path / "empty"
    assert "no job given" in _refused(spark, tmp_path, {"path": str(empty)})
    assert "no path given" in _refused(spark, tmp_path, {"job": "orders"})
    assert "unsupported option(s) bogus" in _refused(spark, tmp_path, {"path": str(empty), "job": "o", "bogus": "1"})
    assert not empty.exists()


def test_complete_mode_refused(spark: Any, tmp_path: Path) -> None:
    inp = tmp_path / "in"
    sparkjobs.write_input(inp, 0)
    stream = spark.readStream.schema(sparkjobs.SCHEMA).json(str(inp)).groupBy("k").count()
    writer = (stream.writeStream.format("ckpt-files").outputMode("complete").option("path", str(tmp_path / "s"))
              .option("job", "o").option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True))
    message = _start_error(writer, tmp_path / "c")
    assert "complete output mode is not supported" in message
    assert not (tmp_path / "s" / COMMITS).exists()


def test_update_and_complete_modes_are_refused_when_the_query_is_defined(spark: Any, tmp_path: Path) -> None:
    """Spark runs Python sinks in append mode only and says so at the first batch with a Java stack trace;
    check_output_mode (the runtime calls it after the job's build function, before the lease) says it first."""
    from airflow_ckpt_provider.core.errors import ConfigError
    from airflow_ckpt_provider.runtime.datasources import check_output_mode, output_mode

    sparkjobs.write_input(tmp_path / "in", 0)
    stream = spark.readStream.schema(sparkjobs.SCHEMA).json(str(tmp_path / "in")).groupBy("k").count()
    for sink in ("ckpt-files", "ckpt-kafka"):
        for mode in ("update", "complete"):
            writer = stream.writeStream.format(sink).outputMode(mode)
            assert output_mode(writer) == (sink, mode.capitalize())
            with pytest.raises(ConfigError, match=rf"the {sink} sink supports the append output mode only, "
                                                  rf"found outputMode\('{mode}'\)"):
                check_output_mode(writer)
    check_output_mode(stream.writeStream.format("ckpt-files").outputMode("append"))
    check_output_mode(stream.writeStream.format("console").outputMode("update"))  # not ours: Spark decides


def test_files_sink_refuses_bad_input_before_the_query_starts(spark: Any, tmp_path: Path) -> None:
    """files_sink() runs the checks in the job's build function: no query, no checkpoint, nothing written."""
    from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
    from airflow_ckpt_provider.sinks.files import files_sink

    inp = tmp_path / "in"
    sparkjobs.write_input(inp, 0)
    stream = spark.readStream.schema(sparkjobs.SCHEMA).json(str(inp))
    owned = tmp_path / "owned"
    owned.mkdir()
    (owned / "_ckpt_sink.json").write_text('{"format": "ckpt-files", "version": 1, "job": "billing"}')
    with pytest.raises(ConflictError, match="belongs to job 'billing'"):
        files_sink(stream.writeStream, str(owned), job="orders")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(ConflictError, match=r"has no _ckpt_sink\.json"):
        files_sink(stream.writeStream, str(foreign), job="orders")
    with pytest.raises(ConfigError, match="unsupported compression"):
        files_sink(stream.writeStream, str(tmp_path / "new"), job="orders", compression="rar")
    assert sorted(p.name for p in owned.iterdir()) == ["_ckpt_sink.json"]
    assert sorted(p.name for p in foreign.iterdir()) == ["part-0.parquet"]
    assert not (tmp_path / "new").exists()
    assert spark.streams.active == []

    ckpt = tmp_path / "c"
    query = (files_sink(stream.writeStream, str(owned), job="billing").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert read_committed(str(owned)).num_rows == sparkjobs.ROWS_PER_FILE
