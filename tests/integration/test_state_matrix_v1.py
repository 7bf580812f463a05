"""Every stateful operator through kill -9, upgrades, a fallback, rescale and time travel in state checkpoint format v1
(RocksDB, no changelog checkpointing):
the lifecycle in tests/support/statematrixrun.py, exact output; --full kills three times and edits the first
savepoint with the State Processor as the v2 matrix does by default (format v1's edits by default:
tests/integration/test_rescale.py, an aggregation's key deleted through `ckpt job edit`)."""

from __future__ import annotations

import pytest

from tests.support.runtimejob import JobEnv, Run
from tests.support.statematrixrun import run_matrix

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("launcher_env")]


def test_every_stateful_operator_in_format_v1_through_kill_upgrades_fallback_rescale_and_time_travel_is_exact(
        env: JobEnv, runs: list[Run], pytestconfig: pytest.Config) -> None:
    full = pytestconfig.getoption("--full", default=False)
    run_matrix(env, runs, "v1", kills=3 if full else 1, edit=full)
