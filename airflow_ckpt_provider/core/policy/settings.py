"""A job's settings, declared once: typed frozen dataclasses whose fields carry their flag, help and parser.
``RuntimeSettings`` (the driver), ``RestartSettings`` (the supervisor), ``JobSettings`` (both); one serializer.

Design notes: docs/development.md#design-notes-corepolicysettingspy."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Any, Self

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import Mode, RestartStrategyName, RestoreSpec, TimeTravel
from airflow_ckpt_provider.core.policy.restart import HealthRule, RestartStrategy, health_rule, restart_strategy

_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}

#: A checkpoint file up to this size goes into the manifest instead of an object (Flink's default threshold is
#: 20 kb), as long as the manifest's inline bytes stay within INLINE_TOTAL_MAX; other files are objects.
INLINE_MAX = 20 * 1024
INLINE_TOTAL_MAX = 128 * 1024
#: Seconds between a driver's looks at its lease unless set: docs/scale.md. The outage tolerance (the fence grace
#: minus this) must outlast one interval and a slow read (LEASE_MARGIN), or the lease watch would stop the query
#: between two healthy reads.
LEASE_INTERVAL = 5.0
LEASE_MARGIN = 2.0


def parse_address(address: str) -> tuple[str, int]:
    """HOST or HOST:PORT (``[v6]:PORT``) -> (host, port); port 0 when not given (a free one)."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    try:
        port = int(port_text) if port_text else 0
    except ValueError:
        port = -1
    if not re.fullmatch(r"[\w.:-]+", host) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics_address: expected HOST or HOST:PORT (a port from 0 to 65535; none or 0: a free "
                          f"one), found {address!r}")
    return host, port


def check_metrics(address: str | None, otlp: str | None, interval: float) -> None:
    """ConfigError unless the metrics settings (a driver's, the supervision service's) are well formed."""
    if interval <= 0:
        raise ConfigError(f"metrics_interval must be > 0 seconds, found {interval}")
    if otlp is not None and not otlp.startswith(("http://", "https://")):
        raise ConfigError(f"metrics_otlp: expected an OTLP/HTTP URL (http://HOST:4318/v1/metrics), found {otlp!r}")
    if address is not None:
        parse_address(address)  # raises ConfigError on a bad one


@dataclass(frozen=True)
class Kind:
    """How a setting's values are read (from text, JSON or Python) and written as a flag's text."""

    expected: str  # for messages: "expected seconds, found 'fast'"
    convert: Callable[[Any], Any]  # raises ValueError or TypeError on a bad value (or ConfigError, kept as is)
    show: Callable[[Any], str] = str
    switch: bool = False  # a flag without a value (store_true)
    repeat: bool = False  # a flag that may be given more than once (its values come as a list)


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(value)
    number = float(value)
    if not math.isfinite(number):  # nan passes every comparison
        raise ValueError(value)
    return number


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(value)
    return int(value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _switch(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(value)


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


SECONDS = Kind("seconds", _seconds, _number_text)
COUNT = Kind("a whole number", _count)
TEXT = Kind("text", _text)
SWITCH = Kind("true or false", _switch, switch=True)
RESTORE = Kind("latest-state, latest-savepoint, none, or a snapshot id or URI", RestoreSpec.parse)


def mode(kind: type[Mode]) -> Kind:
    """The Kind of a mode: its enum's spellings (old ones warn)."""
    return Kind(f"one of {kind.spellings()}", kind.parse, lambda member: member.value)


@dataclass(frozen=True)
class Meta:
    """A setting's metadata (``dataclasses.field(metadata={"setting": Meta(...)})``)."""

    kind: Kind
    help: str
    metavar: str | None = None
    none: str | None = None  # what unset means ("never"); given, None and the text "none" are accepted

    def parse(self, value: object, label: str) -> Any:
        """``value`` (text, JSON or Python) as this setting's type; ConfigError naming ``label`` if bad."""
        if self.none is not None and (value is None or (isinstance(value, str) and value.strip().lower() == "none")):
            return None
        try:
            return self.kind.convert(value)
        except (ValueError, TypeError):
            expected = f"{self.kind.expected} or 'none'" if self.none is not None else self.kind.expected
            raise ConfigError(f"{label}: expected {expected}, found {value!r}") from None


def setting(default: Any = MISSING, *, kind: Kind, help: str, metavar: str | None = None,
            none: str | None = None) -> Any:
    """A settings field: its default and how it is read, written and explained."""
    return field(default=default, metadata={"setting": Meta(kind, help, metavar, none)})


def meta(f: Field[Any]) -> Meta | None:
    found = f.metadata.get("setting")
    return found if isinstance(found, Meta) else None


def setting_fields(cls: type[Any] | object) -> list[tuple[Field[Any], Meta]]:
    """The settings fields of a settings class (or object), in declaration order."""
    # fields() is typed for dataclass instances and types; Settings classes are dataclasses, which mypy cannot see here
    return [(f, m) for f in fields(cls) if (m := meta(f)) is not None]  # type: ignore[arg-type]


def names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f, _ in setting_fields(cls))


def flag_of(name: str) -> str:
    return f"--{name.replace('_', '-')}"


class Settings:
    """Base of the settings dataclasses: parses every field on construction, then ``check()``s the whole."""

    def __post_init__(self) -> None:
        for f, m in setting_fields(self):
            value = getattr(self, f.name)
            parsed = m.parse(value, f.name)
            if parsed is not value:
                object.__setattr__(self, f.name, parsed)
        self.check()

    def check(self) -> None:
        """Refuse combinations (ConfigError); subclasses extend it and call super()."""

    # -- the serializer ----------------------------------------------------------------------------

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, only: Iterable[str] | None = None,
                  exclude: Iterable[str] = ()) -> None:
        """One ``--flag`` per settings field (default None: not given, the field's default applies)."""
        wanted, skip = (set(only) if only is not None else None), set(exclude)
        for f, m in setting_fields(cls):
            if f.name in skip or (wanted is not None and f.name not in wanted):
                continue
            if m.kind.switch:
                parser.add_argument(flag_of(f.name), action="store_true", default=None, help=m.help)
            elif m.kind.repeat:
                parser.add_argument(flag_of(f.name), action="append", default=None, metavar=m.metavar, help=m.help)
            else:
                parser.add_argument(flag_of(f.name), default=None, metavar=m.metavar, help=m.help,
                                    required=f.default is MISSING and f.default_factory is MISSING)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **more: Any) -> Self:
        """This class from parsed flags (those not given keep their defaults); errors name the flag."""
        values: dict[str, Any] = {}
        for f, m in setting_fields(cls):
            raw = getattr(ns, f.name, None)
            if raw is not None:
                values[f.name] = m.parse(raw, flag_of(f.name))
        return cls(**values | more)

    def to_argv(self, cls: type[Settings] | None = None, first: Sequence[str] = ()) -> list[str]:
        """The flags ``from_namespace`` turns back into these settings (only ``cls``'s fields when given; the
        fields named in ``first`` first, for who reads the command).

        Unset settings whose default is unset are left out, so a command never shows a literal "none"
        for them; "none" is written only where it differs from the default (``--checkpoint-interval none``)."""
        argv: list[str] = []
        pairs = setting_fields(cls or self)
        pairs.sort(key=lambda pair: first.index(pair[0].name) if pair[0].name in first else len(first))
        for f, m in pairs:
            value = getattr(self, f.name)
            if m.kind.switch:
                argv += [flag_of(f.name)] if value else []
            elif value is None:
                argv += [] if f.default is None else [flag_of(f.name), "none"]
            else:
                argv += [flag_of(f.name), m.kind.show(value)]
        return argv

    def to_json(self, cls: type[Settings] | None = None) -> dict[str, Any]:
        """Every field (or ``cls``'s) as JSON values: modes as their spelling, tuples as lists."""
        # fields(): cls is a Settings dataclass, typed as type[Settings] which mypy does not know to be one
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(cls or self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, body: Mapping[str, Any], **more: Any) -> Self:
        """This class from ``to_json``'s output: keys of newer versions are ignored, missing ones defaulted."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass (as above)
        return cls(**{k: v for k, v in body.items() if k in known} | more)

    def values(self, cls: type[Settings]) -> dict[str, Any]:
        """``cls``'s fields of this object (a part of it, e.g. the RuntimeSettings of a Deployment)."""
        return {f.name: getattr(self, f.name) for f in fields(cls)}  # type: ignore[arg-type]  # a dataclass (as above)


def _jsonable(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, RestoreSpec):
        return str(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings(Settings):
    """What the Spark driver needs. Intervals are seconds; ``checkpoint_interval`` 0 snapshots after every
    batch and None never; ``savepoint_interval`` None takes savepoints only on request and stop."""

    checkpoint: str | None = setting(
        None, kind=TEXT, none="$CKPT_HOME/jobs/JOB/checkpoint",
        help="the live checkpoint location (default: $CKPT_HOME/jobs/JOB/checkpoint)")
    checkpoint_interval: float | None = setting(  # 60: the recovery point a snapshot keeps vs its requests (scale.md)
        60.0, kind=SECONDS, none="never", metavar="S",
        help="seconds between checkpoint snapshots while batches complete: the newest snapshot is never older than "
        "this (default 60; the live checkpoint is still written every batch); 0 after every batch, none for never")
    savepoint_interval: float | None = setting(
        None, kind=SECONDS, none="never", metavar="S", help="seconds between periodic savepoints (default none)")
    keep_checkpoints: int = setting(3, kind=COUNT, metavar="N", help="checkpoint snapshots to keep (default 3)")
    keep_savepoints: int | None = setting(
        None, kind=COUNT, none="all", metavar="N", help="savepoints to keep (default none: all)")
    heartbeat_interval: float = setting(  # 30: a status PUT every 30 s is $0.44 a month at AWS's prices (scale.md)
        30.0, kind=SECONDS, metavar="S",
        help="seconds between the driver's status.json heartbeats (default 30): completed batches are reported within "
        "half of it; a driver silent for three heartbeats + 5 s counts as lost")
    poll_interval: float = setting(  # 30: a knock at the control door brings a request at once (docs/scale.md)
        30.0, kind=SECONDS, metavar="S",
        help="seconds between the driver's looks at control requests when no asker knocks at its control door "
        "(default 30)")
    lease_interval: float | None = setting(  # 4 s: 900 GETs an hour; a commit needs no read of its own (scale.md)
        None, kind=SECONDS, none="4 with the default fence grace", metavar="S",
        help=f"seconds between the driver's looks at its lease (default: (fence grace - {LEASE_MARGIN:g}) / 2, at most "
        f"{LEASE_INTERVAL:g}: 4 with the default grace): a confirmation this young lets a batch commit without a read "
        "of its own, and a fenced driver notices within it")
    control_door: str | None = setting(
        "127.0.0.1", kind=TEXT, none="none", metavar="ADDRESS",
        help="the address the driver's control door binds (a free port; default 127.0.0.1): an asker knocks there "
        "after writing a request, so it is acted on at once instead of at the next poll; a driver its askers reach "
        "only over the network needs an address they can reach (0.0.0.0: all of its host's); none: no door")
    fence_grace: float = setting(  # 10: a lease read over a slow, lossy link took over 2 s (docs/reliability.md)
        10.0, kind=SECONDS, metavar="S",
        help="seconds a new driver waits for a fenced one to notice (default 10, at least twice the lease interval + "
        "1 s); "
        "the driver rides out a job store that does not answer for this minus a lease interval")
    executor_timeout: float = setting(
        120.0, kind=SECONDS, metavar="S",
        help="seconds a driver on a cluster waits for its first executor before it gives up, exit 2 (default 120)")
    lineage_interval: float = setting(
        300.0, kind=SECONDS, metavar="S",
        help="seconds between the driver's OpenLineage RUNNING events, sent only when its environment configures "
        "OpenLineage (default 300; 0 for none)")
    metrics_address: str | None = setting(
        None, kind=TEXT, none="none", metavar="ADDRESS",
        help="serve the driver's metrics for Prometheus at http://ADDRESS/metrics: HOST:PORT, or HOST for a free port "
        "(its URL in the job's status; `ckpt metrics targets` lists them for Prometheus); default none: not served")
    metrics_otlp: str | None = setting(
        None, kind=TEXT, none="none", metavar="URL",
        help="export the driver's metrics over OTLP/HTTP to URL (http://HOST:4318/v1/metrics) every "
        "metrics_interval; default none")
    metrics_interval: float = setting(
        15.0, kind=SECONDS, metavar="S", help="seconds between OTLP exports of the driver's metrics (default 15)")
    snapshot_nice: int = setting(
        10, kind=COUNT, metavar="N",
        help="how much lower the CPU priority of the driver's snapshot thread is (a nice value added, Linux; 0: the "
        "driver's own; at most 19; default 10): snapshots use the CPU batches leave idle")
    snapshot_inline_bytes: int = setting(
        INLINE_MAX, kind=COUNT, metavar="BYTES",
        help=f"checkpoint files up to this size go into the snapshot's manifest instead of an object of their own "
        f"(Flink's state.storage.fs.memory-threshold; {INLINE_TOTAL_MAX // 1024} KiB per manifest at most; 0: none; "
        f"default {INLINE_MAX})")
    time_travel: TimeTravel = setting(
        TimeTravel.FORK, kind=mode(TimeTravel), metavar="{fork,refuse}",
        help="a restore of a snapshot older than the job's latest batch: fork (default: restore, the exactly-once "
        "sinks follow the restored timeline) or refuse (before the lease is taken)")

    def _check_metrics(self) -> None:
        check_metrics(self.metrics_address, self.metrics_otlp, self.metrics_interval)

    @property
    def lease_seconds(self) -> float:
        """The lease interval in effect: the one set, else one that leaves the outage tolerance a slow read's margin
        (a deployment recorded before the setting existed, with any valid fence grace, keeps a valid pair)."""
        if self.lease_interval is not None:
            return self.lease_interval
        return min(LEASE_INTERVAL, max((self.fence_grace - LEASE_MARGIN) / 2, self.fence_grace / 3))

    def check(self) -> None:
        super().check()
        for name in ("checkpoint_interval", "savepoint_interval"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 seconds or unset, found {value}")
        self._check_metrics()
        if not 0 <= self.snapshot_nice <= 19:
            raise ConfigError(f"snapshot_nice must be a nice value from 0 (the driver's priority) to 19 (the lowest), "
                              f"found {self.snapshot_nice}")
        if not 0 <= self.snapshot_inline_bytes <= INLINE_TOTAL_MAX:
            raise ConfigError(f"snapshot_inline_bytes must be from 0 (no file inline) to {INLINE_TOTAL_MAX} (a "
                              f"manifest's inline bytes at most), found {self.snapshot_inline_bytes}")
        if self.lineage_interval < 0:
            raise ConfigError(f"lineage_interval must be >= 0 seconds (0 for no lineage events), found "
                              f"{self.lineage_interval}")
        if self.lease_interval is not None and self.lease_interval <= 0:
            raise ConfigError(f"lease_interval must be > 0 seconds, found {self.lease_interval}")
        for name in ("heartbeat_interval", "poll_interval", "executor_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, found {getattr(self, name)}")
        for name in ("keep_checkpoints", "keep_savepoints"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 or unset, found {value}")
        if self.lease_interval is not None and self.fence_grace < 2 * self.lease_interval + 1:
            raise ConfigError(
                f"fence_grace ({self.fence_grace} s) must be at least twice lease_interval ({self.lease_interval} s) "
                "+ 1 s: a fenced driver needs a lease interval to notice the newer epoch, and its outage tolerance "
                "(the grace minus an interval) must outlast an interval and a read; raise --fence-grace or lower "
                "--lease-interval"
            )


@dataclass(frozen=True, kw_only=True)
class RestartSettings(Settings):
    """What the supervisor needs: Flink's restart strategy (unset knobs keep Flink's defaults) and the
    health rule (unset: none, unless a knob of it is given)."""

    restart_strategy: RestartStrategyName = setting(
        RestartStrategyName.EXPONENTIAL_DELAY, kind=mode(RestartStrategyName),
        metavar="{exponential-delay,fixed-delay,failure-rate}",
        help="Flink's restart strategies with Flink's defaults (default exponential-delay)")
    restart_attempts: int | None = setting(
        None, kind=COUNT, none="the strategy's default", metavar="N",
        help="fixed-delay: restarts (default 1); failure-rate: failures per interval (default 1); "
        "exponential-delay: restarts before a backoff reset (default unbounded)")
    restart_delay: float | None = setting(
        None, kind=SECONDS, none="the strategy's default", metavar="S",
        help="seconds before a restart; exponential-delay: the initial backoff (default 1)")
    restart_interval: float | None = setting(
        None, kind=SECONDS, none="the strategy's default", metavar="S",
        help="failure-rate: the interval failures are counted in (default 60)")
    max_restarts_in_window: int | None = setting(
        None, kind=COUNT, none="the rule's default", metavar="N",
        help="health rule: give up after N restarts within the window (default 3)")
    health_window: float | None = setting(
        None, kind=SECONDS, none="the rule's default", metavar="S", help="health rule: the window (default 600)")
    progress_timeout: float | None = setting(
        None, kind=SECONDS, none="the rule's default", metavar="S",
        help="health rule: restart a driver with no batch for S seconds while data waits (default 600)")
    standby: bool = setting(
        False, kind=SWITCH,
        help="keep a warm standby driver beside the running one (client mode): its SparkSession and job built, "
        "waiting; a restart starts it instead of a new process (docs/runtime.md#warm-standby---standby)")

    def check(self) -> None:
        super().check()
        self.strategy()
        self.health()

    def strategy(self) -> RestartStrategy:
        return restart_strategy(self.restart_strategy, self.restart_attempts, self.restart_delay,
                                self.restart_interval)

    def health(self) -> HealthRule | None:
        return health_rule(self.max_restarts_in_window, self.health_window, self.progress_timeout)


@dataclass(frozen=True, kw_only=True)
class JobSettings(RestartSettings, RuntimeSettings):
    """Every setting of a job: what its driver needs and what its supervisor needs."""
