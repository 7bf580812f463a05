"""Manifests for unit tests: one per (kind, batch, minutes after T0), with a fixed file list; and what every test
of a written manifest checks of its labels."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_ckpt_provider.core.snapshots.manifest import (
    PARTITIONS_BEFORE,
    RESCALED_FROM,
    TOOK_SECONDS,
    Kind,
    Manifest,
    ManifestFile,
    Trigger,
    new_snapshot_id,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def manifest(kind: Kind, batch: int, minutes: int) -> Manifest:
    created = T0 + timedelta(minutes=minutes)
    return Manifest(
        job="j", snapshot_id=new_snapshot_id(kind, batch, created), kind=kind, trigger=Trigger.PERIODIC,
        batch_id=batch, created_at=created.isoformat(timespec="milliseconds"), query_id="q",
        checkpoint="file:///c", files=(ManifestFile("metadata", 45, "ab" * 32),),
    )


def labels_timed(m: Manifest) -> dict[str, str]:
    """A written snapshot's labels but ``took_seconds``, which every snapshot carries (asserted above 0 here)."""
    assert float(m.labels[TOOK_SECONDS]) > 0, m.labels  # how long the snapshot took
    return {k: v for k, v in m.labels.items() if k != TOOK_SECONDS}


def rescaled_from(source: Manifest) -> dict[str, str]:
    """The labels (but ``took_seconds``) of a rescale's savepoint repartitioned from ``source``."""
    return {RESCALED_FROM: source.snapshot_id, PARTITIONS_BEFORE: str(source.state_partitions)}
