"""Consumer lag of a consumer group, or of a Spark checkpoint, against the partitions' high watermarks.

Used by the CLI (``ckpt kafka lag``) and the Airflow sensor. The lag of a partition is
``high watermark - offset``, where the offset is the next offset to read (a committed group offset,
or a checkpoint's end offset of its latest completed batch). High watermarks come from the standard
ListOffsets(LATEST) request, which is correct on Apache Kafka. Deviation of the tansu test broker:
it answers with the base offset of the LAST record batch + 1, so its high watermarks are exact only
when every record batch holds one record (the tests produce with ``batch.num.messages=1``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage
from airflow_ckpt_provider.kafka.clientlog import configured, serve
from airflow_ckpt_provider.kafka.offsets import Offsets, kafka_offsets_or_none

DEFAULT_TIMEOUT = 10.0

KafkaConf = Mapping[str, str | int | float | bool]


class LagError(CkptError):
    """Kafka could not tell the offsets or watermarks a lag report needs."""


@dataclass(frozen=True)
class PartitionLag:
    """One partition: the next offset to read (None: the group never committed one) and its lag.

    Without an offset the lag is ``high - low``: every record still on the broker is unread.
    The lag is never negative (an offset beyond the high watermark counts as caught up).
    """

    topic: str
    partition: int
    offset: int | None
    low: int
    high: int

    @property
    def lag(self) -> int:
        start = self.low if self.offset is None else self.offset
        return max(0, self.high - start)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "low": self.low, "high": self.high, "lag": self.lag}


@dataclass(frozen=True)
class LagReport:
    """Per-partition lag of a consumer group (kind "group") or a checkpoint (kind "checkpoint")."""

    kind: str
    name: str
    partitions: tuple[PartitionLag, ...]
    batch_id: int | None = None  # the checkpoint's latest completed batch

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "batch_id": self.batch_id, "total_lag": self.total_lag,
                "partitions": [p.to_dict() for p in self.partitions]}


def consumer_group_lag(
    bootstrap_servers: str,
    group: str,
    topics: Collection[str] | None = None,
    conf: KafkaConf | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> LagReport:
    """The lag of ``group`` on ``topics`` (default: every topic it committed offsets for).

    Every partition of those topics is reported, also those without a committed offset. An
    unknown group has no committed offsets: without ``topics`` the report is empty.
    """
    with _admin(bootstrap_servers, conf) as admin:
        committed = _committed(admin, group, timeout)
        wanted = set(topics) if topics is not None else set(committed)
        return _report(admin, "group", group, {t: committed.get(t, {}) for t in wanted}, timeout)


def checkpoint_lag(
    bootstrap_servers: str,
    checkpoint: Storage | str | Mapping[str, Mapping[int, int]],
    *,
    topics: Collection[str] | None = None,
    conf: KafkaConf | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    s3_options: S3Options | None = None,
) -> LagReport:
    """The lag of a Spark checkpoint: its latest completed batch's Kafka end offsets vs the watermarks.

    ``checkpoint`` is a checkpoint location (directory or s3://), a Storage, or offsets already
    read. Every source whose offset is Kafka-shaped counts (``ckpt-kafka`` and Spark's Kafka
    source write the same JSON); a partition two sources read counts at the lower offset.
    """
    batch_id: int | None = None
    if isinstance(checkpoint, Mapping):
        name = "offsets"
        offsets: Offsets = {t: dict(parts) for t, parts in checkpoint.items()}
    else:
        from airflow_ckpt_provider.core.snapshots.checkpoint import SparkCheckpoint

        storage = checkpoint if isinstance(checkpoint, Storage) else open_storage(checkpoint, s3_options)
        name = storage.uri()
        view = SparkCheckpoint(storage).view(write_ahead=False)
        batch_id = view.batch_id
        offsets = {}
        for text in view.offsets:
            for topic, parts in (kafka_offsets_or_none(text) or {}).items():
                mine = offsets.setdefault(topic, {})
                for partition, offset in parts.items():
                    mine[partition] = min(offset, mine.get(partition, offset))
        if not offsets:
            raise ConfigError(
                f"checkpoint {name} at batch {batch_id} has no Kafka source: expected a source offset like "
                '{"topic": {"0": 42}}, found ' + (", ".join(str(o)[:60] for o in view.offsets) or "no sources")
            )
    if topics is not None:
        offsets = {t: offsets.get(t, {}) for t in topics}
    with _admin(bootstrap_servers, conf) as admin:
        report = _report(admin, "checkpoint", name, offsets, timeout)
    return LagReport(report.kind, report.name, report.partitions, batch_id)


# ------------------------------------------------------------------------------------------------
# Broker calls: each with a timeout, every per-partition error checked
# ------------------------------------------------------------------------------------------------


@contextmanager
def _admin(bootstrap_servers: str, conf: KafkaConf | None) -> Iterator[Any]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if not bootstrap_servers:
        raise ConfigError("no Kafka bootstrap servers given: pass host:port[,host:port...]")
    try:
        admin = AdminClient(configured({**dict(conf or {}), "bootstrap.servers": bootstrap_servers}))
    except (KafkaException, ValueError, TypeError) as err:
        raise ConfigError(f"invalid Kafka client configuration: {err}") from err
    try:
        yield admin
    finally:
        serve(admin)
        # AdminClient has no close() in confluent-kafka 2.16; the last reference going frees it.
        del admin


def _result(future: concurrent.futures.Future[Any], timeout: float, what: str) -> Any:
    from confluent_kafka import KafkaException

    try:
        return future.result(timeout=timeout + 1.0)
    except (KafkaException, concurrent.futures.TimeoutError) as err:
        raise LagError(f"cannot {what} within {timeout:.0f} s: {err or type(err).__name__}") from err


def _committed(admin: Any, group: str, timeout: float) -> Offsets:
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=timeout)
    result = _result(futures[group], timeout, f"list the committed offsets of group {group!r}")
    out: Offsets = {}
    for tp in result.topic_partitions:
        if tp.error:
            raise LagError(
                f"group {group!r}: cannot read the committed offset of {tp.topic}[{tp.partition}]: {tp.error}"
            )
        if tp.offset >= 0:  # OFFSET_INVALID (-1001): no committed offset
            out.setdefault(tp.topic, {})[tp.partition] = tp.offset
    return out


def _partitions(admin: Any, topics: Collection[str], timeout: float) -> dict[str, list[int]]:
    from confluent_kafka import KafkaException

    try:
        # All topics, not list_topics(topic=...): a metadata request for one topic may auto-create it.
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as err:
        raise LagError(f"cannot read topic metadata within {timeout:.0f} s: {err}") from err
    out: dict[str, list[int]] = {}
    for topic in sorted(topics):
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise LagError(
                f"topic {topic!r} not found on the cluster ({found.error if found else 'no metadata'}); "
                "check the topic name"
            )
        out[topic] = sorted(found.partitions)
    return out


def _watermarks(
    admin: Any, partitions: list[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, high) watermark of every partition: ListOffsets EARLIEST and LATEST (read_uncommitted,
    as kafka-consumer-groups.sh reports lag)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # public; its stubs miss it

    specs: Any = OffsetSpec
    ends: dict[str, dict[tuple[str, int], int]] = {}
    for name, spec in (("low", specs.earliest()), ("high", specs.latest())):
        futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions}, request_timeout=timeout)
        ends[name] = {
            (tp.topic, tp.partition): _result(f, timeout, f"list the {name} watermark of {tp.topic}[{tp.partition}]")
            .offset
            for tp, f in futures.items()
        }
    return {tp: (ends["low"][tp], ends["high"][tp]) for tp in partitions}


def _report(admin: Any, kind: str, name: str, offsets: Offsets, timeout: float) -> LagReport:
    layout = _partitions(admin, offsets, timeout) if offsets else {}
    partitions = [(t, p) for t, parts in layout.items() for p in parts]
    marks = _watermarks(admin, partitions, timeout) if partitions else {}
    rows = tuple(
        PartitionLag(t, p, offsets.get(t, {}).get(p), *marks[(t, p)]) for t, p in partitions
    )
    return LagReport(kind, name, rows)


# ------------------------------------------------------------------------------------------------
# Waiting on lag
# ------------------------------------------------------------------------------------------------


class LagCondition(StrEnum):
    BELOW = "below"  # total lag < threshold: e.g. threshold 1 waits until the group caught up
    ABOVE = "above"  # total lag > threshold: the group falls behind


#: The closed set of LagWatch event statuses (the trigger adds "timeout" and "error").
LAG_EVENTS = frozenset({"met"})


class LagWatch:
    """Waits until the total lag of consumer group ``group`` is below (or above) ``threshold``.

    Each poll asks the brokers (``consumer_group_lag``). A Kafka error (LagError: a broker down, a
    topic not there yet) keeps the watch polling and is remembered for ``waiting_for``: it fails only
    by the caller's timeout. A bad configuration (ConfigError) raises. Without ``topics`` a group that
    committed nothing has no partitions to judge, which is never "met".
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        topics: Collection[str] | None = None,
        *,
        threshold: int,
        condition: str = LagCondition.BELOW,
        conf: KafkaConf | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        try:
            self.condition = LagCondition(condition)
        except ValueError:
            raise ConfigError(f"invalid lag condition {condition!r}: expected 'below' or 'above'") from None
        self.bootstrap_servers = bootstrap_servers
        self.group = group
        self.topics = list(topics) if topics is not None else None
        self.threshold = int(threshold)
        self.conf = dict(conf or {})
        self.timeout = timeout
        self.last_error: str | None = None
        self.last_report: LagReport | None = None

    def _met(self, total: int) -> bool:
        return total < self.threshold if self.condition is LagCondition.BELOW else total > self.threshold

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        try:
            report = consumer_group_lag(self.bootstrap_servers, self.group, self.topics, self.conf, self.timeout)
        except LagError as err:
            self.last_error = str(err)
            return None
        self.last_error, self.last_report = None, report
        if not report.partitions or not self._met(report.total_lag):
            return None
        return {
            "status": "met", "group": self.group, "total_lag": report.total_lag,
            "partitions": [p.to_dict() for p in report.partitions],
            "condition": self.condition.value, "threshold": self.threshold,
            "message": f"consumer group {self.group!r}: total lag {report.total_lag} is {self.condition.value} "
                       f"{self.threshold} over {len(report.partitions)} partitions",
        }

    def waiting_for(self) -> str:
        expected = f"consumer group {self.group!r}: expected a total lag {self.condition.value} {self.threshold}"
        if self.last_error is not None:
            return f"{expected}; the last poll failed: {self.last_error}"
        if self.last_report is None:
            return f"{expected}; no lag read yet"
        if not self.last_report.partitions:
            return f"{expected}; the group has committed no offsets (pass its topics to count unread records)"
        return f"{expected}; last seen {self.last_report.total_lag} over {len(self.last_report.partitions)} partitions"


class LagAboveWatch:
    """Announces each time the total lag of ``group`` rises above ``threshold``: once per crossing, re-armed
    when the lag is back below ``rearm_below`` (default ``threshold``; core/watches/events.Crossing). A Kafka
    error (LagError) is remembered for ``waiting_for`` and the state is kept until Kafka answers again.

    ``cursor`` / ``cursor()``: the crossing's state (``{"armed": bool}``), to carry it over a restart.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        topics: Collection[str] | None = None,
        *,
        threshold: int,
        rearm_below: int | None = None,
        conf: KafkaConf | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        cursor: Mapping[str, Any] | None = None,
    ) -> None:
        # Imported here: the triggerer imports this module on its event loop (triggers/kafka_lag.py), and the
        # watches' module brings the job store's.
        from airflow_ckpt_provider.core.watches.events import Crossing

        self.crossing = Crossing(int(threshold), rearm_below=rearm_below, cursor=cursor)
        self.bootstrap_servers = bootstrap_servers
        self.group = group
        self.topics = list(topics) if topics is not None else None
        self.conf = dict(conf or {})
        self.timeout = timeout
        self.last_error: str | None = None
        self.last_report: LagReport | None = None

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        try:
            report = consumer_group_lag(self.bootstrap_servers, self.group, self.topics, self.conf, self.timeout)
        except LagError as err:
            self.last_error = str(err)
            return None
        self.last_error, self.last_report = None, report
        if not report.partitions or not self.crossing.update(report.total_lag):
            return None
        return {
            "status": "above", "group": self.group, "total_lag": report.total_lag,
            "threshold": int(self.crossing.threshold), "rearm_below": int(self.crossing.rearm_below),
            "partitions": [p.to_dict() for p in report.partitions],
            "message": f"consumer group {self.group!r}: total lag {report.total_lag} rose above "
                       f"{self.crossing.threshold:g} over {len(report.partitions)} partitions",
        }

    def cursor(self) -> dict[str, Any]:
        return self.crossing.cursor()

    def waiting_for(self) -> str:
        armed = (f"expected a total lag above {self.crossing.threshold:g}" if self.crossing.armed else
                 f"announced a lag above {self.crossing.threshold:g}; re-armed once below "
                 f"{self.crossing.rearm_below:g}")
        head = f"consumer group {self.group!r}: {armed}"
        if self.last_error is not None:
            return f"{head}; the last poll failed: {self.last_error}"
        if self.last_report is None:
            return f"{head}; no lag read yet"
        return f"{head}; last seen {self.last_report.total_lag} over {len(self.last_report.partitions)} partitions"
