"""The start record, ``deployments/<epoch>.json``: how the driver of one epoch started. Written once, before
the driver restores anything (runtime/startup.py), by that driver; read by the health watch, the job report,
lineage, the demo and the next start (the lineage and timeline it continues)."""

from __future__ import annotations

import logging
from typing import Any

from airflow_ckpt_provider.core.records.base import Record, RecordError
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, JobStore

log = logging.getLogger(__name__)


class StartRecord(Record, frozen=True, kw_only=True):
    """How the driver of ``epoch`` started: the restore it was asked for, what it did (the start action:
    keep-live, restore or fresh) and from which snapshot, the lineage it continues, its timeline (time travel
    starts a new one), the launch it belongs to (restarts of one launch are its supervisor's) and its code."""

    WHAT = "start record"
    KEY = "deployments/<epoch>.json"

    epoch: int
    at: float
    restore: str = ""
    action: str = ""
    snapshot: str | None = None
    reason: str = ""
    lineage_since: float | None = None
    lineage_base: str | None = None
    timeline: int = 0
    time_travel: dict[str, Any] | None = None
    launch_id: str | None = None
    code_version: str | None = None


def start_key(epoch: int) -> str:
    return f"{DEPLOYMENTS}{epoch:010d}.json"


def epoch_of(key: str) -> int | None:
    """The epoch a deployments/ key names (None: not a start record's key)."""
    name = key[len(DEPLOYMENTS):] if key.startswith(DEPLOYMENTS) else ""
    if not name.endswith(".json") or not name[:-len(".json")].isdigit():
        return None
    return int(name[:-len(".json")])


def write_start(store: JobStore, record: StartRecord) -> None:
    store.storage.write(start_key(record.epoch), record.to_bytes())


def read_start(store: JobStore, epoch: int) -> StartRecord | None:
    """The start record of ``epoch`` (None: none written, or unreadable, with a warning)."""
    return _read(store, start_key(epoch), epoch)


def read_starts(store: JobStore, *, since_epoch: int = 0, known: frozenset[int] = frozenset()) -> list[StartRecord]:
    """The start records from ``since_epoch`` on, oldest first, skipping the epochs in ``known`` (already read:
    a start record is never rewritten); an unreadable one is skipped with a warning."""
    found = []
    for info in store.storage.list(DEPLOYMENTS):
        epoch = epoch_of(info.key)
        if epoch is None or epoch < since_epoch or epoch in known:
            continue
        record = _read(store, info.key, epoch)
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda r: r.epoch)


def last_start(store: JobStore) -> StartRecord | None:
    """The newest start record (None before the first driver start, or if it is unreadable)."""
    epochs = sorted(e for e in (epoch_of(o.key) for o in store.storage.list(DEPLOYMENTS)) if e is not None)
    return _read(store, start_key(epochs[-1]), epochs[-1]) if epochs else None


def _read(store: JobStore, key: str, epoch: int) -> StartRecord | None:
    try:
        record = StartRecord.from_bytes(store.storage.read(key), f"{store.job}/{key}")
    except FileNotFoundError:
        return None
    except RecordError as err:
        log.warning("job %s: ignoring start record %s: %s", store.job, key, err)
        return None
    if record.epoch != epoch:  # the key names the epoch; a record that disagrees is not trusted
        log.warning("job %s: ignoring start record %s: it says epoch %d", store.job, key, record.epoch)
        return None
    return record
