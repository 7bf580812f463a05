"""Synthetic Spark checkpoints (stateless, one source) for fast tests of the snapshot engine.

Real Spark checkpoints are covered by the integration tests; these follow the same file formats.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path


def write_batch(root: Path, batch: int, *, commit: bool = True, payload: int = 0) -> None:
    """offsets/N (and commits/N): the write-ahead log entry and its commit, as Spark 4 writes them."""
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch,
            "conf": {"spark.sql.shuffle.partitions": "2"}}
    offset = {"logOffset": batch, "pad": "x" * payload}
    (root / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(offset)}")
    if commit:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def make_checkpoint(root: Path, batches: int, *, payload: int = 0) -> Path:
    """A checkpoint whose batches 0..batches-1 are completed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    for b in range(batches):
        write_batch(root, b, payload=payload)
    return root
