"""What the ckpt-kafka source's planner asks the brokers: subscribed partitions and their offsets.

Runs in the driver's source process (a Python worker Spark starts for the DataSourceStreamReader).
A :class:`Snapshot` is one look at the cluster; :class:`BrokerMetadata` takes it with one
AdminClient, retried per the ``fetchOffset.*`` options, and never mistakes a partition whose offsets
could not be listed for a deleted one. The planner (kafka/planner.py) decides over snapshots only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_ckpt_provider.kafka.clientlog import configured, serve
from airflow_ckpt_provider.kafka.offsets import DataLossError
from airflow_ckpt_provider.kafka.options import SourceOptions

log = logging.getLogger(__name__)

#: Timeout of each driver metadata request.
REQUEST_TIMEOUT_S = 30.0
#: While a request waits for a broker, the client's queued log lines are served this often: a broker that went
#: away is logged "unreachable" (kafka/clientlog.py) within about a second, not after the request's timeout
#: (the request itself is unchanged: one call with REQUEST_TIMEOUT_S).
SERVE_INTERVAL_S = 1.0

TP = tuple[str, int]


@dataclass(frozen=True)
class Snapshot:
    """Subscribed partitions with their earliest and latest offsets at one moment.

    ``high`` is the end a consumer of the configured isolation level can read (the last stable
    offset under read_committed). Partitions that exist but whose offsets could not be listed are
    in ``unknown``; topics whose metadata carried an error are in ``unavailable_topics``: neither
    is mistaken for a deleted partition.
    """

    low: Mapping[TP, int]
    high: Mapping[TP, int]
    unknown: frozenset[TP] = frozenset()
    unavailable_topics: frozenset[str] = frozenset()


class Metadata(Protocol):
    """What the planner asks the cluster; a fake in unit tests, BrokerMetadata in production."""

    def snapshot(self) -> Snapshot: ...

    def offsets_for_timestamp(self, partitions: Sequence[TP], timestamp_ms: int) -> dict[TP, int]: ...

    def close(self) -> None: ...


class BrokerMetadata:
    """Metadata and offsets from the brokers with one AdminClient; retried per fetchOffset.* options."""

    def __init__(self, options: SourceOptions, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.options = options
        self._sleep = sleep
        self._admin: Any = None
        self._pool: ThreadPoolExecutor | None = None

    def _client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(configured(self.options.admin_config()))
        return self._admin

    def _retrying(self) -> Any:
        from confluent_kafka import KafkaException
        from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_attempt, wait_fixed

        return Retrying(
            retry=retry_if_exception_type(KafkaException),
            stop=stop_after_attempt(self.options.fetch_retries),
            wait=wait_fixed(self.options.fetch_retry_interval_ms / 1000),
            reraise=True,
            before_sleep=before_sleep_log(log, logging.WARNING),
            sleep=self._sleep,
        )

    def snapshot(self) -> Snapshot:
        partitions, unavailable = self._retrying()(self._subscribed_partitions)
        low, low_unknown = self._offsets(partitions, _offset_spec("earliest"), watermark=True)
        high, high_unknown = self._offsets(partitions, _offset_spec("latest"), watermark=True)
        unknown = low_unknown | high_unknown
        return Snapshot(
            low={tp: o for tp, o in low.items() if tp not in unknown},
            high={tp: o for tp, o in high.items() if tp not in unknown},
            unknown=frozenset(unknown),
            unavailable_topics=frozenset(unavailable),
        )

    def offsets_for_timestamp(self, partitions: Sequence[TP], timestamp_ms: int) -> dict[TP, int]:
        found, unknown = self._offsets(partitions, _offset_spec("for_timestamp", timestamp_ms))
        if unknown:
            raise DataLossError(
                f"Cannot find offsets for startingTimestamp {timestamp_ms} of {partition_names(unknown)}: the "
                "brokers did not answer; check the cluster and restart the query"
            )
        return found

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self._admin = None  # AdminClient has no close(); its threads end when it is collected

    def _subscribed_partitions(self) -> tuple[list[TP], set[str]]:
        """List all topics (naming one would auto-create it on some brokers) and keep the subscribed ones."""
        from confluent_kafka import KafkaError

        metadata = self._list_topics()
        partitions: list[TP] = []
        unavailable: set[str] = set()
        for name, topic in metadata.topics.items():
            if not self.options.subscribed(name):
                continue
            if topic.error is not None:
                if topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    unavailable.add(name)
                continue
            partitions.extend((name, p) for p in topic.partitions)
        return sorted(partitions), unavailable

    def _list_topics(self) -> Any:
        """One list_topics (REQUEST_TIMEOUT_S) in a worker thread, the client served every SERVE_INTERVAL_S while it
        waits: the same request and errors as a direct call, its lines logged as they come."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-kafka-metadata")
        future = self._pool.submit(self._client().list_topics, timeout=REQUEST_TIMEOUT_S)
        try:
            while not wait([future], timeout=SERVE_INTERVAL_S).done:
                serve(self._client())
        finally:
            serve(self._client())
        return future.result()

    def _offsets(self, partitions: Sequence[TP], spec: Any, *,
                 watermark: bool = False) -> tuple[dict[TP, int], set[TP]]:
        """Offsets of ``partitions`` for ``spec``; partitions still failing after the retries are returned apart.

        A ``watermark`` (earliest, latest) is never negative: librdkafka answers OFFSET_INVALID (-1001) without an
        error while it reconnects to a broker that was away, which taken as the partition's end would look like a
        truncated partition (data loss). Such an answer counts as a failed partition: retried, else unknown.
        """
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

        level = (
            IsolationLevel.READ_COMMITTED
            if self.options.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        found: dict[TP, int] = {}
        failed: dict[TP, str] = {}

        def attempt() -> None:
            remaining = [tp for tp in partitions if tp not in found]
            if not remaining:
                return
            failed.clear()
            futures = self._client().list_offsets(
                {TopicPartition(t, p): spec for t, p in remaining},
                isolation_level=level,
                request_timeout=REQUEST_TIMEOUT_S,
            )
            deadline, pending = time.monotonic() + REQUEST_TIMEOUT_S, set(futures.values())
            while pending and time.monotonic() < deadline:  # served while it waits (see SERVE_INTERVAL_S)
                pending = wait(pending, timeout=SERVE_INTERVAL_S).not_done
                serve(self._client())
            for tp, future in futures.items():
                if future in pending:
                    failed[(tp.topic, tp.partition)] = f"no answer within {REQUEST_TIMEOUT_S:g} s"
                    continue
                try:  # every partition carries its own error, even when the request succeeded
                    offset = int(future.result(timeout=0).offset)
                except KafkaException as err:
                    failed[(tp.topic, tp.partition)] = str(err.args[0])
                    continue
                if watermark and offset < 0:
                    failed[(tp.topic, tp.partition)] = f"the broker answered offset {offset} (no offset yet)"
                else:
                    found[(tp.topic, tp.partition)] = offset
            serve(self._client())
            if failed:
                raise KafkaException(
                    f"list offsets failed for {partition_names(failed)}: {next(iter(failed.values()))}"
                )

        try:
            self._retrying()(attempt)
        except KafkaException as err:
            log.warning("offsets unknown, retried next trigger: %s", err)
        return found, set(failed)


def _offset_spec(kind: str, timestamp_ms: int = 0) -> Any:
    """OffsetSpec.earliest() / latest() / for_timestamp(ms) of AdminClient.list_offsets."""
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # re-exported, not in __all__

    spec: Any = OffsetSpec
    return spec.for_timestamp(timestamp_ms) if kind == "for_timestamp" else getattr(spec, kind)()



def partition_name(tp: TP) -> str:
    """``topic/partition``, as messages name a partition."""
    return f"{tp[0]}/{tp[1]}"


def partition_names(tps: Any) -> str:
    """Partitions as ``t/0, t/1``, sorted."""
    return ", ".join(partition_name(tp) for tp in sorted(tps))
