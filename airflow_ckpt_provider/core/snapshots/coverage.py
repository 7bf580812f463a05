"""What a batch covered, read from the query's checkpoint: how sinks tell a replay from a fork.

Spark writes ``offsets/<N>`` (the write-ahead log entry: the end offsets of every source and the
batch's timestamp and watermark) before it runs batch N, and a replay of N after a restart reads that
same file back. So the SHA-256 of its bytes identifies the batch Spark planned: equal for a replay,
different when batch N is planned again after a restore of an older snapshot (time travel), even if
no new record arrived (the batch timestamp differs). ``previous`` is the digest of ``offsets/<N-1>``:
it ties the batch to the batch before it, so a sink can refuse a batch that does not continue the
timeline it shows. See docs/sinks.md#timelines. No pyspark import.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import ConfigError, ConflictError
from airflow_ckpt_provider.core.snapshots.ckptfiles import parse_log_entry
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage

OFFSETS = "offsets"
#: Checkpoint locations a sink can read the offsets log from (the driver's host, or S3).
_SCHEMES = ("", "file", "s3", "s3a")


@dataclass(frozen=True)
class Coverage:
    """Batch ``batch_id`` as Spark planned it: the digest of its offsets log entry, and of the one before."""

    batch_id: int
    digest: str
    previous: str | None
    offsets: tuple[Any, ...] = ()

    def short(self) -> str:
        return self.digest[:12]

    def same_batch(self, digest: str | None) -> bool:
        """True if a commit recorded with ``digest`` is this very batch (None: recorded before coverage
        existed; it cannot be told apart, and is taken as the same, as the sinks did before)."""
        return digest is None or digest == self.digest


def checkpoint_storage(location: str, s3: S3Options | None = None) -> Storage:
    """The checkpoint location as Storage; ConfigError for locations a sink cannot read (hdfs://...)."""
    if not location:
        raise ConfigError(
            "no checkpointLocation option reached the sink: an exactly-once sink reads the query's offsets log "
            "to tell a replayed batch from a new one; pass .option(\"checkpointLocation\", PATH) on the writer "
            "(the ckpt runtime does)"
        )
    if urlparse(location).scheme.lower() not in _SCHEMES:
        raise ConfigError(
            f"checkpoint location {location!r}: an exactly-once sink reads the offsets log with boto3 or the local "
            "file system, expected a local path, file://, s3:// or s3a://; put the checkpoint there"
        )
    return open_storage(location, s3 or S3Options.from_env())


def _digest(storage: Storage, batch_id: int) -> tuple[str, bytes] | None:
    try:
        data = storage.read(f"{OFFSETS}/{batch_id}")
    except FileNotFoundError:
        return None
    return hashlib.sha256(data).hexdigest(), data


def read_coverage(checkpoint: Storage, batch_id: int, *, previous: bool = True) -> Coverage:
    """The coverage of ``batch_id``: its offsets log entry must exist (Spark writes it before the batch runs).

    ``previous=False`` skips reading ``offsets/<N-1>`` (a sink that does not check the chain)."""
    found = _digest(checkpoint, batch_id)
    if found is None:
        raise ConflictError(
            f"batch {batch_id} has no offsets log entry in {checkpoint.uri(OFFSETS)}: expected Spark's write-ahead "
            "entry of the running batch; the sink's checkpointLocation option must be the query's own checkpoint"
        )
    digest, data = found
    before = _digest(checkpoint, batch_id - 1) if previous and batch_id > 0 else None
    try:
        entry = parse_log_entry(data, kind="offsets")
        offsets = tuple(_parse(o) for o in entry.offsets)
    except ValueError:
        offsets = ()
    return Coverage(batch_id, digest, before[0] if before else None, offsets)


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
