"""What the runtime needs to run one job: a frozen config that travels to the driver as arguments."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.jobstore import check_job_name


class RestoreMode(StrEnum):
    """Flink's restore strategies (the operator's upgrade vocabulary)."""

    LATEST_STATE = "latest-state"  # newest of: the live checkpoint, checkpoints, savepoints
    LATEST_SAVEPOINT = "latest-savepoint"
    NONE = "none"  # start without state
    SNAPSHOT = "snapshot"  # one named snapshot (id or URI)


class TimeTravel(StrEnum):
    """What a start does when its restore goes back in time (an older snapshot than the job had reached)."""

    FORK = "fork"  # restore; the exactly-once sinks follow the restored timeline (docs/sinks.md#timelines)
    REFUSE = "refuse"  # refuse an explicit restore of an older snapshot, before the lease is taken

    @classmethod
    def parse(cls, text: str) -> TimeTravel:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ConfigError(f"invalid time-travel policy {text!r}: expected fork (restore and start a new "
                              "timeline) or refuse") from None


@dataclass(frozen=True)
class RestoreSpec:
    mode: RestoreMode
    snapshot: str | None = None

    @classmethod
    def parse(cls, text: str) -> RestoreSpec:
        """``latest-state``, ``latest-savepoint``, ``none``, or a snapshot id or URI."""
        value = text.strip()
        try:
            mode = RestoreMode(value.lower().replace("_", "-"))
        except ValueError:
            if not value or value.lower() == RestoreMode.SNAPSHOT:
                raise ConfigError(
                    f"invalid restore strategy {text!r}: expected latest-state, latest-savepoint, none, or "
                    "a snapshot id or URI as printed by `ckpt snapshot list`"
                ) from None
            return cls(RestoreMode.SNAPSHOT, value)
        if mode is RestoreMode.SNAPSHOT:
            raise ConfigError("restore strategy 'snapshot' needs the snapshot: pass its id or URI instead")
        return cls(mode)

    def __str__(self) -> str:
        return self.snapshot if self.snapshot else self.mode.value


def default_checkpoint(job: str) -> str:
    """The live checkpoint's default home: a local directory, off the job store."""
    base = os.environ.get("CKPT_HOME") or str(Path.home() / ".ckpt")
    return str(Path(base, "jobs", job, "checkpoint"))


@dataclass(frozen=True)
class RuntimeConfig:
    """Per-job knobs of the runtime. Intervals are seconds; ``checkpoint_interval`` 0 snapshots after
    every batch and None never; ``savepoint_interval`` None takes savepoints only on request and stop.

    ``check_restore`` makes the driver only check whether the job file can restore the state that
    ``restore`` names (runtime/restorecheck.py), within ``check_timeout``; state of operators the new
    query no longer has fails the check unless ``allow_non_restored_state`` (Flink's flag)."""

    job: str
    store: str
    checkpoint: str = ""
    restore: str = RestoreMode.LATEST_STATE.value
    time_travel: str = TimeTravel.FORK.value
    checkpoint_interval: float | None = 0.0
    savepoint_interval: float | None = None
    keep_checkpoints: int = 3
    keep_savepoints: int | None = None
    heartbeat_interval: float = 5.0
    poll_interval: float = 1.0
    fence_grace: float = 3.0
    code_version: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    check_restore: bool = False
    allow_non_restored_state: bool = False
    check_timeout: float = 300.0

    def __post_init__(self) -> None:
        check_job_name(self.job)
        if not self.store:
            raise ConfigError("no job store given: expected s3://BUCKET/PREFIX or a directory (--store)")
        if not self.checkpoint:
            object.__setattr__(self, "checkpoint", default_checkpoint(self.job))
        self.restore_spec()  # validate early
        TimeTravel.parse(self.time_travel)
        for name in ("checkpoint_interval", "savepoint_interval"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 seconds or unset, found {value}")
        for name in ("heartbeat_interval", "poll_interval", "check_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, found {getattr(self, name)}")
        if self.fence_grace < 2 * self.poll_interval:
            raise ConfigError(
                f"fence_grace ({self.fence_grace} s) must be at least twice poll_interval ({self.poll_interval} s): "
                "a fenced driver needs that long to notice the newer epoch"
            )

    def restore_spec(self) -> RestoreSpec:
        return RestoreSpec.parse(self.restore)

    def to_args(self) -> list[str]:
        """Command-line arguments that ``from_args`` turns back into this config (flags only when set).

        Unset settings whose default is unset (endpoint, region, code version, ...) are left out, so
        the command never shows a literal "none" for them; "none" is passed only where it differs from
        the default (``--checkpoint-interval none``: never)."""
        args = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _FLAGS:
                args += [f"--{f.name.replace('_', '-')}"] if value else []
                continue
            if value is None:
                if f.default is None:
                    continue
                value = "none"
            args += [f"--{f.name.replace('_', '-')}", str(value)]
        return args

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        p = parser or argparse.ArgumentParser(prog="ckpt-driver", description="Run a job under the ckpt runtime.")
        p.add_argument("--job", required=True)
        p.add_argument("--store", required=True)
        for f in fields(cls):
            if f.name in _FLAGS:
                p.add_argument(f"--{f.name.replace('_', '-')}", action="store_true", default=None)
            elif f.name not in ("job", "store"):
                p.add_argument(f"--{f.name.replace('_', '-')}", default=None)
        return p

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> RuntimeConfig:
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = getattr(ns, f.name, None)
            if raw is None:
                continue
            values[f.name] = raw if isinstance(raw, bool) else _convert(f.name, str(raw), f.default)
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def from_args(cls, argv: Sequence[str]) -> RuntimeConfig:
        return cls.from_namespace(cls.parser().parse_args(list(argv)))


_FLOATS = {"checkpoint_interval", "savepoint_interval", "heartbeat_interval", "poll_interval", "fence_grace",
           "check_timeout"}
_INTS = {"keep_checkpoints", "keep_savepoints"}
#: Boolean fields: command-line flags without a value.
_FLAGS = {"check_restore", "allow_non_restored_state"}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


#: Fields that may be unset: only these accept "none" (the others would fail later with a TypeError).
_OPTIONAL = {f.name for f in fields(RuntimeConfig) if "None" in str(f.type)}


def _convert(name: str, raw: str, default: object) -> object:
    if raw.lower() == "none" and name in _OPTIONAL:
        return None
    if name in _FLAGS:
        if raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise ConfigError(f"--{name.replace('_', '-')}: expected true or false, found {raw!r}")
    kind = "seconds" if name in _FLOATS else "a whole number"
    expected = f"{kind} or 'none'" if name in _OPTIONAL else kind
    try:
        if name in _FLOATS:
            value = float(raw)
            if not math.isfinite(value):  # nan passes every comparison in __post_init__
                raise ValueError(raw)
            return value
        if name in _INTS:
            return int(raw)
    except ValueError:
        raise ConfigError(f"--{name.replace('_', '-')}: expected {expected}, found {raw!r}") from None
    return raw
