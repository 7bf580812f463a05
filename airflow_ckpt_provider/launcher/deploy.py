"""Deployments: what runs for a job (code, Spark, runtime and restart settings), recorded in the job store.

Design notes: docs/airflow.md#design-notes-launcherdeploypy."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.modes import RestoreSpec
from airflow_ckpt_provider.core.policy.settings import JobSettings
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV, Deployment, Launch, new_launch_id, read_launch
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import pyenv
from airflow_ckpt_provider.launcher.sparkapp import driver_command
from airflow_ckpt_provider.launcher.submit import SubmitSpec, check_master
from airflow_ckpt_provider.runtime.config import RuntimeConfig

log = logging.getLogger(__name__)


def run_argv(deployment: Deployment, job: str, store: str, restore: RestoreSpec,
             s3: S3Options | None = None, *, supervise: bool = True) -> list[str]:
    """``ckpt run ... --supervise`` for this deployment, restoring with ``restore`` on the first start
    (without ``--supervise``: one driver, e.g. a restore check's)."""
    d = deployment
    argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", d.job_file, "--job", job, "--store", store,
            "--restore", str(restore), *(["--supervise"] if supervise else []), "--master", d.master,
            "--deploy-mode", d.deploy_mode, *d.to_argv(JobSettings)]
    optional = {"--code-version": d.code_version, "--spark-submit": d.spark_submit, "--python-env": d.python_env,
                "--endpoint-url": s3.endpoint_url if s3 else None, "--region": s3.region if s3 else None}
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, value]
    for key, value in d.conf.items():
        argv += ["--conf", f"{key}={value}"]
    if d.py_files:
        argv += ["--py-files", ",".join(d.py_files)]
    if d.files:
        argv += ["--files", ",".join(d.files)]
    return argv


def submit_spec(deployment: Deployment, job: str, store: str, restore: RestoreSpec, s3: S3Options | None = None,
                *, supervised: bool = False, **runtime: Any) -> SubmitSpec:
    """The spark-submit side of this deployment for one driver (``runtime``: more RuntimeConfig fields);
    ``supervised`` as launched (``ckpt run --supervise``), so what a supervisor may not run is refused here."""
    d = deployment
    config = RuntimeConfig(
        **d.values(JobSettings), job=job, store=store, restore=restore, code_version=d.code_version,
        endpoint_url=s3.endpoint_url if s3 else None, region=s3.region if s3 else None, **runtime,
    )
    return SubmitSpec(job_file=d.job_file, config=config, master=d.master, deploy_mode=d.deploy_mode,
                      conf=dict(d.conf), py_files=d.py_files, files=d.files, spark_submit=d.spark_submit,
                      shipped=pyenv.plan(d.python_env, d.master), supervised=supervised)


def credentials_env(s3: S3Options | None) -> dict[str, str]:
    """The job store credentials as the environment ``ckpt run`` reads (S3Options.from_env); the endpoint and
    region go on its command line."""
    env = s3.env() if s3 is not None else {}
    return {k: v for k, v in env.items() if k not in ("AWS_ENDPOINT_URL", "AWS_REGION")}


def inherited_env() -> dict[str, str]:
    """What a launched job inherits of this process's environment: all but Airflow's own settings (connections,
    the metadata database), which are not the job's business."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}


def log_dir(job: str) -> Path:
    base = os.environ.get("CKPT_HOME") or str(Path.home() / ".ckpt")
    return Path(base, "jobs", job, "logs")


def launch(
    store: JobStore,
    deployment: Deployment,
    *,
    restore: RestoreSpec,
    store_url: str,
    s3: S3Options | None = None,
    launched_by: str = "",
    unrecorded_env: Mapping[str, str] | None = None,
    key: str = "",
) -> Launch:
    """Record the deployment in spec/last.json, then start ``ckpt run --supervise`` detached from this process.

    ``unrecorded_env``: more environment for this launch's supervisor and drivers that spec/last.json does not
    record, unlike the deployment's ``env`` (e.g. an OpenLineage transport, which may hold an API key); the
    deployment's ``env`` wins over it.

    The record is written first (Flink operator: record the target, then act), so whoever looks next
    knows what was meant to run even if this process dies right after.
    """
    record = record_launch(store, deployment, restore=restore, store_url=store_url, s3=s3, launched_by=launched_by,
                           here=True, key=key)
    return start_launch(store, record, store_url=store_url, s3=s3, unrecorded_env=unrecorded_env)


def record_launch(store: JobStore, deployment: Deployment, *, restore: RestoreSpec, store_url: str,
                  s3: S3Options | None = None, launched_by: str = "", here: bool = False,
                  checked: bool = False, key: str = "") -> Launch:
    """Check the deployment (bad input and an unreachable master raise here, nothing recorded), then write it to
    spec/last.json as a new launch that nothing has started yet (``pid`` None); ``here``: to be started on this host
    (its host and log file recorded already, so a start that fails leaves its log findable); ``checked``: the caller
    ran ``check_deployment`` already; ``key``: the run that asks (Launch.key)."""
    now = time.time()
    launch_id = new_launch_id(now)
    record = Launch(store.job, deployment, restore, now, launched_by or f"{os.environ.get('USER', '?')}@"
                    f"{socket.gethostname()}", launch_id, host=socket.gethostname() if here else None,
                    log_file=str(log_dir(store.job) / f"{launch_id}.log") if here else None, key=key)
    if not checked:
        check_deployment(deployment, store.job, store_url, restore, s3)  # before spec/last.json records the launch
    store.storage.write(SPEC_LAST, record.to_bytes())
    return record


def check_deployment(deployment: Deployment, job: str, store_url: str, restore: RestoreSpec,
                     s3: S3Options | None = None) -> None:
    """Bad input (the command its supervisor would run) and an unreachable master raise ConfigError here."""
    driver_command(submit_spec(deployment, job, store_url, restore, s3, supervised=True))
    check_master(deployment.master)


def spawn_detached(argv: Sequence[str], env: Mapping[str, str], log_file: Path) -> int:
    """Start ``argv`` in a session of its own (it outlives this process and its process group), its output
    appended to ``log_file``; reaped by a thread while this process lives (a zombie would look alive to pid checks).
    Its pid."""
    with log_file.open("ab") as out:
        proc = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    threading.Thread(target=proc.wait, name=f"ckpt-reap-{proc.pid}", daemon=True).start()
    return proc.pid


def start_launch(store: JobStore, record: Launch, *, store_url: str, s3: S3Options | None = None,
                 unrecorded_env: Mapping[str, str] | None = None, adopt_epoch: int | None = None) -> Launch:
    """Start the supervisor of recorded launch ``record`` on this host (``ckpt run --supervise``, detached, its
    output in ``log_dir``), then record its pid, host and log in spec/last.json if the record is still ours.
    ``adopt_epoch``: the launch's driver of that epoch runs without a supervisor; the new one watches it first."""
    log_file = Path(record.log_file) if record.host == socket.gethostname() and record.log_file else \
        log_dir(store.job) / f"{record.launch_id}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    argv = run_argv(record.deployment, store.job, store_url, record.restore, s3)
    if adopt_epoch is not None:
        argv += ["--adopt-epoch", str(adopt_epoch)]
    env = {**inherited_env(), **(unrecorded_env or {}), **record.deployment.env, **credentials_env(s3),
           LAUNCH_ENV: record.launch_id}
    pid = spawn_detached(argv, env, log_file)
    started = replace(record, pid=pid, host=socket.gethostname(), log_file=str(log_file))
    try:  # best effort, and only over our own record: its supervisor may have recorded its end already
        current = store.storage.read_versioned(SPEC_LAST)
        if current is not None and Launch.from_bytes(current.data, SPEC_LAST) == record:
            store.storage.write_if(SPEC_LAST, started.to_bytes(), current.tag)
    except StorageError as err:
        log.warning("job %s: launch %s runs (pid %d) but its pid was not recorded: %s", store.job, record.launch_id,
                    pid, err)
    return started


def log_tail(launch_record: Launch | None, lines: int = 20) -> str:
    """The last lines of a launch's log on this host ('' when it is elsewhere or gone)."""
    if launch_record is None or not launch_record.log_file or launch_record.host != socket.gethostname():
        return ""
    try:
        text = Path(launch_record.log_file).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_failure(store: JobStore, event: dict[str, Any]) -> str:
    """Why a launch's driver did not start, from the health watch's event ('' when it is healthy): its message
    and, when the launch ran on this host, the last lines of its log."""
    if event.get("status") == "healthy":
        return ""
    tail = log_tail(read_launch(store))
    return f"job {store.job} did not start: {event.get('message')}" + (
        f"\nlast lines of its log:\n{tail}" if tail else "")
