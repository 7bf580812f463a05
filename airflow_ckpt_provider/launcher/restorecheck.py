"""Can the new code restore the job's state? The restore check, seen from the host that asks.

``check_restore`` runs the job file once with spark-submit in check mode (``ckpt run JOB_FILE
--check-restore``, runtime/restorecheck.py): the driver restores a snapshot into a scratch location
and lets Spark run one empty batch of the new query on it, without touching the running job, its
live checkpoint or its job store. The driver prints its verdict as one line, ``CKPT_RESTORE_CHECK
{json}``, among Spark's output; this module finds it (runtime/restoreverdict.py). Never imports
Airflow or pyspark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.gate import GATE_ENV
from airflow_ckpt_provider.launcher.submit import SubmitSpec, build_command, describe, driver_cwd, gate_file
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, exit_meaning
from airflow_ckpt_provider.runtime.restoreverdict import CheckOutcome, RestoreCheck, parse_report

log = logging.getLogger(__name__)

#: Seconds the driver keeps for itself within the host's timeout (Spark's start, the cleanup).
DRIVER_MARGIN = 30.0
#: Seconds between SIGTERM and SIGKILL of a check that ran out of time.
KILL_GRACE = 10.0
TAIL_LINES = 20


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
    if spec.shipped is not None:
        spec.shipped.ensure()  # the executors' Python, as for the job itself (built once, then cached)
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
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=driver_cwd(spec))
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
