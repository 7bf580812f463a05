"""RestoreCheckWatch on a real local job store with fake records, an injected clock, host and pid probe: the
verdict of its own check only, and a clear ``failed`` when the check ends without one (never a hang)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_ckpt_provider.core.policy.outcomes import CHECK_EVENTS, CheckOutcome
from airflow_ckpt_provider.core.records.restore_check import OUTCOME_GRACE, running_checks
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.restore_check import RestoreCheckWatch
from tests.support.watchrecords import T0, check_ended, check_started

HERE = "worker-1"
PAYLOAD_KEYS = {"status", "message", "job", "check_id", "reason", "snapshot_id", "batch_id", "seconds",
                "state_partitions", "rescaled_snapshot_id", "rewritten_snapshot_id"}


def probe(alive: set[int]) -> Callable[[int], bool]:
    return lambda pid: pid in alive


def watch(store: JobStore, check_id: str = "C2", alive: frozenset[int] = frozenset({4321})) -> RestoreCheckWatch:
    return RestoreCheckWatch(store, check_id, host=HERE, pid_alive=probe(set(alive)))


@pytest.mark.parametrize("outcome", list(CheckOutcome))
def test_the_verdict_of_its_own_check_is_the_event(store: JobStore, outcome: CheckOutcome) -> None:
    check_started(store, "C2")
    w = watch(store)
    assert w.poll(T0 + 5) is None
    assert "running: restore check C2 of orders_v2.py (pid 4321 on worker-1" in w.waiting_for()
    check_ended(store, "C2", outcome)
    event = w.poll(T0 + 60)
    assert event == {"status": outcome.value, "job": "orders", "check_id": "C2", "reason": "the verdict of C2",
                     "snapshot_id": "savepoint-7-x", "batch_id": 7, "seconds": 41.5, "state_partitions": None,
                     "rescaled_snapshot_id": None, "rewritten_snapshot_id": None,
                     "message": f"job orders: restore check C2 of snapshot savepoint-7-x: {outcome.value}: "
                                "the verdict of C2"}
    assert event["status"] in CHECK_EVENTS


def test_an_earlier_checks_verdict_is_never_taken_for_this_one(store: JobStore) -> None:
    check_started(store, "C1", T0 - 900)
    check_ended(store, "C1", CheckOutcome.COMPATIBLE, T0 - 800)  # an earlier run's check: compatible
    check_started(store, "C2")
    w = watch(store)
    assert [w.poll(T0 + t) for t in (1, 30, 300)] == [None, None, None]  # C2 still runs: no verdict yet
    check_ended(store, "C2", CheckOutcome.INCOMPATIBLE)
    event = w.poll(T0 + 301)
    assert event is not None and (event["status"], event["check_id"]) == ("incompatible", "C2")


def test_a_check_process_gone_without_a_verdict_fails_on_the_next_poll(store: JobStore) -> None:
    check_started(store, "C2", pid=4321)
    w = watch(store, alive=frozenset())  # kill -9: no process, no verdict
    assert w.poll(T0 + 10) is None  # noticed: one more poll, in case the verdict lands
    event = w.poll(T0 + 12)
    assert event is not None and set(event) == PAYLOAD_KEYS
    assert (event["status"], event["snapshot_id"], event["batch_id"]) == ("failed", None, None)
    assert event["message"] == (
        "job orders: expected a verdict from restore check C2 of orders_v2.py (pid 4321 on worker-1, started at "
        "08:00:00Z by airflow:upgrade.upgrade run r1 try 1), found none and its process no longer exists; no "
        "verdict. Its log: /ckpt/check-C2.log on worker-1. Run the upgrade again")
    assert event["reason"] == event["message"]


def test_a_verdict_written_just_before_the_process_exited_is_taken(store: JobStore) -> None:
    check_started(store, "C2")
    w = watch(store, alive=frozenset())
    assert w.poll(T0 + 10) is None  # the process has exited
    check_ended(store, "C2", CheckOutcome.COMPATIBLE)  # its verdict lands (it was written before the exit)
    event = w.poll(T0 + 12)
    assert event is not None and event["status"] == "compatible"


def test_a_check_on_another_host_runs_until_its_deadline(store: JobStore) -> None:
    check_started(store, "C2", host="worker-2", timeout=600)  # its pid means nothing on this host
    w = watch(store, alive=frozenset())
    deadline = T0 + 600 + OUTCOME_GRACE
    assert w.poll(T0 + 10) is None and w.poll(deadline) is None
    assert w.poll(deadline + 1) is None
    event = w.poll(deadline + 3)
    assert event is not None and event["status"] == "failed"
    assert "found none and no verdict by 08:11:30Z (its timeout 600 s + 90 s): it is presumably dead or hung" in \
        event["message"]


def test_a_check_alive_past_its_deadline_fails(store: JobStore) -> None:
    check_started(store, "C2", timeout=60)  # hung (e.g. writing its verdict to an unreachable store)
    w = watch(store)
    assert w.poll(T0 + 60 + OUTCOME_GRACE) is None
    assert w.poll(T0 + 61 + OUTCOME_GRACE) is None
    event = w.poll(T0 + 63 + OUTCOME_GRACE)
    assert event is not None and event["status"] == "failed" and "presumably dead or hung" in event["message"]


def test_a_check_whose_pid_was_not_recorded_runs_until_its_deadline(store: JobStore) -> None:
    check_started(store, "C2", pid=None)
    w = watch(store, alive=frozenset())
    assert w.poll(T0 + 600) is None and w.poll(T0 + 600 + OUTCOME_GRACE) is None
    assert "(not spawned yet on worker-1" in w.waiting_for()


def test_a_missing_start_record_fails(store: JobStore) -> None:
    w = watch(store, "C9")
    assert w.poll(T0) is None
    event = w.poll(T0 + 2)
    assert event is not None and event["status"] == "failed"
    assert event["message"].startswith("job orders: expected the record of restore check C9 (")
    assert "checks/C9.json, written before the check starts), found none" in event["message"]


def test_running_checks_are_those_without_a_verdict_that_live(store: JobStore) -> None:
    check_started(store, "C1", T0 - 100, pid=11)
    check_ended(store, "C1", CheckOutcome.COMPATIBLE)  # ended
    check_started(store, "C2", T0 - 50, pid=12)  # its process is gone
    check_started(store, "C3", T0 - 10, pid=13)  # runs here
    check_started(store, "C4", T0 - 5, pid=14, host="worker-2")  # another host, before its deadline
    check_started(store, "C5", T0 - 2000, pid=15, host="worker-2")  # another host, past its deadline
    found = running_checks(store, T0, host=HERE, pid_alive=probe({11, 13}))
    assert [c.check_id for c in found] == ["C3", "C4"]
