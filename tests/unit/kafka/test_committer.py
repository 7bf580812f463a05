"""The OffsetCommitter mailbox and the listener's offset selection, with an injected fake backend.

The fake backend blocks inside ``commit`` until the test releases it, so "commits fall behind"
is staged exactly, without sleeps.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.committer import KafkaCommitListener
from airflow_ckpt_provider.kafka.offsetcommitter import OffsetCommitError, OffsetCommitter
from airflow_ckpt_provider.kafka.offsets import Offsets, kafka_offsets_or_none

WAIT = 10.0  # upper bound of every wait; the happy path takes milliseconds


@dataclass
class FakeBackend:
    """Records commits; ``gate`` (when set) holds each commit until released; ``fail`` raises."""

    gate: threading.Semaphore | None = None
    # Pops one outcome per attempt: False commits, True fails all, an Offsets fails those partitions.
    fail: list[bool | Offsets] = field(default_factory=list)
    commits: list[Offsets] = field(default_factory=list)
    attempts: list[Offsets] = field(default_factory=list)
    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    closed: threading.Event = field(default_factory=threading.Event)

    def commit(self, group_id: str, offsets: Offsets) -> None:
        assert group_id == "g"
        self.attempts.append(offsets)
        self.entered.release()
        if self.gate is not None:
            assert self.gate.acquire(timeout=WAIT), "test never released the commit"
        outcome = self.fail.pop(0) if self.fail else False
        if outcome is True:
            raise OffsetCommitError("broker said no")
        if outcome:
            raise OffsetCommitError("some partitions refused", outcome)
        self.commits.append(offsets)

    def close(self) -> None:
        self.closed.set()


def committer(backend: FakeBackend) -> OffsetCommitter:
    return OffsetCommitter("g", backend=backend, timeout=WAIT)


def off(n: int, m: int | None = None) -> Offsets:
    return {"t": {0: n, 1: n if m is None else m}}


def test_commits_each_submission_in_order() -> None:
    backend = FakeBackend()
    c = committer(backend)
    for i in range(3):
        c.submit(off(i), batch_id=i, query_id="q")
        assert c.flush(WAIT)
    assert backend.commits == [off(0), off(1), off(2)]
    stats = c.stats()
    assert (stats.submitted, stats.committed, stats.skipped, stats.failed) == (3, 3, 0, 0)
    assert stats.last_committed_batch == 2 and not stats.pending
    assert c.committed_offsets() == off(2)
    assert c.close() and backend.closed.is_set()


def test_newest_wins_when_commits_fall_behind_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Semaphore(0)
    backend = FakeBackend(gate=gate)
    c = committer(backend)
    caplog.set_level(logging.DEBUG, "airflow_ckpt_provider.kafka.offsetcommitter")
    c.submit(off(1), batch_id=1)
    assert backend.entered.acquire(timeout=WAIT)  # batch 1 is inside the (slow) broker call
    for batch in (2, 3, 4):
        c.submit(off(batch), batch_id=batch)  # returns at once although the commit is blocked
    gate.release()
    assert backend.entered.acquire(timeout=WAIT)
    gate.release()
    assert c.flush(WAIT)
    assert backend.commits == [off(1), off(4)]  # 2 and 3 were superseded before their turn
    assert c.stats().skipped == 2 and c.stats().last_committed_batch == 4
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "fall behind" in r.getMessage()]
    assert len(warnings) == 1 and "group g" in warnings[0].getMessage()
    assert c.close()


def test_pending_offsets_merge_per_partition() -> None:
    """Two queries (or sources) with different partitions in one group: neither is dropped."""
    gate = threading.Semaphore(0)
    backend = FakeBackend(gate=gate)
    c = committer(backend)
    c.submit({"a": {0: 1}}, batch_id=1)
    assert backend.entered.acquire(timeout=WAIT)
    c.submit({"a": {0: 2}, "b": {0: 7}}, batch_id=2)
    c.submit({"a": {0: 3}}, batch_id=3)  # newer a[0]; b[0] from batch 2 stays pending
    gate.release()
    assert backend.entered.acquire(timeout=WAIT)
    gate.release()
    assert c.flush(WAIT)
    assert backend.commits == [{"a": {0: 1}}, {"a": {0: 3}, "b": {0: 7}}]
    assert c.close()


def test_failure_is_logged_kept_pending_and_retried_with_the_next_submission(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FakeBackend(fail=[True, False])
    c = committer(backend)
    c.submit({"t": {0: 5, 1: 5}}, batch_id=7, query_id="q1")  # never raises
    assert not c.flush(WAIT)  # attempted, failed, still pending
    stats = c.stats()
    assert (stats.failed, stats.committed, stats.pending) == (1, 0, True)
    assert stats.last_error is not None and "broker said no" in stats.last_error
    failure = next(r.getMessage() for r in caplog.records if "failed" in r.getMessage())
    assert "group g" in failure and "batch 7" in failure and "q1" in failure and "broker said no" in failure
    assert len(backend.attempts) == 1  # no retry loop on its own: it waits for the next batch

    c.submit({"t": {0: 6}, "u": {0: 1}}, batch_id=8, query_id="q1")
    assert c.flush(WAIT)
    # The retry carries the failed partitions too, newer values winning.
    assert backend.commits == [{"t": {0: 6, 1: 5}, "u": {0: 1}}]
    assert c.stats().skipped == 0  # a failed submission being retried is not a skip
    assert c.close()


def test_partial_failure_keeps_only_the_failed_partitions() -> None:
    backend = FakeBackend(fail=[{"t": {1: 5}}, False])
    c = committer(backend)
    c.submit({"t": {0: 5, 1: 5}}, batch_id=1)
    assert not c.flush(WAIT)
    assert c.committed_offsets() == {"t": {0: 5}}  # Kafka took partition 0
    c.submit({"u": {0: 2}}, batch_id=2)  # another query's partitions
    assert c.flush(WAIT)
    assert backend.commits == [{"t": {1: 5}, "u": {0: 2}}]
    assert c.committed_offsets() == {"t": {0: 5, 1: 5}, "u": {0: 2}}
    assert c.close()


def test_a_partition_failing_twice_without_resubmission_is_given_up(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend(fail=[{"gone": {0: 9}}, {"gone": {0: 9}}, False])
    c = committer(backend)
    c.submit({"gone": {0: 9}, "t": {0: 1}}, batch_id=1)
    assert not c.flush(WAIT)
    c.submit({"t": {0: 2}}, batch_id=2)  # the query no longer reads "gone"
    assert not c.flush(WAIT)  # gone[0] failed again: given up, nothing pending
    assert not c.stats().pending
    assert any("Giving up committing gone[0] to group g" in r.getMessage() for r in caplog.records)
    c.submit({"t": {0: 3}}, batch_id=3)
    assert c.flush(WAIT)
    assert backend.attempts[1] == {"gone": {0: 9}, "t": {0: 2}} and backend.commits == [{"t": {0: 3}}]
    assert c.close()


def test_a_partition_submitted_again_is_retried_every_time() -> None:
    backend = FakeBackend(fail=[True, True, True, False])
    c = committer(backend)
    for batch in range(4):  # the broker is down for three batches, then back
        c.submit({"t": {0: batch}}, batch_id=batch)
        c.flush(WAIT)
    assert backend.attempts == [{"t": {0: b}} for b in range(4)] and backend.commits == [{"t": {0: 3}}]
    assert c.stats().failed == 3 and c.stats().committed == 1
    assert c.close()


def test_any_exception_of_the_backend_is_contained() -> None:
    class Exploding(FakeBackend):
        def commit(self, group_id: str, offsets: Offsets) -> None:
            self.entered.release()
            raise RuntimeError("librdkafka blew up")

    backend = Exploding()
    c = committer(backend)
    c.submit(off(1), batch_id=1)
    assert not c.flush(WAIT)
    assert c.stats().failed == 1
    assert not c.close()  # the last attempt failed too: reported, not raised


def test_close_drains_the_pending_offsets_once() -> None:
    gate = threading.Semaphore(0)
    backend = FakeBackend(gate=gate)
    c = committer(backend)
    c.submit(off(1), batch_id=1)
    assert backend.entered.acquire(timeout=WAIT)
    c.submit(off(2), batch_id=2)
    gate.release(2)
    assert c.close(WAIT)  # batch 1 finishes, then the last attempt commits batch 2
    assert backend.commits == [off(1), off(2)]
    assert backend.closed.is_set()
    c.submit(off(3), batch_id=3)  # after close: dropped with a warning, not raised
    assert backend.commits == [off(1), off(2)]
    assert c.close()  # idempotent


def test_close_retries_failed_offsets_once_then_gives_up() -> None:
    backend = FakeBackend(fail=[True, True, False])
    c = committer(backend)
    c.submit(off(1), batch_id=1)
    assert not c.flush(WAIT)
    assert not c.close(WAIT)  # one more attempt, failed: the offsets stay uncommitted
    assert len(backend.attempts) == 2 and backend.commits == []


def test_close_without_submissions_releases_the_client() -> None:
    backend = FakeBackend()
    assert committer(backend).close()
    assert backend.closed.is_set() and backend.attempts == []


def test_close_gives_up_on_a_stuck_broker_call() -> None:
    gate = threading.Semaphore(0)
    backend = FakeBackend(gate=gate)
    c = committer(backend)
    c.submit(off(1), batch_id=1)
    assert backend.entered.acquire(timeout=WAIT)
    assert not c.close(timeout=0.05)  # bounded: returns although the call is still running
    gate.release()
    assert backend.closed.wait(WAIT)


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="no consumer group"):
        OffsetCommitter("", "localhost:9092")
    with pytest.raises(ConfigError, match="no bootstrap servers"):
        OffsetCommitter("g")


# -- the listener's choice of offsets ------------------------------------------------------------


@dataclass
class Source:
    description: str
    endOffset: str | None  # pyspark's attribute name


@dataclass
class Progress:
    id: str
    name: str | None
    batchId: int  # pyspark's attribute name
    sources: list[Source]


@dataclass
class Event:
    progress: Any


KAFKA_V2 = Source("KafkaV2[Subscribe[orders]]", '{"orders":{"0":12,"1":5}}')
PYTHON = Source("org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream@1",
                '{"clicks": {"0": 3, "2": 4}}')
FILES = Source("FileStreamSource[file:/in]", '{"logOffset":3}')
RATE = Source("RateStreamV2[rowsPerSecond=1]", "12")


def test_listener_commits_every_kafka_source_of_a_progress_event() -> None:
    backend = FakeBackend()
    listener = KafkaCommitListener(committer(backend))
    # ignore[arg-type] below: Event and Progress are duck-typed stand-ins for pyspark's
    listener.onQueryProgress(Event(Progress("q-1", None, 4, [KAFKA_V2, FILES, PYTHON, RATE])))  # type: ignore[arg-type]
    assert listener.committer.flush(WAIT)
    assert backend.commits == [{"orders": {0: 12, 1: 5}, "clicks": {0: 3, 2: 4}}]
    assert listener.committer.stats().last_committed_batch == 4
    assert listener.close()


def test_listener_filters_by_query_and_topic() -> None:
    listener = KafkaCommitListener(committer(FakeBackend()), queries={"orders-job"}, topics={"orders", "other"})
    by_name = Progress("q-1", "orders-job", 0, [KAFKA_V2, PYTHON])
    by_id = Progress("orders-job", None, 0, [KAFKA_V2])
    other = Progress("q-2", "clicks-job", 0, [KAFKA_V2, PYTHON])
    # ignore[arg-type] on the next 4 lines: Progress is a duck-typed stand-in for pyspark's progress
    assert listener.offsets_of(by_name) == {"orders": {0: 12, 1: 5}}  # type: ignore[arg-type]
    assert listener.offsets_of(by_id) == {"orders": {0: 12, 1: 5}}  # type: ignore[arg-type]
    assert listener.offsets_of(other) is None  # type: ignore[arg-type]
    assert listener.offsets_of(Progress("q-1", "orders-job", 0, [FILES, PYTHON])) is None  # type: ignore[arg-type]


def test_listener_never_raises_into_spark(caplog: pytest.LogCaptureFixture) -> None:
    listener = KafkaCommitListener(committer(FakeBackend()))
    listener.onQueryProgress(Event(progress=None))  # a malformed event: logged, swallowed
    assert any("Cannot submit" in r.getMessage() for r in caplog.records)
    assert listener.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"t":{"0":1,"1":0}}', {"t": {0: 1, 1: 0}}),
        ('{"t": {"0": 1}, "u": {"3": 9}}', {"t": {0: 1}, "u": {3: 9}}),
        ('{"logOffset":3}', None),
        ("12", None),
        ("null", None),
        (None, None),
        ("{}", None),
        ('{"t":{}}', None),
        ('{"t":{"0":-2}}', None),  # a startingOffsets spec, not a resolved offset
        ('{"t":{"x":1}}', None),
    ],
)
def test_kafka_offsets_are_recognised(text: str | None, expected: Offsets | None) -> None:
    assert kafka_offsets_or_none(text) == expected
