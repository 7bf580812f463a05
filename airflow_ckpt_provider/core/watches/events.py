"""Watches that announce a stream of events rather than one outcome: each new completed snapshot, each time a
number crosses above a threshold. The Airflow asset watchers (triggers/events.py) poll them.

Unlike the one-shot watches, these keep a cursor (what was announced) that the caller persists and passes back
when it is re-created, so a restarted poller neither repeats nor skips an event: ``cursor()`` is a JSON-able
value, the constructor's ``cursor`` argument takes it back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, parse_enum, snapshot_order
from airflow_ckpt_provider.core.store.jobstore import SNAPSHOTS, JobStore

log = logging.getLogger(__name__)

_MANIFEST = "/manifest.json"


def parse_kinds(kinds: Iterable[str]) -> tuple[Kind, ...]:
    """``kinds`` as Kinds, in Kind's order, without repeats; ConfigError names the allowed values."""
    parsed = {parse_enum(Kind, k) for k in kinds}
    if not parsed:
        raise ConfigError("no snapshot kinds to announce: expected 'savepoint', 'checkpoint' or both")
    return tuple(k for k in Kind if k in parsed)


def snapshot_cursor_key(job: str, kinds: Iterable[str]) -> str:
    """The key of a snapshot event watch's cursor in Airflow's asset state store (triggers/events.py), e.g.
    ``ckpt.snapshot_events.orders.savepoint``: once it is stored, the watcher announces every newer snapshot."""
    return f"ckpt.snapshot_events.{job}.{'+'.join(kinds)}"


class SnapshotEventWatch:
    """Announces each completed snapshot of ``kinds`` of the job once, oldest first: one event per ``poll``.

    ``cursor``: the ids already announced (or present when the watch began), as ``cursor()`` returned them.
    None: the watch begins now, and the snapshots present at its first poll are not announced (``baseline``
    tells the caller it was taken then, so it can persist it at once). Ids of snapshots no longer in the store
    leave the cursor: an id is never reused, so it stays bounded by the store's retention.

    Each poll lists ``snapshots/`` once and reads only the manifests of unannounced snapshots of ``kinds``.
    A manifest is written last, so a listed manifest is a completed snapshot.
    """

    def __init__(self, store: JobStore, *, kinds: Iterable[str] = (Kind.SAVEPOINT.value,),
                 cursor: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.kinds = parse_kinds(kinds)
        self._seen: set[str] | None = None if cursor is None else {str(i) for i in cursor.get("seen", [])}
        self.baseline = False  # True after the poll that took the baseline
        self._ready: list[Manifest] = []  # read, not yet announced, oldest first
        self._last = "nothing polled yet"

    def _kind_of(self, snapshot_id: str) -> Kind | None:
        """The kind an id names (``savepoint-42-...``); None for an id of another shape (read its manifest)."""
        prefix = snapshot_id.split("-", 1)[0]
        return next((k for k in Kind if k.value == prefix), None)

    def _list(self) -> list[str]:
        keys = [o.key for o in self.store.storage.list(SNAPSHOTS) if o.key.endswith(_MANIFEST)]
        return [k[len(SNAPSHOTS) : -len(_MANIFEST)] for k in keys]

    def _read(self, snapshot_id: str) -> Manifest | None:
        key = f"{SNAPSHOTS}{snapshot_id}{_MANIFEST}"
        try:
            m = Manifest.from_bytes(self.store.storage.read(key), self.store.storage.uri(key))
        except FileNotFoundError:  # disposed between the listing and the read
            return None
        except SnapshotError as err:  # never announced: a restore would refuse it too
            log.warning("job %s: not announcing snapshot %s: %s", self.store.job, snapshot_id, err)
            return None
        if m.job != self.store.job or m.kind not in self.kinds:
            return None
        return m

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        """The next new snapshot's event, or None when there is none (yet)."""
        self.baseline = False
        if not self._ready:
            present = self._list()
            if self._seen is None:
                self._seen, self.baseline = set(present), True
                self._last = f"began with {len(present)} snapshots present, none announced"
                return None
            self._seen &= set(present)
            fresh = sorted(i for i in present if i not in self._seen and self._kind_of(i) in (*self.kinds, None))
            found = []
            for snapshot_id in fresh:
                m = self._read(snapshot_id)
                if m is None:
                    self._seen.add(snapshot_id)  # of another kind or job, or corrupt: looked at once
                else:
                    found.append(m)
            self._ready = sorted(found, key=snapshot_order)
            self._last = f"{len(present)} snapshots, {len(self._ready)} new"
        if not self._ready:
            return None
        m = self._ready.pop(0)
        assert self._seen is not None
        self._seen.add(m.snapshot_id)
        return self._event(m)

    def _event(self, m: Manifest) -> dict[str, Any]:
        uri = self.store.snapshot_uri(m.snapshot_id)
        return {
            "status": "completed", "job": self.store.job, "snapshot_id": m.snapshot_id, "kind": m.kind.value,
            "batch_id": m.batch_id, "uri": uri, "created_at": m.created_at, "trigger": m.trigger.value,
            "message": f"job {self.store.job}: new {m.kind.value} {m.snapshot_id} of batch {m.batch_id} "
                       f"({m.trigger.value}) at {m.created_at}: {uri}",
        }

    def cursor(self) -> dict[str, Any] | None:
        """What to persist: the ids announced or present at the baseline; None before the first poll."""
        return None if self._seen is None else {"seen": sorted(self._seen)}

    def waiting_for(self) -> str:
        kinds = " or ".join(k.value for k in self.kinds)
        return f"job {self.store.job}: expected a new completed {kinds}; last seen: {self._last}"


class Crossing:
    """Hysteresis on a number: fires once when it rises above ``threshold``, re-arms once it is back below
    ``rearm_below`` (default ``threshold``), so a value that stays high fires once, not at every look.

    ``cursor`` / ``cursor()``: ``{"armed": bool}``, to carry the state over a restart (None: armed)."""

    def __init__(self, threshold: float, *, rearm_below: float | None = None,
                 cursor: Mapping[str, Any] | None = None) -> None:
        self.threshold = threshold
        self.rearm_below = threshold if rearm_below is None else rearm_below
        if self.rearm_below > self.threshold:
            raise ConfigError(f"rearm_below {self.rearm_below:g} must be at most the threshold {self.threshold:g}: "
                              "otherwise a value between them would fire at every look")
        self.armed = True if cursor is None else bool(cursor.get("armed", True))

    def update(self, value: float) -> bool:
        """True when ``value`` fires (above the threshold while armed); re-arms below ``rearm_below``."""
        if self.armed and value > self.threshold:
            self.armed = False
            return True
        if not self.armed and value < self.rearm_below:
            self.armed = True
        return False

    def cursor(self) -> dict[str, Any]:
        return {"armed": self.armed}
