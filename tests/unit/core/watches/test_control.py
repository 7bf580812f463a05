"""RequestWatch on a real local job store with an injected clock: the driver's answer, or why none will come."""

from __future__ import annotations

import pytest

from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, write_ack
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.control import RequestWatch
from tests.support.watchrecords import T0, leased, report

# -- control requests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", list(Outcome))
def test_request_watch_reports_the_ack(store: JobStore, outcome: Outcome) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, RequestAction.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 1) is None
    ack = Ack(request.id, RequestAction.SAVEPOINT, outcome, "done here", 2, T0 + 2, snapshot_id="s", batch_id=9)
    write_ack(store, ack)
    event = watch.poll(T0 + 2)
    assert event is not None and event["status"] == outcome.value
    assert event["ack"] == ack.to_dict() and event["request_id"] == request.id
    assert "done here" in event["message"] and "epoch 2" in event["message"]


def test_request_watch_fails_when_the_driver_died_without_answering(store: JobStore) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, RequestAction.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 10) is None
    assert watch.poll(T0 + 30) is None  # noticed: one more poll, in case the ack lands
    event = watch.poll(T0 + 35)
    assert event is not None and (event["status"], event["ack"]) == ("failed", None)
    assert "no heartbeat" in event["message"] and "probably died" in event["message"]


def test_an_ack_written_just_after_the_final_status_is_not_missed(store: JobStore) -> None:
    report(store, T0, epoch=2)
    request = submit_request(store, RequestAction.STOP, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    report(store, T0 + 5, epoch=2, state=JobState.STOPPED)  # the driver writes its status first ...
    assert watch.poll(T0 + 5) is None
    write_ack(store, Ack(request.id, RequestAction.STOP, Outcome.COMPLETED, "stopped with savepoint", 2, T0 + 6))
    event = watch.poll(T0 + 7)  # ... then the ack
    assert event is not None and event["status"] == "completed"


def test_request_watch_fails_when_the_driver_ended_or_a_newer_one_took_over(store: JobStore) -> None:
    report(store, T0, epoch=2, state=JobState.STOPPED, reason="canceled")
    request = submit_request(store, RequestAction.SAVEPOINT, 2, now=T0)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0) is None
    event = watch.poll(T0 + 1)
    assert event is not None and event["status"] == "failed" and "STOPPED" in event["message"]

    leased(store, 3)
    report(store, T0 + 2, epoch=3)
    watch = RequestWatch(store, request.id, 2)
    assert watch.poll(T0 + 2) is None
    event = watch.poll(T0 + 3)
    assert event is not None and event["status"] == "failed" and "newer driver (epoch 3)" in event["message"]


def test_request_watch_waits_for_a_stopping_driver_taking_its_final_savepoint(store: JobStore) -> None:
    report(store, T0, epoch=2, state=JobState.STOPPING)
    request = submit_request(store, RequestAction.STOP, 2, now=T0)
    watch = RequestWatch(store, request.id, 2, busy_timeout=600)
    for t in (100, 300, 599):
        assert watch.poll(T0 + t) is None
    assert watch.poll(T0 + 601) is None
    event = watch.poll(T0 + 602)
    assert event is not None and event["status"] == "failed"


def test_request_watch_waits_while_the_driver_has_not_reported(store: JobStore) -> None:
    request = submit_request(store, RequestAction.SAVEPOINT, 2, now=T0)
    leased(store, 2)
    watch = RequestWatch(store, request.id, 2)
    for t in (0, 100, 1000):
        assert watch.poll(T0 + t) is None
    assert "no status.json" in watch.waiting_for()
