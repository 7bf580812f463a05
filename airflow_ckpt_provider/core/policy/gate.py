"""The admission gate: a file that, when present, makes the ckpt-kafka source offer no new data.

Design notes: docs/runtime.md#design-notes-corepolicygatepy."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

GATE_ENV = "CKPT_GATE_FILE"


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
