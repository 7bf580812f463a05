"""Retention: which snapshots to dispose of. Pure logic; the newest completed savepoint always stays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, snapshot_order


@dataclass(frozen=True)
class RetentionPolicy:
    """Checkpoints keep the last ``checkpoints_keep``; savepoints are bounded by count and/or age."""

    checkpoints_keep: int = 3
    savepoints_max_count: int | None = None
    savepoints_max_age: timedelta | None = None

    def __post_init__(self) -> None:
        if self.checkpoints_keep < 1:
            raise ConfigError(
                f"checkpoints_keep must be >= 1 (found {self.checkpoints_keep}): the latest completed "
                "checkpoint is what a restart resumes from"
            )
        if self.savepoints_max_count is not None and self.savepoints_max_count < 1:
            raise ConfigError(f"savepoints_max_count must be >= 1 or unset, found {self.savepoints_max_count}")
        if self.savepoints_max_age is not None and self.savepoints_max_age <= timedelta(0):
            raise ConfigError(f"savepoints_max_age must be positive or unset, found {self.savepoints_max_age}")


@dataclass(frozen=True)
class Disposal:
    """A snapshot to dispose of, and why."""

    snapshot_id: str
    kind: Kind
    reason: str


def _newest_first(manifests: Sequence[Manifest], kind: Kind) -> list[Manifest]:
    return sorted((m for m in manifests if m.kind == kind), key=snapshot_order, reverse=True)


def plan_retention(manifests: Sequence[Manifest], policy: RetentionPolicy, now: datetime) -> list[Disposal]:
    """The snapshots the policy disposes of, oldest reasons first."""
    out: list[Disposal] = []
    for i, m in enumerate(_newest_first(manifests, Kind.CHECKPOINT)):
        if i >= policy.checkpoints_keep:
            out.append(Disposal(m.snapshot_id, m.kind, f"checkpoint beyond the newest {policy.checkpoints_keep}"))
    for i, m in enumerate(_newest_first(manifests, Kind.SAVEPOINT)):
        if i == 0:
            continue  # the newest completed savepoint is never disposed of by retention
        if policy.savepoints_max_count is not None and i >= policy.savepoints_max_count:
            out.append(Disposal(m.snapshot_id, m.kind, f"savepoint beyond the newest {policy.savepoints_max_count}"))
        elif policy.savepoints_max_age is not None and now - m.created > policy.savepoints_max_age:
            out.append(Disposal(m.snapshot_id, m.kind, f"savepoint older than {policy.savepoints_max_age}"))
    return out
