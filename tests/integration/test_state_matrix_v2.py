"""Every stateful operator through kill -9, upgrades, a fallback, rescale and time travel in state checkpoint format v2
(RocksDB with changelog checkpointing: unique ids, the lineage in the changelogs):
the lifecycle in tests/support/statematrixrun.py, exact output, and the State Processor's edits of the
first savepoint (every operator loses a key, three get a value changed); --full kills three times."""

from __future__ import annotations

import pytest

from tests.support.runtimejob import JobEnv, Run
from tests.support.statematrixrun import run_matrix

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("launcher_env")]


def test_every_stateful_operator_in_format_v2_through_kill_upgrades_fallback_rescale_time_travel_and_edits_is_exact(
        env: JobEnv, runs: list[Run], pytestconfig: pytest.Config) -> None:
    full = pytestconfig.getoption("--full", default=False)
    run_matrix(env, runs, "v2", kills=3 if full else 1, edit=True)
