"""The driver's control door: an asker that wrote a control request and rang the bell knocks here (an HTTP POST with
no body, its address in lease.json), and the driver looks at the bell at once instead of at its next poll.

Design notes: docs/scale.md#design-notes-runtimecontroldoorpy."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError

log = logging.getLogger(__name__)


class ControlDoor:
    """A daemon HTTP server on ``address`` (a free port) that answers ``POST /knock/<job>`` with 204 and sets
    ``knocked``; anything else is 404. A knock carries nothing: the driver reads the request from the job store as
    it would at a poll, so a stray or hostile knock costs one GET of the bell, never an action."""

    def __init__(self, job: str, address: str) -> None:
        self.job = job
        self.knocked = threading.Event()
        door = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != f"/knock/{door.job}":
                    self.send_error(404, "expected POST /knock/<this driver's job>")
                    return
                door.knocked.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("control door of job %s: %s", door.job, format % args)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        host, port = self.server.server_address[:2]
        if str(host) in ("0.0.0.0", "::"):  # every address of the host: askers reach it by the host's own  # noqa: S104
            host = socket.gethostbyname(socket.gethostname())
        self.url = f"http://{_url_host(str(host))}:{port}/knock/{job}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="ckpt-control-door", daemon=True)

    def start(self) -> ControlDoor:
        self._thread.start()
        log.info("job %s: control door at %s: requests are looked at as soon as their asker knocks", self.job,
                 self.url)
        return self

    def take_knock(self) -> bool:
        """True once after one or more knocks."""
        if self.knocked.is_set():
            self.knocked.clear()
            return True
        return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def open_door(job: str, address: str | None) -> ControlDoor | None:
    """The started door of ``job`` on ``address`` (None: no door); ConfigError if this host cannot bind it."""
    if address is None:
        return None
    try:
        door = ControlDoor(job, address)
    except OSError as err:
        raise ConfigError(f"control_door: expected an address of this host to bind the driver's control door on, "
                          f"found {address!r} ({err}); set --control-door to one, or none for no door") from err
    return door.start()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
