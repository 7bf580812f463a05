"""Restore checks run detached: the record of a check started, and the verdict its process records.

Design notes: docs/runtime.md#design-notes-corerecordsrestore_checkpy."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import msgspec

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.store.jobstore import CHECKS, JobStore

#: The check process's environment variable naming its check id (inherited by its spark-submit).
CHECK_ENV = "CKPT_CHECK_ID"
OUTCOME_SUFFIX = ".outcome.json"
#: Seconds after its timeout by which a check records its verdict: it kills spark-submit's process group
#: (SIGTERM, 10 s, SIGKILL, up to 30 s: launcher/restore_check.py), then writes the record (retried).
OUTCOME_GRACE = 90.0

#: Whether process ``pid`` of this host runs (core/records/lease.pid_alive, the one probe).
process_alive = pid_alive


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def check_key(check_id: str) -> str:
    return f"{CHECKS}{check_id}.json"


def outcome_key(check_id: str) -> str:
    return f"{CHECKS}{check_id}{OUTCOME_SUFFIX}"


class CheckStarted(Record, frozen=True):
    """A restore check of ``job_file`` (its code version) started on ``host`` at ``started_at``: its process
    (``pid``, None until it is spawned) and log, who asked (``started_by``: an Airflow task and its try), the time
    it is allowed (``timeout``), the state it checks (``restore``) and, for a rescale, the partitions it
    repartitions that state into first and whether it saves the result as a savepoint. Written by whoever starts the
    check (launcher/restore_check.start_check: the upgrade and rescale operators, `ckpt job upgrade`), before its
    process starts, then once more with the pid; read by the check process (its settings), by the waiters (the
    operators, the trigger, the restore check watch) and by a second check, which is refused while this one runs."""

    WHAT = "restore check record"
    KEY = "checks/<check id>.json"

    job: str
    check_id: str
    job_file: str
    code_version: str | None
    started_at: float
    timeout: float
    host: str
    started_by: str
    pid: int | None = None
    log_file: str | None = None
    restore: str = "latest-state"  # the state checked: a rescale's names its savepoint
    rescale_to: int | None = None  # repartition the copy's state into this many partitions first
    save_rescaled: bool = False  # and save it as a savepoint once the check passed
    delete_keys: str | None = None  # an edit of the copy's state first: keys deleted (OPERATOR:PREDICATE)
    update_values: str | None = None  # or values set (JSON)
    save_edited: bool = False  # and save it as a savepoint once the check passed

    @property
    def deadline(self) -> float:
        """When its verdict is overdue: the check is then taken for dead whatever its process does."""
        return self.started_at + self.timeout + OUTCOME_GRACE

    @property
    def key(self) -> str:
        return check_key(self.check_id)

    def with_pid(self, pid: int) -> CheckStarted:
        """The record once its process is spawned."""
        return msgspec.structs.replace(self, pid=pid)

    def describe(self) -> str:
        pid = "not spawned yet" if self.pid is None else f"pid {self.pid}"
        what = "restore check" if self.rescale_to is None else f"rescale to {self.rescale_to} partitions"
        if self.delete_keys is not None or self.update_values is not None:
            what = "restore check of a state edit"
        return (f"{what} {self.check_id} of {self.job_file} ({pid} on {self.host}, started at "
                f"{_hms(self.started_at)} by {self.started_by})")


class CheckEnded(Record, frozen=True):
    """The verdict of check ``check_id``: ``outcome`` and ``reason``, when it ended, and the whole report
    (runtime/restore_check_verdict.RestoreCheck.to_dict: snapshot, batch, operators, Spark's error class). Written
    once by the check process when it ends (launcher/restore_check.run_recorded_check, retried), whatever happened;
    read by the waiters (the upgrade and rescale operators, the trigger, `ckpt job upgrade`, the restore check
    watch)."""

    WHAT = "restore check verdict"
    KEY = "checks/<check id>.outcome.json"

    check_id: str
    outcome: CheckOutcome
    reason: str
    ended_at: float
    report: dict[str, Any] = msgspec.field(default_factory=dict)


def record_start(store: JobStore, started: CheckStarted) -> None:
    """Write the record of a check about to start; StorageError if one with its id exists (ids are unique)."""
    if not store.storage.create(started.key, started.to_bytes()):
        raise StorageError(f"restore check record {store.storage.uri(started.key)} exists already: expected a new "
                           "check id; start the check again")


def record_pid(store: JobStore, started: CheckStarted, pid: int) -> CheckStarted:
    """The record with the process's pid, written over our own record only (compare-and-swap)."""
    spawned = started.with_pid(pid)
    current = store.storage.read_versioned(started.key)
    if current is not None and CheckStarted.from_bytes(current.data, store.storage.uri(started.key)) == started:
        store.storage.write_if(started.key, spawned.to_bytes(), current.tag)
    return spawned


def record_end(store: JobStore, ended: CheckEnded) -> None:
    store.storage.write(outcome_key(ended.check_id), ended.to_bytes())


def read_start(store: JobStore, check_id: str) -> CheckStarted | None:
    try:
        return CheckStarted.from_bytes(store.storage.read(check_key(check_id)), store.storage.uri(check_key(check_id)))
    except FileNotFoundError:
        return None


def read_end(store: JobStore, check_id: str) -> CheckEnded | None:
    try:
        return CheckEnded.from_bytes(store.storage.read(outcome_key(check_id)),
                                     store.storage.uri(outcome_key(check_id)))
    except FileNotFoundError:
        return None


def liveness(started: CheckStarted, now: float, *, host: str | None = None,
             pid_alive: Callable[[int], bool] = process_alive) -> tuple[bool, str]:
    """(running, why not) of a check that recorded no verdict yet. Past its ``deadline``: not running, whatever
    its process does. On this host (``host``, default this machine's name) with a known pid, the process
    decides; elsewhere (a triggerer on another host) the check runs until its deadline."""
    if now > started.deadline:
        return False, (f"no verdict by {_hms(started.deadline)} (its timeout {started.timeout:g} s + "
                       f"{OUTCOME_GRACE:g} s): it is presumably dead or hung")
    here = socket.gethostname() if host is None else host
    if started.pid is not None and started.host == here and not pid_alive(started.pid):
        return False, "its process no longer exists"
    return True, ""


def running_checks(store: JobStore, now: float, *, host: str | None = None,
                   pid_alive: Callable[[int], bool] = process_alive) -> list[CheckStarted]:
    """The checks of this job that run (no verdict, ``liveness``), oldest first."""
    keys = {o.key for o in store.storage.list(CHECKS)}
    found = []
    for key in sorted(keys):
        if key.endswith(OUTCOME_SUFFIX) or not key.endswith(".json"):
            continue
        check_id = key[len(CHECKS):-len(".json")]
        if outcome_key(check_id) in keys:
            continue
        started = read_start(store, check_id)
        if started is not None and liveness(started, now, host=host, pid_alive=pid_alive)[0]:
            found.append(started)
    return found
