"""`ckpt run JOB_FILE`: run a job with spark-submit, once in the foreground or supervised (Flink-style restarts).

Exit codes follow the driver's (runtime/exitcodes.py): 0 stopped, 1 failed or given up, 2 bad input,
3 fenced by a newer driver, 5 incompatible (--check-restore); a driver killed by signal N gives 128+N.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from airflow_ckpt_provider.cli.common import add_store_args
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.restart import HealthRule, RestartStrategy, describe_strategy
from airflow_ckpt_provider.core.policy.settings import RestartSettings, RuntimeSettings
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
from airflow_ckpt_provider.core.store.progress import human_count
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import pyenv
from airflow_ckpt_provider.launcher.driverprocess import ProcessLike, Spawn, spawn_driver
from airflow_ckpt_provider.launcher.sparkapp import driver_command
from airflow_ckpt_provider.launcher.submit import (
    DEPLOY_MODES,
    SubmitSpec,
    check_master,
    describe,
    driver_cwd,
    parse_conf,
    redact,
    shared_checkpoint_warning,
)
from airflow_ckpt_provider.launcher.supervisor import Supervisor
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG

log = logging.getLogger("airflow_ckpt_provider.cli.run")

#: Seconds a driver asked to stop (SIGTERM) gets before its process group is killed.
STOP_GRACE = 60.0


def spec_from_args(args: argparse.Namespace) -> SubmitSpec:
    if not args.store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE")
    if not args.job:
        raise ConfigError("no job given: pass --job NAME or set CKPT_JOB")
    config = RuntimeConfig.from_namespace(args)  # converts and checks the runtime options
    # A driver next to a shipped environment runs in a directory of its own (driver_cwd): local paths absolute
    config = dataclasses.replace(config, store=absolute_path(config.store),
                                 checkpoint=absolute_path(config.live_checkpoint))
    if args.deploy_mode == "client":
        # The driver runs here and inherits this environment: name the endpoint and region it will use
        # (AWS_ENDPOINT_URL, AWS_REGION) in its command. In cluster mode the driver's own environment decides.
        s3 = S3Options.from_env(config.endpoint_url, config.region)
        config = dataclasses.replace(config, endpoint_url=s3.endpoint_url, region=s3.region)
    return SubmitSpec(
        job_file=args.job_file,
        config=config,
        master=args.master,
        deploy_mode=args.deploy_mode,
        conf=parse_conf(args.conf),
        py_files=[absolute_path(p) for p in _split(args.py_files)],
        files=[absolute_path(p) for p in _split(args.files)],
        name=args.name,
        spark_submit=args.spark_submit,
        shipped=pyenv.plan(args.python_env, args.master, requirements_file=args.requirements),
        supervised=args.supervise,
    )


def absolute_path(path: str) -> str:
    """A local path made absolute; a URI (s3://, s3a://, hdfs://, file://) as it is."""
    return path if "://" in path else os.path.abspath(path)


def _split(values: list[str]) -> list[str]:
    return [item for value in values for item in value.split(",") if item]


def cmd_run(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
        _refuse_conflicts(args, spec)
        argv, env = driver_command(spec)  # spark-submit's, or a SparkApplication holder's (launcher/sparkapp.py)
        warning = shared_checkpoint_warning(spec)  # client mode, remote executors, a local checkpoint
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        restart = RestartSettings.from_namespace(args)
        strategy = restart.strategy() if args.supervise else None
        health = restart.health()
        if args.dry_run:
            _print_dry_run(args, argv, env, strategy, health, shipped=spec.shipped)
            return 0
        for name in ("airflow_ckpt_provider.runtime", "airflow_ckpt_provider.launcher"):  # operators read these
            logging.getLogger(name).setLevel(logging.INFO)
        check_master(spec.master)  # an unreachable or mistyped master: refused before anything is written
        if args.service:
            return _hand_over(args, spec)
        if spec.shipped is not None:
            spec.shipped.ensure()  # the executors' Python: built once per lock, then from the cache
        driver_cwd(spec)  # a driver next to a shipped environment needs a venv: refused here, not per attempt
        if args.check_id:  # started by an upgrade (launcher/restore_check.start_check): record the verdict
            return _run_recorded_check(args, spec)
        if strategy is None:
            return run_once(argv, env, cwd=driver_cwd(spec))
        return _run_supervised(args, spec, strategy, health)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG


def _hand_over(args: argparse.Namespace, spec: SubmitSpec) -> int:
    """``--service``: record the deployment and hand the job to the supervision service; prints the launch."""
    from airflow_ckpt_provider.core.records.deployments import Deployment
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.views.submission import find_running
    from airflow_ckpt_provider.launcher.handover import hand_over
    from airflow_ckpt_provider.launcher.service import START_TIMEOUT

    s3 = S3Options.from_env(args.endpoint_url, args.region)
    deployment = Deployment.from_namespace(
        args, job_file=os.path.abspath(spec.job_file), code_version=spec.config.code_version, master=spec.master,
        deploy_mode=spec.deploy_mode, conf=dict(spec.conf), py_files=tuple(spec.py_files), files=tuple(spec.files),
        spark_submit=spec.spark_submit, python_env=args.python_env)
    store = JobStore.open(spec.config.store, spec.config.job, s3)
    running = find_running(store, START_TIMEOUT)
    if running is not None:  # a second driver would fence the one that runs
        raise ConfigError(
            f"job {store.job}: expected no driver running or starting, found launch {running.launch_id or '-'}"
            f" (epoch {running.epoch if running.epoch is not None else '-'}); nothing was handed over: stop it "
            f"first (`ckpt job stop --job {store.job}`), then hand it over (it restarts from its final savepoint)")
    record = hand_over(store, deployment, restore=spec.config.restore, store_url=spec.config.store, s3=s3)
    if args.json:
        print(json.dumps(record.to_dict()))
    else:
        print(f"job {store.job}: launch {record.launch_id} handed to the supervision service (restore "
              f"{record.restore}); `ckpt service status --store {spec.config.store}` shows its owner")
    return 0


def run_once(
    argv: list[str],
    env: dict[str, str],
    *,
    cwd: str | None = None,
    grace: float = STOP_GRACE,
    spawn: Spawn = spawn_driver,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run spark-submit once in the foreground; SIGTERM or SIGINT reach the driver as SIGTERM, and a driver
    still running ``grace`` seconds later gets SIGKILL with its whole process group."""
    log.info("running %s", describe(argv))
    proc = spawn(argv, env, cwd)
    stop_at: list[float] = []

    def stop() -> None:
        stop_at.append(clock())
        proc.send_signal(signal.SIGTERM)

    with _on_stop_signals(stop):
        code = _wait(proc, stop_at, grace, clock)
    return code if code >= 0 else 128 - code


def _refuse_conflicts(args: argparse.Namespace, spec: SubmitSpec) -> None:
    """ConfigError for flags that do not go together, before anything is started or written."""
    if spec.config.check_restore and args.supervise:
        raise ConfigError("--check-restore runs once and changes nothing: drop --supervise")
    if args.check_id and not spec.config.check_restore:
        raise ConfigError("--check-id records a restore check's verdict: expected --check-restore with it")
    if args.adopt_epoch is not None and not args.supervise:
        raise ConfigError(f"--adopt-epoch {args.adopt_epoch} watches a running driver as its supervisor: expected "
                          "it with --supervise")
    if args.service and (args.supervise or spec.config.check_restore or args.dry_run):
        raise ConfigError("--service hands the job to the supervision service, which supervises it: expected "
                          "it without --supervise, --check-restore and --dry-run")
    if RestartSettings.from_namespace(args).standby and (
            not (args.supervise or args.service) or spec.deploy_mode == "cluster"):
        found = "cluster mode (the cluster manager runs the driver)" if args.supervise or args.service else \
            "no --supervise"
        raise ConfigError(f"--standby keeps a second driver beside the running one, started and given the go by "
                          f"the job's supervisor on its host: expected --supervise (or --service) in client mode, "
                          f"found {found}; drop --standby, or run the job that way")


def _wait(proc: ProcessLike, stop_at: list[float], grace: float, clock: Callable[[], float]) -> int:
    """The driver's exit code; once a stop was asked (``stop_at``), wait ``grace`` seconds at most."""
    while True:
        left = stop_at[0] + grace - clock() if stop_at else 1.0  # no stop yet: look again in 1 s
        if stop_at and left <= 0:
            log.warning("driver pid %d still runs %.0f s after SIGTERM: SIGKILL", proc.pid, grace)
            proc.send_signal(signal.SIGKILL)
            return proc.wait()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=min(1.0, left))


def _run_recorded_check(args: argparse.Namespace, spec: SubmitSpec) -> int:
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.launcher.restore_check import run_recorded_check

    store = JobStore.open(spec.config.store, spec.config.job, S3Options.from_env(args.endpoint_url, args.region))
    return run_recorded_check(store, spec, args.check_id)


def _run_supervised(args: argparse.Namespace, spec: SubmitSpec, strategy: RestartStrategy,
                    health: HealthRule | None) -> int:
    from airflow_ckpt_provider.core.store.jobstore import JobStore

    store = JobStore.open(spec.config.store, spec.config.job, S3Options.from_env(args.endpoint_url, args.region))
    supervisor = Supervisor(spec, strategy, health=health, store=store, poll=args.poll,
                            launch_id=os.environ.get(LAUNCH_ENV) or None, adopt_epoch=args.adopt_epoch,
                            standby=RestartSettings.from_namespace(args).standby)
    with _on_stop_signals(supervisor.request_stop):
        outcome = supervisor.run()
    d = outcome.to_dict()
    print(json.dumps(d, indent=2, sort_keys=True) if args.json else
          f"job {spec.config.job}: {outcome.final.value} after {human_count(outcome.attempts, 'attempt')} "
          f"({human_count(outcome.restarts, 'restart')}), "
          + ("no driver started" if outcome.exit_code is None else f"last exit code {outcome.exit_code}")
          + f": {outcome.reason}")
    return outcome.final.exit_code


def _print_dry_run(args: argparse.Namespace, argv: list[str], env: dict[str, str],
                   strategy: RestartStrategy | None, health: HealthRule | None, *,
                   shipped: pyenv.ShippedEnv | None) -> None:
    rule = None if health is None else {"max_restarts": health.max_restarts, "window": health.window,
                                        "progress_timeout": health.progress_timeout}
    supervise = None if strategy is None else {"strategy": describe_strategy(strategy), "health": rule}
    if args.json:
        # given: the user's archive (--python-env PATH_OR_URI), shipped as it is; else built here into the cache,
        # and built says whether that happened already
        ship = None if shipped is None else {"archive": shipped.archive, "py_files": list(shipped.py_files),
                                             "built": shipped.built, "given": shipped.given,
                                             "requirements": list(shipped.requirements),
                                             "requirements_file": shipped.requirements_file}
        print(json.dumps({"argv": redact(argv), "command": describe(argv), "env": env, "supervise": supervise,
                          "python_env": ship}, indent=2, sort_keys=True))
        return
    lines = [describe(argv), *(f"env: {k}={v}" for k, v in sorted(env.items()))]
    if shipped is not None:
        state = ("given, shipped as it is" if shipped.given else "built" if shipped.built else
                 "built on the first run")
        lines.append(f"python env: {shipped.archive} ({state}), code {', '.join(shipped.py_files)}")
    if strategy is not None:
        lines.append(f"supervised: restart strategy {describe_strategy(strategy)}; " + (
            "no health rule" if health is None else
            f"unhealthy after {human_count(health.max_restarts, 'restart')} within {health.window:g} s"
            + ("" if health.progress_timeout is None else
               f" or {health.progress_timeout:g} s without a batch while data waits")))
    print("\n".join(lines))


@contextlib.contextmanager
def _on_stop_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` on SIGTERM and SIGINT while inside; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda _signum, _frame: stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_run_command(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ckpt run JOB_FILE ...`: spark-submit with the runtime, optionally supervised."""
    p = groups.add_parser("run", help="run a job file under the runtime with spark-submit, optionally supervised",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(p)
    p.set_defaults(fn=cmd_run)
    p.add_argument("job_file", metavar="JOB_FILE", help="the Python file defining the job (@streaming_job)")
    job = p.add_argument_group("job runtime")
    RuntimeConfig.add_flags(job, only=("restore", "code_version"))
    RuntimeSettings.add_flags(job)
    check = p.add_argument_group("restore check (before an upgrade)")
    RuntimeConfig.add_flags(check, only=("check_restore", "allow_non_restored_state", "check_timeout", "rescale_to",
                                         "save_rescaled", "delete_keys", "update_values",
                                         "save_edited"))
    check.add_argument("--check-id", metavar="ID",
                       help="record the verdict in the job store as checks/ID.outcome.json (the record "
                            "checks/ID.json must exist: an upgrade writes it); --check-timeout then bounds the "
                            "whole check, spark-submit's start included")
    spark = p.add_argument_group("spark-submit")
    spark.add_argument("--master", default="local[2]", help="local[N] (default local[2]), spark://, yarn, k8s://")
    spark.add_argument("--deploy-mode", default="client", choices=DEPLOY_MODES, help="default client")
    spark.add_argument("--conf", action="append", default=[], metavar="K=V", help="a Spark setting (repeatable)")
    spark.add_argument("--py-files", action="append", default=[], metavar="A,B", help="Python dependencies to ship")
    spark.add_argument("--files", action="append", default=[], metavar="A,B", help="files to ship to the driver")
    spark.add_argument("--name", help="the Spark application name (default ckpt-JOB)")
    spark.add_argument("--python-env", default=pyenv.AUTO, metavar="auto|ship|none|ARCHIVE",
                       help="the executors' Python: auto (default) ships a packed venv with this provider's "
                            "dependencies on cluster masters and nothing on local[N]; ship always; none uses the "
                            "nodes' python3; or a venv-pack archive (path or URI) you built")
    spark.add_argument("--requirements", metavar="FILE",
                       help="the job's own requirements (pip format), added to the shipped environment")
    spark.add_argument("--spark-submit", metavar="PATH",
                       help="spark-submit to use (default: next to this Python, $SPARK_HOME/bin, PATH)")
    sup = p.add_argument_group("supervision")
    sup.add_argument("--supervise", action="store_true", help="restart the driver after failures")
    sup.add_argument("--service", action="store_true",
                     help="hand the job to the supervision service instead of running it here (`ckpt service run`: "
                          "docs/service.md)")
    RestartSettings.add_flags(sup)
    sup.add_argument("--adopt-epoch", type=int, metavar="N",
                     help="with --supervise, for the supervision service's takeover: the launch's driver of epoch N "
                          "still runs though its supervisor was lost; watch it instead of starting one "
                          "(docs/service.md)")
    sup.add_argument("--poll", type=float, default=5.0, metavar="S",
                     help="seconds between reads of status.json while a driver runs (default 5)")
    p.add_argument("--dry-run", action="store_true", help="print the spark-submit command and exit")
