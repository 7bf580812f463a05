"""The state sample, ``state-samples/<taken at>-<snapshot id>.json``: the first rows of every state table of one
snapshot, as the State Processor read them (``ckpt state sample``), for the Streaming Jobs page. Written once by
whoever takes the sample; read by the job page. The newest few are kept."""

from __future__ import annotations

import logging
import time

import msgspec

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.base import Record, RecordError
from airflow_ckpt_provider.core.store.jobstore import JobStore

log = logging.getLogger(__name__)

SAMPLES = "state-samples/"
#: The samples kept per job: a new one deletes the older ones beyond these.
KEPT = 5


class SampledTable(msgspec.Struct, frozen=True):
    """One state table (``ckpt state list`` names it) with its first rows, each value as text."""

    name: str
    operator: str
    partitions: int
    variable_type: str | None
    columns: list[str]
    rows: list[list[str]]
    rows_total: int


class StateSample(Record, frozen=True, kw_only=True):
    """The first rows of every state table of snapshot ``snapshot_id`` (its batch ``batch_id``), taken at
    ``taken_at`` by ``taken_by``."""

    WHAT = "state sample"
    KEY = "state-samples/<taken at>-<snapshot id>.json"

    snapshot_id: str
    batch_id: int
    taken_at: float
    taken_by: str
    tables: list[SampledTable]

    @property
    def key(self) -> str:
        return f"{SAMPLES}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(self.taken_at))}-{self.snapshot_id}.json"


def write_sample(store: JobStore, sample: StateSample) -> None:
    """Write ``sample`` and delete the older ones beyond KEPT (best effort: a leftover sample is only shown less)."""
    store.storage.write(sample.key, sample.to_bytes())
    try:
        keys = sorted(o.key for o in store.storage.list(SAMPLES) if o.key.endswith(".json"))
        if len(keys) > KEPT:
            store.storage.delete(keys[:-KEPT])
    except StorageError as err:
        log.warning("job %s: older state samples not deleted: %s", store.job, err)


def latest_sample(store: JobStore) -> StateSample | None:
    """The newest state sample (keys sort by the time taken), None without one or when it cannot be read."""
    try:
        keys = sorted(o.key for o in store.storage.list(SAMPLES) if o.key.endswith(".json"))
        return StateSample.from_bytes(store.storage.read(keys[-1]), store.storage.uri(keys[-1])) if keys else None
    except (StorageError, RecordError) as err:
        log.warning("job %s: the state sample cannot be read: %s", store.job, err)
        return None
