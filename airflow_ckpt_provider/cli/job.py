"""`ckpt job ...`: a job's status, and requests to its running driver (savepoint, stop, cancel).

The commands observe the job (status.json, lease.json) into one value, decide whether the driver can
answer at all, and only then write a request to ``control/``: a request that no driver would answer
(unknown job, stopped job, dead driver) is refused before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.cli.common import add_store_args, emit, open_job_store, progress
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.prices import describe_rates
from airflow_ckpt_provider.core.policy.stepsettings import RestartStepSettings, StepSettings, UpgradeSettings
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, wait_ack
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.store.progress import human_count
from airflow_ckpt_provider.core.views.jobview import JobView, observe, request_running, state_text, when

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.store.jobstore import JobStore

EXIT_ERROR = 1
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

#: Seconds to wait for the driver's answer: a stop or savepoint uploads a snapshot, a cancel does not.
DEFAULT_TIMEOUT = {RequestAction.SAVEPOINT: 600.0, RequestAction.STOP: 600.0, RequestAction.CANCEL: 120.0}
#: Seconds between two reads of the ack while waiting.
ACK_POLL = 0.5


def _lease_text(lease: LeaseRecord | None) -> str:
    if lease is None:
        return "-"
    held = "released" if lease.released else "held"
    return f"epoch {lease.epoch}, {held} by {lease.owner} (taken at {when(lease.acquired_at)})"


def _snapshot_text(snapshot: dict[str, Any] | None) -> str:
    if not snapshot:
        return "-"
    # The driver records {"id", "kind", "batch_id", "uri", "created_at"} (runtime/driver.py _snapshot_info).
    return (f"{snapshot.get('id', '?')} ({snapshot.get('kind', '?')}, "
            f"batch {snapshot.get('batch_id', '?')})")


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def describe(view: JobView) -> str:
    """The human view of ``ckpt job status``."""
    s = view.status
    rows: list[tuple[str, str]] = [("job", f"{view.store.job} ({view.store.url})"), ("state", state_text(view))]
    if s is not None:
        driver = f"pid {s.pid} on {s.host}" if s.pid is not None or s.host else None
        rows += [
            ("epoch", str(s.epoch)),
            ("batch", _dash(s.batch_id)),
            ("heartbeat", f"{s.age(view.now):.0f} s ago ({when(s.updated_at)})"),
            ("started", when(s.started_at)),
            ("last snapshot", _snapshot_text(s.last_snapshot)),
            ("restored from", _dash(s.restored_from)),
            ("driver", _dash(driver)),
            ("app id", _dash(s.app_id)),
            ("ui", _dash(s.ui_url)),
            ("code version", _dash(s.code_version)),
            ("reason", _dash(s.reason)),
        ]
        if s.store_window:
            rows.append(("store requests", f"by the driver: {describe_rates(s.store_rates, s.store_window)}"))
    rows.append(("lease", _lease_text(view.lease)))
    newer = view.newer_lease
    if newer is not None and s is not None:
        rows.append(("note", f"a newer driver (epoch {newer.epoch}, {newer.owner}) took the lease at "
                             f"{when(newer.acquired_at)} and is starting; the status above is from epoch {s.epoch}"))
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)


def status_dict(view: JobView) -> dict[str, Any]:
    """The JSON of ``ckpt job status``: the status record plus ``lease`` and ``stale``."""
    body = view.status.to_dict() if view.status else {"job": view.store.job, "state": None}
    return body | {"lease": view.lease.to_dict() if view.lease else None, "stale": view.stale,
                   "restarting": view.restarter.describe() if view.restarter else None}


def _ack_text(ack: Ack, job: str) -> str:
    batch = f" at batch {ack.batch_id}" if ack.batch_id is not None else ""
    if ack.outcome is not Outcome.COMPLETED:
        return f"{ack.action} of job {job} {ack.outcome} (request {ack.id}): {ack.message}"
    if ack.action is RequestAction.CANCEL or ack.snapshot_id is None:
        return f"{ack.action} of job {job} completed{batch}: {ack.message}"
    what = "savepoint" if ack.action is RequestAction.SAVEPOINT else f"job {job} stopped with final savepoint"
    return f"{what} {ack.snapshot_id} completed{batch}\n{ack.snapshot_uri or '-'}"


# -- commands ------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.records.base import RecordError
    from airflow_ckpt_provider.core.records.operations import read_operation
    from airflow_ckpt_provider.core.views.jobreport import service_owner

    store = open_job_store(args)
    view = observe(store)
    service = service_owner(store)
    try:
        found = read_operation(store)
    except RecordError as err:  # the job's status still shows; the record is named
        progress(f"warning: {err}")
        found = None
    operation = found.operation if found is not None else None
    body = {**status_dict(view), "operation": operation.to_dict() if operation is not None else None,
            "service": service}

    def text() -> str:
        shown = describe(view) + (f"\nsupervised by: {service}" if service else "")
        if operation is None:
            return shown
        last = f": {operation.lines[-1]}" if operation.lines and not operation.state.final else ""
        ended = f" ({operation.message})" if operation.state.final and operation.message else ""
        return f"{shown}\noperation: {operation.describe()}{last}{ended}"

    emit(args, body, text)
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    action = RequestAction(args.request_action)
    timeout = DEFAULT_TIMEOUT[action] if args.timeout is None else args.timeout
    if timeout < 0:
        raise ConfigError(f"--timeout must be >= 0 seconds, found {timeout}")
    store = open_job_store(args)
    request = request_running(store, action, key=args.key or None)  # with a key, a re-run finds the earlier request
    queued = f"requested {action} of job {store.job}: request {request.id} for the driver of epoch {request.epoch}"
    if args.no_wait:
        emit(args, request.to_dict(), lambda: f"{queued}; `ckpt job status` shows its effect")
        return 0
    progress(f"{queued}; waiting up to {timeout:.0f} s for its answer")
    try:
        ack = wait_ack(store, request.id, timeout, poll=ACK_POLL)
    except KeyboardInterrupt:
        print(f"interrupted: request {request.id} stays queued and the driver still acts on it; "
              f"check with `ckpt job status --job {store.job}`", file=sys.stderr)
        return EXIT_INTERRUPTED
    if ack is None:
        if args.json:
            print(_json({**request.to_dict(), "ack": None}))
        print(f"error: no answer to {action} request {request.id} within {timeout:.0f} s: the request stays "
              f"queued and the driver of epoch {request.epoch} acts on it when it next polls; check with "
              f"`ckpt job status --job {store.job}`", file=sys.stderr)
        return EXIT_TIMEOUT
    if ack.outcome is Outcome.COMPLETED:
        emit(args, ack.to_dict(), lambda: _ack_text(ack, store.job))
        return 0
    if args.json:
        print(_json(ack.to_dict()))
    print(f"error: {_ack_text(ack, store.job)}", file=sys.stderr)
    return EXIT_ERROR


def cmd_rescale(args: argparse.Namespace) -> int:
    if args.partitions is None:
        raise ConfigError("ckpt job rescale: expected --partitions N (the state partitions to rescale to), found none")
    store, result = _run_upgrade(args, "rescale")
    partitions = result["partitions"]
    emit(args, result, lambda: (f"rescaled job {store.job} to {human_count(partitions, 'state partition')}: savepoint "
                                f"{result['rescaled_snapshot_id']} (from {result['snapshot_id']}), running at epoch "
                                f"{result['epoch']}, " + ("no batch since the rescale (see the 4/5 line)"
                                                          if result['batch_id'] is None else
                                                          f"batch {result['batch_id']}")))
    return 0


def cmd_edit(args: argparse.Namespace) -> int:
    if args.delete_keys is None and args.update_values is None:
        raise ConfigError("ckpt job edit: expected --delete-keys OP:PREDICATE or --update-values JSON (the edit of the "
                          "job's state), found neither")
    store, result = _run_upgrade(args, "edit")
    emit(args, result, lambda: (f"edited the state of job {store.job}: savepoint {result['rescaled_snapshot_id']} "
                                f"(from {result['snapshot_id']}), running at epoch {result['epoch']}, "
                                + ("no batch since the edit (see the 4/5 line)" if result['batch_id'] is None else
                                   f"batch {result['batch_id']}")))
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    if args.job_file is None:
        raise ConfigError("ckpt job upgrade: expected --job-file F (the new code), found none; to keep the code and "
                          "change the partitions, run `ckpt job rescale --partitions N`")
    store, result = _run_upgrade(args, "upgrade")
    moved = result["to_version"] or args.job_file
    if result["partitions"] is not None:
        moved += f" with {human_count(result['partitions'], 'state partition')}"
    emit(args, result, lambda: (f"upgraded job {store.job} to {moved} ({result['upgrade_mode']}, from "
                                f"{result['snapshot_id'] or 'its latest state'}), running at epoch {result['epoch']}, "
                                + ("no batch since the upgrade" if result['batch_id'] is None else
                                   f"batch {result['batch_id']}")))
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    store, result = _run_upgrade(args, "restart")
    by = result["restarted_by"]
    emit(args, result, lambda: (f"restarted job {store.job} from {result['restore']}"
                                + (f" (by its {by}: it was restarting already)" if by != "operation" else "")
                                + f", running at epoch {result['epoch']}"
                                + (f", batch {result['batch_id']}" if result["batch_id"] is not None else "")))
    return 0


def _run_upgrade(args: argparse.Namespace, verb: str) -> tuple[JobStore, dict[str, Any]]:
    """``ckpt job rescale|upgrade|restart``: ask for the operation and act on it here (launcher/upgrade.py), each
    step said on a line of stderr; a re-run after this process died resumes it."""
    import getpass
    import socket

    from airflow_ckpt_provider.cli.common import s3_options
    from airflow_ckpt_provider.launcher.upgrade import run_operation

    settings: StepSettings
    if verb == "restart":
        settings = RestartStepSettings.from_namespace(args)
    else:
        settings = UpgradeSettings.from_namespace(args)
        if settings.py_files is not None or settings.files is not None:
            settings = replace(settings, py_files=_absolute(settings.py_files), files=_absolute(settings.files))
    store = open_job_store(args)
    return store, run_operation(store, args.store, s3_options(args), settings, say=progress,
                              requested_by=f"{getpass.getuser()}@{socket.gethostname()} (ckpt job {verb})")


def cmd_operate(args: argparse.Namespace) -> int:
    """``ckpt job operate``: act on a recorded operation (started detached by an Airflow task; by hand, it resumes an
    operation whose actor is gone)."""
    from airflow_ckpt_provider.cli.common import s3_options
    from airflow_ckpt_provider.core.records.operations import actor_alive, read_operation
    from airflow_ckpt_provider.launcher.upgrade import JobUpgrade, handed, outcome_of

    store = open_job_store(args)
    found = read_operation(store)
    if found is None or found.operation.id != args.operation:
        now = found.operation.describe() if found else "none"
        raise ConfigError(f"job {store.job}: expected operation {args.operation} in operation.json, found {now}; "
                          "nothing to act on")
    operation = found.operation
    if operation.state.final:
        progress(f"{operation.describe()} has ended: nothing to do")
        return 0
    if actor_alive(operation, silent_for=0.0):
        raise ConfigError(f"{operation.describe()}: its actor still acts; expected none, so nothing was done")
    if handed(store):
        raise ConfigError(f"{operation.describe()}: job {store.job} is the supervision service's, whose owning "
                          "instance acts on its operations; expected a job not handed over, so nothing was done "
                          "(`ckpt service status` shows the owner)")
    actor = f"ckpt job operate (pid {os.getpid()})"
    result = outcome_of(JobUpgrade(store, args.store, s3_options(args), say=progress, actor=actor).run(found))
    emit(args, result, lambda: f"{operation.kind} {operation.id} of job {store.job} succeeded")
    return 0


def _absolute(paths: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """``--py-files``/``--files`` of an upgrade: local paths made absolute, as ``ckpt run`` does, URIs as they are."""
    from airflow_ckpt_provider.cli.run import absolute_path

    return None if paths is None else tuple(absolute_path(p) for p in paths)


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


# -- parser --------------------------------------------------------------------------------------


def add_job_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ckpt job status|savepoint|stop|cancel`, with the same common options as `ckpt snapshot`."""
    job = groups.add_parser("job", help="a job's status; savepoint, stop or cancel of its running driver; rescale, "
                            "upgrade")
    sub = job.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="state, epoch, batch, heartbeat, last snapshot and lease of a job")
    add_store_args(p)
    p.set_defaults(fn=cmd_status)
    helps = {
        RequestAction.SAVEPOINT: "ask the running driver for a savepoint now; the job keeps running",
        RequestAction.STOP: "ask the running driver to finish its batch, take a final savepoint and exit",
        RequestAction.CANCEL: "ask the running driver to stop now; the latest completed checkpoint stays valid",
    }
    for action, help_ in helps.items():
        p = sub.add_parser(action.value, help=help_)
        add_store_args(p)
        p.set_defaults(fn=cmd_request, request_action=action.value)
        p.add_argument("--timeout", type=float, default=None,
                       help=f"seconds to wait for the driver's answer (default {DEFAULT_TIMEOUT[action]:.0f}; "
                            "exit 4 when it does not come)")
        p.add_argument("--no-wait", action="store_true", help="submit the request and return at once")
        p.add_argument("--key", help="the same for every run of one intent (a script's retry): a run finds the "
                                     "request an earlier run with this key wrote and waits for it, or returns its "
                                     "answer, instead of asking again; after a failure it asks again")
    def operation(name: str, fn: Callable[[argparse.Namespace], int], help_: str,
                  only: tuple[str, ...] | None = None) -> None:
        """An upgrade-kind operation's command: the store's flags and UpgradeSettings' (``only`` those)."""
        p = sub.add_parser(name, help=help_)
        add_store_args(p)
        p.set_defaults(fn=fn)
        UpgradeSettings.add_flags(p, only=only)

    steps = ("check_timeout", "stop_timeout", "verify_batches", "verify_timeout")
    operation("rescale", cmd_rescale, "rescale the job's state to N partitions through a savepoint (a recorded "
              "deployment, RocksDB state): checked on a copy first, rolled back if it fails; run again after an "
              "interruption, it resumes", ("partitions", *steps))
    operation("edit", cmd_edit, "edit the running job's state through a savepoint (the State Processor): delete keys "
              "or set values, checked on a copy of the latest state first, applied to the stop's savepoint, the job "
              "started from the edited savepoint and verified, rolled back if it fails",
              ("delete_keys", "update_values", *steps))
    operation("upgrade", cmd_upgrade, "upgrade a recorded deployment to new code keeping its state: the new code "
              "checked on a copy of the state first, the job verified after, rolled back if it fails; run again "
              "after an interruption, it resumes")
    p = sub.add_parser("restart", help="restart the job's recorded deployment from its latest state (or --restore "
                       "SPEC), a running driver stopped first; a restart its supervisor makes already is waited for; "
                       "run again after an interruption, it resumes")
    add_store_args(p)
    p.set_defaults(fn=cmd_restart)
    RestartStepSettings.add_flags(p)
    p = sub.add_parser("operate", help="act on the job's recorded operation (an upgrade, a rescale, a restart) whose "
                       "actor is gone: resume it from its recorded step (an Airflow task starts this detached)")
    add_store_args(p)
    p.set_defaults(fn=cmd_operate)
    p.add_argument("--operation", required=True, metavar="ID", help="the operation's id (in operation.json)")
