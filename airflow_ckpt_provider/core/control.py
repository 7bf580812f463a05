"""The control channel: requests written to ``control/<id>.json``, answered in ``<id>.ack.json``.

A request names the epoch of the driver it is meant for, so a request written for a driver that
has since been replaced is rejected instead of acting on the new one.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.jobstore import CONTROL, JobStore
from airflow_ckpt_provider.core.modes import StopMode

ACK_SUFFIX = ".ack.json"


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


@dataclass(frozen=True)
class Request:
    id: str
    action: RequestAction
    epoch: int
    created_at: float
    requested_by: str

    def to_bytes(self) -> bytes:
        return json.dumps({**asdict(self), "action": self.action.value}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Request:
        try:
            body = json.loads(data)
            return cls(
                id=str(body["id"]), action=RequestAction(body["action"]), epoch=int(body["epoch"]),
                created_at=float(body["created_at"]), requested_by=str(body.get("requested_by", "")),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise StorageError(f"control request {where} is malformed ({err})") from err


@dataclass(frozen=True)
class Ack:
    """The driver's answer: outcome, a message for humans, and for savepoints the snapshot."""

    id: str
    action: RequestAction | None  # None: the request could not be read
    outcome: Outcome
    message: str
    epoch: int
    finished_at: float
    snapshot_id: str | None = None
    snapshot_uri: str | None = None
    batch_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "action": self.action.value if self.action else None, "outcome": self.outcome.value}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Ack:
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise TypeError(f"expected a JSON object, found {type(body).__name__}")
            known = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}  # newer drivers may add fields
            action = RequestAction(body["action"]) if body.get("action") is not None else None
            return cls(**known | {"action": action, "outcome": Outcome(body["outcome"])})
        except (ValueError, KeyError, TypeError) as err:
            raise StorageError(f"control ack {where} is malformed ({err})") from err


def request_key(request_id: str) -> str:
    return f"{CONTROL}{request_id}.json"


def ack_key(request_id: str) -> str:
    return f"{CONTROL}{request_id}{ACK_SUFFIX}"


def submit_request(store: JobStore, action: RequestAction, epoch: int, *, now: float | None = None,
                   requested_by: str | None = None) -> Request:
    """Write a request for the driver of ``epoch``; it is picked up within the driver's poll interval.
    ``requested_by`` (default: USER@host) says who asked, e.g. an Airflow user from the UI."""
    created = time.time() if now is None else now
    stamp = datetime.fromtimestamp(created, UTC).strftime("%Y%m%dT%H%M%SZ")
    request = Request(
        id=f"{action.value}-{stamp}-{secrets.token_hex(3)}", action=action, epoch=epoch, created_at=created,
        requested_by=requested_by or f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}",
    )
    if not store.storage.create(request_key(request.id), request.to_bytes()):
        raise ConfigError(f"control request id {request.id} already exists; retry")
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
    """The ack of a request, waiting up to ``timeout`` seconds; None if none came in time."""
    deadline = clock() + timeout
    while True:
        ack = read_ack(store, request_id)
        if ack is not None or clock() >= deadline:
            return ack
        sleep(poll)
