"""Manifests for unit tests: one per (kind, batch, minutes after T0), with a fixed file list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile, Trigger, new_snapshot_id

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def manifest(kind: Kind, batch: int, minutes: int) -> Manifest:
    created = T0 + timedelta(minutes=minutes)
    return Manifest(
        job="j", snapshot_id=new_snapshot_id(kind, batch, created), kind=kind, trigger=Trigger.PERIODIC,
        batch_id=batch, created_at=created.isoformat(timespec="milliseconds"), query_id="q",
        checkpoint="file:///c", files=(ManifestFile("metadata", 45, "ab" * 32),),
    )
