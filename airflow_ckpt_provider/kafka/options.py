"""Options of the ``ckpt-kafka`` source: parsed and validated once, when the query starts.

Names follow Spark's Kafka source so a query can switch between the two by changing the format:
``kafka.``-prefixed options go to librdkafka (the prefix stripped), the rest are the source's own.
Spark lower-cases option names; so does :func:`parse_options`. Every error is a ConfigError that
says what was expected, what was found and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.clientlog import configured
from airflow_ckpt_provider.kafka.offsets import Offsets, parse_offsets

KAFKA_PREFIX = "kafka."
#: The consumers of the source never join this group and never commit: librdkafka only needs one.
DUMMY_GROUP_ID = "ckpt-kafka-source"

#: The source's own options (lower case) and what each takes, for error messages.
KNOWN_OPTIONS: dict[str, str] = {
    "subscribe": "comma-separated topic names",
    "subscribepattern": "a Java-style regex matched against whole topic names",
    "startingoffsets": 'earliest | latest (default) | JSON {"topic": {"0": 23, "1": -2}}',
    "startingtimestamp": "milliseconds since the epoch",
    "maxoffsetspertrigger": "a positive integer",
    "minoffsetspertrigger": "a positive integer",
    "maxtriggerdelay": "a duration like 15m (default), 30s, 500ms",
    "failondataloss": "true (default) | false",
    "includeheaders": "true | false (default)",
    "minpartitions": "a positive integer",
    "commitgroupid": "a consumer group that gets each completed batch's end offsets (monitoring only)",
    "kafkaconsumer.polltimeoutms": "milliseconds without progress before a read fails (default 120000)",
    "fetchoffset.numretries": "attempts of each metadata request (default 3)",
    "fetchoffset.retryintervalms": "milliseconds between those attempts (default 1000)",
}

#: Options of Spark's Kafka source that this source does not take, and what to do instead.
_UNSUPPORTED: dict[str, str] = {
    "assign": "use subscribe with the topics of those partitions",
    "startingoffsetsbytimestamp": "use startingTimestamp (one timestamp for every partition)",
    "startingoffsetsbytimestampstrategy": "a partition without a record at or after startingTimestamp starts at latest",
    "endingoffsets": "ckpt-kafka is a streaming source; use Trigger.AvailableNow to stop at the current end",
    "endingtimestamp": "ckpt-kafka is a streaming source; use Trigger.AvailableNow to stop at the current end",
    "endingoffsetsbytimestamp": "ckpt-kafka is a streaming source; use Trigger.AvailableNow to stop at the current end",
    "groupidprefix": "the source joins no consumer group; see commitGroupId to commit offsets for monitoring",
}

#: librdkafka settings the source owns: the user setting them would break offset tracking.
_OWNED_KAFKA: dict[str, str] = {
    "auto.offset.reset": "use startingOffsets; offsets out of range follow failOnDataLoss",
    "enable.auto.commit": "the source never commits to Kafka; offsets live in the Spark checkpoint",
    "enable.auto.offset.store": "the source never commits to Kafka; offsets live in the Spark checkpoint",
    "enable.partition.eof": "the source needs partition EOF events to finish ranges that end in a gap",
    "key.deserializer": "keys are always bytes; deserialize with DataFrame functions",
    "value.deserializer": "values are always bytes; deserialize with DataFrame functions",
}

#: librdkafka properties of consumers only: left out of the driver's admin client (it would warn).
_CONSUMER_ONLY_PREFIXES = (
    "group.", "isolation.level", "enable.auto.", "auto.commit.", "auto.offset.reset", "enable.partition.eof",
    "fetch.", "max.poll.interval.ms", "session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.",
    "queued.", "check.crcs", "allow.auto.create.topics", "consume.callback.max.messages", "coordinator.",
)

_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {
    "us": 0.001, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000,
}


@dataclass(frozen=True)
class StartingOffsets:
    """Where a new query starts: earliest, latest, per-partition offsets, or a timestamp."""

    kind: Literal["earliest", "latest", "specific", "timestamp"]
    specific: Offsets | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    """Validated options; picklable (Spark ships the reader, and these, to the executors)."""

    kafka: dict[str, str]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: StartingOffsets = field(default_factory=lambda: StartingOffsets("latest"))
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    poll_timeout_ms: int = 120_000
    fetch_retries: int = 3
    fetch_retry_interval_ms: int = 1000
    commit_group_id: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka["bootstrap.servers"]

    @property
    def isolation_level(self) -> str:
        return self.kafka.get("isolation.level", "read_committed")

    def subscribed(self, topic: str) -> bool:
        """Whether ``topic`` belongs to the subscription (a pattern matches whole names, as in Java)."""
        if self.pattern is not None:
            # Internal topics (__consumer_offsets, __transaction_state) are never matched, as with
            # the Java consumer's exclude.internal.topics=true.
            return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def describe_subscription(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        return f"subscribe {','.join(self.topics)}"

    def consumer_config(self) -> dict[str, str | int | bool]:
        """librdkafka config of the executors' assign-only consumers."""
        return {
            "group.id": DUMMY_GROUP_ID,
            "client.id": "ckpt-kafka-source",
            "isolation.level": "read_committed",
            **self.kafka,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # An out-of-range offset becomes an error event instead of a silent jump: the reader
            # decides with failOnDataLoss.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
        }

    def admin_config(self) -> dict[str, str | int | bool]:
        """librdkafka config of the driver's admin client (metadata and list offsets)."""
        shared = {k: v for k, v in self.kafka.items() if not k.startswith(_CONSUMER_ONLY_PREFIXES)}
        return {"client.id": "ckpt-kafka-source", **shared}


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options given to ``spark.readStream.format("ckpt-kafka")``."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    kafka = {k[len(KAFKA_PREFIX):]: v for k, v in opts.items() if k.startswith(KAFKA_PREFIX)}
    own = {k: v for k, v in opts.items() if not k.startswith(KAFKA_PREFIX)}
    _reject_unknown(own)
    _check_kafka(kafka)
    topics, pattern = _subscription(own)
    max_offsets = _positive_int(own, "maxoffsetspertrigger")
    min_offsets = _positive_int(own, "minoffsetspertrigger")
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise ConfigError(
            f"minOffsetsPerTrigger {min_offsets} is larger than maxOffsetsPerTrigger {max_offsets}: "
            "expected min <= max; lower minOffsetsPerTrigger or raise maxOffsetsPerTrigger"
        )
    if "maxtriggerdelay" in own and min_offsets is None:
        raise ConfigError(
            "maxTriggerDelay is set without minOffsetsPerTrigger: it only bounds how long a batch waits "
            "for minOffsetsPerTrigger records; set minOffsetsPerTrigger too or drop maxTriggerDelay"
        )
    return SourceOptions(
        kafka=kafka,
        topics=topics,
        pattern=pattern,
        starting=_starting(own),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=_duration_ms(own.get("maxtriggerdelay", "15m"), "maxTriggerDelay"),
        fail_on_data_loss=_bool(own, "failondataloss", default=True),
        include_headers=_bool(own, "includeheaders", default=False),
        min_partitions=_positive_int(own, "minpartitions"),
        poll_timeout_ms=_positive_int(own, "kafkaconsumer.polltimeoutms") or 120_000,
        fetch_retries=_positive_int(own, "fetchoffset.numretries") or 3,
        fetch_retry_interval_ms=_non_negative_int(own, "fetchoffset.retryintervalms", 1000),
        commit_group_id=own.get("commitgroupid") or None,
    )


def check_client_config(options: SourceOptions) -> None:
    """Let librdkafka validate the ``kafka.`` settings now (no broker call) instead of on executors."""
    from confluent_kafka import Consumer, KafkaException

    try:
        Consumer(configured(options.consumer_config(), stats=False)).close()  # never polled: no stats
    except KafkaException as err:
        raise ConfigError(
            f"librdkafka rejected the kafka.* options: {err.args[0].str()}. Expected librdkafka "
            "configuration properties (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md) "
            "prefixed with 'kafka.'; fix or remove that option"
        ) from err


def _reject_unknown(own: Mapping[str, str]) -> None:
    for key in sorted(own):
        if key in _UNSUPPORTED:
            raise ConfigError(
                f"option {key!r} of Spark's Kafka source is not supported by ckpt-kafka: {_UNSUPPORTED[key]}"
            )
    unknown = sorted(set(own) - set(KNOWN_OPTIONS))
    if unknown:
        known = "; ".join(f"{k} ({v})" for k, v in KNOWN_OPTIONS.items())
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for ckpt-kafka: expected 'kafka.'-prefixed librdkafka "
            f"settings or one of: {known}. Fix the spelling or remove the option"
        )


def _check_kafka(kafka: Mapping[str, str]) -> None:
    if not kafka.get("bootstrap.servers", "").strip():
        raise ConfigError(
            "option kafka.bootstrap.servers is missing: expected host:port[,host:port...] of the Kafka "
            "cluster; add .option('kafka.bootstrap.servers', 'broker:9092')"
        )
    for key, reason in _OWNED_KAFKA.items():
        if key in kafka and not (key == "enable.auto.commit" and kafka[key].lower() == "false"):
            raise ConfigError(f"option kafka.{key} is managed by the source and cannot be set: {reason}")
    level = kafka.get("isolation.level")
    if level is not None and level not in _ISOLATION_LEVELS:
        raise ConfigError(
            f"option kafka.isolation.level is {level!r}: expected one of {', '.join(_ISOLATION_LEVELS)} "
            "(default read_committed)"
        )


def _subscription(own: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    has_topics, has_pattern = "subscribe" in own, "subscribepattern" in own
    if has_topics == has_pattern:
        found = "both" if has_topics else "neither"
        raise ConfigError(
            f"expected exactly one of the options subscribe (a comma list of topics) and subscribePattern "
            f"(a regex), found {found}; set one of them"
        )
    if has_pattern:
        pattern = own["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"option subscribePattern {pattern!r} is not a valid regex: {err}; fix it") from err
        if not pattern:
            raise ConfigError("option subscribePattern is empty: expected a regex matching topic names")
        return (), pattern
    topics = tuple(t.strip() for t in own["subscribe"].split(",") if t.strip())
    if not topics:
        raise ConfigError(f"option subscribe is {own['subscribe']!r}: expected one or more comma-separated topics")
    return topics, None


def _starting(own: Mapping[str, str]) -> StartingOffsets:
    # As in Spark's Kafka source, a timestamp takes precedence over startingOffsets.
    if "startingtimestamp" in own:
        return StartingOffsets("timestamp", timestamp_ms=_non_negative_int(own, "startingtimestamp", 0))
    value = own.get("startingoffsets", "latest").strip()
    if value.lower() in ("earliest", "latest"):
        return StartingOffsets("earliest" if value.lower() == "earliest" else "latest")
    if not value.startswith("{"):
        raise ConfigError(
            f"option startingOffsets is {value!r}: expected earliest, latest, or JSON like "
            '{"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest)'
        )
    specific = parse_offsets(value, "startingOffsets")
    bad = sorted(f"{t}/{p}={o}" for t, parts in specific.items() for p, o in parts.items() if o < -2 or p < 0)
    if bad:
        raise ConfigError(
            f"option startingOffsets has invalid entries {', '.join(bad)}: expected partitions >= 0 and "
            "offsets >= 0, or -2 (earliest) / -1 (latest)"
        )
    return StartingOffsets("specific", specific=specific)


def _bool(own: Mapping[str, str], key: str, *, default: bool) -> bool:
    value = own.get(key)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {key} is {value!r}: expected true or false")
    return value.strip().lower() == "true"


def _positive_int(own: Mapping[str, str], key: str) -> int | None:
    if key not in own:
        return None
    value = _int(own, key)
    if value <= 0:
        raise ConfigError(f"option {key} is {value}: expected a positive integer; {KNOWN_OPTIONS[key]}")
    return value


def _non_negative_int(own: Mapping[str, str], key: str, default: int) -> int:
    if key not in own:
        return default
    value = _int(own, key)
    if value < 0:
        raise ConfigError(f"option {key} is {value}: expected an integer >= 0; {KNOWN_OPTIONS[key]}")
    return value


def _int(own: Mapping[str, str], key: str) -> int:
    try:
        return int(own[key].strip())
    except ValueError as err:
        raise ConfigError(f"option {key} is {own[key]!r}: expected an integer; {KNOWN_OPTIONS[key]}") from err


def _duration_ms(value: str, name: str) -> int:
    """Spark's time strings: ``500ms``, ``30s``, ``15m``, ``1h``; a bare number is milliseconds."""
    match = _DURATION.match(value)
    if match is None:
        raise ConfigError(f"option {name} is {value!r}: expected a duration like 15m, 30s or 500ms")
    unit = (match.group(2) or "ms").lower()
    return int(int(match.group(1)) * _DURATION_MS[unit])
