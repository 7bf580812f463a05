"""The store requests this process made, by S3 operation: every HTTP request of every S3 client the process makes
(botocore's ``before-send`` event: retries and upload parts included). The driver reports them in status.json;
``ckpt job status`` and the Streaming Jobs page turn them into a rate and a monthly cost (core/policy/prices.py).

Design notes: docs/scale.md#design-notes-corestorerequestcountpy."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_lock = threading.Lock()
_counts: Counter[str] = Counter()


def counted(event_name: str = "", **_: Any) -> None:
    """botocore's ``before-send.s3.<Operation>`` handler: one request of that operation."""
    operation = event_name.rsplit(".", 1)[-1] if event_name.count(".") >= 2 else "other"  # before-send.s3.Op
    with _lock:
        _counts[operation] += 1


def register(client: Any) -> None:
    """Count the requests of ``client`` (an S3 client of boto3)."""
    client.meta.events.register("before-send.s3", counted)


def counts() -> dict[str, int]:
    """The requests this process made so far, by operation (e.g. ``{"GetObject": 120, "PutObject": 14}``)."""
    with _lock:
        return dict(_counts)
