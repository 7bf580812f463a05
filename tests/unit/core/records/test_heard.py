"""A heartbeat's age on the reader's clock, measured by the store's (core/records/heard.py; finding 8)."""

from __future__ import annotations

import datetime as dt

from airflow_ckpt_provider.core.records import heard
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, Restart, RestartOwner, driver_live
from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState
from airflow_ckpt_provider.core.store.s3 import _store_age

READER = 2_000_000_000.0  # the reader's clock when it read the heartbeat


def _status(updated_at: float, state: JobState = JobState.RUNNING, **changes: object) -> JobStatus:
    return JobStatus(job="orders-heard", state=state, epoch=7, updated_at=updated_at,
                     started_at=updated_at - 600, heartbeat_interval=5.0, **changes)  # type: ignore[arg-type]


def test_a_heartbeat_read_from_the_store_is_judged_by_the_stores_age_whatever_the_writers_clock() -> None:
    for skew in (-3600.0, -130.0, 0.0, 130.0, 86400.0):  # the driver host's clock minus the reader's
        s = _status(READER - 2 + skew, batch_at=READER - 5 + skew)  # written 2 s ago, a batch 5 s ago
        heard.note(("status", s.job, s.epoch), s.updated_at, age=2.0, now=READER)
        assert s.age(READER + 10) == 12.0, skew
        assert driver_live(s, READER + 10) and not driver_live(s, READER + 21), skew  # limit 3 x 5 + 5 s
        assert s.local(s.batch_at or 0) == READER - 5, skew  # the driver's other times, on the reader's clock


def test_a_status_made_here_or_read_from_a_store_without_a_clock_keeps_the_writers_time() -> None:
    s = _status(READER - 30)
    heard.note(("status", s.job, s.epoch), s.updated_at, age=None, now=READER)
    assert s.age(READER) == 30.0 and s.local(READER - 40) == READER - 40
    other_beat = _status(READER - 30.5)  # another heartbeat of the same driver: its own entry, none noted
    assert other_beat.age(READER) == 30.5


def test_the_first_reading_of_a_heartbeat_stays_so_its_age_never_jumps_back() -> None:
    s = _status(READER - 900)
    heard.note(("status", s.job, s.epoch), s.updated_at, age=3.0, now=READER)
    heard.note(("status", s.job, s.epoch), s.updated_at, age=4.0, now=READER + 2)  # whole seconds: 1 s off
    assert s.age(READER + 2) == 5.0


def test_a_store_clock_a_second_behind_never_makes_a_heartbeat_younger_than_zero() -> None:
    s = _status(READER + 50)
    heard.note(("status", s.job, s.epoch), s.updated_at, age=-1.0, now=READER)
    assert s.age(READER) == 0.0


def test_a_restart_in_progress_is_judged_on_the_readers_clock() -> None:
    skew = 500.0
    restart = Restart(RestartOwner.SUPERVISOR, 2, "exit code 1", 2.0, at=READER - 3 + skew,
                      expected_by=READER + 60 + skew)
    s = _status(READER - 1 + skew, state=JobState.RESTARTING, restart=restart.to_dict())
    heard.note(("status", s.job, s.epoch), s.updated_at, age=1.0, now=READER)
    assert s.local(restart.expected_by) == READER + 60  # due in a minute, on this clock too


def test_a_supervisors_heartbeat_is_judged_by_the_stores_age() -> None:
    record = SupervisorRecord(job="orders-heard", launch_id="20261128T220000Z-abcdef", pid=11, host="launcher-2",
                              state=SupervisorState.WATCHING, started_at=READER + 900, updated_at=READER + 899,
                              interval=2.0)  # a host 900 s ahead wrote it 1 s ago
    assert record.liveness(READER)[0] is True  # before the note: a heartbeat "from the future" (age < 0)
    heard.note(("supervisor", record.launch_id), record.updated_at, age=1.0, now=READER)
    assert record.liveness(READER + 10) == (True, "")
    live, why = record.liveness(READER + 13)  # limit 3 x 2 + 5 s; written at READER - 1 on this clock
    assert not live and why == "is gone: no heartbeat for 14 s (every 2 s expected)"


def test_the_store_age_is_the_answers_date_minus_last_modified() -> None:
    modified = dt.datetime(2026, 11, 28, 22, 0, 0, tzinfo=dt.UTC)
    answer = {"LastModified": modified, "ResponseMetadata": {"HTTPHeaders": {"date": "Sat, 28 Nov 2026 22:00:07 GMT"}}}
    assert _store_age(answer) == 7.0
    assert _store_age({"LastModified": modified}) is None
    assert _store_age({"LastModified": modified, "ResponseMetadata": {"HTTPHeaders": {"date": "yesterday"}}}) is None
