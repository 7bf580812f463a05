"""The lag a batch event reports: Kafka records between the batch's end offsets and the latest ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_ckpt_provider.runtime.batchevents import LagClock, records_behind


@pytest.mark.parametrize(("end", "latest", "behind"), [
    ({"t": {"0": 10, "1": 5}}, {"t": {"0": 12, "1": 5}}, 2),
    ({"t": {"0": 10}}, {"t": {"0": 10, "1": 7}}, 7),  # a partition the batch never read counts from 0
    ({"t": {"0": 10}}, {"t": {"0": 9}}, 0),  # ahead of latest: caught up, never negative
    ({"a": {"0": 1}}, {"a": {"0": 4}, "b": {"0": 3}}, 6),
    # ckpt-kafka's offsets carry its commit group next to the topics (kafka/source.py COMMIT_KEY)
    ({"t": {"0": 3}, "$commit": {"group": "g", "servers": "h:9092"}}, {"t": {"0": 5}}, 2),
])
def test_records_behind_kafka_offsets(end: Any, latest: Any, behind: int) -> None:
    assert records_behind(json.dumps(end), json.dumps(latest)) == behind


@pytest.mark.parametrize(("end", "latest"), [
    (None, {"t": {"0": 1}}), ({"t": {"0": 1}}, None), ({"offset": 3}, {"offset": 4}), ("12", "13"), ({}, {}),
    ({"g": {"group": "x"}}, {"g": {"group": "x"}}),
])
def test_offsets_that_are_not_kafka_shaped_give_no_lag(end: Any, latest: Any) -> None:
    def text(offsets: Any) -> str | None:
        return None if offsets is None else json.dumps(offsets)

    assert records_behind(text(end), text(latest)) is None


def kafka(**partitions: int) -> str:
    """Query progress' JSON of topic ``t``'s offsets: p0=5 -> {"t": {"0": 5}}."""
    return json.dumps({"t": {name[1:]: offset for name, offset in partitions.items()}})


def test_lag_seconds_is_how_long_ago_the_first_record_after_the_batch_arrived_interpolated_between_batches() -> None:
    clock = LagClock()
    assert clock.observe(100.0, [(kafka(p0=0), kafka(p0=0))]) == 0.0  # caught up
    # latest went 0 -> 100 between t=100 and t=110: record 20 (the first after end 20) arrived at t=102.1
    assert clock.observe(110.0, [(kafka(p0=20), kafka(p0=100))]) == pytest.approx(110.0 - 102.1)
    # at t=120 the batch ended at 100 (caught up with what existed at 110) but 50 more came: record 100 arrived
    # between t=110 (latest 100) and t=120 (latest 150)
    assert clock.observe(120.0, [(kafka(p0=100), kafka(p0=150))]) == pytest.approx(120.0 - 110.2)
    assert clock.observe(130.0, [(kafka(p0=150), kafka(p0=150))]) == 0.0


def test_lag_seconds_is_the_slowest_partitions_and_none_without_kafka_offsets() -> None:
    clock = LagClock()
    clock.observe(0.0, [(kafka(p0=0, p1=0), kafka(p0=0, p1=0))])
    # p0 is caught up; p1's record 10 arrived at t=5.5 (latest 0 -> 20 between 0 and 10)
    assert clock.observe(10.0, [(kafka(p0=20, p1=10), kafka(p0=20, p1=20))]) == pytest.approx(4.5)
    assert LagClock().observe(1.0, [('{"logOffset": 3}', '{"logOffset": 5}')]) is None  # a file source


def test_a_driver_that_starts_behind_reports_a_lower_bound_and_keeps_only_what_anchors_the_lag() -> None:
    clock = LagClock()
    assert clock.observe(50.0, [(kafka(p0=10), kafka(p0=1000))]) == 0.0  # first look: behind since at least now
    assert clock.observe(60.0, [(kafka(p0=20), kafka(p0=1000))]) == 10.0  # at least 10 s
    for t in range(70, 2000, 10):
        clock.observe(float(t), [(kafka(p0=t * 10), kafka(p0=t * 10 + 50))])
    assert len(clock._seen) <= 3  # caught up to older observations: they were dropped
