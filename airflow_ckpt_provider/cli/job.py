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
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.cli.common import add_store_args, emit, open_job_store, progress
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import UpgradeMode
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.store.progress import human_count
from airflow_ckpt_provider.core.views.jobview import JobView, check_can_request, observe, state_text, when

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
    view = observe(open_job_store(args))
    emit(args, status_dict(view), lambda: describe(view))
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    action = RequestAction(args.request_action)
    timeout = DEFAULT_TIMEOUT[action] if args.timeout is None else args.timeout
    if timeout < 0:
        raise ConfigError(f"--timeout must be >= 0 seconds, found {timeout}")
    store = open_job_store(args)
    status = check_can_request(observe(store), action)
    request = submit_request(store, action, epoch=status.epoch)
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
    partitions = _partitions(args.partitions)
    assert partitions is not None  # required
    store, result = _run_upgrade(args, partitions, "rescale")
    emit(args, result, lambda: (f"rescaled job {store.job} to {human_count(partitions, 'state partition')}: savepoint "
                                f"{result['rescaled_snapshot_id']} (from {result['snapshot_id']}), running at epoch "
                                f"{result['epoch']}, " + ("no batch since the rescale (see the 4/5 line)"
                                                          if result['batch_id'] is None else
                                                          f"batch {result['batch_id']}")))
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    store, result = _run_upgrade(args, _partitions(args.partitions), "upgrade")
    moved = result["to_version"] or args.job_file
    if result["partitions"] is not None:
        moved += f" with {human_count(result['partitions'], 'state partition')}"
    emit(args, result, lambda: (f"upgraded job {store.job} to {moved} ({result['upgrade_mode']}, from "
                                f"{result['snapshot_id'] or 'its latest state'}), running at epoch {result['epoch']}, "
                                + ("no batch since the upgrade" if result['batch_id'] is None else
                                   f"batch {result['batch_id']}")))
    return 0


def _partitions(value: str | None) -> int | None:
    from airflow_ckpt_provider.core.snapshots.rescaling import parse_partitions

    if value is None:
        return None
    try:
        return parse_partitions(value)
    except ValueError as err:
        raise ConfigError(f"--{err}") from None


def _run_upgrade(args: argparse.Namespace, partitions: int | None, verb: str) -> tuple[JobStore, dict[str, Any]]:
    """``ckpt job rescale|upgrade``: the steps of launcher/upgrade.py, each said on a line of stderr."""
    import getpass
    import socket

    from airflow_ckpt_provider.cli.common import s3_options
    from airflow_ckpt_provider.launcher.upgrade import JobUpgrade, UpgradeOptions

    upgrade = {"job_file": args.job_file, "code_version": args.code_version, "mode": UpgradeMode(args.upgrade_mode),
               "allow_non_restored_state": args.allow_non_restored_state, "py_files": _paths(args.py_files),
               "files": _paths(args.files)} if verb == "upgrade" else {}
    options = UpgradeOptions(partitions, check_timeout=args.check_timeout, stop_timeout=args.stop_timeout,
                             verify_batches=2 if args.verify_batches is None else args.verify_batches,
                             require_batches=args.verify_batches is not None, verify_timeout=args.verify_timeout,
                             **upgrade)
    store = open_job_store(args)
    run = JobUpgrade(store, args.store, s3_options(args), options, say=progress,
                     launched_by=f"{getpass.getuser()}@{socket.gethostname()} (ckpt job {verb})")
    return store, run.run()


def _paths(values: list[str] | None) -> tuple[str, ...] | None:
    """``--py-files``/``--files`` of an upgrade: None when not given (the recorded ones stay), else the paths
    (``--py-files ''``: none); local paths made absolute, as ``ckpt run`` does, URIs as they are."""
    if values is None:
        return None
    return tuple(p.strip() if "://" in p else os.path.abspath(p.strip())
                 for value in values for p in value.split(",") if p.strip())


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
    p = sub.add_parser("rescale", help="rescale the job's state to N partitions through a savepoint (a recorded "
                       "deployment, RocksDB state): checked on a copy first, rolled back if it fails")
    add_store_args(p)
    p.set_defaults(fn=cmd_rescale)
    p.add_argument("--partitions", required=True, metavar="N", help="the state partitions to rescale to")
    _add_step_args(p)
    p = sub.add_parser("upgrade", help="upgrade a recorded deployment to new code keeping its state: the new code "
                       "checked on a copy of the state first, the job verified after, rolled back if it fails")
    add_store_args(p)
    p.set_defaults(fn=cmd_upgrade)
    p.add_argument("--job-file", required=True, metavar="F", help="the new code: the Python file defining the job")
    p.add_argument("--code-version", metavar="V", help="the new code's version (recorded, shown in the status)")
    p.add_argument("--upgrade-mode", choices=[m.value for m in UpgradeMode], default=UpgradeMode.SAVEPOINT.value,
                   help="savepoint (stop with savepoint, restore it; default), last-state (cancel, restore the latest "
                        "checkpoint) or stateless (cancel, start without state)")
    p.add_argument("--partitions", metavar="N", help="also rescale the state to N partitions (savepoint mode)")
    p.add_argument("--allow-non-restored-state", action="store_true",
                   help="let the new code drop state of operators it no longer has")
    p.add_argument("--py-files", action="append", metavar="A,B",
                   help="the new code's own Python modules (spark-submit --py-files; repeatable), instead of the "
                        "recorded deployment's; default: keep those; '' ships none. A rollback ships the old ones")
    p.add_argument("--files", action="append", metavar="A,B",
                   help="the new code's data files (spark-submit --files), instead of the recorded deployment's; "
                        "default: keep those; '' ships none")
    _add_step_args(p)


def _add_step_args(p: argparse.ArgumentParser) -> None:
    """The timeouts of the steps of `ckpt job rescale|upgrade`."""
    p.add_argument("--check-timeout", type=float, default=600.0, metavar="S",
                   help="seconds for each of the check and the repartition (default 600)")
    p.add_argument("--stop-timeout", type=float, default=300.0, metavar="S",
                   help="seconds for the stop with savepoint (default 300)")
    p.add_argument("--verify-batches", type=int, default=None, metavar="N",
                   help="wait for N batches of the new deployment within --verify-timeout, even if no input comes "
                        "(0: none). Default: 2 batches, or none on a job caught up with no new input, which is "
                        "then reported as verified without a batch")
    p.add_argument("--verify-timeout", type=float, default=300.0, metavar="S",
                   help="seconds for the verification (default 300)")
