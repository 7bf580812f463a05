"""A class-data archive (JDK CDS) of Spark's driver classes for the tests' drivers.

Most of the suite's time is Spark drivers starting (every ``ckpt run``, restart, restore check and test
session is a new driver JVM), and most of a driver JVM's start is loading and verifying Spark's classes
from its jars. A dynamic CDS archive (``-XX:ArchiveClassesAtExit``, JDK 13+) holds them already parsed
and verified; a driver started with ``-XX:SharedArchiveFile`` maps it: on the 2-core machine a test
session's start to its first job took 5.3-5.5 s with the archive and 9.1-9.6 s without.

``driver_archive`` makes the archive once (a short training driver: a RocksDB-backed streaming
deduplication, a Python foreachBatch, a parquet round trip) and keeps it under the temporary directory,
named after what it depends on: the java binary and its version, pyspark's location and version, and the
JVM options. The JVM checks the rest itself: a driver whose classpath does not start with the archive's
(another Spark) runs without it, as it would with no archive. The tests pass the options through
``SPARK_SUBMIT_OPTS`` (tests/conftest.py), which spark-submit gives the driver JVM only: not the
launcher JVM that builds its command (another classpath), not executors, not the embedded cluster's
master and workers (they drop the variable).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

#: Quiet CDS: a driver that cannot use the archive (another classpath) says so on stderr otherwise.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_TRAINING = textwrap.dedent("""
    import sys, tempfile
    from pyspark.sql import SparkSession, functions as F
    work = tempfile.mkdtemp(prefix="ckpt-cds-training-")
    spark = (SparkSession.builder.master("local[2]").appName("ckpt-cds-training")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .getOrCreate())
    spark.range(100).selectExpr("id", "id % 7 AS k").write.parquet(work + "/p")
    assert spark.read.parquet(work + "/p").groupBy("k").count().count() == 7
    seen = []
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .withColumn("k", F.col("value") % 5)
             .dropDuplicates(["k"])
             .writeStream.option("checkpointLocation", work + "/ckpt")
             .foreachBatch(lambda df, batch: seen.append((batch, df.count())))
             .start())
    while len(seen) < 3:
        query.awaitTermination(0.5)
    query.stop()
    spark.stop()
    print("trained on", len(seen), "batches", file=sys.stderr)
""")


def _key(java: str, jvm_options: str) -> str:
    """What the archive depends on besides the classpath the JVM checks itself."""
    import pyspark

    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False).stderr
    parts = [java, version, str(Path(pyspark.__file__).parent), pyspark.__version__, jvm_options]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def driver_archive(jvm_options: str, *, timeout: float = 300.0) -> tuple[Path | None, str]:
    """The archive for drivers started with ``jvm_options``, made now unless a matching one exists; and one
    line on what happened. None (and why) where it cannot be made: no java, a JDK without dynamic archives,
    a training run that failed; the drivers then start as before."""
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get(
        "JAVA_HOME") else shutil.which("java")
    if java is None:
        return None, "no java on PATH or in JAVA_HOME: drivers start without a class archive"
    archive = Path(tempfile.gettempdir()) / f"ckpt-tests-driver-classes-{_key(java, jvm_options)}.jsa"
    if archive.is_file():
        return archive, f"class archive {archive} (made earlier)"
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_SUBMIT_OPTS": f"{jvm_options} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=error"}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", _TRAINING], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return None, f"class archive: the training driver ran over {timeout:.0f} s: drivers start without one"
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stderr.splitlines()[-5:])
        return None, f"class archive not made (exit {done.returncode}): drivers start without one\n{tail}"
    os.replace(partial, archive)  # whole or absent: a driver never maps a half-written archive
    size = archive.stat().st_size / 2**20
    return archive, f"class archive {archive} made in {time.monotonic() - started:.0f} s ({size:.0f} MiB)"
