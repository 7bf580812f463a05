"""The demo shows its proof: the progress lines it picks from ``airflow dags test`` (the output of real runs,
trimmed), the counts next to each claim, and lines handed over while the command still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from airflow_ckpt_provider.demo.progress import DagTestLines
from airflow_ckpt_provider.demo.summary import Proof, Resumed, Summary
from airflow_ckpt_provider.demo.world import _follow

OP = "airflow.task.operators.airflow_ckpt_provider.operators.upgrade.UpgradeStreamingJobOperator"
DAG = "airflow.sdk.definitions.dag"
API = "airflow.api_fastapi.execution_api.routes.task_instances"
#: An ``airflow dags test`` run of ckpt_upgrade_job, trimmed: Airflow's noise, our lines, a failed verification.
UPGRADE_RUN = Path(__file__).parent / "data" / "dags_test_upgrade_output.txt"


def _picked(text: str) -> list[str]:
    lines = DagTestLines()
    return [shown for line in text.splitlines(keepends=True) for shown in lines.feed(line)]


def test_the_progress_lines_are_our_loggers_and_the_task_states_one_line_each() -> None:
    assert _picked(UPGRADE_RUN.read_text()) == [
        "upgrade: started",
        "upgrade: step 1/5: checking that orders_v2.py (code v2) restores the current state",
        "upgrade: step 2/5: stop with savepoint (driver of epoch 2)",
        "upgrade: deferred",
        "upgrade: waiting: expected it healthy; last seen: RUNNING at epoch 3, batch 4, 0 of 1 batches",
        # batch 5: the same wait with other numbers, 2 s later: not shown
        "upgrade: waiting: expected it healthy; last seen: RESTARTING by its driver, attempt 2",
        "upgrade: waiting: expected it healthy; last seen: RESTARTING by its driver, attempt 3",  # 30 s later
        "upgrade: ERROR the new code failed verification: it is crash-looping",  # the first line of the record
        "upgrade: airflow.sdk.exceptions.AirflowException: upgrade of job orders to v2 failed verification; "
        "rolled back to v1",
        "upgrade: failed",
    ]


def test_a_skipped_sensor_says_why_and_control_characters_never_pass() -> None:
    run = (f"2026-11-26T06:36:27.871540Z [info     ] [DAG TEST] starting task_id=watch_health map_index=-1 [{DAG}]\n"
           "\x1b[32m2026-11-26T06:36:52.936408Z [info     ] Skipping task.  [task] loc=task_runner.py:1622 "
           "reason='Skipping due to soft_fail is set to True.'\x1b[0m\n"
           f"2026-11-26T06:36:52.947781Z [info     ] Task instance state updated [{API}] new_state=skipped\r\n"
           f"2026-11-26T06:36:53.001000Z [info     ] Task instance state updated [{API}] new_state=skipped\n"
           f"2026-11-26T06:36:53.996808Z [info     ] job orders: disposed of 0 snapshots\x07 "
           "[airflow.task.operators.airflow_ckpt_provider.operators.snapshot.DisposeSnapshotsOperator] loc=s.py:91\n")
    picked = _picked(run)
    assert picked == ["watch_health: started", "watch_health: skipped (Skipping due to soft_fail is set to True.)",
                      "watch_health: disposed of 0 snapshots"]
    assert all(ch.isprintable() for line in picked for ch in line)


def test_a_long_line_is_cut() -> None:
    long = "x" * 1000
    [line] = _picked(f"2026-11-26T06:36:19.657985Z [info     ] job orders: launched {long} [{OP}] loc=job.py:76\n")
    assert len(line) == 300 and line.endswith("…")


def test_the_proof_shows_the_counts_next_to_the_claim() -> None:
    expected = {"c000": (2, 7), "c001": (2, 14), "c002": (1, 21)}
    proof = Proof.of(expected, dict(expected))
    assert proof.exact
    assert proof.line() == ("final state equals the produced stream: YES — 5 orders produced, 5 counted; revenue 42 "
                            "produced, 42 counted; 3 of 3 customers' totals equal")
    short = Proof.of(expected, {"c000": (2, 7), "c001": (1, 7), "c009": (1, 1)})
    assert not short.exact
    assert (short.produced, short.counted, short.equal, short.customers) == (5, 4, 1, 4)
    assert short.line().startswith("final state equals the produced stream: NO — 5 orders produced, 4 counted")
    big = Proof(4500, 4500, 222750, 222750, 50, 50)
    assert "4,500 orders produced, 4,500 counted; revenue 222,750 produced" in big.line()


def test_a_resumed_driver_names_its_snapshot_and_batches() -> None:
    assert Resumed("savepoint-12-x", 12, 3, 14).line() == (
        "epoch 3 restored from savepoint-12-x (taken at batch 12, so it resumed at batch 13); now at batch 14")
    assert Resumed(None, None, 2, None).line() == (
        "epoch 2 started from the live checkpoint; no batch since (no new orders yet)")
    summary = Summary(proof=Proof(10, 10, 70, 70, 5, 5), lag=0, restart="driver killed", restored=Resumed(
        "savepoint-12-x", 12, 3, 14), upgraded=Resumed("savepoint-20-y", 20, 4, 22), code_version="v2",
        final="stopped with final savepoint savepoint-30-z at batch 30", store_url="s3://b/jobs/orders",
        snapshots=7, savepoints=3, seconds=61.04)
    assert summary.ok
    assert summary.lines()[2:5] == [
        "2. savepoint and restore: epoch 3 restored from savepoint-12-x (taken at batch 12, so it resumed at "
        "batch 13); now at batch 14",
        "3. upgrade to code v2: epoch 4 restored from savepoint-20-y (taken at batch 20, so it resumed at batch 21); "
        "now at batch 22",
        "4. stopped with final savepoint savepoint-30-z at batch 30",
    ]
    assert summary.lines()[-1] == "total 61.0 s"


def test_lines_are_handed_over_while_the_command_runs(tmp_path: Path) -> None:
    """The second line is written only after the first one was seen; the last one has no newline."""
    log, seen = tmp_path / "out.log", []
    code = ("import sys, time, pathlib\nprint('one', flush=True)\n"
            f"while not pathlib.Path({str(tmp_path / 'go')!r}).exists(): time.sleep(0.05)\n"
            "sys.stdout.write('two\\nthree'); sys.stdout.flush()\n")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, text=True)

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "one":
            (tmp_path / "go").touch()

    _follow(proc, log, on_line, timeout=60)
    assert seen == ["one", "two", "three"]
    assert proc.wait() == 0
