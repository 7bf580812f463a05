"""A class-data archive (JDK CDS) of Spark's driver classes for the tests' drivers.

Most of the suite's time is Spark drivers starting (every ``ckpt run``, restart, restore check and test
session is a new driver JVM), and most of a driver JVM's start is loading and verifying Spark's classes
from its jars. A dynamic CDS archive (``-XX:ArchiveClassesAtExit``, JDK 13+) holds them already parsed
and verified; a driver started with ``-XX:SharedArchiveFile`` maps it: on the 2-core machine a test
session's start to its first job took 5.3-5.5 s with the archive and 9.1-9.6 s without.

``driver_archive`` makes the archive once (a short training driver: a RocksDB-backed streaming
deduplication, a Python foreachBatch, a parquet round trip) and keeps it in a directory of this user's under
the temporary directory (~185 MiB each; remove old ones at will), named after what it depends on: the java
binary and its version, pyspark's location, version and jars, and the JVM options. A driver whose classpath
does not start with the archive's (another Spark) runs without it, as it would with no archive. The tests
pass the options through ``SPARK_SUBMIT_OPTS`` (tests/conftest.py), which spark-submit gives the driver JVM
only: not the launcher JVM that builds its command (another classpath), not executors, not the embedded
cluster's master and workers (they drop the variable).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from airflow_ckpt_provider.launcher.submit import LOOPBACK

#: Quiet CDS: a driver that cannot use the archive (another classpath) says so on stderr otherwise.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_TRAINING = textwrap.dedent("""
    import shutil, sys, tempfile
    from pyspark.sql import SparkSession, functions as F
    LOOPBACK = sys.argv[1]  # every port the training driver opens is on loopback
    work = tempfile.mkdtemp(prefix="ckpt-cds-training-")
    spark = (SparkSession.builder.master("local[2]").appName("ckpt-cds-training")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", LOOPBACK).config("spark.driver.host", LOOPBACK)
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
    shutil.rmtree(work)
    print("trained on", len(seen), "batches", file=sys.stderr)
""")


def _key(java: str, jvm_options: str) -> str:
    """What the archive depends on: the java binary and its version, pyspark's location, version and jars (the
    JVM refuses an archive whose jars changed since, silently here: a reinstalled pyspark makes a new one), and
    the options."""
    import pyspark

    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False).stderr
    home = Path(pyspark.__file__).parent
    jars = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(home / "jars"))
    parts = [java, version, str(home), pyspark.__version__, repr(jars), jvm_options]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def archive_dir() -> Path:
    """This user's directory of archives (mode 0700: a driver maps only an archive this user made)."""
    where = Path(tempfile.gettempdir()) / f"ckpt-tests-jvm-{os.getuid()}"
    where.mkdir(mode=0o700, exist_ok=True)
    if where.stat().st_uid != os.getuid() or where.stat().st_mode & 0o077:
        raise PermissionError(f"{where} is not this user's alone (owner {where.stat().st_uid}, mode "
                              f"{where.stat().st_mode & 0o777:o}); remove it")
    return where


def driver_archive(jvm_options: str, *, timeout: float = 300.0) -> tuple[Path | None, str]:
    """The archive for drivers started with ``jvm_options``, made now unless a matching one exists (one process
    makes it: another that asks meanwhile waits for it, as xdist's workers do); and one line on what happened.
    None (and why) where it cannot be made: no java, a JDK without dynamic archives, a training run that failed;
    the drivers then start as before."""
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get(
        "JAVA_HOME") else shutil.which("java")
    if java is None:
        return None, "no java on PATH or in JAVA_HOME: drivers start without a class archive"
    try:
        where = archive_dir()
    except PermissionError as err:
        return None, f"no class archive: {err}"
    archive = where / f"driver-classes-{_key(java, jvm_options)}.jsa"
    with (where / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if archive.is_file():
            return archive, f"class archive {archive} (made earlier)"
        return _train(archive, jvm_options, timeout)


def _train(archive: Path, jvm_options: str, timeout: float) -> tuple[Path | None, str]:
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": LOOPBACK,  # the block manager too, as the launcher sets for local masters
           "SPARK_SUBMIT_OPTS": f"{jvm_options} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=error"}
    started = time.monotonic()
    # Its own process group: a training run over time is killed with its JVM, not only its Python.
    proc = subprocess.Popen([sys.executable, "-c", _TRAINING, LOOPBACK], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        partial.unlink(missing_ok=True)
        return None, f"class archive: the training driver ran over {timeout:.0f} s: drivers start without one"
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(err.splitlines()[-5:])
        return None, f"class archive not made (exit {proc.returncode}): drivers start without one\n{tail}"
    os.replace(partial, archive)  # whole or absent: a driver never maps a half-written archive
    size = archive.stat().st_size / 2**20
    return archive, f"class archive {archive} made in {time.monotonic() - started:.0f} s ({size:.0f} MiB)"
