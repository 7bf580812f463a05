"""SnapshotWatch: waits for a completed snapshot (of a kind, if given) created after a point in time."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

from airflow_ckpt_provider.core.errors import SnapshotError
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, parse_enum
from airflow_ckpt_provider.core.store.jobstore import SNAPSHOTS, JobStore
from airflow_ckpt_provider.core.views.jobview import when

log = logging.getLogger(__name__)

_ID_TIME = re.compile(r"-(\d{8}T\d{6}Z)-[0-9a-f]{6}$")


class SnapshotWatch:
    """Waits for a completed snapshot (of ``kind``, if given) created at or after ``after`` (epoch seconds);
    answers with the latest completed one among them (core/snapshots/catalog.latest_completed)."""

    def __init__(self, store: JobStore, *, after: float, kind: str | None = None) -> None:
        self.store = store
        self.after = float(after)
        self.kind: Kind | None = parse_enum(Kind, kind) if kind is not None else None
        self._manifests: dict[str, Manifest | None] = {}  # manifests never change: read each once
        self._seen = "nothing polled yet"

    def _candidates(self) -> list[Manifest]:
        keys = [o.key for o in self.store.storage.list(SNAPSHOTS) if o.key.endswith("/manifest.json")]
        for key in keys:
            if key in self._manifests or self._older(key):
                continue
            try:
                m = Manifest.from_bytes(self.store.storage.read(key), self.store.storage.uri(key))
            except FileNotFoundError:  # disposed while we listed
                continue
            except SnapshotError as err:
                log.warning("job %s: skipping snapshot: %s", self.store.job, err)
                m = None
            self._manifests[key] = m if m is None or m.job == self.store.job else None
        present = set(keys)
        return [m for k, m in self._manifests.items() if m is not None and k in present]

    def _older(self, key: str) -> bool:
        """True when the id's timestamp (the creation second) shows the snapshot precedes ``after``:
        its manifest need not be read."""
        found = _ID_TIME.search(key[len(SNAPSHOTS) : -len("/manifest.json")])
        if not found:
            return False
        created = datetime.strptime(found.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        return created + 1 <= self.after

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        fresh = [m for m in self._candidates() if m.created.timestamp() >= self.after]
        kinds = (self.kind,) if self.kind else tuple(Kind)
        m = latest_completed(fresh, kinds)
        if m is None:
            self._seen = f"no completed {self._what()} since {when(self.after)} among {len(fresh)} new snapshots"
            return None
        uri = self.store.snapshot_uri(m.snapshot_id)
        return {
            "status": "completed", "snapshot_id": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id,
            "uri": uri, "created_at": m.created_at, "job": self.store.job,
            "message": f"job {self.store.job}: {m.kind.value} {m.snapshot_id} of batch {m.batch_id} completed at "
                       f"{m.created_at}: {uri}",
        }

    def _what(self) -> str:
        return self.kind.value if self.kind else "snapshot"

    def waiting_for(self) -> str:
        return (f"job {self.store.job}: expected a completed {self._what()} created after {when(self.after)}; "
                f"last seen: {self._seen}")
