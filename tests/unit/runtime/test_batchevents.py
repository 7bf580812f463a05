"""The lag a batch event reports: Kafka records between the batch's end offsets and the latest ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_ckpt_provider.runtime.batchevents import records_behind


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
