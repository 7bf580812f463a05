"""Durable plans: a sink that cannot unpublish commits batch N only once the job store can replay it.

A live checkpoint on the driver host's disk is lost with the host; a driver elsewhere resumes from the
newest snapshot and plans the batches after it again, with other offsets. The runtime (runtime/plangate.py)
stores batch N-1 with Spark's write-ahead entry ``offsets/N`` as soon as N is planned, then records N in
``DURABLE_FILE`` of the live checkpoint; the ckpt-kafka sink's tasks wait for it before they commit, so a
replay elsewhere runs N with the same offsets and its markers skip it (Flink's KafkaSink commits once the
checkpoint completes). Batch 0 has no snapshot to stand on: its plan goes to ``FIRST_PLAN``.
Design notes: docs/sink-kafka.md#design-notes-coresnapshotsdurableplanpy.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.store.storage import Storage

log = logging.getLogger(__name__)

#: In the live checkpoint; hidden, so neither Spark nor a snapshot reads it.
DURABLE_FILE = ".ckpt-durable-plan"
#: In the job store: the first batch's plan of the newest query that started without a snapshot.
FIRST_PLAN = "plans/first-batch.json"


@dataclass(frozen=True)
class DurablePlan:
    """Every batch of query ``query_id`` up to ``batch`` can be replayed from the job store (-1: none yet)."""

    query_id: str | None
    batch: int
    epoch: int | None = None

    def to_bytes(self) -> bytes:
        return json.dumps({"query_id": self.query_id, "batch": self.batch, "epoch": self.epoch}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DurablePlan:
        raw = json.loads(data.decode("utf-8"))
        return cls(raw.get("query_id"), int(raw["batch"]), raw.get("epoch"))


class PlanNotDurable(CkptError):
    """A batch's plan did not reach the job store in time: the sink must not commit it."""


def read_durable(live: Storage) -> DurablePlan | None:
    """The live checkpoint's durable-plan record; None where the runtime keeps none (the gate is off)."""
    try:
        data = live.read(DURABLE_FILE)
    except FileNotFoundError:
        return None
    try:
        return DurablePlan.from_bytes(data)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return DurablePlan(None, -1)  # torn by hand: nothing counts as durable until the runtime rewrites it


def write_durable(live: Storage, plan: DurablePlan) -> None:
    live.write(DURABLE_FILE, plan.to_bytes())  # LocalStorage writes a temporary file and renames it


def await_durable(live: Storage, *, query_id: str, batch_id: int, timeout_s: float, job: str,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Wait until batch ``batch_id`` of ``query_id`` is durable; seconds waited, None when the gate is off.

    Raises PlanNotDurable after ``timeout_s``: the caller aborts its transaction, the batch fails and is retried.
    """
    start = clock()
    pause = 0.005
    while True:
        plan = read_durable(live)
        if plan is None:
            return None
        if plan.query_id == query_id and plan.batch >= batch_id:
            return clock() - start
        waited = clock() - start
        if waited >= timeout_s:
            found = (f"batch {plan.batch} of query {plan.query_id}" if plan.query_id else "none yet")
            raise PlanNotDurable(
                f"batch {batch_id} of job {job} (query {query_id}): expected the job store to hold its plan (the "
                f"snapshot of batch {batch_id - 1} with offsets/{batch_id}) within {timeout_s:g} s, found {found} "
                f"in {live.uri(DURABLE_FILE)}. The sink commits nothing a restart on another host could not replay: "
                "the transaction is aborted and the batch retried. Check that the driver reaches the job store")
        sleep(min(pause, max(timeout_s - waited, 0.0)))
        pause = min(pause * 2, 0.05)


# --------------------------------------------------------------------------------------------
# The first batch: no snapshot yet, so its plan goes to the store on its own
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FirstPlan:
    """The files Spark resumes batch 0 of ``query_id`` from: ``metadata``, ``offsets/0`` and ``sources/``."""

    query_id: str
    epoch: int | None
    files: dict[str, bytes]

    def to_bytes(self) -> bytes:
        return json.dumps({"query_id": self.query_id, "epoch": self.epoch,
                           "files": {k: base64.b64encode(v).decode() for k, v in sorted(self.files.items())}}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> FirstPlan:
        raw = json.loads(data.decode("utf-8"))
        return cls(str(raw["query_id"]), raw.get("epoch"), {k: base64.b64decode(v) for k, v in raw["files"].items()})


def first_plan_files(live: Storage) -> dict[str, bytes]:
    """What a restart elsewhere needs to run batch 0 again as planned (the hidden files left out)."""
    keys = ["metadata", "offsets/0"] + [o.key for o in live.list("sources/")]
    return {k: live.read(k) for k in keys if not k.rsplit("/", 1)[-1].startswith(".")}


def read_first_plan(store_storage: Storage) -> FirstPlan | None:
    try:
        data = store_storage.read(FIRST_PLAN)
    except FileNotFoundError:
        return None
    try:
        return FirstPlan.from_bytes(data)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        log.warning("ignoring the unreadable first-batch plan %s: %s", store_storage.uri(FIRST_PLAN), err)
        return None


def seed_first_plan(plan: FirstPlan, live: Storage) -> None:
    """Write the first batch's plan into an empty live checkpoint: Spark then runs batch 0 of that query again."""
    for key, data in plan.files.items():
        live.write(key, data)
