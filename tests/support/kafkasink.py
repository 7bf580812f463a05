"""Reading what the transactional ckpt-kafka sink wrote, as a read_committed consumer on Apache Kafka would.

tansu shows ABORTED transactional records to read_committed consumers (ENVIRONMENT.md), so a test
cannot just count records. ``read_sink_output`` reads everything and keeps, for each (query id,
batch, sink partition), only the records of the LAST attempt that wrote it. Given the sink's
protocol that is exactly Apache Kafka's abort filtering:

- an attempt of (batch, partition) is retried only if it did not commit (a committed one leaves its
  marker, and every later attempt of that (batch, partition) finds it and writes nothing);
- attempts of one (batch, partition) use one transactional.id, so they are sequential: a new attempt's
  init_transactions fences and aborts the earlier one before it writes.

So every attempt but the last is aborted, and the last one is committed once the query committed the
batch (a test reads only after that: Spark commits a batch only after every task returned, and a task
returns only after its commit_transaction succeeded; the tasks' "committed" log lines cannot confirm it, as
a kill -9 right after a commit can lose the line, not the commit). Attempts are ordered by the attempt part
of their ``ckpt`` header (``{query id}/{batch}/{sink partition}/{attempt}``; an attempt id starts with its
start time in ns): comparable across Kafka partitions, where offsets are not (records without a key or a
partition column may land on other partitions on a retry).

The reader reads ``read_uncommitted`` by default: tansu gives read_committed consumers no abort filtering,
and its last stable offset can stay before the last transactions of a producer that went away, though their
commits succeeded (fresh25 .ci/run: read_committed stopped at offsets 192/148/148 of partitions 0/1/2,
read_uncommitted at 219/169/169; the 60 records between were the committed last attempts of the job's last
two batches): a read_committed reader misses committed records on tansu, never on Apache Kafka. What only
Apache Kafka can confirm (the broker itself hiding aborted records and holding read_committed consumers at
the last stable offset) is listed in docs/sink-kafka.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_ckpt_provider.kafka.writeroptions import HEADER, AttemptTag


@dataclass(frozen=True)
class SinkRecord:
    """One record as read from the output topic; ``headers`` are the user's (the ``ckpt`` one is decoded)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    query_id: str | None
    batch_id: int | None
    sink_partition: int | None
    attempt: str | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())


def read_all(bootstrap: str, topic: str, timeout: float = 30.0, *, isolation: str = "read_uncommitted",
             ends: dict[int, int] | None = None) -> list[SinkRecord]:
    """Every record of ``topic`` (aborted and open transactions' ones included), in log order per partition.

    Reads with assign() up to the end seen by the fetch (partition EOF), not ListOffsets(LATEST):
    tansu answers that with the last record batch's base offset + 1 and the sink writes batches.
    ``ends`` (if given) gets each partition's offset at its EOF.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    records: list[SinkRecord] = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
        assert meta.error is None, f"topic {topic}: {meta.error}"
        pending = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{topic} {sorted(pending)}: end not reached in {timeout} s"
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    pending.discard(msg.partition())
                    if ends is not None:
                        ends[int(msg.partition() or 0)] = int(msg.offset() or 0)
                    continue
                records.append(_record(msg))
        return records
    finally:
        consumer.close()


def _record(msg: object) -> SinkRecord:
    from typing import Any

    m: Any = msg
    tag: AttemptTag | None = None
    user: list[tuple[str, bytes | None]] = []
    for k, v in m.headers() or []:
        if k == HEADER and v is not None:
            tag = AttemptTag.decode(v)
        else:
            user.append((k, v))
    if tag is None:
        return SinkRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value(), None, None, None, None, tuple(user))
    return SinkRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value(), tag.query_id, tag.batch_id,
                      tag.partition, tag.attempt, tuple(user))


def last_attempts(records: list[SinkRecord]) -> list[SinkRecord]:
    """Keep, per (query id, batch, sink partition), only the records of the last attempt (see module doc)."""
    last: dict[tuple[str | None, int | None, int | None], str] = {}
    for r in records:
        key = (r.query_id, r.batch_id, r.sink_partition)
        if r.attempt is not None and (key not in last or r.attempt > last[key]):
            last[key] = r.attempt
    return [r for r in records if r.attempt is None or last[(r.query_id, r.batch_id, r.sink_partition)] == r.attempt]


def read_sink_output(bootstrap: str, topic: str, timeout: float = 30.0) -> list[SinkRecord]:
    """What a read_committed consumer sees on Apache Kafka: the committed records of the sink (see module doc)."""
    return last_attempts(read_all(bootstrap, topic, timeout))


def explain_missing(bootstrap: str, topic: str, missing: set[int], id_of: Callable[[SinkRecord], int]) -> str:
    """Why ids are missing from the committed output: each partition's end as read_committed and
    read_uncommitted fetches see it next to its watermarks, and which attempts wrote the missing ids."""
    from confluent_kafka import Consumer, TopicPartition

    committed_ends: dict[int, int] = {}
    uncommitted_ends: dict[int, int] = {}
    committed = read_all(bootstrap, topic, isolation="read_committed", ends=committed_ends)
    everything = read_all(bootstrap, topic, ends=uncommitted_ends)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}"})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)
                 for p in sorted(uncommitted_ends)}
    finally:
        consumer.close()
    lines = [f"partition {p}: read_committed EOF at {committed_ends.get(p)}, read_uncommitted EOF at "
             f"{uncommitted_ends.get(p)}, watermarks {marks[p]}" for p in sorted(marks)]
    lines.append(f"{len(committed)} records read_committed, {len(everything)} read_uncommitted")
    kept = {(r.partition, r.offset) for r in last_attempts(everything)}
    found = [r for r in everything if id_of(r) in missing]
    attempts = sorted({(r.batch_id, r.sink_partition, r.attempt, r.partition, (r.partition, r.offset) in kept)
                       for r in found}, key=str)
    lines.append(f"{len({id_of(r) for r in found})} of the {len(missing)} missing ids are in the topic "
                 f"read_uncommitted; (batch, sink partition, attempt, kafka partition, kept) of them: {attempts[:20]}")
    return "\n".join(lines)
