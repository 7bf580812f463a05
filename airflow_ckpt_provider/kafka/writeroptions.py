"""Options, input-schema checks and the commit-marker encoding of the transactional ``ckpt-kafka`` sink.

Pure logic (no broker, no Spark session): the writer in kafka/writer.py and the unit tests use it.
The marker of (job, Spark query id, sink partition p) is the committed offset of a consumer group
named from those three on partition 0 of the marker topic: it encodes the last committed batch id and
30 bits of the digest of that batch's offsets log entry (core/snapshots/coverage.py), and is committed with
``send_offsets_to_transaction`` inside the task's transaction, so it is applied if and only if the
records are (see docs/sink-kafka.md). Markers of version 1 (``batch id + 1``, no digest) are still read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.streambatch import EPOCH_OPTION, OUTCOMES_OPTION, outcomes_option

#: Options of the sink itself (lower case; Spark passes option names case-insensitively).
KNOWN_OPTIONS: dict[str, str] = {
    "kafka.bootstrap.servers": "brokers, host:port[,...] (required)",
    "topic": "the output topic; else every row needs a 'topic' column",
    "job": "the job name: part of transactional ids and marker groups (required)",
    "transactionalidprefix": "prefix of transactional ids and marker groups (default 'ckpt')",
    "markertopic": "an existing topic whose partition 0 carries the commit markers (default: topic)",
    "timeoutms": "timeout of each broker call of the sink, ms (default 30000)",
    "serializetxnends": "auto, true or false: end this host's transactions one at a time (default auto: on for "
                        "tansu, whose concurrent ends over the same partitions can lose markers for good)",
    "commitaftersnapshot": "auto, true or false: commit a batch only once the job store can replay it (default "
                           "auto: on under ckpt run when the live checkpoint is on the driver host's disk)",
}
#: Values of options serializeTxnEnds and commitAfterSnapshot: None is auto (serializeTxnEnds: decided from the
#: broker's cluster id, kafka/txnlock.py; commitAfterSnapshot: by the runtime, core/snapshots/durableplan.py).
_SERIALIZE = {"auto": None, "true": True, "false": False}
#: librdkafka settings the sink owns.
_OWNED = {
    "transactional.id": "set from transactionalIdPrefix, job and the sink partition",
    "key.serializer": "keys and values are written as bytes",
    "value.serializer": "keys and values are written as bytes",
}
#: Producer-only librdkafka prefixes, left out of the marker consumer's and admin client's config.
_PRODUCER_ONLY = (
    "transaction.", "enable.idempotence", "acks", "request.required.acks", "linger.ms", "queue.buffering.",
    "batch.", "compression.", "message.send.max.retries", "retries", "retry.backoff", "delivery.",
    "partitioner", "sticky.", "max.in.flight", "message.timeout.ms", "enable.gapless.guarantee",
)
#: Options Spark's DataStreamWriter passes along to every sink.
#: Spark's, and the runtime's epoch and outcomes file.
_SPARK = ("checkpointlocation", "path", "queryname", EPOCH_OPTION, OUTCOMES_OPTION)
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
#: librdkafka's "no committed offset" (OFFSET_INVALID).
NO_OFFSET = -1001
#: The one header the sink adds to every record: ``{query id}/{batch}/{sink partition}/{attempt}``
#: (one header, not four: per-record header cost is measurable in the benchmark).
HEADER = "ckpt"


@dataclass(frozen=True)
class SinkOptions:
    """Validated sink options; picklable (Spark ships the writer, and these, to the executors)."""

    kafka: dict[str, str]
    job: str
    topic: str | None = None
    prefix: str = "ckpt"
    marker_topic: str = ""
    timeout_ms: int = 30_000
    checkpoint: str = ""  # the query's checkpointLocation, whose offsets log says what a batch covered
    serialize_txn_ends: bool | None = None  # None: auto, until the driver asked the broker (kafka/txnlock.py)
    commit_after_snapshot: bool | None = None  # None: auto (core/snapshots/durableplan.py); the runtime decides
    outcomes: str | None = None  # the runtime's outcomes file (core/policy/streambatch.py OUTCOMES_OPTION)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka["bootstrap.servers"]

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    def transactional_id(self, partition: int) -> str:
        """Stable for (job, sink partition): a retried task fences the earlier attempt's producer."""
        return f"{self.prefix}-{self.job}-{partition}"

    def marker_group(self, query_id: str, partition: int) -> str:
        """Consumer group of the commit marker of (job, query id, sink partition); never shared across jobs."""
        return f"{self.prefix}-{self.job}-{query_id}-{partition}"

    def partitions_group(self) -> str:
        """Consumer group whose offset on the marker topic is the number of sink partitions the job has had."""
        return f"{self.prefix}-{self.job}-partitions"

    def producer_config(self, partition: int) -> dict[str, str | int | bool]:
        """librdkafka config of the transactional producer of ``partition``."""
        return {
            "client.id": f"ckpt-kafka-sink-{self.job}",
            "linger.ms": 5,
            **self.kafka,
            "transactional.id": self.transactional_id(partition),
            "enable.idempotence": True,
            "acks": "all",
        }

    def client_config(self) -> dict[str, str | int | bool]:
        """Shared settings (brokers, security) for the marker consumer and the admin client."""
        return {k: v for k, v in self.kafka.items() if not k.startswith(_PRODUCER_ONLY)}


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the writeStream options of ``ckpt-kafka``; a ConfigError says what to fix."""
    own = {k.lower(): str(v) for k, v in options.items()}
    kafka = {k[len("kafka."):]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    unknown = sorted(k for k in own if not k.startswith("kafka.") and k not in KNOWN_OPTIONS and k not in _SPARK)
    if unknown:
        known = "; ".join(f"{k} ({v})" for k, v in KNOWN_OPTIONS.items())
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for the ckpt-kafka sink: expected 'kafka.'-prefixed "
            f"librdkafka producer settings or one of: {known}. Fix the spelling or remove the option"
        )
    if not kafka.get("bootstrap.servers", "").strip():
        raise ConfigError("the ckpt-kafka sink needs option kafka.bootstrap.servers (host:port[,...]); none was given")
    for key, why in _OWNED.items():
        if key in kafka:
            raise ConfigError(f"option kafka.{key} cannot be set for the ckpt-kafka sink ({why}): remove it")
    if kafka.get("enable.idempotence", "true").lower() != "true":
        raise ConfigError("kafka.enable.idempotence=false conflicts with the transactional ckpt-kafka sink: remove it")
    if kafka.get("acks", "all").lower() not in ("all", "-1"):
        raise ConfigError(f"kafka.acks={kafka['acks']} conflicts with the transactional ckpt-kafka sink "
                          "(transactions need acks=all): remove it")
    job = own.get("job", "").strip()
    if not job:
        raise ConfigError("the ckpt-kafka sink needs option 'job' (a stable name of this streaming job, "
                          "part of its transactional ids); none was given")
    prefix = own.get("transactionalidprefix", "ckpt").strip()
    for name, value in (("job", job), ("transactionalIdPrefix", prefix)):
        if not _NAME.match(value):
            raise ConfigError(f"option {name}={value!r} must match [A-Za-z0-9._-]+ (it names transactional ids "
                              "and consumer groups)")
    topic = own.get("topic", "").strip() or None
    marker = own.get("markertopic", "").strip() or topic
    if marker is None:
        raise ConfigError("the ckpt-kafka sink without option 'topic' needs option 'markerTopic': an existing "
                          "topic whose partition 0 carries the commit markers (offsets of dedicated groups)")
    timeout = own.get("timeoutms", "30000").strip()
    if not timeout.isdigit() or int(timeout) <= 0:
        raise ConfigError(f"option timeoutMs must be a positive number of milliseconds, found {timeout!r}")
    return SinkOptions(kafka=kafka, job=job, topic=topic, prefix=prefix, marker_topic=marker,
                       timeout_ms=int(timeout), checkpoint=own.get("checkpointlocation", "").strip(),
                       serialize_txn_ends=_tristate(own, "serializeTxnEnds", "auto ends transactions one at a time "
                                                    "per host on tansu only"),
                       commit_after_snapshot=_tristate(own, "commitAfterSnapshot", "auto commits a batch only once "
                                                       "the job store can replay it where the live checkpoint is on "
                                                       "the driver host's disk"),
                       outcomes=outcomes_option(own))


def _tristate(own: Mapping[str, str], name: str, what: str) -> bool | None:
    """An auto/true/false option (None: auto)."""
    value = own.get(name.lower(), "auto").strip().lower()
    if value not in _SERIALIZE:
        raise ConfigError(f"option {name} must be auto, true or false, found {value!r}: {what}")
    return _SERIALIZE[value]


# --------------------------------------------------------------------------------------------
# Input schema (Spark's Kafka sink columns)
# --------------------------------------------------------------------------------------------

def check_schema(schema: Any, options: SinkOptions) -> None:
    """Columns as Spark's Kafka sink: value (binary|string), key, topic, partition, headers (optional)."""
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    found = schema.simpleString()
    if "value" not in fields:
        raise ConfigError(f"the ckpt-kafka sink needs a 'value' column (binary or string), found {found}: "
                          "select or alias one")
    expected = {
        "value": ("binary", "string"), "key": ("binary", "string"), "topic": ("string",),
        "partition": ("int",), "headers": ("array<struct<key:string,value:binary>>",),
    }
    for name, types in expected.items():
        if name in fields and fields[name] not in types:
            raise ConfigError(f"column {name!r} of the ckpt-kafka sink must be {' or '.join(types)}, found "
                              f"{fields[name]}: cast it")
    if "topic" not in fields and options.topic is None:
        raise ConfigError(f"the ckpt-kafka sink needs option 'topic' or a 'topic' column, found neither in {found}")


# --------------------------------------------------------------------------------------------
# Commit markers and skip decisions
# --------------------------------------------------------------------------------------------

_V2 = 1 << 62  # flags a version-2 marker; version 1 markers are batch id + 1, far below
_DIGEST_BITS = 30
_BATCH_BITS = 32


@dataclass(frozen=True)
class Marker:
    """What a marker offset says: the last committed batch, and its offsets digest (None: version 1)."""

    batch_id: int
    digest: int | None = None


def digest_bits(hexdigest: str) -> int:
    """The 30 bits of an offsets-log digest that a marker carries."""
    return int(hexdigest[:8], 16) & ((1 << _DIGEST_BITS) - 1)


def marker_offset(batch_id: int, hexdigest: str) -> int:
    """The committed offset that says 'batch_id, with this offsets digest, is committed' (>= 0, < 2**63)."""
    if not 0 <= batch_id < 1 << _BATCH_BITS:
        raise ValueError(f"batch id must be in [0, 2**32), found {batch_id}")
    return _V2 | (batch_id << _DIGEST_BITS) | digest_bits(hexdigest)


def read_marker(offset: int | None) -> Marker | None:
    """The marker an offset encodes, None when the group has no marker."""
    if offset is None or offset < 1:  # NO_OFFSET (-1001) or the unused 0
        return None
    if offset >= _V2:
        return Marker((offset >> _DIGEST_BITS) & ((1 << _BATCH_BITS) - 1), offset & ((1 << _DIGEST_BITS) - 1))
    return Marker(offset - 1)


class MarkerAction(StrEnum):
    WRITE = "write"  # a new batch
    SKIP = "skip"  # a replay of the committed batch
    REWRITE = "rewrite"  # the batch was planned again after a restore of an older snapshot: write it again


def marker_decision(marker: Marker | None, batch_id: int, hexdigest: str) -> MarkerAction:
    """Skip only a replay of the very batch the marker names; write a batch that came back with other content.

    Spark replays only the batch after the last one it completed, so a marker at a LATER batch, or at
    this batch with another digest, means the query was restored to an older snapshot (time travel):
    its batches are written again (Kafka cannot unpublish the abandoned ones, as with Flink).
    """
    if marker is None or marker.batch_id < batch_id:
        return MarkerAction.WRITE
    if marker.batch_id == batch_id and (marker.digest is None or marker.digest == digest_bits(hexdigest)):
        return MarkerAction.SKIP
    return MarkerAction.REWRITE


@dataclass(frozen=True)
class AttemptTag:
    """Who wrote a record: (query id, batch, sink partition) and the attempt, sortable by start time."""

    query_id: str
    batch_id: int
    partition: int
    attempt: str

    def encode(self) -> bytes:
        return f"{self.query_id}/{self.batch_id}/{self.partition}/{self.attempt}".encode()

    @classmethod
    def decode(cls, value: bytes) -> AttemptTag:
        query_id, batch, partition, attempt = value.decode().rsplit("/", 3)
        return cls(query_id, int(batch), int(partition), attempt)


def new_attempt(now_ns: int, random_hex: str) -> str:
    """An attempt id that sorts by start time (16 hex digits of ns: fixed width until the year 2554)."""
    return f"{now_ns:016x}-{random_hex}"
