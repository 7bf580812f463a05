"""The admission gate: a file that, when present, makes the ckpt-kafka source offer no new data.

A stop-with-savepoint closes the gate, lets the batch in flight commit, and stops the query at that
batch boundary. The source runs in a Python worker the JVM starts, which inherits the driver's
environment: the gate's path travels in ``CKPT_GATE_FILE`` (set before the JVM starts).
"""

from __future__ import annotations

import os
from pathlib import Path

GATE_ENV = "CKPT_GATE_FILE"


def gate_path() -> Path | None:
    value = os.environ.get(GATE_ENV)
    return Path(value) if value else None


def gate_closed() -> bool:
    path = gate_path()
    return path is not None and path.exists()


def close_gate() -> bool:
    """Close the gate; False if this process has no gate (the source then keeps offering data)."""
    path = gate_path()
    if path is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return True


def open_gate() -> None:
    path = gate_path()
    if path is not None:
        path.unlink(missing_ok=True)
