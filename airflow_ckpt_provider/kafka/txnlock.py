"""One transaction end at a time per host and broker, where the broker needs it (tansu 0.6).

Two ends racing over the same topic partitions on tansu can leave one transaction marked ended with
its records still counted as open, which holds back every later marker on those partitions for good.
The sink's tasks and its driver take a file lock around every call that ends a transaction on the
broker (init_transactions, commit, abort) when option serializeTxnEnds decides so.
Design notes: docs/sink-kafka.md#design-notes-kafkatxnlockpy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.kafka.writeroptions import SinkOptions

#: The cluster id tansu reports starts with this (``tansu_cluster`` unless --kafka-cluster-id is given).
TANSU_CLUSTER_ID = "tansu"


def decided(options: SinkOptions, cluster_id: str | None) -> SinkOptions:
    """``options`` with serializeTxnEnds decided: auto is on where the broker's cluster id says tansu."""
    if options.serialize_txn_ends is not None:
        return options
    return dataclasses.replace(options, serialize_txn_ends=(cluster_id or "").startswith(TANSU_CLUSTER_ID))


def lock_path(bootstrap_servers: str) -> Path:
    """This host's lock file for ending transactions on ``bootstrap_servers`` (one per broker cluster)."""
    digest = hashlib.sha256(bootstrap_servers.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ckpt-kafka-txn-ends-{digest}.lock"


@contextlib.contextmanager
def txn_end_slot(options: SinkOptions, what: str) -> Iterator[None]:
    """Hold this host's slot for ending a transaction on the sink's brokers while the block runs, if serialized."""
    if not options.serialize_txn_ends:
        yield
        return
    from filelock import FileLock, Timeout  # only where ends are serialized: an executor image may lack it otherwise

    path = lock_path(options.bootstrap_servers)
    # 0o666: the tasks of another user on this host (a second executor, the driver) take the same file.
    lock = FileLock(path, timeout=options.timeout_s, mode=0o666, poll_interval=0.01)
    try:
        lock.acquire()
    except Timeout as err:
        raise CkptError(
            f"{what} (job {options.job}): expected this host's transaction-end lock {path} within "
            f"{options.timeout_s:g} s (timeoutMs), found it held all along: another ckpt-kafka task on this host "
            f"is stuck ending a transaction on {options.bootstrap_servers}. Find the process holding it "
            "(fuser the file); on Apache Kafka, serializeTxnEnds=false turns the lock off") from err
    try:
        yield
    finally:
        lock.release()
