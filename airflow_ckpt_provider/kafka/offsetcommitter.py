"""The offset committer: commits Kafka offsets to a consumer group on its own thread, newest wins.

Used by the commit-on-completion listeners (kafka/committer.py), in the Spark driver program. A
single-slot mailbox: ``submit`` never blocks or raises; pending offsets are merged under newer ones;
a failed commit is retried with the next batch (and, when the broker did not answer, on its own after
a backoff); ``close()`` makes one last attempt. Commits go through
``AdminClient.alter_consumer_group_offsets`` (no group join, every call bounded; the client is
replaced after a commit that got no answer). No pyspark import. Details and guarantees: docs/kafka.md.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.kafka.clientlog import configured, serve
from airflow_ckpt_provider.kafka.offsets import Offsets, flatten, format_offsets

log = logging.getLogger(__name__)

#: Seconds for every broker call, and for close() to drain the last commit.
DEFAULT_TIMEOUT = 10.0
#: Seconds before offsets the broker did not answer for are retried without a new batch; doubled
#: after each such failure, up to MAX_RETRY_INTERVAL.
DEFAULT_RETRY_INTERVAL = 5.0
MAX_RETRY_INTERVAL = 30.0

KafkaConf = Mapping[str, str | int | float | bool]


class OffsetCommitError(CkptError):
    """Kafka refused an offset commit, or did not answer in time (the request or some partitions)."""

    def __init__(self, message: str, failed: Offsets | None = None, *, unanswered: bool = False) -> None:
        super().__init__(message)
        #: The partitions that were not committed; None: all of the request.
        self.failed = failed
        #: The broker never answered (timeout, connection lost): nothing was learnt about the offsets.
        self.unanswered = unanswered


#: librdkafka's own errors that mean the request got no answer from the broker.
_NO_ANSWER = frozenset({"_TIMED_OUT", "_TIMED_OUT_QUEUE", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE",
                        "_WAIT_COORD", "_DESTROY"})


def _unanswered(err: BaseException) -> bool:
    """True for a request the broker never answered (our wait or librdkafka's timed out, no connection)."""
    if isinstance(err, concurrent.futures.TimeoutError):
        return True
    kafka_error = err.args[0] if err.args else None
    name = getattr(kafka_error, "name", None)
    return callable(name) and name() in _NO_ANSWER


class CommitBackend(Protocol):
    """Commits offsets for a group; raises on any failure, including a single partition's."""

    def commit(self, group_id: str, offsets: Offsets) -> None: ...

    def close(self) -> None: ...


class AdminCommitBackend:
    """Commits with ``AdminClient.alter_consumer_group_offsets``: no group join, every call bounded.

    Committing for a group does not require joining it: the broker accepts an OffsetCommit with no
    member id and generation -1 (librdkafka sends exactly that here; ``Consumer.commit(offsets=...)``
    with a ``group.id`` and no ``subscribe`` does too, but its synchronous form takes no timeout).
    On Apache Kafka this works only while the group has no active members: a group used by running
    consumers rejects it (UNKNOWN_MEMBER_ID), so ``commitGroupId`` must be a group of its own.
    Confirmed on tansu (commit, read back, per-partition errors for unknown topics).

    After a commit that got no answer the client is dropped and the next commit builds a new one. A
    request that timed out waiting for the group coordinator leaves librdkafka 2.16 a coordinator
    request that outlives it: once the broker is back it aborted the process in every run on tansu
    (``Assertion `eonce->refcnt > 0' failed``); a Spark driver saw every later commit time out.
    Destroying the client ends that request cleanly (~50 ms).
    """

    def __init__(self, bootstrap_servers: str, conf: KafkaConf | None = None, timeout: float = DEFAULT_TIMEOUT,
                 *, client_factory: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.conf = dict(conf or {})
        self.timeout = timeout
        self._factory = client_factory  # None: confluent_kafka's AdminClient (tests inject a fake)
        self._admin: Any = None
        self._unanswered = 0  # commits in a row that got no answer, each followed by a new client

    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient

            factory = self._factory or AdminClient
            try:
                self._admin = factory(configured({**self.conf, "bootstrap.servers": self.bootstrap_servers}))
            except (KafkaException, ValueError, TypeError) as err:
                raise ConfigError(f"invalid Kafka client configuration for offset commits: {err}") from err
        return self._admin

    def _replace_client(self, group_id: str, err: BaseException) -> None:
        """Drop the client after a commit that got no answer (see the class doc); the next commit builds one."""
        self._unanswered += 1
        serve(self._admin)  # its queued lines first (the "unreachable" line)
        self.close()
        (log.info if self._unanswered == 1 else log.debug)(
            "Replacing the Kafka admin client of group %s at %s after %d commit(s) without an answer (%s)",
            group_id, self.bootstrap_servers, self._unanswered, err or type(err).__name__,
        )

    def commit(self, group_id: str, offsets: Offsets) -> None:
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

        partitions = [TopicPartition(t, p, o) for (t, p), o in sorted(flatten(offsets).items())]
        request = [ConsumerGroupTopicPartitions(group_id, partitions)]
        try:
            futures = self._client().alter_consumer_group_offsets(request, request_timeout=self.timeout)
            result = futures[group_id].result(timeout=self.timeout + 1.0)
        except (KafkaException, concurrent.futures.TimeoutError) as err:
            unanswered = _unanswered(err)
            if unanswered:
                self._replace_client(group_id, err)
            raise OffsetCommitError(
                f"group {group_id!r} at {self.bootstrap_servers}: commit failed or got no answer within "
                f"{self.timeout:.0f} s: {err or type(err).__name__}", unanswered=unanswered,
            ) from err
        finally:
            if self._admin is not None:
                serve(self._admin)
        self._unanswered = 0
        failed = [tp for tp in result.topic_partitions if tp.error]
        if failed:
            problems = "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in failed[:5])
            not_committed: Offsets = {}
            for tp in failed:
                not_committed.setdefault(tp.topic, {})[tp.partition] = offsets[tp.topic][tp.partition]
            raise OffsetCommitError(
                f"group {group_id!r}: {len(failed)} of {len(partitions)} partitions not committed: {problems}",
                not_committed,
            )

    def close(self) -> None:
        # AdminClient has no close() in confluent-kafka 2.16: dropping the last reference destroys
        # the librdkafka handle and its threads.
        self._admin = None


@dataclass(frozen=True)
class CommitterStats:
    """Counters of one committer; ``skipped`` counts submissions superseded before their commit."""

    group_id: str
    submitted: int
    committed: int
    skipped: int
    failed: int
    last_committed_batch: int | None
    last_error: str | None
    pending: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Submission:
    offsets: Offsets
    batch_id: int | None
    query_id: str | None
    # Partitions whose offsets are a failed attempt's, carried into this one: retried once only.
    carried: frozenset[tuple[str, int]] = frozenset()

    def merged_under(self, newer: _Submission) -> _Submission:
        """This submission's partitions, overridden by ``newer``'s (newest wins per partition)."""
        offsets = {t: dict(parts) for t, parts in self.offsets.items()}
        for topic, parts in newer.offsets.items():
            offsets.setdefault(topic, {}).update(parts)
        carried = self.carried - flatten(newer.offsets).keys()
        return _Submission(offsets, newer.batch_id, newer.query_id, carried)

    def retained_after(self, failed: Offsets | None) -> tuple[_Submission | None, list[tuple[str, int]]]:
        """What stays pending after ``failed`` partitions (None: all) were not committed, and the
        partitions given up: those that failed already before and were not submitted again since."""
        keys = flatten(self.offsets).keys() if failed is None else flatten(failed).keys()
        keep = sorted(k for k in keys if k not in self.carried)
        dropped = sorted(k for k in keys if k in self.carried)
        if not keep:
            return None, dropped
        offsets: Offsets = {}
        for topic, partition in keep:
            offsets.setdefault(topic, {})[partition] = self.offsets[topic][partition]
        return _Submission(offsets, self.batch_id, self.query_id, frozenset(keep)), dropped

    def describe(self) -> str:
        return f"batch {self.batch_id} of query {self.query_id}"


class OffsetCommitter:
    """Commits offsets to group ``group_id`` on its own thread, through a single-slot mailbox.

    ``submit`` never blocks and never raises. If commits fall behind, pending offsets are merged
    with newer ones per partition (newest wins), so only the newest are committed and older
    submissions are skipped (one warning, then a counter), as Flink does. A failed commit is logged
    and the partitions that failed stay pending until the next submission (merged under it)
    retries them; a partition that fails again without being submitted again (e.g. a topic the
    query no longer reads) is given up, with a warning. When the broker did not answer (an outage),
    nothing is given up and the thread also retries on its own after ``retry_interval`` (doubled per
    such failure, at most MAX_RETRY_INTERVAL), so an idle query's group still catches up after an
    outage. A failure never propagates. ``close()``
    makes one last attempt at whatever is pending (bounded by ``timeout``) and releases the client.
    Offsets are committed exactly as submitted: a query restored from an older snapshot (time
    travel) moves the group back, which is where the query is.
    """

    def __init__(
        self,
        group_id: str,
        bootstrap_servers: str | None = None,
        conf: KafkaConf | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        backend: CommitBackend | None = None,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
    ) -> None:
        if not group_id:
            raise ConfigError("no consumer group given: pass the group id that offsets are committed to")
        if not retry_interval > 0:
            raise ConfigError(f"retry interval of offset commits must be positive, found {retry_interval}")
        if backend is None:
            if not bootstrap_servers:
                raise ConfigError(f"no bootstrap servers given for committing offsets to group {group_id!r}")
            backend = AdminCommitBackend(bootstrap_servers, conf, timeout)
        self.group_id = group_id
        self.timeout = timeout
        self._backend = backend
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pending: _Submission | None = None
        self._fresh = False  # a submission arrived that no attempt has taken yet
        self._busy = False  # the thread is inside backend.commit
        self._closing = False
        self._final_done = False
        self._submitted = self._committed = self._skipped = self._failed = 0
        self._consecutive_failures = 0
        self.retry_interval = retry_interval
        self._unanswered = 0  # failures in a row where the broker did not answer
        self._retry_at: float | None = None  # when the pending offsets are retried without a submission
        self._last_batch: int | None = None
        self._last_error: str | None = None
        self._last_offsets: Offsets = {}

    # -- caller side -------------------------------------------------------------------------

    def submit(self, offsets: Offsets, batch_id: int | None = None, query_id: str | None = None) -> None:
        """Queue ``offsets`` (next offsets to read) of a completed batch; returns at once."""
        if not offsets:
            return
        item = _Submission({t: dict(parts) for t, parts in offsets.items()}, batch_id, query_id)
        with self._cond:
            if self._closing:
                log.warning("Offset committer of group %s is closed: %s not committed", self.group_id, item.describe())
                return
            self._submitted += 1
            if self._pending is not None and self._fresh:
                self._skipped += 1
                if self._skipped == 1:
                    log.warning(
                        "Offset commits to group %s fall behind: %s superseded by %s before it was committed; "
                        "only the newest offsets are committed (further skips are counted, not logged)",
                        self.group_id, self._pending.describe(), item.describe(),
                    )
            self._pending = item if self._pending is None else self._pending.merged_under(item)
            self._fresh = True
            self._start_thread()
            self._cond.notify_all()

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Wait until every submission was attempted; True if the last attempt committed everything."""
        with self._cond:
            self._cond.wait_for(lambda: not self._fresh and not self._busy, timeout)
            return not self._fresh and not self._busy and self._settled()

    def _settled(self) -> bool:
        return self._pending is None and self._consecutive_failures == 0

    def committed_offsets(self) -> Offsets:
        """What this committer last committed successfully, per partition."""
        with self._cond:
            return {t: dict(parts) for t, parts in self._last_offsets.items()}

    def stats(self) -> CommitterStats:
        with self._cond:
            return CommitterStats(
                group_id=self.group_id,
                submitted=self._submitted,
                committed=self._committed,
                skipped=self._skipped,
                failed=self._failed,
                last_committed_batch=self._last_batch,
                last_error=self._last_error,
                pending=self._pending is not None,
            )

    def close(self, timeout: float | None = None) -> bool:
        """Make one last attempt at pending offsets, stop the thread, release the client; idempotent.

        Returns True when the thread stopped within ``timeout`` (default: the broker timeout + 1 s)
        and its last attempt committed everything. A thread stuck in a broker call is left behind
        (a daemon).
        """
        wait = self.timeout + 1.0 if timeout is None else timeout
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is None:
            self._close_backend()
            return True
        thread.join(wait)
        if thread.is_alive():
            log.warning("Offset committer of group %s still busy after %.1f s; leaving its thread", self.group_id, wait)
            return False
        with self._cond:
            if not self._settled():
                log.warning(
                    "Offset committer of group %s closed after a failed commit (last error: %s); the group stays "
                    "at batch %s until the query commits again",
                    self.group_id, self._last_error, self._last_batch,
                )
            return self._settled()

    # -- committing thread ---------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"offset-committer-{self.group_id}", daemon=True)
            self._thread.start()

    def _take(self) -> tuple[_Submission, bool] | None:
        """The next submission to commit and whether it is a retry without a new submission, or None
        to stop (called with the lock held)."""
        while not (self._fresh or self._closing):
            due = self._retry_at if self._pending is not None else None
            if due is None:
                self._cond.wait()
            elif due > time.monotonic():
                self._cond.wait(due - time.monotonic())
            else:
                break
        own_retry = not (self._fresh or self._closing)
        if self._closing:
            if self._pending is None or self._final_done:
                return None
            self._final_done = True
        item, self._pending, self._fresh, self._busy = self._pending, None, False, True
        self._retry_at = None
        assert item is not None  # fresh, closing with offsets pending, or a due retry of pending ones
        return item, own_retry

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    taken = self._take()
                if taken is None:
                    return
                retained, retry_in = self._attempt(*taken)
                with self._cond:
                    self._busy = False
                    if retained is not None:
                        # Keep the failed offsets pending: the next submission merges over them.
                        self._pending = retained if self._pending is None else retained.merged_under(self._pending)
                        if retry_in is not None:
                            self._retry_at = time.monotonic() + retry_in
                    self._cond.notify_all()
        finally:
            self._close_backend()

    def _attempt(self, item: _Submission, own_retry: bool = False) -> tuple[_Submission | None, float | None]:
        """Commit ``item``; on failure return what stays pending, and in how many seconds to retry it
        without a new submission (None: only with the next one)."""
        try:
            self._backend.commit(self.group_id, item.offsets)
        except Exception as err:  # never into Spark: logged, counted, retried with the next batch
            message = str(err) or type(err).__name__
            failed = err.failed if isinstance(err, OffsetCommitError) else None
            retry_in: float | None = None
            with self._cond:
                self._failed += 1
                self._consecutive_failures += 1
                self._last_error = message
                if failed is not None:  # Kafka took the other partitions
                    self._remember(item.offsets, failed)
                if isinstance(err, OffsetCommitError) and err.unanswered:
                    self._unanswered += 1
                    retry_in = min(self.retry_interval * 2 ** (self._unanswered - 1), MAX_RETRY_INTERVAL)
                else:
                    self._unanswered = 0
            # No answer: nothing was learnt about the partitions, so none is given up.
            retained, dropped = (item, []) if retry_in is not None else item.retained_after(failed)
            when = "with the next batch" if retry_in is None else f"with the next batch or in {retry_in:g} s"
            # A failed retry of the committer's own repeats a failure already logged at WARNING.
            (log.debug if own_retry else log.warning)(
                "Offset commit to group %s failed for %s (retried %s): %s",
                self.group_id, item.describe(), when, message,
            )
            if dropped:
                log.warning(
                    "Giving up committing %s to group %s: failed twice and not submitted again",
                    ", ".join(f"{t}[{p}]" for t, p in dropped), self.group_id,
                )
            return retained, retry_in
        with self._cond:
            first, recovered = self._committed == 0, self._consecutive_failures
            self._committed += 1
            self._consecutive_failures = self._unanswered = 0
            self._last_batch = item.batch_id
            self._remember(item.offsets, {})
        if first or recovered:
            log.info(
                "Committed offsets of %s to group %s%s: %s",
                item.describe(), self.group_id, f" after {recovered} failed attempts" if recovered else "",
                format_offsets(item.offsets),
            )
        else:
            log.debug("Committed offsets of %s to group %s: %s", item.describe(), self.group_id,
                      format_offsets(item.offsets))
        return None, None

    def _remember(self, offsets: Offsets, failed: Offsets) -> None:
        """Record the partitions of ``offsets`` that Kafka accepted (all but ``failed``)."""
        skip = flatten(failed).keys()
        for (topic, partition), offset in flatten(offsets).items():
            if (topic, partition) not in skip:
                self._last_offsets.setdefault(topic, {})[partition] = offset

    def _close_backend(self) -> None:
        try:
            self._backend.close()
        except Exception:  # releasing a client must not fail a shutdown
            log.exception("Cannot close the Kafka client of offset committer %s", self.group_id)
