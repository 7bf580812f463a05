"""OperationWatch: the one wait for an operation someone else acts on (the Airflow trigger, a re-run command)."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.records.operations import ACTOR_SILENCE, Acting, OperationState, ask, read_operation
from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.operation import ORPHANED, OperationWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _acted_on_elsewhere(store: JobStore) -> str:
    found, _ = ask(store, "rescale", {"partitions": 3}, requested_by="test")
    acting = Acting(store, found, "an actor on another host")
    acting.save(actor="an actor on another host", actor_host="elsewhere", actor_pid=1, line="1/5 checking",
                state=OperationState.RUNNING)
    return found.operation.id


def test_an_actor_on_another_host_is_gone_once_its_record_is_silent_for_the_silence_on_the_watchers_clock(
        store: JobStore) -> None:
    operation_id = _acted_on_elsewhere(store)
    clock = Clock()
    watch = OperationWatch(store, operation_id, clock=clock, host="here")
    assert watch.poll() is None and watch.take_lines() == ["1/5 checking"]
    clock.now += ACTOR_SILENCE - 1
    assert watch.poll() is None  # silent, not yet long enough
    clock.now += 1
    event = watch.poll()
    assert event is not None and event["status"] == ORPHANED
    assert "its actor an actor on another host is gone; a new actor resumes it" in event["message"]


def test_a_write_of_the_actor_restarts_the_silence(store: JobStore) -> None:
    operation_id = _acted_on_elsewhere(store)
    clock = Clock()
    watch = OperationWatch(store, operation_id, clock=clock, host="here")
    assert watch.poll() is None and watch.take_lines() == ["1/5 checking"]
    clock.now += ACTOR_SILENCE - 1
    found = read_operation(store)
    assert found is not None
    Acting(store, found, "an actor on another host").save(line="2/5 stopping")  # its heartbeat
    assert watch.poll() is None and watch.take_lines() == ["2/5 stopping"]
    clock.now += ACTOR_SILENCE - 1
    assert watch.poll() is None


def test_a_job_of_the_supervision_service_is_never_orphaned_and_an_ended_one_says_how(store: JobStore) -> None:
    operation_id = _acted_on_elsewhere(store)
    store.root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="t").to_bytes())
    clock = Clock()
    watch = OperationWatch(store, operation_id, clock=clock, host="here")
    assert watch.poll() is None
    clock.now += 10 * ACTOR_SILENCE
    assert watch.poll() is None and "the supervision service resumes it" in watch.waiting_for()
    found = read_operation(store)
    assert found is not None
    Acting(store, found, "x").save(state=OperationState.FAILED, message="upgrade of job orders: rolled back")
    event = watch.poll()
    assert event is not None and (event["status"], event["message"]) == ("failed", "upgrade of job orders: rolled back")


@pytest.mark.parametrize("replaced", [True, False])
def test_a_replaced_or_missing_record_ends_the_wait_saying_what_is_there(store: JobStore, replaced: bool) -> None:
    operation_id = _acted_on_elsewhere(store)
    if replaced:
        found = read_operation(store)
        assert found is not None
        Acting(store, found, "x").save(state=OperationState.SUCCEEDED, result={})
        ask(store, "upgrade", {"job_file": "v2.py"}, requested_by="someone")
    else:
        store.storage.delete(["operation.json"])
    event = OperationWatch(store, operation_id, host="here").poll()
    assert event is not None and event["status"] == "gone"
    assert f"expected operation {operation_id} in operation.json, found " in event["message"]


def test_an_actor_busy_in_one_long_act_writes_a_heartbeat_so_it_never_looks_silent(store: JobStore) -> None:
    """The heartbeat thread beside every act: a write whenever ``every`` s passed without one; the act's own writes
    (the same lock) never fail against it."""
    import threading
    import time

    found, _ = ask(store, "rescale", {"partitions": 3}, requested_by="test")
    acting = Acting(store, found, "actor")
    acting.save(actor="actor", state=OperationState.RUNNING)
    stop = threading.Event()
    beating = threading.Thread(target=acting.beat_while, args=(stop,), kwargs={"every": 0.05}, daemon=True)
    beating.start()
    try:
        for i in range(20):  # the act meanwhile writes lines of its own
            time.sleep(0.03)
            acting.save(line=f"line {i}")  # would raise NotActor if a heartbeat had raced it
        time.sleep(0.3)  # no write of the act: the heartbeat writes
        before = read_operation(store)
        time.sleep(0.3)
        after = read_operation(store)
    finally:
        stop.set()
        beating.join(5)
    assert before is not None and after is not None and after.tag != before.tag
    assert after.operation.lines[-1] == "line 19" and len(after.operation.lines) == 20  # nothing lost to a race
    assert not beating.is_alive()
