"""Benchmark: snapshots and restores of real Spark checkpoints on SeaweedFS, side by side with plain boto3.

For each state size: build a checkpoint with a stateful streaming query (batch 0 loads every key), take a
full snapshot and upload the same files with plain boto3, change 1% of the keys (batch 1), take an
incremental snapshot, and restore the latest snapshot next to a plain boto3 download of the same objects.
Each figure is the median of --repeat runs, engine and plain boto3 interleaved in one process, so the ratios
compare like with like; targets are reported (pass/MISS), never asserted.

    .venv/bin/python bench/snapshot_bench.py [--sizes 10000,100000,1000000] [--provider rocksdb|hdfs]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig
    from mypy_boto3_s3 import S3Client
    from pyspark.sql import SparkSession

    from airflow_ckpt_provider.core.snapshots.manifest import Manifest, ManifestFile
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.embedded import EmbeddedS3

log = logging.getLogger("snapshot_bench")

_E = TypeVar("_E")

PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
BUCKET = "bench"
STORE_PREFIX = "jobs"
MiB = 1024 * 1024
#: Same split as the engine's S3Storage: one PUT below it, multipart upload_file above.
MULTIPART_THRESHOLD = 16 * MiB
FULL_VS_PLAIN_TARGET = 0.8
INCR_VS_FULL_TARGET = 0.10
#: Copies of the state on disk besides the 2 * repeat uploads: input, checkpoint, warm-up upload, restore,
#: download, and headroom.
DISK_COPIES = 6


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to measure."""


class BenchTimeout(BenchError):
    """The whole run exceeded its time limit."""


@dataclass(frozen=True)
class Options:
    """What to measure and within which limits."""

    sizes: tuple[int, ...]
    provider: str
    payload: int
    change: float
    concurrency: int
    partitions: int
    repeat: int
    budget_s: float
    timeout_s: float
    out_dir: Path
    workdir: Path | None
    keep: bool


@dataclass(frozen=True)
class Transfer:
    """Files and bytes moved in a wall-clock time (the median of ``samples`` when repeated)."""

    files: int
    bytes: int
    seconds: float
    samples: tuple[float, ...] = ()

    @property
    def mib_s(self) -> float:
        """Throughput in MiB/s."""
        return self.bytes / MiB / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form with the derived throughput."""
        return {"files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "mib_s": round(self.mib_s, 1), "samples": [round(s, 3) for s in self.samples]}


def median_transfer(runs: Sequence[Transfer]) -> Transfer:
    """One transfer for repeated runs of the same files: the median wall time, all samples kept."""
    moved = {(r.files, r.bytes) for r in runs}
    if len(moved) != 1:
        raise BenchError(f"expected every repetition to move the same files and bytes, found {sorted(moved)}")
    seconds = tuple(r.seconds for r in runs)
    return Transfer(runs[0].files, runs[0].bytes, statistics.median(seconds), seconds)


@dataclass(frozen=True)
class SnapshotRun:
    """One create_snapshot call: its manifest, the transfer (wall time), where the time went, files reused."""

    manifest: Manifest
    transfer: Transfer
    phases: dict[str, float]
    reused: int


def median_phases(runs: Sequence[SnapshotRun]) -> dict[str, float]:
    """Median seconds of each snapshot phase over repeated runs."""
    return {k: round(statistics.median(r.phases[k] for r in runs), 3) for k in runs[0].phases}


@dataclass(frozen=True)
class SizeResult:
    """Everything measured for one state size (transfers are medians over the repetitions)."""

    keys: int
    requested_keys: int
    spark_batch0_s: float
    spark_batch1_s: float
    checkpoint_files: int
    checkpoint_bytes: int
    full: Transfer
    full_phases: dict[str, float]
    plain_full: Transfer
    incremental: Transfer
    incremental_phases: dict[str, float]
    incremental_reused_files: int
    reused_hash_s: float
    plain_incremental: Transfer
    restore: Transfer
    restore_transfer_s: float
    plain_download: Transfer
    total_s: float
    load_1m: float

    @property
    def full_vs_plain(self) -> float:
        """Snapshot throughput / plain boto3 throughput, same files (target >= 0.8)."""
        return self.full.mib_s / self.plain_full.mib_s if self.plain_full.mib_s else 0.0

    @property
    def incr_vs_full(self) -> float:
        """Bytes uploaded by the incremental snapshot / by the full one (target <= 0.10)."""
        return self.incremental.bytes / self.full.bytes if self.full.bytes else 0.0

    @property
    def restore_vs_plain(self) -> float:
        """Restore throughput / plain boto3 download throughput (no target)."""
        return self.restore.mib_s / self.plain_download.mib_s if self.plain_download.mib_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form: raw figures, transfers and the ratios with their verdicts."""
        d: dict[str, Any] = {}
        for name in (f.name for f in fields(self)):
            value = getattr(self, name)
            d[name] = value.to_dict() if isinstance(value, Transfer) else value
        d["ratios"] = {
            "full_vs_plain": round(self.full_vs_plain, 3),
            "full_vs_plain_pass": self.full_vs_plain >= FULL_VS_PLAIN_TARGET,
            "incr_vs_full_bytes": round(self.incr_vs_full, 4),
            "incr_vs_full_pass": self.incr_vs_full <= INCR_VS_FULL_TARGET,
            "incr_vs_full_seconds": round(self.incremental.seconds / self.full.seconds, 3),
            "restore_vs_plain": round(self.restore_vs_plain, 3),
        }
        return d


@dataclass
class Budget:
    """Wall-clock accounting used to scale down a size that would not fit in the budget."""

    limit_s: float
    start: float = field(default_factory=time.monotonic)
    done: list[tuple[int, float]] = field(default_factory=list)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.start

    def estimate(self, keys: int) -> float:
        """Seconds a size would take, proportional to the last size measured (pessimistic: fixed costs scale too)."""
        if not self.done:
            return 0.0
        k, t = self.done[-1]
        return t * keys / k

    def fit(self, keys: int) -> int:
        """The largest key count up to ``keys`` whose estimate fits in what is left; 0 if none does."""
        left = self.limit_s - self.elapsed()
        fitted = keys
        while fitted >= 1000 and self.estimate(fitted) > left:
            fitted = int(fitted * 0.8)
        if fitted < 1000:
            return 0
        unit: int = 10 ** (len(str(fitted)) - 2)  # two significant digits: 35183 -> 35000 (label "35k")
        return fitted // unit * unit


def configure_logging() -> None:
    """Timestamped progress lines on stderr; the engine's own progress lines included."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for noisy in ("py4j", "botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@dataclass
class Alarm:
    """A time limit for the whole run; ``expired`` tells a timeout from a failure it caused inside py4j."""

    seconds: float
    expired: bool = False

    def message(self) -> str:
        return f"the benchmark exceeded its time limit of {self.seconds:.0f} s; pass a larger --timeout"


@contextlib.contextmanager
def time_limit(alarm: Alarm) -> Iterator[Alarm]:
    """Raise BenchTimeout in the main thread once the alarm's seconds have passed (SIGALRM)."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        alarm.expired = True
        raise BenchTimeout(alarm.message())

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, alarm.seconds)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_disk(workdir: Path, opts: Options) -> None:
    """Refuse to start when the work dir's file system cannot hold the largest size."""
    need = max(opts.sizes) * (opts.payload + 16) * (2 * opts.repeat + DISK_COPIES)
    free = shutil.disk_usage(workdir).free
    log.info("disk: need about %.0f MiB, %.0f MiB free under %s", need / MiB, free / MiB, workdir)
    if free < need:
        raise BenchError(f"expected {need / MiB:.0f} MiB free under {workdir}, found {free / MiB:.0f} MiB; "
                         "pass smaller --sizes or another --workdir")


# ---------------------------------------------------------------- Spark workload


@contextlib.contextmanager
def spark_session(opts: Options) -> Iterator[SparkSession]:
    """A local[2] session on 127.0.0.1, UI off, few shuffle partitions, the chosen state store."""
    from airflow_ckpt_provider.embedded import local_spark

    started = time.monotonic()
    spark = local_spark("snapshot-bench", **{
        "spark.driver.memory": "4g",  # the HDFS-backed store keeps two versions of the state on heap
        "spark.sql.shuffle.partitions": str(opts.partitions),
        "spark.sql.streaming.stateStore.providerClass": PROVIDERS[opts.provider],
    })
    log.info("spark %s started in %.1f s (local[2], %s state store, %d shuffle partitions)",
             spark.version, time.monotonic() - started, opts.provider, opts.partitions)
    try:
        yield spark
    finally:
        spark.stop()
        log.info("spark stopped")


def write_input(spark: SparkSession, path: Path, count: int, step: int, seed: str, payload: int) -> None:
    """Append ``count`` rows (key = i * step, payload = ``payload`` random base64 characters) as parquet."""
    from pyspark.sql import functions as F

    digests = math.ceil(payload * 3 / 4 / 32)  # 32 random bytes per SHA-256, 4 base64 chars per 3 bytes
    hashes = [F.sha2(F.concat_ws("-", F.lit(seed), F.col("id").cast("string"), F.lit(str(i))), 256)
              for i in range(digests)]
    body = F.substring(F.base64(F.unhex(F.concat(*hashes))), 1, payload)
    rows = spark.range(0, count, numPartitions=2).select((F.col("id") * step).alias("key"), body.alias("payload"))
    rows.write.mode("append").parquet(str(path))


def run_batch(spark: SparkSession, input_dir: Path, checkpoint: Path, expected_rows: int, timeout_s: float) -> float:
    """Run the stateful query once with trigger availableNow (one new batch); its seconds."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    source = spark.readStream.schema("key LONG, payload STRING").parquet(str(input_dir))
    latest = source.groupBy("key").agg(F.max("payload").alias("payload"))
    query = (latest.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        if not query.awaitTermination(math.ceil(timeout_s)):
            raise BenchError(f"expected the streaming query to finish within {timeout_s:.0f} s, it did not")
        progress: dict[str, Any] = query.lastProgress or {}
    finally:
        query.stop()
    rows = int(progress.get("numInputRows", -1))
    if rows != expected_rows:
        raise BenchError(f"expected batch {progress.get('batchId')} to read {expected_rows} rows, it read {rows}")
    return time.monotonic() - started


# ---------------------------------------------------------------- plain boto3 baseline


def plain_client(s3: EmbeddedS3, concurrency: int) -> S3Client:
    """A boto3 client configured like the engine's (core/store/s3.client_config: pool size, timeouts, checksum setting),
    without its wrappers."""
    import boto3

    from airflow_ckpt_provider.core.store.s3 import client_config

    config = client_config(concurrency, connect_timeout=5.0, read_timeout=60.0)
    return boto3.session.Session().client(
        "s3", endpoint_url=s3.endpoint_url, region_name=s3.region,
        aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key, config=config,
    )


def transfer_config(concurrency: int) -> TransferConfig:
    """The engine's multipart settings: 16 MiB threshold and parts, ``concurrency`` threads per file."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD,
                          max_concurrency=concurrency)


def timed_pool(work: Callable[[Any], int], items: Sequence[Any], concurrency: int) -> Transfer:
    """Run ``work`` over ``items`` on a thread pool; files, bytes (summed returns) and wall seconds."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        sizes = list(pool.map(work, items))
    return Transfer(len(sizes), sum(sizes), time.perf_counter() - started)


def plain_upload(client: S3Client, root: Path, paths: Sequence[str], prefix: str, concurrency: int) -> Transfer:
    """Upload local files under ``prefix``: put_object below 16 MiB, upload_file (multipart) above."""
    config = transfer_config(concurrency)

    def one(path: str) -> int:
        local = root / path
        size = local.stat().st_size
        key = f"{prefix}/{path}"
        if size < MULTIPART_THRESHOLD:
            client.put_object(Bucket=BUCKET, Key=key, Body=local.read_bytes())
        else:
            client.upload_file(str(local), BUCKET, key, Config=config)
        return size

    return timed_pool(one, paths, concurrency)


def plain_download(
    client: S3Client, objects: Sequence[tuple[str, str, int]], dest: Path, concurrency: int
) -> Transfer:
    """Download (key, path, size) objects under ``dest``: get_object below 16 MiB, download_file (ranged) above."""
    config = transfer_config(concurrency)

    def one(obj: tuple[str, str, int]) -> int:
        key, path, size = obj
        local = dest / path
        local.parent.mkdir(parents=True, exist_ok=True)
        if size < MULTIPART_THRESHOLD:
            local.write_bytes(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        else:
            client.download_file(BUCKET, key, str(local), Config=config)
        return local.stat().st_size

    return timed_pool(one, objects, concurrency)


def warm_up(client: S3Client, engine: JobStore) -> None:
    """Let SeaweedFS allocate volumes for the bucket and both sides create their clients before measuring."""
    started = time.monotonic()
    for i in range(16):
        client.put_object(Bucket=BUCKET, Key=f"warmup/{i}", Body=os.urandom(MiB))
        engine.storage.write(f"warmup/{i}", os.urandom(MiB))
    log.info("seaweedfs warmed up in %.1f s", time.monotonic() - started)


# ---------------------------------------------------------------- snapshot engine


def open_store(s3: EmbeddedS3, job: str, concurrency: int) -> JobStore:
    """The job store of one size on the embedded S3."""
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.store.storage import S3Options, open_storage

    options = S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=s3.access_key,
                        secret_access_key=s3.secret_key, max_concurrency=concurrency)
    return JobStore(open_storage(f"s3://{BUCKET}/{STORE_PREFIX}", options), job)


def snapshot(store: JobStore, checkpoint: Path, concurrency: int) -> SnapshotRun:
    """Take a snapshot, timing its phases through the engine's step hook."""
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot
    from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
    from airflow_ckpt_provider.core.snapshots.snapshotwrite import drop_committed_markers
    from airflow_ckpt_provider.core.store.storage import LocalStorage

    marks: dict[str, float] = {}

    def step(name: str) -> None:
        marks.setdefault(name, time.perf_counter())

    started = time.perf_counter()
    # As the driver takes a periodic checkpoint: its pending marker is deleted later with others, in one request
    # (timed below, not part of the snapshot's time).
    result = create_snapshot(store, LocalStorage(checkpoint), kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC,
                             concurrency=concurrency, on_step=step, keep_marker=True)
    ended = time.perf_counter()
    drop_committed_markers(store, [result.manifest.snapshot_id])
    phases = {
        # read the checkpoint; a process's first snapshot of the store reads (or, new, creates) gc's token
        "prepare_s": marks["upload"] - started,
        "transfer_s": marks["uploaded"] - marks["upload"],  # hash and upload (a LIST and the handshake beside)
        "handshake_s": marks["pending"] - marks["uploaded"],  # waiting for the handshake after the uploads
        "commit_s": ended - marks["pending"],  # create the manifest (after storing again what a gc deleted, if so)
        "marker_s": time.perf_counter() - ended,  # the pending marker's DELETE, batched by the driver
    }
    stats = result.stats
    return SnapshotRun(result.manifest, Transfer(stats.files, stats.bytes, ended - started), phases,
                       stats.skipped_files)


def restore(store: JobStore, manifest: Manifest, target: Path, concurrency: int) -> tuple[Transfer, float]:
    """Restore a snapshot into a fresh local directory and check the files landed; wall and transfer time."""
    from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
    from airflow_ckpt_provider.core.store.storage import LocalStorage

    started = time.perf_counter()
    result = restore_snapshot(store, manifest.snapshot_id, LocalStorage(target), concurrency=concurrency)
    wall = time.perf_counter() - started
    missing = [f.path for f in manifest.files if not (target / f.path).is_file()]
    if missing:
        raise BenchError(f"expected the {len(manifest.files)} files of the snapshot under {target}, "
                         f"{len(missing)} are missing, e.g. {missing[0]}")
    return Transfer(len(manifest.files), manifest.total_bytes, wall), result.stats.seconds


def check_same(what: str, engine: Transfer, plain: Transfer, why: str = "") -> None:
    """Warn when the plain baseline did not move the same files and bytes as the engine (``why``: the known reason)."""
    if (engine.files, engine.bytes) != (plain.files, plain.bytes):
        log.warning("%s: engine moved %d files / %d bytes, plain boto3 %d files / %d bytes%s",
                    what, engine.files, engine.bytes, plain.files, plain.bytes, why)


# ---------------------------------------------------------------- one size


def label(keys: int) -> str:
    """10000 -> '10k', 1000000 -> '1M'."""
    if keys >= 1_000_000 and keys % 1_000_000 == 0:
        return f"{keys // 1_000_000}M"
    if keys >= 1000 and keys % 1000 == 0:
        return f"{keys // 1000}k"
    return str(keys)


def settle() -> None:
    """Flush dirty pages (Spark's output, the server's writes) so that writeback does not slow the next run."""
    os.sync()


def interleaved(i: int, engine: Callable[[], _E], plain: Callable[[], Transfer]) -> tuple[_E, Transfer]:
    """Run the engine and the plain baseline, alternating which goes first, each from a settled disk."""
    if i % 2 == 0:
        settle()
        first = engine()
        settle()
        return first, plain()
    settle()
    second = plain()
    settle()
    return engine(), second


@dataclass
class SizeRun:
    """What one size needs while it is measured: servers, paths, job stores, and the settings."""

    spark: SparkSession
    s3: EmbeddedS3
    client: S3Client
    opts: Options
    keys: int
    base: Path
    stores: list[JobStore] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return label(self.keys)

    @property
    def checkpoint(self) -> Path:
        return self.base / "checkpoint"

    @property
    def inputs(self) -> Path:
        return self.base / "input"

    def batch(self, count: int, step: int, seed: str) -> float:
        """Write ``count`` rows as a new input file and run one batch; its seconds."""
        write_input(self.spark, self.inputs, count, step, seed, self.opts.payload)
        return run_batch(self.spark, self.inputs, self.checkpoint, count, max(self.opts.timeout_s / 2, 60.0))

    def snapshots(self, what: str, known: set[str]) -> tuple[list[SnapshotRun], list[Transfer], float]:
        """One snapshot into each job store next to a plain upload of the same new files; + reused-hash seconds."""
        runs, plains = [], []
        paths, reused_hash_s = self.new_files(known)
        settle()
        warm = plain_upload(self.client, self.checkpoint, paths, f"warmup/{self.tag}/{what}", self.opts.concurrency)
        log.info("[%s] %s warm-up upload (not measured): %.2f s", self.tag, what, warm.seconds)
        for i, store in enumerate(self.stores):
            prefix = f"plain/{self.tag}/{what}-{i}"
            run, plain = interleaved(
                i,
                partial(snapshot, store, self.checkpoint, self.opts.concurrency),
                partial(plain_upload, self.client, self.checkpoint, paths, prefix, self.opts.concurrency),
            )
            runs.append(run)
            plains.append(plain)
            resent = sum(1 for f in run.manifest.files if f.data is not None and f.path not in paths)
            check_same(f"[{self.tag}] {what} #{i}", run.transfer, plain,
                       f" ({resent} of the engine's files are unchanged small files sent again inside the manifest, "
                       "which holds them instead of an object)" if resent else "")
            log.info("[%s] %s snapshot #%d: %d files, %.2f MiB in %.2f s (%.1f MiB/s); plain boto3 %.2f s (%.1f MiB/s)",
                     self.tag, what, i, run.transfer.files, run.transfer.bytes / MiB, run.transfer.seconds,
                     run.transfer.mib_s, plain.seconds, plain.mib_s)
        return runs, plains, reused_hash_s

    def new_files(self, known: set[str]) -> tuple[list[str], float]:
        """Files of the latest batch whose content is not in ``known``; + seconds to hash the others."""
        from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint
        from airflow_ckpt_provider.core.store.storage import LocalStorage

        new, reused_hash_s = [], 0.0
        for f in SparkCheckpoint(LocalStorage(self.checkpoint)).view().files:
            started = time.perf_counter()
            if _sha256(self.checkpoint / f.path) in known:
                reused_hash_s += time.perf_counter() - started
            else:
                new.append(f.path)
        return new, reused_hash_s

    def restores(self, manifests: Sequence[Manifest]) -> tuple[list[Transfer], list[float], list[Transfer]]:
        """Restore each job store's latest snapshot next to a plain download of the same objects."""
        restored, phases, plains = [], [], []
        for store, manifest in zip(self.stores, manifests, strict=True):  # the baseline downloads every file
            for f in manifest.files:
                if f.data is not None:
                    self.client.put_object(Bucket=BUCKET, Key=self.plain_key(store, f), Body=f.data)
        settle()
        warm = plain_download(self.client, self.objects(self.stores[0], manifests[0]), self.base / "warm-up",
                              self.opts.concurrency)
        shutil.rmtree(self.base / "warm-up")
        log.info("[%s] warm-up download (not measured): %.2f s", self.tag, warm.seconds)
        for i, (store, manifest) in enumerate(zip(self.stores, manifests, strict=True)):
            target, dest = self.base / f"restored-{i}", self.base / f"plain-download-{i}"
            (engine, transfer_s), plain = interleaved(
                i,
                partial(restore, store, manifest, target, self.opts.concurrency),
                partial(plain_download, self.client, self.objects(store, manifest), dest, self.opts.concurrency),
            )
            check_same(f"[{self.tag}] restore #{i}", engine, plain)
            log.info("[%s] restore #%d: %d files, %.1f MiB in %.2f s (%.1f MiB/s); plain boto3 %.2f s (%.1f MiB/s)",
                     self.tag, i, engine.files, engine.bytes / MiB, engine.seconds, engine.mib_s, plain.seconds,
                     plain.mib_s)
            restored.append(engine)
            phases.append(transfer_s)
            plains.append(plain)
            shutil.rmtree(target)
            shutil.rmtree(dest)
        return restored, phases, plains

    @staticmethod
    def plain_key(store: JobStore, f: ManifestFile) -> str:
        """The bucket key the plain download reads a file from: its object, or for a file inline in the manifest
        (which has none) a copy stored for the baseline only."""
        key = store.object_key(f.sha256) if f.data is None else f"plain-inline/{f.sha256}"
        return f"{STORE_PREFIX}/{store.job}/{key}"

    @classmethod
    def objects(cls, store: JobStore, manifest: Manifest) -> list[tuple[str, str, int]]:
        """(bucket key, checkpoint path, size) for every file of a snapshot: the plain download gets each file
        from an object of its own, where the restore reads the inline files from the manifest."""
        return [(cls.plain_key(store, f), f.path, f.size) for f in manifest.files]


def _sha256(path: Path) -> str:
    """SHA-256 of a local file, as the engine keys its objects."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def measure_size(spark: SparkSession, s3: EmbeddedS3, client: S3Client, workdir: Path, keys: int,
                 requested: int, opts: Options) -> SizeResult:
    """Build the checkpoint, snapshot it full and incrementally, restore it; all next to plain boto3."""
    started, load = time.monotonic(), os.getloadavg()[0]
    sr = SizeRun(spark, s3, client, opts, keys, workdir / label(keys))
    sr.stores = [open_store(s3, f"bench-{sr.tag}-{i}", opts.concurrency) for i in range(opts.repeat)]

    spark0 = sr.batch(keys, 1, "full")
    log.info("[%s] batch 0: %d keys of %d-byte payload in %.1f s", sr.tag, keys, opts.payload, spark0)
    full, plain_full, _ = sr.snapshots("full", set())

    changed = max(1, round(keys * opts.change))
    spark1 = sr.batch(changed, keys // changed, "changed")
    log.info("[%s] batch 1: %d changed keys in %.1f s", sr.tag, changed, spark1)
    known = {f.sha256 for f in full[0].manifest.files}
    incr, plain_incr, reused_hash_s = sr.snapshots("incremental", known)

    restored, restore_transfer, plain_dl = sr.restores([r.manifest for r in incr])
    return SizeResult(
        keys=keys, requested_keys=requested, spark_batch0_s=round(spark0, 2), spark_batch1_s=round(spark1, 2),
        checkpoint_files=len(full[0].manifest.files), checkpoint_bytes=full[0].manifest.total_bytes,
        full=median_transfer([r.transfer for r in full]), full_phases=median_phases(full),
        plain_full=median_transfer(plain_full),
        incremental=median_transfer([r.transfer for r in incr]), incremental_phases=median_phases(incr),
        incremental_reused_files=incr[0].reused, reused_hash_s=round(reused_hash_s, 3),
        plain_incremental=median_transfer(plain_incr),
        restore=median_transfer(restored), restore_transfer_s=round(statistics.median(restore_transfer), 3),
        plain_download=median_transfer(plain_dl), total_s=round(time.monotonic() - started, 1), load_1m=load,
    )


# ---------------------------------------------------------------- report


def mark(ok: bool) -> str:
    """'pass' or 'MISS'."""
    return "pass" if ok else "MISS"


SNAPSHOT_HEADER = ("keys", "ckpt files", "ckpt MiB", "full s", "full MiB/s", "plain s", "plain MiB/s",
                   "full/plain (>=0.8)", "incr files", "incr MiB", "incr/full bytes (<=0.10)", "incr s",
                   "plain incr s")
RESTORE_HEADER = ("keys", "files", "MiB", "restore s", "of which transfer s", "restore MiB/s", "plain dl s",
                  "plain dl MiB/s", "restore/plain")
PHASES_HEADER = ("keys", "snapshot", "wall s", "prepare s", "hash+upload s", "handshake wait s", "commit s",
                 "plain s", "re-hash of reused files s", "marker delete s (batched, not in wall)")
RUN_HEADER = ("keys", "requested", "spark batch 0 s", "spark batch 1 s", "size total s", "load avg at start")


def snapshot_row(r: SizeResult) -> tuple[str, ...]:
    """One row of the snapshot table."""
    return (label(r.keys), str(r.checkpoint_files), f"{r.checkpoint_bytes / MiB:.1f}", f"{r.full.seconds:.2f}",
            f"{r.full.mib_s:.1f}", f"{r.plain_full.seconds:.2f}", f"{r.plain_full.mib_s:.1f}",
            f"{r.full_vs_plain:.3f} {mark(r.full_vs_plain >= FULL_VS_PLAIN_TARGET)}", str(r.incremental.files),
            f"{r.incremental.bytes / MiB:.2f}", f"{r.incr_vs_full:.4f} {mark(r.incr_vs_full <= INCR_VS_FULL_TARGET)}",
            f"{r.incremental.seconds:.2f}", f"{r.plain_incremental.seconds:.2f}")


def restore_row(r: SizeResult) -> tuple[str, ...]:
    """One row of the restore table."""
    return (label(r.keys), str(r.restore.files), f"{r.restore.bytes / MiB:.1f}", f"{r.restore.seconds:.2f}",
            f"{r.restore_transfer_s:.2f}", f"{r.restore.mib_s:.1f}", f"{r.plain_download.seconds:.2f}",
            f"{r.plain_download.mib_s:.1f}", f"{r.restore_vs_plain:.3f}")


def phase_rows(r: SizeResult) -> list[tuple[str, ...]]:
    """Two rows (full, incremental) of the phase breakdown table."""
    rows: list[tuple[str, ...]] = []
    for kind, t, phases, plain, rehash in (
        ("full", r.full, r.full_phases, r.plain_full, "-"),
        ("incremental", r.incremental, r.incremental_phases, r.plain_incremental, f"{r.reused_hash_s:.3f}"),
    ):
        rows.append((label(r.keys), kind, f"{t.seconds:.3f}", f"{phases['prepare_s']:.3f}",
                     f"{phases['transfer_s']:.3f}", f"{phases['handshake_s']:.3f}", f"{phases['commit_s']:.3f}",
                     f"{plain.seconds:.3f}", rehash, f"{phases['marker_s']:.3f}"))
    return rows


def run_row(r: SizeResult) -> tuple[str, ...]:
    """One row of the run table."""
    return (label(r.keys), label(r.requested_keys), f"{r.spark_batch0_s:.1f}", f"{r.spark_batch1_s:.1f}",
            f"{r.total_s:.0f}", f"{r.load_1m:.1f}")


def tables(results: Sequence[SizeResult]) -> list[tuple[str, tuple[str, ...], list[tuple[str, ...]]]]:
    """Every table: title, header, rows."""
    return [
        ("Snapshot: full vs plain boto3 upload of the same files; incremental after 1% of the keys changed",
         SNAPSHOT_HEADER, [snapshot_row(r) for r in results]),
        ("Restore of the incremental snapshot into a fresh directory vs plain boto3 download of the same objects",
         RESTORE_HEADER, [restore_row(r) for r in results]),
        ("Where the snapshot time goes (median seconds)", PHASES_HEADER, [x for r in results for x in phase_rows(r)]),
        ("Run", RUN_HEADER, [run_row(r) for r in results]),
    ]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width table for the terminal."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table in GitHub markdown."""
    lines = [header, ["---:"] * len(header), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def engine_digests() -> dict[str, str]:
    """Short SHA-256 of every engine module (core/*.py) measured: the code changes while the project is young."""
    import airflow_ckpt_provider.core as core

    root = Path(core.__file__).parent
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in sorted(root.glob("*.py"))}


def environment(opts: Options, engine: dict[str, str]) -> dict[str, Any]:
    """Machine and software facts that the figures depend on."""
    import boto3
    import pyspark

    return {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "pyspark": pyspark.__version__, "boto3": boto3.__version__, "provider": opts.provider,
        "payload_bytes": opts.payload, "change_fraction": opts.change, "concurrency": opts.concurrency,
        "shuffle_partitions": opts.partitions, "repeat": opts.repeat, "engine_sources_sha256": engine,
    }


def write_reports(
    results: Sequence[SizeResult], opts: Options, command: str, engine: dict[str, str]
) -> tuple[Path, Path]:
    """Write the figures as JSON and markdown into the output directory."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"snapshot_bench-{opts.provider}"
    json_path, md_path = opts.out_dir / f"{stem}.json", opts.out_dir / f"{stem}.md"
    body = {"command": command, "environment": environment(opts, engine), "results": [r.to_dict() for r in results]}
    json_path.write_text(json.dumps(body, indent=2) + "\n")
    parts = [f"`{command}`"] + [f"{title}\n\n{markdown_table(h, rows)}" for title, h, rows in tables(results)]
    md_path.write_text("\n\n".join(parts) + "\n")
    return json_path, md_path


def print_tables(results: Sequence[SizeResult]) -> None:
    """Every table on stdout."""
    for title, header, rows in tables(results):
        print(f"\n{title}\n{text_table(header, rows)}")


# ---------------------------------------------------------------- main


def run(opts: Options, workdir: Path) -> list[SizeResult]:
    """Start SeaweedFS and Spark, measure every size within the budget, stop both."""
    from airflow_ckpt_provider.embedded import EmbeddedS3

    check_disk(workdir, opts)
    budget = Budget(opts.budget_s)
    results: list[SizeResult] = []
    with EmbeddedS3(workdir=workdir / "seaweedfs") as s3, spark_session(opts) as spark:
        s3.create_bucket(BUCKET)
        client = plain_client(s3, opts.concurrency)
        warm_up(client, open_store(s3, "warmup", opts.concurrency))
        for requested in opts.sizes:
            keys = budget.fit(requested)
            if keys <= max((k for k, _ in budget.done), default=0):
                log.warning("%d keys would not fit in the %.0f s budget (estimate %.0f s, %.0f s used): skipped",
                            requested, opts.budget_s, budget.estimate(requested), budget.elapsed())
                continue
            if keys != requested:
                log.warning("%d keys would not fit in the %.0f s budget (estimate %.0f s, %.0f s used): "
                            "measuring %d keys instead", requested, opts.budget_s, budget.estimate(requested),
                            budget.elapsed(), keys)
            result = measure_size(spark, s3, client, workdir, keys, requested, opts)
            budget.done.append((keys, result.total_s))
            results.append(result)
    return results


def parse_args(argv: Sequence[str] | None) -> Options:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated key counts")
    p.add_argument("--provider", choices=sorted(PROVIDERS), default="rocksdb", help="state store provider")
    p.add_argument("--payload", type=int, default=200, help="payload bytes per key")
    p.add_argument("--change", type=float, default=0.01, help="fraction of keys changed in batch 1")
    p.add_argument("--concurrency", type=int, default=8, help="threads for the engine and plain boto3")
    p.add_argument("--partitions", type=int, default=2, help="spark.sql.shuffle.partitions")
    p.add_argument("--repeat", type=int, default=5, help="measurements per figure (the median is reported)")
    p.add_argument("--budget", type=float, default=600.0, help="seconds; larger sizes are scaled down to fit")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds; hard limit of the whole run")
    p.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "snapshot-bench",
                   help="where the JSON and markdown figures go")
    p.add_argument("--workdir", type=Path, default=None, help="scratch dir (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the scratch dir")
    a = p.parse_args(argv)
    sizes = tuple(int(s) for s in a.sizes.split(",") if s.strip())
    if not sizes or min(sizes) < 100:
        p.error("--sizes: expected comma-separated key counts of at least 100")
    return Options(sizes=sizes, provider=a.provider, payload=a.payload, change=a.change,
                   concurrency=a.concurrency, partitions=a.partitions, repeat=max(1, a.repeat), budget_s=a.budget,
                   timeout_s=a.timeout, out_dir=a.out_dir, workdir=a.workdir, keep=a.keep)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the tables, write JSON and markdown."""
    configure_logging()
    opts = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/snapshot_bench.py", *(sys.argv[1:] if argv is None else argv)])
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="snapshot-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    engine = engine_digests()  # before the engine modules are imported: the code that is measured
    alarm = Alarm(opts.timeout_s)
    try:
        with time_limit(alarm):
            results = run(opts, workdir)
    except Exception as err:
        if not (alarm.expired or isinstance(err, BenchError)):
            raise
        # py4j turns the alarm's exception into a Py4JError when it fires during a Spark call.
        log.error("%s", alarm.message() if alarm.expired else err)
        return 1
    finally:
        if opts.keep:
            log.info("scratch dir kept: %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    json_path, md_path = write_reports(results, opts, command, engine)  # first: stdout may be a closed pipe
    log.info("figures written to %s and %s", json_path, md_path)
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
