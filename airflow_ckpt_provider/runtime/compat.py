"""Can the new code restore the job's state? The restore check, seen from the host that asks.

``check_restore`` runs the job file once with spark-submit in check mode (``ckpt run JOB_FILE
--check-restore``, runtime/restorecheck.py): the driver restores a snapshot into a scratch location
and lets Spark run one empty batch of the new query on it, without touching the running job, its
live checkpoint or its job store. The driver prints its verdict as one line, ``CKPT_RESTORE_CHECK
{json}``, among Spark's output; this module finds it. Never imports Airflow or pyspark.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.gate import GATE_ENV
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INCOMPATIBLE,
    EXIT_STOPPED,
    exit_meaning,
)
from airflow_ckpt_provider.runtime.submit import SubmitSpec, build_command, describe, gate_file

log = logging.getLogger(__name__)

#: How the driver's verdict starts on stdout: the prefix, then one JSON object, on one line.
REPORT_PREFIX = "CKPT_RESTORE_CHECK "
#: Seconds the driver keeps for itself within the host's timeout (Spark's start, the cleanup).
DRIVER_MARGIN = 30.0
#: Seconds between SIGTERM and SIGKILL of a check that ran out of time.
KILL_GRACE = 10.0
TAIL_LINES = 20


class CheckOutcome(StrEnum):
    """The closed set of verdicts; ``EXIT_CODES`` maps each to the driver's exit code."""

    COMPATIBLE = "compatible"  # Spark restored the state and ran a batch of the new query on it
    INCOMPATIBLE = "incompatible"  # Spark refused it, or state of the snapshot would be dropped
    INCONCLUSIVE = "inconclusive"  # no verdict: timeout, crash, unreachable storage (retry may help)
    BAD_INPUT = "bad-input"  # nothing to check: unknown snapshot, broken job file, no snapshot of the state


EXIT_CODES = {
    CheckOutcome.COMPATIBLE: EXIT_STOPPED,
    CheckOutcome.INCOMPATIBLE: EXIT_INCOMPATIBLE,
    CheckOutcome.INCONCLUSIVE: EXIT_FAILED,
    CheckOutcome.BAD_INPUT: EXIT_CONFIG,
}


@dataclass(frozen=True)
class RestoreCheck:
    """The verdict of one restore check.

    ``snapshot_id``/``batch_id``: the snapshot checked and its completed batch (the check runs batch
    ``batch_id + 1``, without data). ``snapshot_operators``: the stateful operators whose state the
    snapshot holds; ``new_operators``: those the new query ran (it wrote state for them);
    ``non_restored_operators``: in the snapshot but not in the new query (their state would be dropped).
    ``error_class``: Spark's error condition when Spark refused, e.g. STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE.
    ``seconds``: the check's wall time (from ``check_restore``: spark-submit's start included).
    """

    outcome: CheckOutcome
    reason: str
    snapshot_id: str | None = None
    batch_id: int | None = None
    snapshot_operators: tuple[int, ...] = ()
    new_operators: tuple[int, ...] = ()
    non_restored_operators: tuple[int, ...] = ()
    error_class: str | None = None
    seconds: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields of a newer driver, kept as they are

    @property
    def compatible(self) -> bool:
        return self.outcome is CheckOutcome.COMPATIBLE

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "compatible": self.compatible,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "snapshot_id": self.snapshot_id,
            "batch_id": self.batch_id,
            "snapshot_operators": list(self.snapshot_operators),
            "new_operators": list(self.new_operators),
            "non_restored_operators": list(self.non_restored_operators),
            "error_class": self.error_class,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestoreCheck:
        """The check ``to_dict`` described; ValueError says what is missing or malformed."""
        try:
            outcome = CheckOutcome(d["outcome"]) if "outcome" in d else (
                CheckOutcome.COMPATIBLE if d["compatible"] is True else CheckOutcome.INCOMPATIBLE
            )
            known = {"compatible", "outcome", "reason", "snapshot_id", "batch_id", "snapshot_operators",
                     "new_operators", "non_restored_operators", "error_class", "seconds"}
            return cls(
                outcome=outcome,
                reason=str(d["reason"]),
                snapshot_id=None if d.get("snapshot_id") is None else str(d["snapshot_id"]),
                batch_id=None if d.get("batch_id") is None else int(d["batch_id"]),
                snapshot_operators=tuple(int(o) for o in d.get("snapshot_operators") or ()),
                new_operators=tuple(int(o) for o in d.get("new_operators") or ()),
                non_restored_operators=tuple(int(o) for o in d.get("non_restored_operators") or ()),
                error_class=None if d.get("error_class") is None else str(d["error_class"]),
                seconds=None if d.get("seconds") is None else float(d["seconds"]),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a restore check report ({err!r}): {dict(d)!r:.300}") from err

    def to_line(self) -> str:
        """The line the driver prints: the prefix and the JSON object."""
        return REPORT_PREFIX + json.dumps(self.to_dict(), sort_keys=True)


def parse_report(lines: Iterable[str]) -> RestoreCheck | None:
    """The last report line among ``lines`` (a driver's whole output), or None if there is none."""
    found: RestoreCheck | None = None
    for line in lines:
        start = line.find(REPORT_PREFIX)
        if start < 0:
            continue
        try:
            body = json.loads(line[start + len(REPORT_PREFIX):])
            if isinstance(body, dict):
                found = RestoreCheck.from_dict(body)
        except ValueError as err:  # a line cut by another process's output: keep looking
            log.warning("ignoring a malformed restore check line: %s", err)
    return found


def check_spec(spec: SubmitSpec, timeout: float) -> SubmitSpec:
    """``spec`` in check mode: its config with ``check_restore`` and a driver timeout within ``timeout``."""
    if timeout <= 0:
        raise ConfigError(f"the restore check timeout must be > 0 seconds, found {timeout}")
    driver_timeout = max(timeout - DRIVER_MARGIN, timeout / 2)
    config = replace(spec.config, check_restore=True, check_timeout=driver_timeout)
    return replace(spec, config=config, name=spec.name or f"ckpt-{spec.config.job}-restore-check")


def check_restore(
    spec: SubmitSpec, timeout: float, *, log_file: str | None = None, env: Mapping[str, str] | None = None
) -> RestoreCheck:
    """Ask Spark whether ``spec.job_file`` can restore the state ``spec.config.restore`` names.

    Runs spark-submit in its own process group, killed after ``timeout`` seconds. Raises ConfigError
    for bad input (an unknown or foreign snapshot, a job file that does not load, no snapshot of the
    job's state); every other outcome is returned. Its output goes to ``log_file`` when given. ``env``
    is added to this process's environment: the job's settings and the job store's credentials, as for
    the job itself (the check builds the same query).
    """
    spec = check_spec(spec, timeout)
    argv, submit_env = build_command(spec)
    # The check's own gate: the running driver's gate (same job and checkpoint) must never be touched.
    # The new code runs here: not with Airflow's own settings (connections, the metadata database).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env = {**inherited, **submit_env, **(env or {}), GATE_ENV: gate_file(spec.config)}
    log.info("job %s: restore check of %s (restore %s): %s", spec.config.job, spec.job_file, spec.config.restore,
             describe(argv))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if log_file is None:
            out_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ckpt-restore-check-")), "log")
        else:
            out_path = Path(log_file)
            out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            code = _wait(proc, timeout)
        text = out_path.read_text(errors="replace").splitlines()
    seconds = round(time.monotonic() - started, 1)
    if code is None:
        return RestoreCheck(
            CheckOutcome.INCONCLUSIVE, seconds=seconds,
            reason=f"the restore check of {spec.job_file} did not finish within {timeout:g} s and was killed; "
            f"no verdict. Give it more time, or check Spark's output: {_tail(text)}",
        )
    report = parse_report(text)
    if report is not None:
        report = replace(report, seconds=seconds)  # the whole check, spark-submit's start included
    else:
        report = RestoreCheck(
            CheckOutcome.BAD_INPUT if code == EXIT_CONFIG else CheckOutcome.INCONCLUSIVE, seconds=seconds,
            reason=f"the restore check of {spec.job_file} exited with {code} ({exit_meaning(code)}) without a "
            f"verdict; its last lines: {_tail(text)}",
        )
    log.info("job %s: restore check of %s: %s in %.1f s: %s", spec.config.job, spec.job_file,
             report.outcome.value, seconds, report.reason)
    if report.outcome is CheckOutcome.BAD_INPUT:
        raise ConfigError(report.reason)
    return report


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code, or None after killing the process group once ``timeout`` passed."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 30.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
                break
        return None
    return code if code >= 0 else 128 - code


def _tail(lines: list[str]) -> str:
    """The last lines of Spark's output that say something (no stack frames), joined."""
    useful = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith(("at ", "..."))]
    return " | ".join(useful[-TAIL_LINES:]) or "(no output)"
