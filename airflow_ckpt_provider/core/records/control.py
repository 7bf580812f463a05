"""The control channel: requests written to ``control/<id>.json``, answered in ``<id>.ack.json``.

A request names the epoch of the driver it is meant for, so a request written for a driver that
has since been replaced is rejected instead of acting on the new one. After writing one, the asker rings the bell
(``control-bell.json``): the driver reads that one small object every poll and lists ``control/`` only when it changed
(or every ``BELL_SWEEP`` s). Design notes: docs/scale.md#design-notes-corerecordscontrolpy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from http import HTTPStatus

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.policy.modes import StopMode
from airflow_ckpt_provider.core.records.base import Record
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.store.jobstore import CONTROL, JobStore

log = logging.getLogger(__name__)

ACK_SUFFIX = ".ack.json"
#: The object an asker rewrites after each request: outside ``control/``, so no lister takes it for a request.
BELL = "control-bell.json"
#: Seconds between the driver's listings of ``control/`` while the bell is silent: a request of an asker that rings
#: no bell (an older version, or one that died between its request and the bell) is found within this.
BELL_SWEEP = 300.0  # a LIST every 30 s was $0.44 a month: most of an idle job's budget (docs/scale.md)
#: Seconds an asker waits for the driver's door to answer its knock (on one host it answers in milliseconds).
KNOCK_TIMEOUT = 1.0


class RequestAction(StrEnum):
    """What a control request asks the running driver to do."""

    SAVEPOINT = "savepoint"  # take a savepoint now, keep running
    STOP = "stop"  # finish the batch in flight, take a final savepoint, exit 0
    CANCEL = "cancel"  # stop now; the latest completed checkpoint stays valid


#: The request that stops a driver in each stop mode.
STOP_ACTION = {StopMode.SAVEPOINT: RequestAction.STOP, StopMode.CANCEL: RequestAction.CANCEL}


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"


class Request(Record, frozen=True):
    """A request to the running driver of ``epoch``: take a savepoint, stop with a final savepoint, or cancel.
    Written create-if-absent by ``submit_request`` (`ckpt job savepoint|stop|cancel`, the operators, the UI,
    Dagster), with who asked (``requested_by``); read by the driver (``open_requests``), which answers it in
    ``control/<id>.ack.json`` and rejects one meant for another epoch, or one it cannot read."""

    WHAT = "control request"
    KEY = "control/<id>.json"

    id: str
    action: RequestAction
    epoch: int
    created_at: float
    requested_by: str = ""


class Ack(Record, frozen=True):
    """The driver's answer to request ``id``: ``outcome`` (completed, failed or rejected), a message for humans,
    the epoch of the driver that answered, and for a savepoint the snapshot and its batch. ``action`` is None
    when the request could not be read. Written once by the driver (runtime/reporting.py); read by whoever
    waits for it (``wait_ack``: `ckpt job`, the operators and triggers, the UI, Dagster, the control watch)."""

    WHAT = "control ack"
    KEY = "control/<id>.ack.json"

    id: str
    action: RequestAction | None  # None: the request could not be read
    outcome: Outcome
    message: str
    epoch: int
    finished_at: float
    snapshot_id: str | None = None
    snapshot_uri: str | None = None
    batch_id: int | None = None



class Bell(Record, frozen=True):
    """The control channel's bell: rewritten by whoever writes a request (its id and time), after the request, so
    a driver that reads a changed bell finds the request in its next listing of ``control/``."""

    WHAT = "control bell"
    KEY = BELL

    request_id: str
    at: float


class BellWatch:
    """The driver's look at the bell: ``due()`` reads it (one GET) and says whether to list ``control/`` now: the
    bell changed since the last look, or ``sweep`` s passed since the last listing (also the first look)."""

    def __init__(self, store: JobStore, *, sweep: float = BELL_SWEEP,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.sweep, self.clock = store, sweep, clock
        self.tag: str | None = None
        self.listed_at: float | None = None

    def due(self) -> bool:
        """StorageError if the bell cannot be read (the caller rides out the outage as for any look)."""
        found = self.store.storage.read_versioned(BELL)
        tag = found.tag if found is not None else None
        now = self.clock()
        if self.listed_at is not None and tag == self.tag and now - self.listed_at < self.sweep:
            return False
        self.tag, self.listed_at = tag, now
        return True


def ring(store: JobStore, request: Request) -> None:
    """Rewrite the bell after ``request`` was written, then knock at the running driver's door (``knock``). A failed
    bell write raises StorageError (the driver's sweep finds the request within BELL_SWEEP s)."""
    store.storage.write(BELL, Bell(request_id=request.id, at=request.created_at).to_bytes())
    knock(store)


def knock(store: JobStore, timeout: float = KNOCK_TIMEOUT) -> bool:
    """Tell the driver holding the job's lease to look at the bell now: one GET of lease.json and a POST to the door
    it names (runtime/controldoor.py). False (one debug line) if there is none or it does not answer in ``timeout``
    s: the driver then finds the request at its next poll, as without a door."""
    try:
        lease = read_lease(store)
    except StorageError as err:
        log.debug("job %s: no knock: the lease cannot be read: %s", store.job, err)
        return False
    if lease is None or lease.released or not lease.door:
        return False
    try:
        with urllib.request.urlopen(urllib.request.Request(lease.door, method="POST", data=b""),  # noqa: S310  # http only, the lease's own door
                                    timeout=timeout) as answer:
            return bool(answer.status == HTTPStatus.NO_CONTENT)
    except (OSError, ValueError) as err:  # unreachable, refused, timed out, or not a URL
        log.debug("job %s: the driver's door %s did not answer: %s", store.job, lease.door, err)
        return False


def request_key(request_id: str) -> str:
    return f"{CONTROL}{request_id}.json"


def ack_key(request_id: str) -> str:
    return f"{CONTROL}{request_id}{ACK_SUFFIX}"


def new_request_id(action: RequestAction, now: float | None = None) -> str:
    """A new request's id (an actor records it before it writes the request, to find it again if it dies)."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{action.value}-{stamp}-{secrets.token_hex(3)}"


def keyed_request_id(action: RequestAction, key: str, attempt: int) -> str:
    """The id of attempt ``attempt`` (1, 2, ...) at ``action`` for ``key``: the same for every try of one Airflow task
    run or Dagster op, so a retry finds what its first try asked for (``keyed_requests``)."""
    return f"{_keyed_prefix(action, key)}{attempt}"


def _keyed_prefix(action: RequestAction, key: str) -> str:
    return f"{action.value}-k{hashlib.sha256(key.encode()).hexdigest()[:16]}-"


def keyed_requests(store: JobStore, action: RequestAction, key: str) -> list[tuple[int, Request, Ack | None]]:
    """The requests asked for ``key`` so far (attempt, request, its ack or None), by attempt: one LIST of their ids."""
    prefix = _keyed_prefix(action, key)
    found: list[tuple[int, Request, Ack | None]] = []
    for info in store.storage.list(f"{CONTROL}{prefix}"):
        name = info.key[len(CONTROL) + len(prefix):]
        if not name.endswith(".json") or name.endswith(ACK_SUFFIX) or not name[: -len(".json")].isdigit():
            continue
        try:
            request = Request.from_bytes(store.storage.read(info.key), store.storage.uri(info.key))
        except FileNotFoundError:  # disposed of by retention meanwhile
            continue
        found.append((int(name[: -len(".json")]), request, read_ack(store, request.id)))
    return sorted(found, key=lambda entry: entry[0])


def submit_request(store: JobStore, action: RequestAction, epoch: int, *, now: float | None = None,
                   requested_by: str | None = None, request_id: str | None = None) -> Request:
    """Write a request for the driver of ``epoch``; it is picked up within the driver's poll interval.
    ``requested_by`` (default: USER@host) says who asked, e.g. an Airflow user from the UI. Returns the request
    as written (its ``schema`` the version that wrote it)."""
    created = time.time() if now is None else now
    request = Request(
        id=request_id or new_request_id(action, created), action=action, epoch=epoch, created_at=created,
        requested_by=requested_by or f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}",
    )
    if not store.storage.create(request_key(request.id), request.to_bytes()):
        raise ConfigError(f"control request id {request.id} already exists; retry")
    try:
        ring(store, request)
    except StorageError as err:  # the request stands: the driver's sweep finds it, later
        log.warning("job %s: request %s written, but the bell could not be rung (%s): the driver finds the request "
                    "within %.0f s", store.job, request.id, err, BELL_SWEEP)
    return request


def open_requests(store: JobStore, on_malformed: Callable[[str, str], None] | None = None) -> list[Request]:
    """Requests without an ack, oldest first. A request that cannot be read raises StorageError, or
    with ``on_malformed`` is reported as (request id, problem) and skipped, so it blocks no other."""
    keys = {o.key for o in store.storage.list(CONTROL)}
    found = []
    for key in sorted(keys):
        if key.endswith(ACK_SUFFIX) or not key.endswith(".json"):
            continue
        if key[: -len(".json")] + ACK_SUFFIX in keys:
            continue
        try:
            found.append(Request.from_bytes(store.storage.read(key), store.storage.uri(key)))
        except FileNotFoundError:
            continue
        except StorageError as err:
            if on_malformed is None:
                raise
            on_malformed(key[len(CONTROL) : -len(".json")], str(err))
    return sorted(found, key=lambda r: r.created_at)


def write_ack(store: JobStore, ack: Ack) -> None:
    store.storage.write(ack_key(ack.id), ack.to_bytes())


def read_ack(store: JobStore, request_id: str) -> Ack | None:
    try:
        data = store.storage.read(ack_key(request_id))
    except FileNotFoundError:
        return None
    return Ack.from_bytes(data, store.storage.uri(ack_key(request_id)))


def wait_ack(
    store: JobStore,
    request_id: str,
    timeout: float,
    *,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Ack | None:
    """The ack of a request, waiting up to ``timeout`` seconds; None if none came in time. The wait is at the door of
    the driver holding the lease (one GET of lease.json; runtime/controldoor.py), which answers as soon as the driver
    wrote the ack, read then from the store; where there is no door or it does not answer, the store is read every
    ``poll`` s."""
    deadline = clock() + timeout
    door = _door(store)
    while True:
        ack = read_ack(store, request_id)
        if ack is not None or clock() >= deadline:
            return ack
        if door is not None:
            asked = clock()
            waited = wait_at_door(door, request_id, deadline - asked)
            if waited is None or (not waited and clock() - asked < min(1.0, deadline - asked) / 2):
                door = None  # unreachable, or closed (an answer at once that is no ack): the store, every poll
            continue
        sleep(poll)


def _door(store: JobStore) -> str | None:
    """The door named in lease.json (None: none, released, or unreadable)."""
    try:
        lease = read_lease(store)
    except StorageError:
        return None
    return lease.door if lease is not None and not lease.released else None


def wait_at_door(door: str, request_id: str, wait: float) -> bool | None:
    """Wait at ``door`` (a driver's knock URL) up to ``wait`` s for the ack of ``request_id``: True once the driver
    wrote it, False if it did not within the wait, None if the door does not answer (or is an older driver's, which
    only takes knocks)."""
    url = door.replace("/knock/", "/ack/", 1) + f"/{urllib.parse.quote(request_id)}?wait={max(wait, 0.0):.2f}"
    try:
        with urllib.request.urlopen(url, timeout=wait + KNOCK_TIMEOUT) as answer:  # noqa: S310  # http only, the lease's own door
            return bool(answer.status == HTTPStatus.OK)
    except (OSError, ValueError) as err:  # unreachable, refused, timed out, not a URL, or an HTTP error
        log.debug("the driver's door %s did not answer for request %s: %s", door, request_id, err)
        return None
