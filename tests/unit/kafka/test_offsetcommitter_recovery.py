"""Recovery of offset commits after a broker outage (issue 39): the admin client is replaced after a
commit that got no answer, and offsets the broker did not answer for are retried without a new batch.

Fakes only: an injected AdminClient factory for AdminCommitBackend, a scripted backend for
OffsetCommitter. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.offsetcommitter import (
    MAX_RETRY_INTERVAL,
    AdminCommitBackend,
    OffsetCommitError,
    OffsetCommitter,
    _unanswered,
)
from airflow_ckpt_provider.kafka.offsets import Offsets

WAIT = 10.0  # upper bound of every wait; the fakes answer in microseconds
LOGGER = "airflow_ckpt_provider.kafka.offsetcommitter"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"expected {what} within {timeout:.0f} s"
        time.sleep(0.005)


# -- AdminCommitBackend with a fake AdminClient ---------------------------------------------------


class FakeAdmin:
    """Answers each alter_consumer_group_offsets with the next scripted outcome: None commits, a
    KafkaError name (``"_TIMED_OUT"``) fails the request, a set of partitions is refused per partition."""

    def __init__(self, outcomes: list[str | set[int] | None]) -> None:
        self.outcomes = outcomes
        self.requests = 0

    def alter_consumer_group_offsets(self, request: list[Any], request_timeout: float) -> dict[str, Any]:
        from confluent_kafka import KafkaError, KafkaException

        self.requests += 1
        (group,) = request
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, str):
            future.set_exception(KafkaException(KafkaError(getattr(KafkaError, outcome))))
        else:
            refused = outcome or set()
            # What the backend reads of the answer (TopicPartition.error is read-only in Python).
            parts = [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=tp.offset,
                                     error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if tp.partition in refused
                                     else None) for tp in group.topic_partitions]
            future.set_result(SimpleNamespace(group_id=group.group_id, topic_partitions=parts))
        return {group.group_id: future}

    def poll(self, timeout: float) -> int:
        return 0


@dataclass
class Factory:
    """Builds the next FakeAdmin per call; all scripted outcomes are shared, in order."""

    outcomes: list[str | set[int] | None]
    built: list[FakeAdmin] = field(default_factory=list)

    def __call__(self, conf: dict[str, Any]) -> FakeAdmin:
        assert conf["bootstrap.servers"] == "b:9092"
        self.built.append(FakeAdmin(self.outcomes))
        return self.built[-1]


def backend(factory: Factory) -> AdminCommitBackend:
    return AdminCommitBackend("b:9092", timeout=1.0, client_factory=factory)


def test_a_commit_without_an_answer_replaces_the_client_with_one_line_per_streak(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    factory = Factory(["_TIMED_OUT", "_TRANSPORT", None, None, "_TIMED_OUT"])
    b = backend(factory)
    for _ in range(2):
        with pytest.raises(OffsetCommitError, match=r"_TIMED_OUT|_TRANSPORT") as raised:
            b.commit("g", {"t": {0: 1}})
        assert raised.value.unanswered and raised.value.failed is None
    b.commit("g", {"t": {0: 2}})  # a new client answers
    b.commit("g", {"t": {0: 3}})  # ... and is kept while it answers
    with pytest.raises(OffsetCommitError):
        b.commit("g", {"t": {0: 4}})
    assert [a.requests for a in factory.built] == [1, 1, 3]  # each failure dropped the client that failed
    assert b._admin is None  # the last one too: the next commit builds a fourth
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "Replacing" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.INFO, logging.DEBUG, logging.INFO]  # a success ends a streak
    assert lines[0][1].startswith("Replacing the Kafka admin client of group g at b:9092 after 1 commit(s) "
                                  "without an answer")


def test_an_answer_from_the_broker_keeps_the_client() -> None:
    factory = Factory(["GROUP_AUTHORIZATION_FAILED", {1}, None])
    b = backend(factory)
    with pytest.raises(OffsetCommitError, match="GROUP_AUTHORIZATION_FAILED") as refused:
        b.commit("g", {"t": {0: 1, 1: 1}})
    assert not refused.value.unanswered
    with pytest.raises(OffsetCommitError, match=r"1 of 2 partitions not committed") as partial:
        b.commit("g", {"t": {0: 2, 1: 2}})
    assert not partial.value.unanswered and partial.value.failed == {"t": {1: 2}}
    b.commit("g", {"t": {0: 3, 1: 3}})
    assert len(factory.built) == 1 and factory.built[0].requests == 3


@pytest.mark.parametrize(("name", "expected"), [
    ("_TIMED_OUT", True),
    ("_ALL_BROKERS_DOWN", True),
    ("NOT_COORDINATOR", False),  # the broker answered
    ("_INVALID_ARG", False),
])
def test_which_errors_mean_no_answer(name: str, expected: bool) -> None:
    from confluent_kafka import KafkaError, KafkaException

    assert _unanswered(KafkaException(KafkaError(getattr(KafkaError, name)))) is expected
    assert _unanswered(concurrent.futures.TimeoutError())  # our own wait for the future ran out
    assert not _unanswered(KafkaException("no KafkaError inside"))


# -- OffsetCommitter retrying offsets the broker did not answer for -------------------------------


@dataclass
class ScriptedBackend:
    """Pops one outcome per attempt: None commits, "silent" raises an unanswered failure, "refused" a
    failure the broker answered; records each attempt's offsets and time."""

    outcomes: list[str | None] = field(default_factory=list)
    attempts: list[tuple[float, Offsets]] = field(default_factory=list)
    commits: list[Offsets] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def commit(self, group_id: str, offsets: Offsets) -> None:
        with self.lock:
            self.attempts.append((time.monotonic(), offsets))
            outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome == "silent":
            raise OffsetCommitError("no answer within 10 s: _TIMED_OUT", unanswered=True)
        if outcome == "refused":
            raise OffsetCommitError("broker said no")
        with self.lock:
            self.commits.append(offsets)

    def close(self) -> None:
        pass


def test_offsets_without_an_answer_are_retried_without_a_new_batch_backing_off(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    b = ScriptedBackend(["silent", "silent", "silent", None])
    c = OffsetCommitter("g", backend=b, timeout=WAIT, retry_interval=0.05)
    c.submit({"t": {0: 5}}, batch_id=7, query_id="q")  # the last batch before the query goes idle
    wait_until(lambda: b.commits == [{"t": {0: 5}}], "the offsets committed by the committer's own retries")
    times = [at for at, _ in b.attempts]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(times) == 4 and gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2  # doubled each time
    stats = c.stats()
    assert (stats.submitted, stats.failed, stats.committed, stats.pending) == (1, 3, 1, False)
    assert stats.last_committed_batch == 7 and c.flush(WAIT)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    failures = [(level, m) for level, m in messages if "failed for batch 7" in m]
    assert [level for level, _ in failures] == [logging.WARNING, logging.DEBUG, logging.DEBUG]  # one warning
    assert "(retried with the next batch or in 0.05 s)" in failures[0][1]
    assert any(level == logging.INFO and "after 3 failed attempts" in m for level, m in messages)
    assert c.close()


def test_a_new_batch_is_committed_at_once_over_offsets_waiting_for_a_retry() -> None:
    b = ScriptedBackend(["silent", None])
    c = OffsetCommitter("g", backend=b, timeout=WAIT, retry_interval=600.0)  # never due in this test
    c.submit({"t": {0: 1, 1: 1}}, batch_id=1)
    wait_until(lambda: c.stats().failed == 1, "the first commit failing")
    c.submit({"t": {0: 2}}, batch_id=2)
    assert c.flush(WAIT)
    assert b.commits == [{"t": {0: 2, 1: 1}}]  # newest wins per partition; t[1] carried over
    assert c.close()


def test_no_partition_is_given_up_while_the_broker_does_not_answer() -> None:
    b = ScriptedBackend(["silent", "silent", "silent", None])
    c = OffsetCommitter("g", backend=b, timeout=WAIT, retry_interval=600.0)
    c.submit({"gone": {0: 9}, "t": {0: 1}}, batch_id=1)
    for batch in (2, 3, 4):  # the query no longer reads "gone"; the broker is down for three batches
        c.flush(WAIT)
        c.submit({"t": {0: batch}}, batch_id=batch)
    assert c.flush(WAIT)
    assert b.commits == [{"gone": {0: 9}, "t": {0: 4}}]
    assert c.close()


def test_a_failure_the_broker_answered_is_retried_only_with_the_next_batch() -> None:
    b = ScriptedBackend(["refused", None])
    c = OffsetCommitter("g", backend=b, timeout=WAIT, retry_interval=0.01)
    c.submit({"t": {0: 1}}, batch_id=1)
    assert not c.flush(WAIT)
    time.sleep(0.1)  # ten retry intervals: nothing may happen (asserting an absence)
    assert len(b.attempts) == 1 and c.stats().pending
    assert c.close(WAIT)  # close's one last attempt commits
    assert b.commits == [{"t": {0: 1}}]


def test_close_while_a_retry_is_scheduled_makes_the_last_attempt_at_once() -> None:
    b = ScriptedBackend(["silent", None])
    c = OffsetCommitter("g", backend=b, timeout=WAIT, retry_interval=600.0)
    c.submit({"t": {0: 1}}, batch_id=1)
    wait_until(lambda: c.stats().failed == 1, "the first commit failing")
    started = time.monotonic()
    assert c.close(WAIT)
    assert time.monotonic() - started < WAIT / 2 and b.commits == [{"t": {0: 1}}]


def test_the_retry_interval_is_checked_and_capped() -> None:
    with pytest.raises(ConfigError, match="retry interval of offset commits must be positive"):
        OffsetCommitter("g", backend=ScriptedBackend(), retry_interval=0)
    assert MAX_RETRY_INTERVAL <= 60.0  # an idle query's group catches up within a minute of the broker's return
