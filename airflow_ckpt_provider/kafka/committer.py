"""Commit Kafka offsets to a consumer group after Spark completed a batch (Flink's commit on checkpoint).
Call ``enable_commit_on_completion`` (or ``ensure_listener``) in the driver program.

Design notes: docs/kafka.md#design-notes-kafkacommitterpy."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.listening import ProgressListener  # imports pyspark: only the driver imports this
from airflow_ckpt_provider.kafka.offsetcommitter import DEFAULT_TIMEOUT, KafkaConf, OffsetCommitter
from airflow_ckpt_provider.kafka.offsets import Offsets, commit_target, kafka_offsets_or_none

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
        StreamingQueryProgress,
    )

log = logging.getLogger(__name__)


class KafkaCommitListener(ProgressListener):
    """Submits each completed batch's Kafka end offsets to an :class:`OffsetCommitter`.

    Every source whose ``endOffset`` is Kafka-shaped counts: the ``ckpt-kafka`` Python source and
    Spark's JVM Kafka source (``KafkaV2[...]``) alike. ``queries`` (ids or names) and ``topics``
    narrow what is committed. Handlers never raise into Spark's listener bus and never block.
    """

    def __init__(
        self,
        committer: OffsetCommitter,
        *,
        queries: Collection[str] | None = None,
        topics: Collection[str] | None = None,
    ) -> None:
        self.committer = committer
        self.queries = frozenset(queries) if queries is not None else None
        self.topics = frozenset(topics) if topics is not None else None

    @property
    def group_id(self) -> str:
        return self.committer.group_id

    def offsets_of(self, progress: StreamingQueryProgress) -> Offsets | None:
        """The Kafka end offsets this listener commits for ``progress``, or None if it does not apply."""
        if self.queries is not None and not {str(progress.id), progress.name or ""} & self.queries:
            return None
        merged: Offsets = {}
        for source in progress.sources:
            offsets = kafka_offsets_or_none(source.endOffset)
            for topic, parts in (offsets or {}).items():
                if self.topics is None or topic in self.topics:
                    merged.setdefault(topic, {}).update(parts)
        return merged or None

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        log.debug("Query %s (%s) started; offsets go to group %s", event.id, event.name, self.group_id)

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        try:
            progress = event.progress
            offsets = self.offsets_of(progress)
            if offsets is not None:
                self.committer.submit(offsets, progress.batchId, str(progress.id))
        except Exception:  # a listener that raises is logged by Spark and kept; be explicit instead
            log.exception("Cannot submit the offsets of a progress event to group %s", self.group_id)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        log.debug("Query %s terminated; group %s keeps its last committed offsets", event.id, self.group_id)

    def close(self, timeout: float | None = None) -> bool:
        """Close the committer (one last attempt at pending offsets); see :meth:`OffsetCommitter.close`."""
        return self.committer.close(timeout)


#: Guards the registries below and the routers' committer maps.
_lock = threading.Lock()


class SourceCommitRouter(ProgressListener):
    """Commits for ``ckpt-kafka`` sources that set ``commitGroupId``: the group is in their end offset.

    One per session (installed by ``source.register``); one :class:`OffsetCommitter` per group.
    """

    def __init__(self, conf: KafkaConf | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.conf = dict(conf or {})
        self.timeout = timeout
        self.committers: dict[tuple[str, str], OffsetCommitter] = {}

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        try:
            for source in progress.sources:
                target = commit_target(source.endOffset)
                offsets = kafka_offsets_or_none(source.endOffset)
                if target is not None and offsets is not None:
                    self._committer(*target).submit(offsets, progress.batchId, str(progress.id))
        except Exception:  # never raise into Spark's listener bus
            log.exception("Cannot submit the offsets of batch %s of query %s", progress.batchId, progress.id)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    def _committer(self, group_id: str, servers: str) -> OffsetCommitter:
        with _lock:
            committer = self.committers.get((group_id, servers))
            if committer is None:
                committer = OffsetCommitter(group_id, servers, self.conf, timeout=self.timeout)
                self.committers[(group_id, servers)] = committer
                log.info("Offsets of completed batches are committed to group %s at %s (commitGroupId)",
                         group_id, servers)
            return committer

    def close(self, timeout: float | None = None) -> bool:
        with _lock:
            committers = list(self.committers.values())
        closed = [c.close(timeout) for c in committers]  # close every one, even after a failure
        return all(closed)


_routers: dict[int, tuple[Any, SourceCommitRouter]] = {}


def ensure_source_router(spark: SparkSession, conf: KafkaConf | None = None) -> SourceCommitRouter:
    """The session's :class:`SourceCommitRouter`, registered on first call; idempotent."""
    with _lock:
        found = _routers.get(id(spark))
        if found is not None:
            return found[1]
        router = SourceCommitRouter(conf)
        spark.streams.addListener(router)
        _routers[id(spark)] = (spark, router)
        return router


# ------------------------------------------------------------------------------------------------
# Registration: one listener per (session, group)
# ------------------------------------------------------------------------------------------------

# (id of the Python SparkSession, group) -> (session kept alive so its id is not reused, listener, settings)
_listeners: dict[tuple[int, str], tuple[Any, KafkaCommitListener, tuple[str, tuple[tuple[str, str], ...]]]] = {}


def ensure_listener(
    spark: SparkSession,
    group_id: str,
    bootstrap_servers: str,
    conf: KafkaConf | None = None,
    *,
    topics: Collection[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> KafkaCommitListener:
    """The commit listener of ``group_id`` on ``spark``, registered on first call; idempotent.

    Call it in the driver program (the process that owns ``spark``). Later calls for the same
    session and group return the same listener and widen its topic filter (None: all topics);
    other bootstrap servers or client settings for the same group are a ConfigError.
    """
    settings = (bootstrap_servers, tuple(sorted((k, str(v)) for k, v in (conf or {}).items())))
    key = (id(spark), group_id)
    with _lock:
        found = _listeners.get(key)
        if found is not None:
            _session, listener, known = found
            if known != settings:
                raise ConfigError(
                    f"group {group_id!r} already commits offsets through {known[0]} with other client settings; "
                    f"expected the same bootstrap servers and settings, found {bootstrap_servers}. Use one "
                    "configuration per group, or another group"
                )
            if listener.topics is not None:
                listener.topics = None if topics is None else listener.topics | frozenset(topics)
            return listener
        listener = KafkaCommitListener(
            OffsetCommitter(group_id, bootstrap_servers, conf, timeout=timeout), topics=topics
        )
        spark.streams.addListener(listener)
        _listeners[key] = (spark, listener, settings)
    log.info("Offsets of completed batches are committed to group %s at %s (topics: %s)",
             group_id, bootstrap_servers, ", ".join(sorted(topics)) if topics is not None else "all")
    return listener


def enable_commit_on_completion(
    spark: SparkSession,
    group_id: str,
    bootstrap_servers: str,
    *,
    topics: Collection[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    **kafka_conf: str | int | float | bool,
) -> KafkaCommitListener:
    """Commit the Kafka end offsets of every completed batch of ``spark``'s queries to ``group_id``.

    librdkafka settings go in ``kafka_conf``, e.g. ``**{"security.protocol": "SSL"}``. Same
    listener as :func:`ensure_listener`; undo with :func:`disable_commit_on_completion`.
    """
    return ensure_listener(spark, group_id, bootstrap_servers, kafka_conf, topics=topics, timeout=timeout)


def disable_commit_on_completion(
    spark: SparkSession, listener: KafkaCommitListener, timeout: float | None = None
) -> bool:
    """Unregister ``listener`` and close its committer (one last attempt at pending offsets)."""
    spark.streams.removeListener(listener)
    with _lock:
        for key, (_session, known, _settings) in list(_listeners.items()):
            if known is listener:
                del _listeners[key]
    return listener.close(timeout)


def _close_all() -> None:
    """At interpreter exit: drain what the registered listeners still hold (bounded)."""
    with _lock:
        listeners = [listener for _session, listener, _settings in _listeners.values()]
        _listeners.clear()
        routers = [router for _session, router in _routers.values()]
        _routers.clear()
    for listener in listeners:
        listener.close(timeout=min(listener.committer.timeout, 5.0))
    for router in routers:
        router.close(timeout=min(router.timeout, 5.0))


atexit.register(_close_all)
