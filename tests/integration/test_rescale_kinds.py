"""Rescaling each kind of state through savepoints: the output stays exactly that of an uninterrupted run.

One job per kind of state (tests/jobs/rescale_kinds.py), over ckpt-kafka (tansu) into the exactly-once
``ckpt-files`` sink on SeaweedFS, RocksDB state, 2 state partitions at first:

- ``agg_dedup``: dropDuplicates on an id, then a count per (event-time window, key) in append mode (two stateful
  operators in one query); a fifth of the records repeat the id of the record 153 or 252 before (often before
  the last rescale), with a later event time: a lost or misplaced dedup state would count them again;
- ``join``: a stream-stream inner join of orders and payments with watermarks and an event-time range; payments
  arrive both after their order and before it, often across a rescale (four state stores);
- ``tws``: Python ``transformWithState`` with a ValueState (count per key), a ListState (every id of the key) and
  a MapState (value -> count), one row per key and batch.

Per kind: the job reads the first third of the records and stops with a savepoint; the rescale step (as a rescale
runs it: restore on a copy, Spark's offline repartition, the job's empty batch, saved as a savepoint of its own)
moves the state to 5 partitions; the job restarts from that savepoint with the second third, stops; 5 -> 3 the
same way; the last third. The sink's committed rows are then exactly what an uninterrupted run gives (computed
here from the records; for the join and transformWithState batch by batch, with the batch boundaries the sink's
manifests recorded), without a duplicate or a missing row, and its batch ids skip exactly the repartition
batches (Spark runs them without a sink).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.status import JobStatus
from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import (
    Kind,
    Manifest,
    Trigger,
)
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck
from airflow_ckpt_provider.sinks.filelayout import BatchManifest, committed_batches, read_committed
from airflow_ckpt_provider.sinks.filemaintenance import verify_sink
from tests.support.manifests import labels_timed, rescaled_from
from tests.support.runtimejob import ROCKSDB, JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("launcher_env")]

JOB = Path(__file__).parent.parent / "jobs" / "rescale_kinds.py"
KINDS = ("agg_dedup", "join", "tws")
TIMEOUT = 180.0
CHECK_TIMEOUT = 240.0
THIRD = 300  # records per third
MAX_OFFSETS = 60  # records per batch: a third takes five batches or more
T0 = 1_800_000_000  # event time of record j: T0 + j seconds (T0 is a whole minute)
WINDOW = 60  # the agg_dedup job's window and
DELAY = 120  # watermark delay (seconds); batches are ~20 records per partition apart, far less
JOIN_RANGE = 600  # the join's event-time range (seconds)
#: The stateful operators of each kind's query, as the savepoints' manifests name them.
OPERATORS = {"agg_dedup": ["dedupe", "stateStoreSave"], "join": ["symmetricHashJoin"],
             "tws": ["transformWithStateInPySparkExec"]}

Record = dict[str, Any]


# -- the records, and the output an uninterrupted run gives -----------------------------------------------------


def agg_dedup_records() -> list[Record]:
    """Record j: id j, key k<id % 7>, time T0 + j; but every j % 5 == 4 from 153 on repeats the id of record
    j - 153 (first third) or j - 252 (later: often before the last rescale), with its own later time. Both
    copies are in the same Kafka partition and in different batches, so dropDuplicates keeps the first. A last
    record far in event time moves the watermark past every window (its own window stays open)."""
    records = []
    for j in range(3 * THIRD):
        first = j - 153 if j < THIRD else j - 252
        rid = first if j % 5 == 4 and j >= 153 else j
        records.append({"side": "E", "id": rid, "k": f"k{rid % 7}", "t": T0 + j})
    records.append({"side": "E", "id": -1, "k": "flush", "t": T0 + 86_400})
    return records


def join_records() -> list[Record]:
    """Record j (time T0 + j): j % 3 == 0 an order (L, id j); j % 3 == 1 its payment (R, ref j - 1); j % 3 == 2 a
    payment of the order 212 records before or, every other 50 records, of the order 100 records later (it
    arrives first); refs outside the records match nothing."""
    records: list[Record] = []
    for j in range(3 * THIRD):
        if j % 3 == 0:
            records.append({"side": "L", "id": j, "k": f"k{j % 7}", "t": T0 + j})
        else:
            ref = j - 1 if j % 3 == 1 else (j - 212 if (j // 50) % 2 == 0 else j + 100)
            records.append({"side": "R", "id": j, "ref": ref, "t": T0 + j})
    return records


def tws_records() -> list[Record]:
    return [{"side": "E", "id": j, "k": f"k{j % 10}", "v": f"v{(j // 10) % 4}", "t": T0 + j} for j in range(3 * THIRD)]


RECORDS: dict[str, Callable[[], list[Record]]] = {"agg_dedup": agg_dedup_records, "join": join_records,
                                                   "tws": tws_records}


def expected_agg_dedup(records: list[Record]) -> list[tuple[Any, ...]]:
    """(window start, k, count) of every window the watermark closed, counting each id's first record."""
    first: dict[int, Record] = {}
    for r in records:
        first.setdefault(r["id"], r)
    counts = Counter((r["t"] - r["t"] % WINDOW, r["k"]) for r in first.values() if r["k"] != "flush")
    return sorted((start, k, n) for (start, k), n in counts.items())


def pairs(records: list[Record]) -> list[tuple[Record, Record]]:
    orders = {r["id"]: r for r in records if r["side"] == "L"}
    return [(orders[r["ref"]], r) for r in records
            if r["side"] == "R" and r["ref"] in orders and abs(r["t"] - orders[r["ref"]]["t"]) <= JOIN_RANGE]


def expected_join(records: list[Record], batch_of: dict[int, int]) -> list[tuple[Any, ...]]:
    """(batch, lid, k, lt, rid, rt) of every matching pair, in the batch that read the later of the two."""
    return sorted((max(batch_of[o["id"]], batch_of[p["id"]]), o["id"], o["k"], o["t"], p["id"], p["t"])
                  for o, p in pairs(records))


def expected_tws(records: list[Record], batch_of: dict[int, int]) -> list[tuple[Any, ...]]:
    """(batch, k, count, ids, counts) for every key a batch read records of: its state after the batch."""
    ids: dict[str, list[int]] = defaultdict(list)
    values: dict[str, Counter[str]] = defaultdict(Counter)
    rows = []
    for batch in sorted(set(batch_of.values())):
        read = [r for r in records if batch_of[r["id"]] == batch]
        for k in sorted({r["k"] for r in read}):
            mine = [r for r in read if r["k"] == k]
            ids[k] += [r["id"] for r in mine]
            values[k].update(r["v"] for r in mine)
            rows.append((batch, k, len(ids[k]), tuple(sorted(ids[k])), json.dumps(dict(values[k]), sort_keys=True)))
    return sorted(rows)


def state_across_rescales(kind: str, records: list[Record]) -> bool:
    """Do the records need state from before the first rescale after it (the records' design, checked)?"""
    third: dict[int, int] = {}  # id -> the third of its first record (an order's, for the join)
    for r in records:
        if r["side"] != "R":
            third.setdefault(r["id"], (r["t"] - T0) // THIRD)
    if kind == "agg_dedup":  # a repeated id whose first record is in an earlier third
        return any(third[r["id"]] < (r["t"] - T0) // THIRD for r in records)
    if kind == "join":  # a payment after the rescale of an order before it, and the other way round
        spans = {(third[o["id"]], (p["t"] - T0) // THIRD) for o, p in pairs(records)}
        return {(0, 1), (1, 0), (1, 2), (2, 1)} <= spans
    return all(len({third[r["id"]] for r in records if r["k"] == k}) == 3 for k in {r["k"] for r in records})


def batches_read(manifests: list[BatchManifest], topic: str, placed: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Record id -> the committed batch that read it: the first whose end offset in its partition is beyond
    the record's offset (the sink's manifests record each batch's end offsets; every source's must agree)."""
    ends: dict[int, dict[int, int]] = {}
    for m in manifests:
        sources = [{int(p): int(o) for p, o in (s or {}).get(topic, {}).items()} for s in m.offsets or []]
        assert sources and all(s == sources[0] for s in sources), f"batch {m.batch_id}: offsets {m.offsets}"
        ends[m.batch_id] = sources[0]
    found = {}
    for rid, (partition, offset) in placed.items():
        found[rid] = min(b for b, end in ends.items() if end.get(partition, 0) > offset)
    return found


# -- the job, its runs and its rescales ----------------------------------------------------------------------------


class KindsEnv:
    """One kind's job: its records (produced a third at a time), runs, rescale steps and sink."""

    def __init__(self, env: JobEnv, kind: str, runs: list[Run]) -> None:
        self.env, self.kind, self.runs = env, kind, runs
        self.checkpoint = env.work / "checkpoint"
        self.sink = f"s3://{env.bucket}/out-{kind}"
        self.s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region,
                            access_key_id=env.s3.access_key, secret_access_key=env.s3.secret_key)
        self.settings = {"CKPT_KINDS_KIND": kind, "CKPT_KINDS_SINK": self.sink}
        self.records = RECORDS[kind]()
        self.placed: dict[int, tuple[int, int]] = {}  # record id (agg_dedup: of its first copy) -> partition, offset
        self.produced = 0

    def produce(self, third: int) -> None:
        """The third ``third`` of the records (the last one with whatever follows), partition j % 3."""
        from confluent_kafka import Producer

        end = (third + 1) * THIRD if third < 2 else len(self.records)
        producer = Producer({"bootstrap.servers": self.env.kafka.bootstrap_servers, "acks": "all",
                             "enable.idempotence": True, "batch.num.messages": 1, "linger.ms": 0})
        failed: list[str] = []

        def delivered(rid: int) -> Callable[[Any, Any], None]:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    failed.append(str(err))
                else:
                    self.placed.setdefault(rid, (msg.partition(), msg.offset()))
            return report

        try:
            for j in range(third * THIRD, end):
                record = self.records[j]
                producer.produce(self.env.topic, key=str(record["id"]).encode(), value=json.dumps(record).encode(),
                                 partition=j % 3, on_delivery=delivered(record["id"]))
            assert producer.flush(30) == 0, "records still queued after 30 s"
        finally:
            del producer
        assert not failed, failed
        self.produced = end

    def read_all(self, status: JobStatus) -> bool:
        """The status' last completed batch read every record produced (each source, if the query has two)."""
        ends = [sum(int(o) for o in (offsets or {}).get(self.env.topic, {}).values())
                for offsets in status.offsets.values() if isinstance(offsets, dict)]
        return bool(ends) and all(e == self.produced for e in ends)

    def run_until_stopped(self, name: str, restore: str, done: Callable[[], bool] | None = None) -> Manifest:
        """Run the job from ``restore`` until it read every record produced (and ``done``), stop with a savepoint."""
        run = self.env.run(name, self.checkpoint, "--conf", ROCKSDB, "--checkpoint-interval", "none",
                           "--restore", restore, max_offsets=MAX_OFFSETS, job_file=JOB, extra_env=self.settings)
        self.runs.append(run)
        return self.env.stop_when(name, run, self.read_all, done, TIMEOUT)

    def rescale(self, savepoint: str, partitions: int) -> RestoreCheck:
        return self.env.rescale_step(JOB, self.checkpoint, savepoint, partitions,
                                     env=self.env.env(MAX_OFFSETS, self.settings), timeout=CHECK_TIMEOUT)

    def committed_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = read_committed(self.sink, self.s3, batch_id_column="batch_id").to_pylist()
        return rows


@pytest.mark.full(proven_by="integration/test_rescale.py::test_ckpt_job_rescale_moves_a_deployment_... "
                            "(one state kind, through the whole rescale)")
@pytest.mark.parametrize("kind", KINDS)
def test_dedup_agg_join_and_tws_state_rescaled_2_to_5_to_3_gives_exactly_the_uninterrupted_output(
        env: JobEnv, runs: list[Run], kind: str) -> None:
    job = KindsEnv(env, kind, runs)
    started = time.monotonic()
    seconds: dict[str, float] = {}
    expected_final = expected_agg_dedup(job.records) if kind == "agg_dedup" else None
    assert state_across_rescales(kind, job.records)

    job.produce(0)
    source = job.run_until_stopped("on-2", "latest-state")
    assert (source.state_partitions, source.trigger) == (2, Trigger.STOP), source
    assert sorted(str(op["name"]) for op in source.operators) == OPERATORS[kind], source.operators
    repartition_batches = []
    for third, partitions in ((1, 5), (2, 3)):
        step = time.monotonic()
        verdict = job.rescale(source.snapshot_id, partitions)
        seconds[f"rescale {source.state_partitions}->{partitions}"] = time.monotonic() - step
        assert verdict.outcome is CheckOutcome.COMPATIBLE and verdict.state_partitions == partitions, verdict
        assert verdict.rescaled_snapshot_id is not None, verdict
        rescaled = load_manifest(env.store(), verdict.rescaled_snapshot_id)
        assert (rescaled.kind, rescaled.trigger, rescaled.batch_id, rescaled.state_partitions) == (
            Kind.SAVEPOINT, Trigger.RESCALE, source.batch_id + 1, partitions)
        assert labels_timed(rescaled) == rescaled_from(source)
        assert rescaled.offsets == source.offsets  # the repartition batch reads no input
        repartition_batches.append(rescaled.batch_id)
        job.produce(third)
        done = None
        if expected_final is not None and third == 2:  # the last windows close in a batch after the last data
            # E731 below: a one-line stop condition, None when the run needs none
            done = lambda: len(job.committed_rows()) >= len(expected_final)  # noqa: E731
        after = job.run_until_stopped(f"on-{partitions}", rescaled.snapshot_id, done)
        assert after.state_partitions == partitions and after.batch_id > rescaled.batch_id, after
        assert sorted(str(op["name"]) for op in after.operators) == OPERATORS[kind], after.operators
        source = after
    seconds["total"] = time.monotonic() - started

    # The sink: one query (restores keep its id), one timeline, every batch Spark ran but the repartitions'.
    shown = committed_batches(job.sink, job.s3)
    assert len({m.query_id for m in shown}) == 1, [(m.query_id, m.batch_id) for m in shown]
    assert [m.batch_id for m in shown] == [b for b in range(source.batch_id + 1) if b not in repartition_batches]
    report = verify_sink(job.sink, job.s3)
    assert report.ok and not any(report.forks.values()), (report.problems, report.forks)

    rows = job.committed_rows()
    if kind == "agg_dedup":
        assert expected_final is not None
        got: list[tuple[Any, ...]] = sorted((r["window_start"], r["k"], r["count"]) for r in rows)
        want = expected_final
    else:
        batch_of = batches_read(shown, env.topic, job.placed)
        assert set(batch_of) == {r["id"] for r in job.records}
        assert not set(batch_of.values()) & set(repartition_batches)
        if kind == "join":
            got = sorted((r["batch_id"], r["lid"], r["k"], r["lt"], r["rid"], r["rt"]) for r in rows)
            want = expected_join(job.records, batch_of)
        else:
            got = sorted((r["batch_id"], r["k"], r["count"], tuple(r["ids"]), r["counts"]) for r in rows)
            want = expected_tws(job.records, batch_of)
    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)  # a row twice is one extra
    assert not missing and not extra, (f"{len(rows)} rows, expected {len(want)}: missing {sorted(missing)[:5]}, "
                                       f"unexpected {sorted(extra)[:5]}")
    print(f"{kind}: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
