"""The driver's control door: an asker that wrote a control request and rang the bell knocks here (an HTTP POST with
no body, its address in lease.json), and the driver looks at the bell at once instead of at its next poll; the asker
then waits here for the driver to have written the request's ack (a long GET) instead of polling the store for it.

Design notes: docs/scale.md#design-notes-runtimecontroldoorpy."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.parse
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError

log = logging.getLogger(__name__)

#: Seconds an asker may wait for an ack at the door in one GET (it asks again, or reads the store, after).
MAX_WAIT = 30.0
#: The acks the door remembers (the newest): an asker that comes after its ack still learns it at once.
ANSWERS_KEPT = 64


class ControlDoor:
    """A daemon HTTP server on ``address`` (a free port) that answers ``POST /knock/<job>`` with 204 and sets
    ``knocked``, and ``GET /ack/<job>/<request id>?wait=<s>`` with 200 once the driver wrote that request's ack
    (``answered``), or 204 after ``wait`` seconds (at most ``MAX_WAIT``) or when the door closes; anything else is 404.
    Neither carries a request or an answer: the driver reads the request, and the asker the ack, from the job store,
    so a stray or hostile knock costs one GET of the bell, never an action."""

    def __init__(self, job: str, address: str) -> None:
        self.job = job
        self.knocked = threading.Event()
        self._answered: OrderedDict[str, None] = OrderedDict()  # the last ANSWERS_KEPT requests acked, newest last
        self._changed = threading.Condition()
        self._closed = False
        door = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != f"/knock/{door.job}":
                    self.send_error(404, "expected POST /knock/<this driver's job>")
                    return
                door.knocked.set()
                self.send_response(204)
                self.end_headers()

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                prefix = f"/ack/{door.job}/"
                if not url.path.startswith(prefix) or "/" in url.path[len(prefix):]:
                    self.send_error(404, "expected GET /ack/<this driver's job>/<request id>?wait=<seconds>")
                    return
                try:
                    wait = float(urllib.parse.parse_qs(url.query).get("wait", ["0"])[0])
                except ValueError:
                    wait = 0.0
                done = door.wait_answered(url.path[len(prefix):], min(max(wait, 0.0), MAX_WAIT))
                self.send_response(200 if done else 204)
                self.send_header("Content-Length", "0")
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

    def answered(self, request_id: str) -> None:
        """The driver wrote the ack of ``request_id``: whoever waits for it here is told at once."""
        with self._changed:
            self._answered[request_id] = None
            while len(self._answered) > ANSWERS_KEPT:
                self._answered.popitem(last=False)
            self._changed.notify_all()

    def wait_answered(self, request_id: str, timeout: float) -> bool:
        """Whether the driver wrote the ack of ``request_id`` within ``timeout`` s (False at once when closed)."""
        with self._changed:
            return self._changed.wait_for(lambda: request_id in self._answered or self._closed, timeout) and (
                request_id in self._answered)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
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
