"""The actions sinks register to run before each start of the driver's query (core/policy/streambatch.py)."""

from __future__ import annotations

from airflow_ckpt_provider.core.policy.streambatch import (
    before_query_start,
    forget_before_query_start,
    run_before_query_start,
)


def test_actions_run_before_every_start_once_per_name_and_are_forgotten_for_the_next_job() -> None:
    ran: list[str] = []
    forget_before_query_start()
    before_query_start("ckpt-kafka:a", lambda: ran.append("a1"))
    before_query_start("ckpt-kafka:a", lambda: ran.append("a2"))  # the build function ran again: replaced
    before_query_start("ckpt-kafka:b", lambda: ran.append("b"))
    run_before_query_start()
    run_before_query_start()  # an in-driver restart
    assert ran == ["a2", "b", "a2", "b"]
    forget_before_query_start()  # the runtime, before another job's build function
    run_before_query_start()
    assert ran == ["a2", "b", "a2", "b"]
