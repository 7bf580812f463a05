"""The closed vocabularies of a job's life as types: one spelling each, hyphenated lowercase like Flink's.

Every mode parses the enum itself, its one spelling and the spellings earlier versions took (underscores,
capitals: a DeprecationWarning says which to use); anything else is a ConfigError naming the valid
spellings. Parse once where a value comes in (an operator argument, a flag, a record), then carry the
enum: no string comparisons past that edge.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import StrEnum
from typing import Self

from airflow_ckpt_provider.core.errors import ConfigError


class Mode(StrEnum):
    """Base of the modes; a subclass's members are its spellings."""

    @classmethod
    def what(cls) -> str:
        """The name of the vocabulary in messages ("stop mode")."""
        return cls.__name__

    @classmethod
    def advice(cls) -> str:
        """What to do about a bad value, after "expected ..., found ...". """
        return f"use one of the {cls.what()}s listed"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """Old spellings (after lowercasing and ``_`` -> ``-``) that map to another member's."""
        return {}

    @classmethod
    def spellings(cls) -> str:
        return ", ".join(m.value for m in cls)

    @classmethod
    def parse(cls, value: object, *, warning: type[Warning] = DeprecationWarning, stacklevel: int = 2) -> Self:
        """The member ``value`` names: the member itself, its spelling, or an old spelling (which warns)."""
        if isinstance(value, cls):
            return value
        text = value.strip() if isinstance(value, str) else None
        if text is not None:
            if text in cls._value2member_map_:
                return cls(text)
            old = text.lower().replace("_", "-")
            old = cls.aliases().get(old, old)
            if old in cls._value2member_map_:
                member = cls(old)
                warnings.warn(f"{cls.what()} {value!r} is deprecated: use {member.value!r}", warning,
                              stacklevel=stacklevel + 1)
                return member
        raise ConfigError(f"invalid {cls.what()}: expected one of {cls.spellings()}, found {value!r}; "
                          f"{cls.advice()}")


class StopMode(Mode):
    """How a running driver is stopped (StopStreamingJobOperator ``mode``, restart's ``stop_mode``)."""

    SAVEPOINT = "savepoint"  # Flink's stop-with-savepoint: finish the batch in flight, final savepoint, exit
    CANCEL = "cancel"  # stop now; the latest completed checkpoint stays valid

    @classmethod
    def what(cls) -> str:
        return "stop mode"

    @classmethod
    def advice(cls) -> str:
        return "savepoint stops with a final savepoint, cancel stops now"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        return {"stop-with-savepoint": "savepoint"}


class KillPolicy(Mode):
    """What happens to the job when its submit task is killed or marked failed while it waits (``on_kill``)."""

    LEAVE_RUNNING = "leave-running"
    STOP_WITH_SAVEPOINT = "stop-with-savepoint"
    CANCEL = "cancel"

    @classmethod
    def what(cls) -> str:
        return "on_kill_policy"

    @classmethod
    def advice(cls) -> str:
        return "leave-running keeps the job, stop-with-savepoint stops it with a final savepoint, cancel stops it now"


class SupervisionMode(Mode):
    """Who keeps a launched job running (docs/service.md): its own supervisor started on the launching host, or the
    supervision service; ``auto`` hands it to the service when the job was handed to it before."""

    AUTO = "auto"
    LAUNCHER = "launcher"  # `ckpt run --supervise` on the host that launches it (the Airflow worker, the terminal)
    SERVICE = "service"  # the supervision service's instances (`ckpt service run`); nothing runs on the launcher

    @classmethod
    def what(cls) -> str:
        return "supervision"

    @classmethod
    def advice(cls) -> str:
        return ("launcher runs the job's supervisor on the launching host, service hands the job to `ckpt service "
                "run`, auto does what the job had")


class UpgradeMode(Mode):
    """How an upgrade stops the old code and what the new code restores (Flink operator's upgradeMode)."""

    SAVEPOINT = "savepoint"  # stop with a savepoint, restore it
    LAST_STATE = "last-state"  # cancel, restore the latest state
    STATELESS = "stateless"  # cancel, start without state on a fresh checkpoint location

    @classmethod
    def what(cls) -> str:
        return "upgrade_mode"

    @classmethod
    def advice(cls) -> str:
        return "savepoint keeps exactly the stopped state, last-state the latest checkpoint, stateless none"

    @property
    def stop(self) -> StopMode:
        """How the old driver is stopped."""
        return StopMode.SAVEPOINT if self is UpgradeMode.SAVEPOINT else StopMode.CANCEL


class RestartStrategyName(Mode):
    """Flink's restart strategies (core/policy/restart.py builds them, with Flink's defaults)."""

    EXPONENTIAL_DELAY = "exponential-delay"
    FIXED_DELAY = "fixed-delay"
    FAILURE_RATE = "failure-rate"

    @classmethod
    def what(cls) -> str:
        return "restart strategy"

    @classmethod
    def advice(cls) -> str:
        return "these are Flink's restart strategies, with Flink's defaults"


class TimeTravel(Mode):
    """What a start does when its restore goes back in time (an older snapshot than the job had reached)."""

    FORK = "fork"  # restore; the exactly-once sinks follow the restored timeline (docs/sinks.md#timelines)
    REFUSE = "refuse"  # refuse an explicit restore of an older snapshot, before the lease is taken

    @classmethod
    def what(cls) -> str:
        return "time-travel policy"

    @classmethod
    def advice(cls) -> str:
        return "fork restores and starts a new timeline, refuse refuses restores of older snapshots"


class RestoreMode(Mode):
    """Flink's restore strategies (the operator's upgrade vocabulary)."""

    LATEST_STATE = "latest-state"  # newest of: the live checkpoint, checkpoints, savepoints
    LATEST_SAVEPOINT = "latest-savepoint"
    NONE = "none"  # start without state
    SNAPSHOT = "snapshot"  # one named snapshot (id or URI)


@dataclass(frozen=True)
class RestoreSpec:
    """A restore strategy: a mode, and for SNAPSHOT the snapshot's id or URI. ``str()`` is its spelling."""

    mode: RestoreMode
    snapshot: str | None = None

    @classmethod
    def parse(cls, value: object, *, warning: type[Warning] = DeprecationWarning, stacklevel: int = 2) -> RestoreSpec:
        """``latest-state``, ``latest-savepoint``, ``none``, or a snapshot id or URI (or a RestoreSpec)."""
        if isinstance(value, RestoreSpec):
            return value
        text = value.strip() if isinstance(value, str) else ""
        if text in RestoreMode._value2member_map_ and text != RestoreMode.SNAPSHOT:
            return cls(RestoreMode(text))
        key = text.lower().replace("_", "-")
        if key == RestoreMode.SNAPSHOT:
            raise ConfigError("restore strategy 'snapshot' needs the snapshot: pass its id or URI instead, as printed "
                              "by `ckpt snapshot list`")
        if key in RestoreMode._value2member_map_:  # an old spelling: LATEST_STATE, Latest_Savepoint
            return cls(RestoreMode.parse(text, warning=warning, stacklevel=stacklevel + 1))
        if not text:
            raise ConfigError(f"invalid restore strategy {value!r}: expected latest-state, latest-savepoint, none, "
                              "or a snapshot id or URI as printed by `ckpt snapshot list`")
        return cls(RestoreMode.SNAPSHOT, text)

    def __str__(self) -> str:
        return self.snapshot if self.snapshot else self.mode.value


LATEST_STATE = RestoreSpec(RestoreMode.LATEST_STATE)
