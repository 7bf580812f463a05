"""The admission gate: a file that, when present, makes the ckpt-kafka source offer no new data.

A stop-with-savepoint closes the gate, lets the batch in flight commit, and stops the query at that
batch boundary. The source runs in a Python worker the JVM starts, which inherits the driver's
environment: the gate's path travels in ``CKPT_GATE_FILE`` (set before the JVM starts).

Only the driver's host uses the gate: the driver closes it (runtime/controlhandler.py) and the source's offsets
are planned in a Python worker next to the driver. A driver launched here (client mode) gets an absolute path in
this host's temporary directory. A driver in the cluster (YARN, Kubernetes cluster mode) gets a bare file name
instead, which means: in the temporary directory of the host the driver runs on (``tempfile.gettempdir()`` there,
the same for the driver and its Python workers, which inherit one environment); a path of the launching host
would mean nothing in a driver pod or container.
"""

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
