"""A port another process took: what a server's start meets when a port it picked free is bound before it binds it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port bound by this process and not listening, while the block runs: a server cannot bind it, and
    nothing answers on it (so a client never mistakes it for the server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        yield int(taken.getsockname()[1])
