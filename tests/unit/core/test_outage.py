"""core/policy/outage.Outage: one line when a dependency goes, one when it is back, the failures in between counted."""

from __future__ import annotations

import logging

import pytest

from airflow_ckpt_provider.core.policy.outage import Outage


def test_an_outage_logs_one_line_when_it_starts_and_one_with_its_length_and_count_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outage = Outage("orders", "the job store", clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.core.policy.outage")
    outage.ok()  # no outage: nothing to say
    for _ in range(37):
        outage.failed("read lease.json: cannot reach S3 endpoint")
        now[0] += 0.5
    assert outage.down
    assert outage.seconds() == pytest.approx(18.5)
    outage.ok()
    outage.ok()
    assert not outage.down
    assert [r.getMessage() for r in caplog.records] == [
        "job orders: the job store is unreachable: read lease.json: cannot reach S3 endpoint (retrying; further "
        "failures are not logged until it is back)",
        "job orders: the job store is reachable again after 18.5 s (37 failed requests)",
    ]


def test_a_second_outage_is_logged_again_with_its_own_count(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage("orders", "the job store", clock=lambda: 0.0)
    caplog.set_level(logging.INFO, logger="airflow_ckpt_provider.core.policy.outage")
    for rounds in (2, 3):
        for _ in range(rounds):
            outage.failed("refused")
        outage.ok()
    assert [r.getMessage().split(" after ")[-1] for r in caplog.records if "again" in r.getMessage()] == [
        "0.0 s (2 failed requests)", "0.0 s (3 failed requests)"]
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 2
