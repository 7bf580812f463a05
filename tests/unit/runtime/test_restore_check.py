"""The restore check's pure parts: config flags, the report line, the empty batch, the verdict, and
the host side (check_restore) against a fake spark-submit."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.gate import GATE_ENV
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile, Trigger
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.launcher.restore_check import check_restore, check_spec
from airflow_ckpt_provider.launcher.submit import SubmitSpec, gate_file
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.exitcodes import EXIT_INCOMPATIBLE, exit_meaning
from airflow_ckpt_provider.runtime.restore_check_verdict import (
    OPERATORS_MISMATCH,
    REPORT_PREFIX,
    CheckOutcome,
    RestoreCheck,
    judge,
    operators_in_error,
    operators_run,
    parse_report,
    plan_empty_batch,
    snapshot_operators,
    source_changes,
    spark_error,
)

SHA = "0" * 64


# -- config -----------------------------------------------------------------------------------


def test_check_flags_round_trip_through_args() -> None:
    cfg = RuntimeConfig(job="orders", store="/s", checkpoint="/c", restore="latest-savepoint", check_restore=True,
                        allow_non_restored_state=True, check_timeout=42.5)
    args = cfg.to_args()
    assert "--check-restore" in args and "--allow-non-restored-state" in args
    assert args[args.index("--check-timeout") + 1] == "42.5"
    assert RuntimeConfig.from_args(args) == cfg


def test_unset_flags_are_left_out_and_default_to_false() -> None:
    cfg = RuntimeConfig(job="orders", store="/s", checkpoint="/c")
    args = cfg.to_args()
    assert "--check-restore" not in args and "--allow-non-restored-state" not in args
    back = RuntimeConfig.from_args(args)
    assert back == cfg
    assert (back.check_restore, back.allow_non_restored_state) == (False, False)


def test_check_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"^check_timeout must be > 0 seconds, found 0.0$"):
        RuntimeConfig(job="j", store="/s", checkpoint="/c", check_timeout=0)


def test_the_check_has_its_own_gate() -> None:
    job = RuntimeConfig(job="orders", store="/s", checkpoint="/c")
    check = RuntimeConfig(job="orders", store="/s", checkpoint="/c", check_restore=True)
    assert gate_file(job) != gate_file(check)
    assert "ckpt-gate-check-orders-" in gate_file(check)


def test_check_spec_sets_check_mode_a_driver_timeout_and_a_name(tmp_path: Path) -> None:
    spec = SubmitSpec(job_file=str(tmp_path / "v2.py"), config=RuntimeConfig(job="orders", store="/s",
                                                                               checkpoint="/c"))
    checked = check_spec(spec, 300)
    assert checked.config.check_restore
    assert checked.config.check_timeout == 270
    assert checked.app_name == "ckpt-orders-restore-check"
    assert check_spec(spec, 40).config.check_timeout == 20  # half of a short timeout
    with pytest.raises(ConfigError, match="timeout must be > 0 seconds"):
        check_spec(spec, 0)


def test_exit_code_five_means_incompatible() -> None:
    assert EXIT_INCOMPATIBLE == 5
    assert exit_meaning(5) == "cannot restore the state"


# -- the report line --------------------------------------------------------------------------


def _report(**changes: object) -> RestoreCheck:
    base = RestoreCheck(CheckOutcome.COMPATIBLE, "fine", "checkpoint-6-20261122T130841Z-f853f8", 6, (0,), (0,), ())
    return RestoreCheck(**{**base.__dict__, **changes})


def test_report_round_trips_through_its_line() -> None:
    report = _report(error_class=None, seconds=21.5, rewritten_snapshot_id="savepoint-7-20261130T091500Z-0a1b2c",
                     source_changes=("source 'c' added: ...",))
    line = report.to_line()
    assert line.startswith(REPORT_PREFIX) and "\n" not in line
    body = json.loads(line[len(REPORT_PREFIX):])
    assert body["compatible"] is True
    assert body["snapshot_operators"] == [0]
    assert body["rewritten_snapshot_id"] == "savepoint-7-20261130T091500Z-0a1b2c"
    assert RestoreCheck.from_dict(body) == report


def test_parse_report_finds_the_last_line_among_spark_output() -> None:
    first = _report(outcome=CheckOutcome.INCOMPATIBLE, reason="no")
    last = _report()
    lines = ["26/11/22 13:13:35 INFO SparkContext: Running Spark version 4.3.0", first.to_line(),
             "WARN something", f"2026-11-22 INFO x: {last.to_line()}", "  at org.apache.Foo(Foo.java:1)"]
    assert parse_report(lines) == last
    assert parse_report(["nothing here"]) is None


def test_parse_report_skips_a_malformed_line() -> None:
    good = _report()
    assert parse_report([good.to_line(), REPORT_PREFIX + '{"compatible": tru']) == good
    assert parse_report([REPORT_PREFIX + '{"reason": "no outcome, no compatible"}']) is None


def test_from_dict_accepts_compatible_alone_and_keeps_unknown_fields() -> None:
    check = RestoreCheck.from_dict({"compatible": False, "reason": "r", "future": 1})
    assert (check.outcome, check.compatible, check.snapshot_operators) == (CheckOutcome.INCOMPATIBLE, False, ())
    assert check.to_dict()["future"] == 1
    with pytest.raises(ValueError, match="not a restore check report"):
        RestoreCheck.from_dict({"outcome": "maybe", "reason": "r"})


# -- the empty batch --------------------------------------------------------------------------


def _checkpoint(root: Path, completed: int, write_ahead: bool) -> LocalStorage:
    storage = LocalStorage(root)
    storage.write("metadata", b'{"id":"q"}')
    for n in range(completed + 1):
        storage.write(f"offsets/{n}", f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{n * 10}}}}}'.encode())
        storage.write(f"offsets/.{n}.crc", b"crc")
        storage.write(f"commits/{n}", b'v1\n{"nextBatchWatermarkMs":0}')
    if write_ahead:
        storage.write(f"offsets/{completed + 1}", b'v1\n{"batchWatermarkMs":0}\n{"t":{"0":999}}')
        storage.write(f"offsets/.{completed + 1}.crc", b"crc")
    return storage


@pytest.mark.parametrize("write_ahead", [False, True])
def test_plan_empty_batch_logs_the_next_batch_with_the_same_offsets(tmp_path: Path, write_ahead: bool) -> None:
    storage = _checkpoint(tmp_path / "ckpt", 6, write_ahead)
    assert plan_empty_batch(storage, 6) == 7
    assert storage.read("offsets/7") == storage.read("offsets/6")
    assert not storage.exists("offsets/.7.crc"), "a stale checksum of the dropped write-ahead entry"
    assert not storage.exists("commits/7")
    assert storage.exists("offsets/5") and storage.exists("offsets/.6.crc")


def test_plan_empty_batch_drops_entries_after_the_batch(tmp_path: Path) -> None:
    storage = _checkpoint(tmp_path / "ckpt", 8, write_ahead=True)
    assert plan_empty_batch(storage, 6) == 7
    keys = {o.key for o in storage.list()}
    assert {"offsets/8", "commits/7", "commits/8", "offsets/9"}.isdisjoint(keys)
    assert storage.read("offsets/7") == storage.read("offsets/6")


def test_plan_empty_batch_refuses_an_uncompleted_batch(tmp_path: Path) -> None:
    storage = _checkpoint(tmp_path / "ckpt", 3, write_ahead=False)
    with pytest.raises(CkptError, match="batch 4 is not completed"):
        plan_empty_batch(storage, 4)


# -- the operators and the verdict ------------------------------------------------------------


def _manifest(operators: dict[int, str | None]) -> Manifest:
    files = tuple(ManifestFile(f"state/{op}/0/7.delta", 10, SHA) for op in operators)
    return Manifest(
        job="orders", snapshot_id="savepoint-6-20261122T130841Z-f853f8", kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL,
        batch_id=6, created_at="2026-11-22T13:08:41+00:00", query_id="q", checkpoint="/c", files=files,
        operators=[{"operator_id": op, "name": name} for op, name in operators.items() if name],
    )


def test_operators_run_are_those_that_wrote_state_files() -> None:
    before = {"state/0/0/7.delta", "state/0/1/7.delta", "state/1/0/7.delta"}
    after = [*before, "state/0/0/8.delta", "state/0/0/.8.delta.crc", "state/2/_metadata/metadata", "commits/7"]
    assert operators_run(before, after) == (0, 2)


def test_snapshot_operators_come_from_the_manifest_and_its_files() -> None:
    assert snapshot_operators(_manifest({0: "stateStoreSave", 1: None})) == {0: "stateStoreSave", 1: None}


def test_judge_all_state_restored_is_compatible() -> None:
    check = judge(_manifest({0: "stateStoreSave"}), "orders_v2.py", (0,), allow_non_restored=False)
    assert check.compatible
    assert (check.snapshot_id, check.batch_id, check.non_restored_operators) == (
        "savepoint-6-20261122T130841Z-f853f8", 6, ())
    assert "orders_v2.py can restore savepoint savepoint-6-20261122T130841Z-f853f8 (batch 6)" in check.reason
    assert "operator 0 (stateStoreSave)" in check.reason and "ran batch 7" in check.reason


def test_judge_non_restored_state_is_incompatible_unless_allowed() -> None:
    manifest = _manifest({0: "stateStoreSave", 1: "dedupe"})
    refused = judge(manifest, "v3.py", (0, 2), allow_non_restored=False)
    assert refused.outcome is CheckOutcome.INCOMPATIBLE
    assert (refused.snapshot_operators, refused.new_operators, refused.non_restored_operators) == ((0, 1), (0, 2), (1,))
    assert "has no stateful operator 1 (dedupe)" in refused.reason
    assert "--allow-non-restored-state" in refused.reason
    allowed = judge(manifest, "v3.py", (0, 2), allow_non_restored=True)
    assert allowed.compatible
    assert "the state of operator 1 (dedupe) is dropped (--allow-non-restored-state)" in allowed.reason
    assert "operator 2 start(s) with empty state" in allowed.reason


SPARK_MISMATCH = (
    "[STREAM_FAILED] Query [id = 42c5, runId = 7cf0] terminated with exception: "
    f"[{OPERATORS_MISMATCH}] Streaming stateful operator name does not match with the operator in state "
    "metadata. This likely to happen when user adds/removes/changes stateful operator of existing streaming query.\n"
    "Stateful operators in the metadata: [(OperatorId: 0 -> OperatorName: stateStoreSave), (OperatorId: 1 -> "
    "OperatorName: dedupe)]; Stateful operators in current batch: [(OperatorId: 0 -> OperatorName: stateStoreSave)]."
    " SQLSTATE: 42K03\n=== Streaming Query ===\nIdentifier: check [id = 42c5]\nCurrent State: ACTIVE\n"
)


def test_spark_error_keeps_the_message_and_the_condition() -> None:
    message, condition = spark_error(RuntimeError(SPARK_MISMATCH + "\tat org.apache.spark.Foo(Foo.scala:1)\n"))
    assert condition == OPERATORS_MISMATCH
    assert message.startswith(f"[{OPERATORS_MISMATCH}] Streaming stateful operator name")
    assert "STREAM_FAILED" not in message and "Streaming Query" not in message and "Foo.scala" not in message
    assert spark_error(ValueError("")) == ("ValueError", None)


def test_operators_in_error_reads_both_lists() -> None:
    message, _ = spark_error(RuntimeError(SPARK_MISMATCH))
    assert operators_in_error(message) == ({0: "stateStoreSave", 1: "dedupe"}, {0: "stateStoreSave"})
    assert operators_in_error("[OTHER] something else") is None


# -- the host side, against a fake spark-submit -----------------------------------------------


def _fake_spark_submit(tmp_path: Path, body: str) -> str:
    script = tmp_path / "spark-submit"
    script.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _spec(tmp_path: Path, body: str) -> SubmitSpec:
    job_file = tmp_path / "v2.py"
    job_file.write_text("# a job\n")
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "ckpt"))
    return SubmitSpec(job_file=str(job_file), config=config, spark_submit=_fake_spark_submit(tmp_path, body))


def test_check_restore_returns_the_drivers_verdict_and_passes_check_mode(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    verdict = _report(outcome=CheckOutcome.INCOMPATIBLE, reason="Spark refused", error_class="X")
    body = (f"open({str(seen)!r}, 'w').write(__import__('json').dumps({{'argv': sys.argv, 'gate': "
            f"os.environ.get({GATE_ENV!r}), 'job': os.environ.get('ORDERS_TOPIC')}}))\n"
            f"print('INFO lots of Spark output', file=sys.stderr)\nprint({verdict.to_line()!r})\nsys.exit(5)")
    log_file = tmp_path / "logs" / "check.log"
    check = check_restore(_spec(tmp_path, body), 60, log_file=str(log_file), env={"ORDERS_TOPIC": "orders"})
    assert check == replace(verdict, seconds=check.seconds)
    assert check.seconds is not None and check.seconds < 60
    seen_by_driver = json.loads(seen.read_text())
    assert "--check-restore" in seen_by_driver["argv"]
    assert seen_by_driver["argv"][seen_by_driver["argv"].index("--check-timeout") + 1] == "30"
    assert seen_by_driver["gate"] == gate_file(check_spec(_spec(tmp_path, body), 60).config)
    assert seen_by_driver["job"] == "orders"
    assert "lots of Spark output" in log_file.read_text()


def test_check_restore_raises_config_error_for_bad_input(tmp_path: Path) -> None:
    bad = RestoreCheck(CheckOutcome.BAD_INPUT, "restore check: snapshot nope-1 not found; choose another")
    with pytest.raises(ConfigError, match="snapshot nope-1 not found"):
        check_restore(_spec(tmp_path, f"print({bad.to_line()!r})\nsys.exit(2)"), 60)
    with pytest.raises(ConfigError, match=r"exited with 2 \(bad input\) without a verdict; its last lines: boom"):
        check_restore(_spec(tmp_path, "print('boom', file=sys.stderr)\nsys.exit(2)"), 60)


def test_check_restore_without_a_verdict_is_inconclusive(tmp_path: Path) -> None:
    check = check_restore(_spec(tmp_path, "print('java.lang.OutOfMemoryError', file=sys.stderr)\nsys.exit(1)"), 60)
    assert check.outcome is CheckOutcome.INCONCLUSIVE and not check.compatible
    assert "exited with 1 (failed) without a verdict" in check.reason
    assert "java.lang.OutOfMemoryError" in check.reason


def test_check_restore_kills_the_process_group_after_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    body = (f"import subprocess\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\nprint('started', flush=True)\ntime.sleep(60)")
    started = time.monotonic()
    check = check_restore(_spec(tmp_path, body), 3)
    assert time.monotonic() - started < 20
    assert check.outcome is CheckOutcome.INCONCLUSIVE
    assert "did not finish within 3 s and was killed" in check.reason and "started" in check.reason
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child), "the driver's children must die with its process group"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")  # a zombie is dead


def test_source_changes_name_the_added_and_dropped_sources_of_an_offset_log_v2_only() -> None:
    before = {"orders": '{"logOffset":4}', "refunds": None}
    assert source_changes(before, ["orders", "refunds"]) == ()
    assert source_changes(before, ["orders", "payments"]) == (
        "source 'payments' added: Spark reads it from its starting offsets (its own options say where; nothing of it "
        "is in the state)",
        "source 'refunds' no longer read: its position (none yet) is dropped, and reading it again later starts it "
        "over")
    assert source_changes(None, ["0", "1"]) == ()  # offset log v1: sources by position, no names to compare
    assert source_changes(before, None) == ()  # the new query did not say
