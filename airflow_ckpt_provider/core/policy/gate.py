"""The admission gate: a file that, when present, makes the ckpt-kafka source offer no new data; closed for a
stop with savepoint, it also holds Spark's planning of the next batch at the source until the query stops.

Design notes: docs/runtime.md#design-notes-corepolicygatepy."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

GATE_ENV = "CKPT_GATE_FILE"
#: The gate file's content when the closer waits for the query to park at the source (a stop with savepoint).
PARK = "park"
#: The file next to the gate that says a source is holding Spark's planning there (``<gate>.parked``).
PARKED_SUFFIX = ".parked"
#: How long a source holds the planning before it plans a batch without new data (and is held again): bounds a
#: gate left closed by a driver that died while stopping (its successor opens the gate when it starts).
PARK_S = 30.0
PARK_STEP_S = 0.05


def gate_path() -> Path | None:
    """The gate file: ``CKPT_GATE_FILE`` as it is, or a bare name in this host's temporary directory."""
    value = os.environ.get(GATE_ENV)
    if not value:
        return None
    path = Path(value)
    return path if path.parent != Path() else Path(tempfile.gettempdir(), value)


def gate_closed() -> bool:
    path = gate_path()
    return path is not None and path.exists()


def close_gate(*, park: bool = False) -> bool:
    """Close the gate; with ``park`` the source also holds Spark's next planning (:func:`hold_at_gate`). False if
    this process has no gate (the source then keeps offering data)."""
    path = gate_path()
    if path is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    _parked(path).unlink(missing_ok=True)
    path.write_text(PARK if park else "")
    return True


def open_gate() -> None:
    path = gate_path()
    if path is not None:
        path.unlink(missing_ok=True)
        _parked(path).unlink(missing_ok=True)


def parked() -> bool:
    """Is a source holding Spark's planning at the closed gate (so no batch is planned until the query stops)?"""
    path = gate_path()
    return path is not None and _parked(path).exists()


def hold_at_gate(bound_s: float = PARK_S) -> bool:
    """The source's side, in ``latestOffset``: while a stop with savepoint keeps the gate closed, hold Spark's
    planning of the next batch here (marked by ``<gate>.parked``) until the gate opens or ``bound_s`` passes.

    Spark plans every batch, a batch without new data too (a watermark or a processing-time timer asks for one),
    by asking each source for its latest offset first; a query held here has written no ``offsets/N`` it has not
    committed, and ``query.stop()`` ends it at once. True once the gate is open (plan as usual), False if it is
    still closed (offer no new data)."""
    path = gate_path()
    if path is None or not path.exists():
        return True
    if not _parks(path):
        return False
    marker = _parked(path)
    marker.touch()
    try:
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            time.sleep(PARK_STEP_S)  # a look at a local file: the driver opens the gate when the query stopped
            if not path.exists():
                return True
        return False
    finally:
        marker.unlink(missing_ok=True)


def _parks(path: Path) -> bool:
    try:
        return path.read_text() == PARK
    except OSError:  # opened meanwhile
        return False


def _parked(path: Path) -> Path:
    return path.with_name(path.name + PARKED_SUFFIX)
