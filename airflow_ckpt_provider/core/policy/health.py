"""HealthCriteria: what a job must show to count as healthy, and what makes it unhealthy, as one value.

The job-health watch judges by it; JobHealthTrigger serializes its fields by name (``to_kwargs``) and
rebuilds it from them (``from_kwargs``); the sensor and the operators build one from their arguments.
Its fields are the one place the health knobs are written out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.restart import Health

#: Earlier names of fields, {old: new}: accepted for one release (the sensor warns; a trigger serialized by
#: the previous version, which the triggerer rehydrates, still loads).
RENAMED = {"restart_window": "health_window"}


@dataclass(frozen=True)
class HealthCriteria:
    """When a job counts as healthy, or unhealthy (``expect`` says which outcome is awaited).

    Statuses of an epoch below ``min_epoch``, or that started before ``started_after`` (epoch seconds),
    belong to an older deployment. Unhealthy: FAILED or STOPPED; ``max_restarts`` driver restarts within
    ``health_window`` s (None: restarts are not judged; ``count_query_restarts``: the driver's own restarts of
    its query count too, as an upgrade's verification wants: any failure of the new code fails it); no
    heartbeat for ``heartbeat_timeout`` s (None: three heartbeat intervals + 5 s; a STARTING or STOPPING driver
    gets ``start_timeout`` at least); data waiting and no batch for ``progress_timeout`` s (None: not judged);
    no status of the watched deployment within ``start_timeout`` s. Healthy: RUNNING, ``min_batches`` new
    batches (or caught up), continuously for ``healthy_for`` s. Invalid values raise ConfigError.
    """

    expect: Health = Health.HEALTHY
    min_epoch: int | None = None
    started_after: float | None = None
    healthy_for: float = 0
    min_batches: int = 0
    heartbeat_timeout: float | None = None
    max_restarts: int | None = None
    count_query_restarts: bool = False
    health_window: float = 600
    progress_timeout: float | None = None
    start_timeout: float = 300

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "expect", Health(self.expect))
        except ValueError:
            raise ConfigError(f"invalid expect {self.expect!r}: expected 'healthy' or 'unhealthy'") from None
        for name in ("healthy_for", "min_batches", "heartbeat_timeout", "health_window", "progress_timeout",
                     "start_timeout"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0, found {value}")
        if self.max_restarts is not None and self.max_restarts < 1:
            raise ConfigError(
                f"max_restarts must be >= 1 (or None: restarts are not judged), found {self.max_restarts}")

    def to_kwargs(self) -> dict[str, Any]:
        """Every field by name, JSON-able: what JobHealthTrigger serializes."""
        return {**asdict(self), "expect": self.expect.value}

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> HealthCriteria:
        """From fields by name, the earlier names (``RENAMED``) too; ConfigError for an unknown name, or for
        a field given under both names."""
        return cls(**current_names(kwargs))


def current_names(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the earlier names of HealthCriteria fields (``RENAMED``) replaced by the current ones;
    ConfigError for a name HealthCriteria does not know, or for a field given under both names."""
    known = {f.name for f in fields(HealthCriteria)}
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        new = RENAMED.get(name, name)
        if new not in known:
            raise ConfigError(f"unknown health criterion {name!r}: expected one of {', '.join(sorted(known))}")
        if new in out or (new != name and new in kwargs):
            raise ConfigError(f"{name} is the earlier name of {new}: pass {new} only")
        out[new] = value
    return out


def restart_times(starts: list[tuple[int, float, str | None]]) -> list[float]:
    """Start times of the driver restarts among ``starts`` ((epoch, at, launch id) of every driver start, by
    epoch: deployments/): the starts a supervisor made after a launch's first (a launch from Airflow, an
    upgrade or its rollback is no crash); without launch ids, every start but the first."""
    times, launches = [], set()
    for index, (_epoch, at, launch_id) in enumerate(starts):
        if (launch_id is None and index > 0) or (launch_id is not None and launch_id in launches):
            times.append(at)
        launches.add(launch_id)
    return times
