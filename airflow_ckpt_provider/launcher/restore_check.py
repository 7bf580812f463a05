"""Can the new code restore the job's state? The restore check, seen from the host that asks.
Never imports Airflow or pyspark.

Design notes: docs/runtime.md#design-notes-launcherrestore_checkpy."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_fixed

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.policy.gate import GATE_ENV
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreSpec
from airflow_ckpt_provider.core.records.deployments import Deployment, new_launch_id
from airflow_ckpt_provider.core.records.restore_check import (
    CHECK_ENV,
    CheckEnded,
    CheckStarted,
    read_start,
    record_end,
    record_pid,
    record_start,
    running_checks,
)
from airflow_ckpt_provider.core.records.supervision import take_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher.deploy import credentials_env, log_dir, run_argv, spawn_detached, submit_spec
from airflow_ckpt_provider.launcher.submit import SubmitSpec, build_command, describe, driver_cwd, gate_file
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, exit_meaning
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck, parse_report

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
    if spec.deploy_mode == "cluster":  # the check driver runs in the cluster: its verdict comes back as its end record
        spec = replace(spec, driver_run=f"check-{new_launch_id(time.time())}")
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
    report = parse_report(text) or _reported_end(spec)
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


def _reported_end(spec: SubmitSpec) -> RestoreCheck | None:
    """A cluster-mode check driver's verdict from its end record (core/records/supervision.py DriverEnd), deleted
    once read; None without a named run or a report (the driver died without a word)."""
    if not spec.driver_run:
        return None
    try:
        store = JobStore.open(spec.config.store, spec.config.job,
                              S3Options.from_env(spec.config.endpoint_url, spec.config.region))
        end = take_driver_end(store, spec.driver_run)
    except StorageError as err:
        log.warning("job %s: cannot read the end record of restore check run %s: %s", spec.config.job,
                    spec.driver_run, err)
        return None
    return RestoreCheck.from_dict(end.report) if end is not None and end.report else None


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


# -- detached: started by an upgrade, its verdict recorded in the job store --------------------------------------


#: Seconds the check process keeps retrying to record its verdict while the job store is unreachable.
RECORD_RETRY = 60.0


def start_check(
    store: JobStore,
    deployment: Deployment,
    *,
    store_url: str,
    timeout: float,
    s3: S3Options | None = None,
    allow_non_restored_state: bool = False,
    started_by: str = "",
    now: float | None = None,
    restore: RestoreSpec = LATEST_STATE,
    rescale_to: int | None = None,
    save_rescaled: bool = False,
    delete_keys: str | None = None,
    update_values: str | None = None,
    save_edited: bool = False,
) -> CheckStarted:
    """Start the restore check of ``deployment`` (the new code) against the job's state as a process of its own
    (``ckpt run --check-restore --check-id ID``, a session of its own, output to the job's log directory), and
    return its record. Its verdict comes as ``checks/<id>.outcome.json``.

    ``rescale_to``: repartition the restored copy's state first (``save_rescaled``: and save it as a savepoint
    once the check passed: a rescale's step, ``restore`` naming the savepoint it rescales). ``delete_keys`` or
    ``update_values``: edit the copy's state first (``save_edited``: and save it, an edit's step).

    Bad input (spark-submit would refuse the check) and a check of this job that still runs raise ConfigError,
    before anything is written. The record is written before the process starts (record the target, then act).
    """
    at = time.time() if now is None else now
    spec = check_spec(submit_spec(deployment, store.job, store_url, restore, s3,
                                  allow_non_restored_state=allow_non_restored_state, check_restore=True,
                                  rescale_to=rescale_to, save_rescaled=save_rescaled, delete_keys=delete_keys,
                                  update_values=update_values, save_edited=save_edited), timeout)
    build_command(spec)  # bad input: here, before anything is recorded
    busy = running_checks(store, at)
    if busy:
        raise ConfigError(
            f"expected no restore check of job {store.job} running, found {busy[-1].describe()}, which has not "
            f"recorded its verdict (it may run until {time.strftime('%H:%M:%SZ', time.gmtime(busy[-1].deadline))}); "
            "wait for it to end, or kill its process, then run the upgrade again")
    if spec.shipped is not None:
        spec.shipped.ensure()  # the executors' Python, built before the clock of the check starts
    check_id = new_launch_id(at)
    logs = log_dir(store.job)
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"check-{check_id}.log"
    started = CheckStarted(store.job, check_id, deployment.job_file, deployment.code_version, at, float(timeout),
                           socket.gethostname(), started_by or f"{os.environ.get('USER', '?')}@{socket.gethostname()}",
                           log_file=str(log_file), restore=str(restore), rescale_to=rescale_to,
                           save_rescaled=save_rescaled, delete_keys=delete_keys, update_values=update_values,
                           save_edited=save_edited)
    argv = [*run_argv(deployment, store.job, store_url, restore, s3, supervise=False), "--check-restore",
            "--check-timeout", f"{timeout:g}", "--check-id", check_id]
    if allow_non_restored_state:
        argv.append("--allow-non-restored-state")
    if rescale_to is not None:
        argv += ["--rescale-to", str(rescale_to), *(["--save-rescaled"] if save_rescaled else [])]
    if delete_keys is not None:
        argv += ["--delete-keys", delete_keys]
    if update_values is not None:
        argv += ["--update-values", update_values]
    if save_edited:
        argv.append("--save-edited")
    record_start(store, started)
    # Airflow's own settings (connections, the metadata database) are not the new code's business.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env = {**inherited, **deployment.env, **credentials_env(s3), CHECK_ENV: check_id}
    log.info("job %s: restore check %s of %s started detached: %s", store.job, check_id, deployment.job_file,
             describe(argv))
    pid = spawn_detached(argv, env, log_file)
    try:  # best effort: without its pid, a waiter falls back to the check's deadline
        return record_pid(store, started, pid)
    except StorageError as err:
        log.warning("job %s: restore check %s runs (pid %d) but its pid was not recorded: %s", store.job, check_id,
                    pid, err)
        return started.with_pid(pid)


def run_recorded_check(store: JobStore, spec: SubmitSpec, check_id: str) -> int:
    """The detached check's process: run the check (``spec.config.check_timeout`` s for all of it), record its
    verdict as ``checks/<id>.outcome.json``, and return the verdict's exit code. Whatever goes wrong is recorded
    as a verdict (bad-input, inconclusive); a check without its start record refuses to run."""
    started = read_start(store, check_id)
    if started is None:
        raise ConfigError(f"restore check {check_id} of job {store.job}: expected its record (checks/{check_id}.json, "
                          "written by whoever starts the check), found none; start it with the upgrade operator")
    here = started.host == socket.gethostname()
    try:
        report = check_restore(spec, spec.config.check_timeout, log_file=started.log_file if here else None)
    except ConfigError as err:
        report = RestoreCheck(CheckOutcome.BAD_INPUT, str(err))
    except Exception as err:  # the verdict is recorded whatever happened: a waiter must not wait for nothing
        log.exception("job %s: restore check %s failed", store.job, check_id)
        report = RestoreCheck(CheckOutcome.INCONCLUSIVE, f"the restore check failed: {type(err).__name__}: {err}")
    ended = CheckEnded(check_id, report.outcome, report.reason, time.time(), report.to_dict())
    for attempt in Retrying(stop=stop_after_delay(RECORD_RETRY), wait=wait_fixed(2.0),
                            retry=retry_if_exception_type(StorageError), reraise=True,
                            before_sleep=before_sleep_log(log, logging.WARNING)):
        with attempt:
            record_end(store, ended)
    log.info("job %s: restore check %s recorded: %s", store.job, check_id, report.outcome.value)
    return report.exit_code
