"""Durable plans (runtime/plangate.py, core/snapshots/durableplan.py) over a synthetic checkpoint and a local store:
a planned batch counts as durable only once the store holds what a restart elsewhere replays it from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.modes import RestoreSpec
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots
from airflow_ckpt_provider.core.snapshots.durableplan import (
    DURABLE_FILE,
    FIRST_PLAN,
    DurablePlan,
    PlanNotDurable,
    await_durable,
    read_durable,
    write_durable,
)
from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime import plangate
from airflow_ckpt_provider.runtime.plangate import PlanGate
from airflow_ckpt_provider.runtime.snapshotter import Snapshotter
from airflow_ckpt_provider.runtime.startup import plan_start, prepare_checkpoint
from tests.support.ckptfactory import make_checkpoint, write_batch

LATEST = RestoreSpec.parse("latest-state")


class FlakyStore(LocalStorage):
    """A job store that refuses every write while ``down``."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StorageError("the job store is unreachable (test)")

    def write(self, key: str, data: bytes) -> None:
        self._check()
        super().write(key, data)

    def create(self, key: str, data: bytes) -> bool:
        self._check()
        return super().create(key, data)

    def create_tagged(self, key: str, data: bytes) -> str | None:
        self._check()
        return super().create_tagged(key, data)

    def write_object(self, key: str, data: bytes, sha256: str) -> None:
        self._check()
        super().write_object(key, data, sha256)

    def upload(self, path: Path, key: str, callback: Any = None) -> None:
        self._check()
        super().upload(path, key, callback)

    def child(self, prefix: str) -> LocalStorage:
        child = FlakyStore(self.root / prefix)
        child._check = self._check  # type: ignore[method-assign]  # the job's storage is down with its root
        return child


@pytest.fixture
def gate_of(tmp_path: Path) -> Iterator[Any]:
    made: list[tuple[Snapshotter, PlanGate]] = []

    def make(ckpt: Path, storage: LocalStorage | None = None) -> tuple[JobStore, PlanGate]:
        store = JobStore(storage or LocalStorage(tmp_path / "store"), "orders")
        snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(checkpoints_keep=5),
                                  fence=lambda: None, on_done=lambda _o: None, inline_max=0)
        gate = PlanGate(store, LocalStorage(ckpt), snapshotter, epoch=1).start()
        made.append((snapshotter, gate))
        return store, gate

    yield make
    for snapshotter, gate in made:
        gate.close()
        snapshotter.close()


def _query_id(ckpt: Path) -> str:
    return str(json.loads((ckpt / "metadata").read_text())["id"])


def test_a_planned_batch_is_durable_once_the_store_holds_the_batch_before_it_with_its_write_ahead_entry(
        tmp_path: Path, gate_of: Any) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)  # batches 0 and 1 completed
    write_batch(ckpt, 2, commit=False)  # Spark planned batch 2
    store, _gate = gate_of(ckpt)
    live = LocalStorage(ckpt)
    assert await_durable(live, query_id=_query_id(ckpt), batch_id=2, timeout_s=30, job="orders") is not None
    newest = list_snapshots(store)[-1]
    assert (newest.batch_id, newest.next_offsets is not None) == (1, True)
    elsewhere = LocalStorage(tmp_path / "elsewhere")  # another host restores it: Spark replays batch 2 as planned
    restore_snapshot(store, newest.snapshot_id, elsewhere)
    assert elsewhere.read("offsets/2") == live.read("offsets/2")
    assert not elsewhere.exists(DURABLE_FILE)  # the record is the live checkpoint's own, never in a snapshot


def test_a_store_that_refuses_the_snapshot_keeps_the_batch_from_committing_until_it_answers(
        tmp_path: Path, gate_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plangate, "RETRY_S", 0.05)
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    storage = FlakyStore(tmp_path / "store")
    storage.down = True
    write_batch(ckpt, 2, commit=False)
    _store, gate = gate_of(ckpt, storage)
    live = LocalStorage(ckpt)
    with pytest.raises(PlanNotDurable, match=r"batch 2 of job orders .* found none yet"):
        await_durable(live, query_id=_query_id(ckpt), batch_id=2, timeout_s=0.5, job="orders")
    assert read_durable(live) == DurablePlan(None, -1, 1)
    storage.down = False
    assert await_durable(live, query_id=_query_id(ckpt), batch_id=2, timeout_s=30, job="orders") is not None
    assert gate.durable == 2


def test_the_first_batch_is_stored_as_a_plan_resumed_by_a_fresh_start_elsewhere_and_dropped_after_a_snapshot(
        tmp_path: Path, gate_of: Any) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 0)
    write_batch(ckpt, 0, commit=False)  # the query's first batch is planned, nothing completed
    store, _gate = gate_of(ckpt)
    live = LocalStorage(ckpt)
    query = _query_id(ckpt)
    assert await_durable(live, query_id=query, batch_id=0, timeout_s=30, job="orders") is not None
    assert store.storage.exists(FIRST_PLAN) and list_snapshots(store) == []

    # The host is lost: a fresh start elsewhere resumes that query at batch 0 with the same offsets.
    elsewhere = LocalStorage(tmp_path / "elsewhere")
    plan, _live = plan_start(store, elsewhere, LATEST)
    assert plan.first_plan is not None and plan.first_plan.query_id == query
    assert "resuming that query at batch 0 as planned" in plan.reason
    prepare_checkpoint(store, elsewhere, LATEST, epoch=2)
    assert (elsewhere.read("metadata"), elsewhere.read("offsets/0")) == (live.read("metadata"), live.read("offsets/0"))
    # `--restore none` never resumes it.
    assert plan_start(store, LocalStorage(tmp_path / "other"), RestoreSpec.parse("none"))[0].first_plan is None

    write_batch(ckpt, 0)  # batch 0 completes, batch 1 is planned: a snapshot holds the query now
    write_batch(ckpt, 1, commit=False)
    assert await_durable(live, query_id=query, batch_id=1, timeout_s=30, job="orders") is not None
    assert not store.storage.exists(FIRST_PLAN)


def test_a_record_of_another_query_is_not_taken_for_this_ones_and_no_record_means_no_wait(tmp_path: Path) -> None:
    live = LocalStorage(tmp_path)
    assert await_durable(live, query_id="q", batch_id=7, timeout_s=0, job="orders") is None  # the gate is off
    write_durable(live, DurablePlan("another-query", 9))
    with pytest.raises(PlanNotDurable, match="found batch 9 of query another-query"):
        await_durable(live, query_id="q", batch_id=7, timeout_s=0.05, job="orders")
    PlanGate.disable(live)
    assert await_durable(live, query_id="q", batch_id=7, timeout_s=0, job="orders") is None
