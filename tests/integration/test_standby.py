"""A warm standby (issue 44; docs/runtime.md#warm-standby---standby): the supervisor keeps a second driver built and
waiting beside the running one. A kill -9 of the running driver is taken over by the standby (no new process is
started for it) and a new standby follows; a killed standby is replaced and the running driver is untouched;
``--standby`` where it cannot work is refused before anything starts. Real Spark (local), tansu, SeaweedFS; exact
counts."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.records.supervision import latest_supervisor
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_STOPPED
from tests.support.runtimejob import JobEnv, Run, expected_counts, kill_driver, produce, wait_logged

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
FAST = ("--poll-interval", "1", "--lease-interval", "1", "--restart-strategy", "fixed-delay", "--restart-attempts",
        "9", "--restart-delay", "0.5")
STARTED = re.compile(r"standby driver pid (\d+) started")


def _lines(run: Run, text: str) -> list[str]:
    return [ln for ln in run.ckpt_lines() if text in ln]


def _standbys(run: Run) -> list[int]:
    """The pids of the standbys the supervisor started, in order."""
    return [int(m.group(1)) for ln in run.ckpt_lines() if (m := STARTED.search(ln))]


def _ready(run: Run, count: int) -> None:
    wait_logged(f"{count} standby ready", lambda: len(_lines(run, "standby ready")) >= count, TIMEOUT, run.log)


def test_each_kill_of_the_running_driver_is_taken_over_by_its_standby_and_a_killed_standby_is_replaced_exact(
        env: JobEnv, runs: list[Run], pytestconfig: pytest.Config) -> None:
    kills = 5 if pytestconfig.getoption("--full", default=False) else 2
    produce(env.kafka.bootstrap_servers, env.topic, 0, 300)
    runs.append(run := env.run("job", env.work / "checkpoint", "--supervise", "--standby", *FAST))
    status = env.wait_status("300 records counted", lambda s: env.consumed(s) == 300, TIMEOUT, run)
    first_pid, produced, took = status.pid, 300, []
    _ready(run, 1)
    wait_logged("the supervisor's record naming its ready standby", lambda: (
        (r := latest_supervisor(env.store())) is not None and r.standby_ready and r.standby_pid == _standbys(run)[0]),
        TIMEOUT, run.log)  # what the Streaming Jobs page shows
    for i in range(1, kills + 1):
        _ready(run, i)
        killed_at = time.time()
        kill_driver(status)
        produce(env.kafka.bootstrap_servers, env.topic, produced, 200)
        produced += 200
        status = env.wait_status(f"epoch {status.epoch + 1} counting {produced}",
                                 lambda s, e=status.epoch + 1, n=produced: s.epoch == e and env.consumed(s) == n,
                                 TIMEOUT, run)
        took.append(round(status.updated_at - killed_at, 1))
        assert len(_lines(run, "is the standby, given the go")) == i
    print(f"kill -9 to the standby's first counted batch (s, an upper bound: a heartbeat's time): {took}")
    assert len(_lines(run, "standby taking over")) == kills
    assert len([ln for ln in _lines(run, "launcher.supervisor") if "driver pid" in ln and " started (attempt" in ln]) \
        == 1, "the supervisor started one driver itself; every later one was a standby"
    assert status.pid != first_pid and status.state is JobState.RUNNING

    # The standby is killed: the running driver goes on (same epoch and process), and a new standby appears.
    _ready(run, kills + 1)
    spare = _standbys(run)[-1]
    os.killpg(spare, signal.SIGKILL)
    wait_logged("a new standby", lambda: len(_standbys(run)) == kills + 2, TIMEOUT, run.log)
    produce(env.kafka.bootstrap_servers, env.topic, produced, 200)
    produced += 200
    after = env.wait_status(f"{produced} counted", lambda s: env.consumed(s) == produced, TIMEOUT, run)
    assert (after.epoch, after.pid) == (status.epoch, status.pid)
    _ready(run, kills + 2)

    assert env.request(RequestAction.STOP, after.epoch).outcome is Outcome.COMPLETED
    assert run.wait(TIMEOUT) == EXIT_STOPPED
    assert _lines(run, "standby driver pid") and f"standby driver pid {_standbys(run)[-1]} stopped" in "\n".join(
        run.ckpt_lines())  # the supervisor's end stopped its standby
    assert env.final_counts() == expected_counts(produced)
    committed = sorted(b for entries in env.commits().values() for b, _t in entries)
    assert committed == list(range(len(committed))), "every batch committed exactly once"


def test_a_paused_driver_is_stopped_by_its_supervisor_and_its_standby_takes_over_exact(
        env: JobEnv, runs: list[Run]) -> None:
    """SIGSTOP of the running driver's process group: its heartbeat stops, the supervisor terminates it (SIGTERM, and
    SIGCONT so that the paused driver can act on it) and gives the standby the go only once it exited, so the old
    driver never runs beside the standby."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, 300)
    runs.append(run := env.run("job", env.work / "checkpoint", "--supervise", "--standby", "--heartbeat-interval", "2",
                               *FAST))
    status = env.wait_status("300 records counted", lambda s: env.consumed(s) == 300, TIMEOUT, run)
    _ready(run, 1)
    assert status.pid is not None
    group = os.getpgid(status.pid)
    os.killpg(group, signal.SIGSTOP)
    produce(env.kafka.bootstrap_servers, env.topic, 300, 200)
    after = env.wait_status("the standby counting 500",
                            lambda s: s.epoch == status.epoch + 1 and env.consumed(s) == 500, TIMEOUT, run)
    assert _lines(run, "no heartbeat in status.json") and len(_lines(run, "is the standby, given the go")) == 1
    assert not pid_alive(status.pid), "the paused driver ended before the standby took over"
    assert not _lines(run, "after SIGTERM: SIGKILL"), "resumed to act on SIGTERM, it stopped within the grace"
    assert env.request(RequestAction.STOP, after.epoch).outcome is Outcome.COMPLETED
    assert run.wait(TIMEOUT) == EXIT_STOPPED
    assert env.final_counts() == expected_counts(500)
    committed = sorted(b for entries in env.commits().values() for b, _t in entries)
    assert committed == list(range(len(committed))), "every batch committed exactly once"


def test_standby_without_a_supervisor_or_in_cluster_mode_is_refused_before_anything_starts(
        env: JobEnv, runs: list[Run]) -> None:
    runs.append(run := env.run("job", env.work / "checkpoint", "--standby"))
    assert run.wait(TIMEOUT) == EXIT_CONFIG
    text = run.log.read_text()
    assert "--standby keeps a second driver beside the running one" in text
    assert "expected --supervise (or --service) in client mode, found no --supervise" in text
    assert env.status() is None  # nothing started, nothing written
