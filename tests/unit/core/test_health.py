"""HealthCriteria: its checks, its fields by name as JobHealthTrigger serializes them, and the earlier names."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.health import RENAMED, HealthCriteria, current_names
from airflow_ckpt_provider.core.policy.restart import Health

EVERY_FIELD: dict[str, Any] = {"expect": "unhealthy", "min_epoch": 4, "started_after": 1.5e9, "healthy_for": 30.0,
                               "min_batches": 2, "heartbeat_timeout": 45.0, "max_restarts": 3,
                               "count_query_restarts": True, "health_window": 900.0, "progress_timeout": 120.0,
                               "start_timeout": 200.0}


def test_the_defaults_judge_no_restarts_and_no_progress() -> None:
    c = HealthCriteria()
    assert (c.expect, c.max_restarts, c.progress_timeout, c.health_window, c.start_timeout) == (
        Health.HEALTHY, None, None, 600, 300)


def test_expect_is_a_health_whether_given_as_text_or_enum() -> None:
    # ignore[arg-type] on the next 2 lines: expect given as text on purpose (HealthCriteria parses it)
    assert HealthCriteria(expect="unhealthy").expect is Health.UNHEALTHY  # type: ignore[arg-type]
    assert HealthCriteria(expect=Health.UNHEALTHY) == HealthCriteria(expect="unhealthy")  # type: ignore[arg-type]


@pytest.mark.parametrize(("changes", "message"), [
    ({"expect": "sick"}, "invalid expect 'sick': expected 'healthy' or 'unhealthy'"),
    ({"max_restarts": 0}, "max_restarts must be >= 1"),
    ({"healthy_for": -1}, "healthy_for must be >= 0, found -1"),
    ({"min_batches": -1}, "min_batches must be >= 0"),
    ({"heartbeat_timeout": -0.5}, "heartbeat_timeout must be >= 0"),
    ({"health_window": -1}, "health_window must be >= 0"),
    ({"progress_timeout": -1}, "progress_timeout must be >= 0"),
    ({"start_timeout": -1}, "start_timeout must be >= 0"),
])
def test_invalid_values_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        HealthCriteria(**changes)


def test_every_field_round_trips_by_name_as_plain_json() -> None:
    assert set(EVERY_FIELD) == {f.name for f in fields(HealthCriteria)}  # the test names every field
    criteria = HealthCriteria.from_kwargs(EVERY_FIELD)
    assert criteria.to_kwargs() == EVERY_FIELD
    assert json.loads(json.dumps(criteria.to_kwargs())) == EVERY_FIELD
    assert type(criteria.to_kwargs()["expect"]) is str  # the enum's value, not the enum


def test_the_earlier_name_of_a_field_is_accepted() -> None:
    assert RENAMED == {"restart_window": "health_window"}
    old = {k: v for k, v in EVERY_FIELD.items() if k != "health_window"} | {"restart_window": 900.0}
    assert HealthCriteria.from_kwargs(old) == HealthCriteria.from_kwargs(EVERY_FIELD)


@pytest.mark.parametrize("order", [("restart_window", "health_window"), ("health_window", "restart_window")])
def test_a_field_under_both_names_is_refused(order: tuple[str, str]) -> None:
    with pytest.raises(ConfigError, match="restart_window is the earlier name of health_window: pass health_window"):
        current_names(dict.fromkeys(order, 600.0))


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown health criterion 'window': expected one of "):
        HealthCriteria.from_kwargs({"window": 600})
