"""The control channel's bell (core/records/control.py): an asker rewrites it after each request; the driver reads
it every poll and lists ``control/`` only when it changed, or once per sweep (a request of an asker that rang no
bell is found by the sweep)."""

from __future__ import annotations

from airflow_ckpt_provider.core.records.control import (
    BELL,
    Bell,
    BellWatch,
    Request,
    RequestAction,
    open_requests,
    request_key,
    submit_request,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore


def test_a_request_rings_the_bell_and_the_driver_lists_control_only_when_it_rang_or_the_sweep_is_due(
        store: JobStore) -> None:
    now = [0.0]
    bell = BellWatch(store, sweep=30.0, clock=lambda: now[0])
    assert bell.due() is True  # the first look lists (requests written before the driver started)
    now[0] = 1.0
    assert bell.due() is False  # silent: no listing
    request = submit_request(store, RequestAction.SAVEPOINT, epoch=3)
    assert Bell.from_bytes(store.storage.read(BELL), BELL) == Bell(request_id=request.id, at=request.created_at)
    now[0] = 2.0
    assert bell.due() is True and [r.id for r in open_requests(store)] == [request.id]
    now[0] = 3.0
    assert bell.due() is False
    now[0] = 32.0
    assert bell.due() is True  # the sweep


def test_a_request_written_without_a_bell_is_found_by_the_sweep(store: JobStore) -> None:
    now = [0.0]
    bell = BellWatch(store, sweep=30.0, clock=lambda: now[0])
    assert bell.due() is True
    older = Request(id="stop-20261129T000000Z-abcdef", action=RequestAction.STOP, epoch=3, created_at=1.0,
                    requested_by="an older ckpt")  # an asker of a version without the bell
    assert store.storage.create(request_key(older.id), older.to_bytes())
    now[0] = 29.0
    assert bell.due() is False
    now[0] = 30.0
    assert bell.due() is True and [r.id for r in open_requests(store)] == [older.id]


def test_the_bell_is_no_request_for_any_lister(store: JobStore) -> None:
    submit_request(store, RequestAction.CANCEL, epoch=1)
    assert not BELL.startswith("control/")  # an older driver lists control/ and never sees it
    assert [r.action for r in open_requests(store)] == [RequestAction.CANCEL]
