"""A job's operation in progress (upgrade, rescale, restart): what was asked, the plan, the step being acted on and
what each step did, in ``operation.json``, written by compare-and-swap before every act. One actor at a time: the
front-end that asked (``ckpt``, a Dagster op), a detached ``ckpt job operate`` an Airflow task started, or the owning
instance of the supervision service. A retried task, a re-run command or a new owner finds the record and resumes the
step it names instead of redoing or refusing it (the Flink Kubernetes Operator's status, written before acting).
Design notes: docs/operations.md#design-notes-corerecordsoperationspy.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import msgspec

from airflow_ckpt_provider.core.errors import ConflictError
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.records.lease import pid_alive
from airflow_ckpt_provider.core.records.ownership import ring_if_handed
from airflow_ckpt_provider.core.store.jobstore import JobStore

log = logging.getLogger(__name__)

OPERATION = "operation.json"
#: Seconds an actor writes its record at least once in (a heartbeat while it waits on a long step).
ACTOR_BEAT = 5.0
#: Seconds without a write after which an actor on another host is taken for dead (on the observer's clock).
ACTOR_SILENCE = 30.0
#: The progress lines an operation keeps (the newest).
LINES = 200


class OperationState(StrEnum):
    PENDING = "pending"  # asked for, no actor has begun
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    REFUSED = "refused"  # refused before anything was stopped: the job runs as before
    FAILED = "failed"  # failed after the stop: the message says where the job is now (rolled back or not)

    @property
    def final(self) -> bool:
        return self not in (OperationState.PENDING, OperationState.RUNNING)


class NotActor(ConflictError):
    """The operation record changed under this actor (another actor took it over, or it was replaced)."""


class Operation(Record, frozen=True, kw_only=True):
    """The job's current (or last) operation, written by the front-end that asks for it and then only by its actor,
    by compare-and-swap; read by every front-end waiting for it, by ``ckpt job status`` and the Streaming Jobs page.
    ``settings`` are UpgradeSettings (core/policy/stepsettings.py) as JSON; ``plan`` the upgrade plan
    (launcher/upgradesteps.py); ``step`` the step being acted on (its type, fields, number, start, and the ids of what
    it started: a control request, a restore check, a launch), ``outcome`` the last step's outcome (neither: nothing
    done yet). ``key``: the asking task's identity (an Airflow task run, a Dagster op run), so that its retry finds
    this operation. ``actor``/``actor_host``/``actor_pid``: who acts now."""

    SCHEMA = 1
    WHAT = "operation record"
    KEY = OPERATION

    id: str
    job: str
    kind: str  # upgrade | rescale
    settings: dict[str, Any]
    requested_by: str
    requested_at: float
    key: str = ""
    state: OperationState = OperationState.PENDING
    plan: dict[str, Any] | None = None
    step: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    steps: int = 0  # steps begun so far (the number of the step in ``step``)
    lines: list[str] = msgspec.field(default_factory=list)
    actor: str = ""
    actor_host: str = ""
    actor_pid: int | None = None
    updated_at: float = 0.0
    message: str = ""
    result: dict[str, Any] | None = None

    def describe(self) -> str:
        step = f", step {self.steps} ({self.step['type']})" if self.step else ""
        who = f", acted on by {self.actor}" if self.actor else ""
        return f"{self.kind} {self.id} of job {self.job} ({self.state.value}{step}{who}; asked by {self.requested_by})"

    def same_ask(self, kind: str, settings: dict[str, Any], key: str) -> bool:
        """Is this the operation a front-end asking for ``kind`` with ``settings`` (and ``key``) asked for?"""
        if key and self.key:
            return key == self.key
        return kind == self.kind and settings == self.settings


class Found(msgspec.Struct, frozen=True):
    operation: Operation
    tag: str


def read_operation(store: JobStore) -> Found | None:
    """The job's operation record and its tag (for a compare-and-swap); None if the job never had one."""
    found = store.storage.read_versioned(OPERATION)
    if found is None:
        return None
    return Found(Operation.from_bytes(found.data, store.storage.uri(OPERATION)), found.tag)


def new_operation_id(kind: str, now: float) -> str:
    return f"{kind}-{datetime.fromtimestamp(now, UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def ask(store: JobStore, kind: str, settings: dict[str, Any], *, requested_by: str, key: str = "",
        now: float | None = None) -> tuple[Found, bool]:
    """Record an operation of ``kind`` with ``settings`` for the job, or find the one asked for before (the same
    ``key``, or without keys the same kind and settings): ``(found, new)``. A final operation with the same key is
    returned as it ended (a retried task gets its result, nothing is redone). Another operation in progress:
    ConflictError naming it, nothing written."""
    now = time.time() if now is None else now
    found = read_operation(store)
    if found is not None:
        current = found.operation
        if current.same_ask(kind, settings, key) and (not current.state.final or (key and key == current.key)):
            return found, False
        if not current.state.final:
            raise ConflictError(
                f"job {store.job}: expected no operation in progress, found {current.describe()}; wait for it to end "
                f"(`ckpt job status --job {store.job}` shows it), or, if nothing acts on it any more, run the same "
                f"{current.kind} again to resume it. Nothing was changed")
    operation = Operation(id=new_operation_id(kind, now), job=store.job, kind=kind, settings=settings,
                          requested_by=requested_by, requested_at=now, key=key, updated_at=now)
    tag = _swap(store, None if found is None else found.tag, operation)
    if tag is None:
        raise ConflictError(f"job {store.job}: another operation was asked for at the same moment; run it again to see "
                            "which. Nothing was changed")
    ring_if_handed(store)  # an instance that owns the job acts at its next renewal
    return Found(operation, tag), True


def _swap(store: JobStore, tag: str | None, operation: Operation) -> str | None:
    """Write ``operation`` if the record still has ``tag`` (None: if there is none); its new tag, or None if it
    changed meanwhile."""
    return store.storage.swap(OPERATION, operation.to_bytes(), tag)


def actor_alive(operation: Operation, *, silent_for: float, host: str | None = None,
                alive: Callable[[int], bool] | None = None) -> bool:
    """Does the operation's actor still act? Not when none was named, when it was on this host and its process is
    gone, or when the record has not changed for ``silent_for`` s (the observer's own clock: ACTOR_SILENCE)."""
    if not operation.actor or operation.state.final:
        return False
    here = (host or socket.gethostname()) == operation.actor_host
    if here and operation.actor_pid is not None and not (alive or pid_alive)(operation.actor_pid):
        return False
    return silent_for < ACTOR_SILENCE


class Acting:
    """An actor's hold on an operation: every write is a compare-and-swap on the tag it last wrote (NotActor when the
    record changed meanwhile: another actor took over). ``take`` names this actor in the record."""

    def __init__(self, store: JobStore, found: Found, actor: str, clock: Callable[[], float] = time.time) -> None:
        self.store, self.operation, self.tag, self.actor, self.clock = store, found.operation, found.tag, actor, clock
        self.saved_at = time.monotonic()  # when this actor last wrote the record (its monotonic clock)
        self._lock = threading.Lock()  # the actor's step and its heartbeat thread write one after the other

    @classmethod
    def take(cls, store: JobStore, found: Found, actor: str, *, line: str = "") -> Acting:
        acting = cls(store, found, actor)
        acting.save(actor=actor, actor_host=socket.gethostname(), actor_pid=os.getpid(), line=line)
        return acting

    def save(self, *, line: str = "", **changes: Any) -> Operation:
        """Write the record with ``changes`` (and ``line`` added to its progress lines)."""
        with self._lock:
            lines = [*self.operation.lines, line][-LINES:] if line else self.operation.lines
            operation = msgspec.structs.replace(self.operation, **changes, lines=lines, updated_at=self.clock())
            tag = _swap(self.store, self.tag, operation)
            if tag is None:
                found = read_operation(self.store)
                now = found.operation.describe() if found else "no record"
                raise NotActor(f"job {self.store.job}: {self.actor} no longer acts on {self.operation.kind} "
                               f"{self.operation.id}: its record changed meanwhile ({now}); it stops here")
            self.operation, self.tag, self.saved_at = operation, tag, time.monotonic()
            return operation

    def beat_while(self, stop: threading.Event, every: float = ACTOR_BEAT) -> None:
        """Until ``stop``: write the record whenever ``every`` s passed without a write, so the others see this actor
        live during a long act (a heartbeat thread's loop). Stops at the first failed write (the actor's own next
        write then fails too, and it stops)."""
        while not stop.wait(min(1.0, every)):
            if time.monotonic() - self.saved_at < every:
                continue
            try:
                self.save()
            except NotActor:
                return
            except Exception as err:  # the store, most likely: the next beat tries again
                log.warning("job %s: %s could not write its heartbeat: %s", self.store.job, self.actor, err)
