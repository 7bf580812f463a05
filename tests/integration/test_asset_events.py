"""The asset watchers' triggers run() against real servers: SnapshotEventTrigger on a job store in SeaweedFS,
KafkaLagEventTrigger on tansu. Exact events: one per new savepoint (checkpoints only when asked), none
repeated by a trigger re-created from the same kwargs (a triggerer restart), one per rise of the lag.

The cursor goes to ``DictStateStore``: the two methods of Airflow's asset state store accessor the triggers
call, over a dict (the real one, in Airflow's database, is exercised by tests/system/test_example_dags.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.snapshots.catalog import SnapshotResult, create_snapshot
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, S3Options, open_storage
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.triggers import events as events_module
from airflow_ckpt_provider.triggers.events import EventWatchTrigger, KafkaLagEventTrigger, SnapshotEventTrigger
from tests.integration.test_kafka_lag_sensor import commit, produce
from tests.support.ckptfactory import make_checkpoint, write_batch

pytestmark = pytest.mark.integration

WITHIN = 30.0  # seconds for any awaited outcome


class DictStateStore:
    """Airflow's AssetStateStoreAccessors as the triggers use it (aget, aset), over a dict."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = json.loads(json.dumps(value))  # stored as JSON, as Airflow does


class Running:
    """A trigger's run() as a task on the current loop: its event payloads, and how many polls it finished."""

    def __init__(self, trigger: EventWatchTrigger, drains: list[int]) -> None:
        self.trigger, self.events, self._drains = trigger, [], drains
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.trigger.run():
            self.events.append(event.payload)

    def polls(self) -> int:
        return len(self._drains)

    async def until(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WITHIN
        while not done():
            if self.task.done():
                self.task.result()
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {WITHIN:.0f} s: {what}; events {self.events}")
            await asyncio.sleep(0.05)

    async def quiet_polls(self, n: int) -> None:
        """Wait until ``n`` more polls completed (nothing to announce is a poll's outcome, not a sleep's)."""
        start = self.polls()
        await self.until(f"{n} more polls", lambda: self.polls() >= start + n)

    async def stop(self) -> None:
        """Cancel it, as a triggerer that stops (or moves the trigger) does."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
def drains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the triggers' completed polls; the cursor is written 0.5 s after an announcement (not 5 s)."""
    counted: list[int] = []
    real = events_module._drain

    def counting(watch: Any) -> Any:
        out = real(watch)
        counted.append(len(out[0]))
        return out

    monkeypatch.setattr(events_module, "_drain", counting)
    monkeypatch.setattr(events_module, "CONFIRM_DELAY", 0.5)
    return counted


@pytest.fixture
def store(s3_server: EmbeddedS3, bucket: str, s3_options: S3Options, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    """Job ``orders`` in SeaweedFS, reached by the triggers through the default job store connection."""
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT", json.dumps({
        "conn_type": "ckpt_store", "host": s3_server.endpoint_url, "login": s3_server.access_key,
        "password": s3_server.secret_key, "extra": {"store_url": f"s3://{bucket}/jobs",
                                                     "region_name": s3_server.region}}))
    return JobStore(open_storage(f"s3://{bucket}/jobs", s3_options), "orders")


@pytest.fixture
def snapshot(store: JobStore, tmp_path: Path) -> Callable[[Kind], SnapshotResult]:
    """Snapshots a local checkpoint that gains a batch each time: its result."""
    checkpoint = LocalStorage(make_checkpoint(tmp_path / "ckpt", 3))
    batches = iter(range(3, 1000))

    def take(kind: Kind) -> SnapshotResult:
        write_batch(Path(checkpoint.root), next(batches))
        return create_snapshot(store, checkpoint, kind=kind, trigger=Trigger.MANUAL)

    return take


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["snapshot_id"] for e in events]


def test_one_event_per_new_savepoint_none_for_checkpoints_none_repeated_after_a_restart(
    snapshot: Callable[[Kind], SnapshotResult], drains: list[int]
) -> None:
    key = "ckpt.snapshot_events.orders.savepoint"

    async def scenario() -> None:
        before = await asyncio.to_thread(snapshot, Kind.SAVEPOINT)
        state = DictStateStore()
        trigger = SnapshotEventTrigger(job="orders", poll_interval=0.2)
        trigger.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        first = Running(trigger, drains)
        await first.until("the baseline stored", lambda: key in state.values)
        assert state.values[key] == {"seen": [before.manifest.snapshot_id]}
        await asyncio.to_thread(snapshot, Kind.CHECKPOINT)
        s1 = await asyncio.to_thread(snapshot, Kind.SAVEPOINT)
        s2 = await asyncio.to_thread(snapshot, Kind.SAVEPOINT)
        await first.until("both savepoints in the stored cursor",
                          lambda: s2.manifest.snapshot_id in state.values[key]["seen"])
        await first.quiet_polls(3)
        assert ids(first.events) == [s1.manifest.snapshot_id, s2.manifest.snapshot_id]
        assert {k: first.events[0][k] for k in ("job", "kind", "batch_id", "uri", "created_at")} == {
            "job": "orders", "kind": "savepoint", "batch_id": s1.manifest.batch_id, "uri": s1.uri,
            "created_at": s1.manifest.created_at}
        await first.stop()

        s3 = await asyncio.to_thread(snapshot, Kind.SAVEPOINT)  # while no trigger runs
        again = SnapshotEventTrigger(**trigger.serialize()[1])  # as the triggerer re-creates it
        again.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        second = Running(again, drains)
        await second.until("the savepoint taken while stopped", lambda: len(second.events) >= 1)
        await second.quiet_polls(3)
        assert ids(second.events) == [s3.manifest.snapshot_id]  # s1 and s2 not again
        await second.stop()

    asyncio.run(scenario())


def test_checkpoints_are_announced_when_asked_and_an_unconfirmed_event_comes_again(
    snapshot: Callable[[Kind], SnapshotResult], drains: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At least once: stopped after yielding but before the cursor was written, the trigger announces the
    same snapshot again when re-created; a downstream DAG keys its work on the snapshot id."""
    monkeypatch.setattr(events_module, "CONFIRM_DELAY", 3600.0)  # the cursor never gets written in time

    async def scenario() -> None:
        state = DictStateStore()
        trigger = SnapshotEventTrigger(job="orders", kinds=["checkpoint", "savepoint"], poll_interval=0.2)
        trigger.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        first = Running(trigger, drains)
        key = trigger.cursor_key()
        await first.until("the baseline stored", lambda: key in state.values)
        c = await asyncio.to_thread(snapshot, Kind.CHECKPOINT)
        s = await asyncio.to_thread(snapshot, Kind.SAVEPOINT)
        await first.until("two events", lambda: len(first.events) >= 2)
        assert ids(first.events) == [c.manifest.snapshot_id, s.manifest.snapshot_id]
        assert [e["kind"] for e in first.events] == ["checkpoint", "savepoint"]
        await first.stop()
        assert state.values[key] == {"seen": []}  # the baseline only: neither was confirmed

        again = SnapshotEventTrigger(**trigger.serialize()[1])
        again.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        second = Running(again, drains)
        await second.until("the re-announcements", lambda: len(second.events) >= 2)
        assert ids(second.events) == ids(first.events)
        await second.stop()

    asyncio.run(scenario())


def test_lag_above_the_threshold_fires_once_per_rise(kafka_server: EmbeddedKafka, topic: str,
                                                       drains: list[int]) -> None:
    bootstrap, group = kafka_server.bootstrap_servers, f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, {0: 10, 1: 7, 2: 5})
    commit(bootstrap, group, topic, {0: 4, 1: 7, 2: 0})  # lag 6 + 0 + 5 = 11

    async def scenario() -> None:
        state = DictStateStore()
        trigger = KafkaLagEventTrigger(group=group, topics=[topic], threshold=10, rearm_below=3,
                                       bootstrap_servers=bootstrap, poll_interval=0.2)
        trigger.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        key = trigger.cursor_key()
        running = Running(trigger, drains)
        await running.until("the first rise", lambda: len(running.events) >= 1)
        await running.until("the fired state stored", lambda: state.values.get(key) == {"armed": False})
        await running.quiet_polls(3)  # still 11 behind: no second event
        assert [(e["status"], e["total_lag"], e["threshold"]) for e in running.events] == [("above", 11, 10)]

        await asyncio.to_thread(commit, bootstrap, group, topic, {0: 10, 1: 7, 2: 5})  # caught up: re-armed
        await running.until("re-armed", lambda: state.values.get(key) == {"armed": True})
        await asyncio.to_thread(produce, bootstrap, topic, {0: 12})  # 12 behind: the second rise
        await running.until("the second rise", lambda: len(running.events) >= 2)
        await running.quiet_polls(3)
        assert [e["total_lag"] for e in running.events] == [11, 12]
        await running.stop()

        again = KafkaLagEventTrigger(**trigger.serialize()[1])  # restarted while still 12 behind
        again.asset_state_store = state  # type: ignore[assignment]  # the accessor's two methods
        second = Running(again, drains)
        await second.quiet_polls(3)
        assert second.events == []
        await second.stop()

    asyncio.run(scenario())
