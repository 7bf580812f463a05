"""A counting HTTP reverse proxy for an S3 endpoint on 127.0.0.1: what the benchmarks count S3 requests with.

Each client connection is relayed to the server request by request (HTTP/1.1, no pipelining, as boto3
sends them); the proxy parses the request line and the framing (Content-Length or chunked) and records
one ``Hit`` per request: which process sent it (the client socket's owner, found in /proc), the S3
operation, the job store prefix it touched, the status and the bytes both ways. It answers
``Expect: 100-continue`` itself (botocore leaves that header out of the signature), and forwards the
Host header unchanged, so SigV4 signatures made for the proxy's address still verify upstream.
Linux only (/proc/net/tcp).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

#: Job store keys by their first segment (core/store/jobstore.py's layout) -> the kind reported.
PREFIXES = {
    "status.json": "status", "lease.json": "lease", "snapshots": "snapshots", "objects": "objects",
    "pending": "pending", "locks": "locks", "control": "control", "deployments": "deployments",
    "spec": "spec", "supervisors": "supervisors", "control-bell.json": "control", "operation.json": "operation",
    "ends": "ends",
}
_KEY = re.compile(rb"<Key>([^<]*)</Key>")


@dataclass(frozen=True)
class Hit:
    """One S3 request seen by the proxy."""

    t: float  # wall clock when its response ended
    role: str  # driver | supervisor | watch (this process) | the sender's command name
    op: str  # GET HEAD PUT LIST DELETE POST OTHER (DELETE includes DeleteObjects, a POST ?delete)
    prefix: str  # the PREFIXES kind of the key (or the LIST prefix, or the first deleted key), or "other"
    status: int
    sent: int  # request body bytes
    received: int  # response body bytes
    keys: int = 0  # keys a LIST returned, or keys a DeleteObjects named


def classify(method: str, target: str, body: bytes, job_root: str) -> tuple[str, str, int]:
    """(operation, prefix kind, key count) of one request to a path-style S3 endpoint."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    path = unquote(parts.path).lstrip("/")
    key = path.split("/", 1)[1] if "/" in path else ""
    if not key:  # bucket level: ListObjectsV2, DeleteObjects, CreateBucket
        if method == "GET" and ("list-type" in query or "prefix" in query):
            return "LIST", _kind(query.get("prefix", [""])[0], job_root), 0
        if method == "POST" and "delete" in query:
            keys = [k.decode() for k in _KEY.findall(body)]
            return "DELETE", _kind(keys[0] if keys else "", job_root), len(keys)
        return "OTHER", "other", 0
    op = method if method in ("GET", "HEAD", "PUT", "DELETE", "POST") else "OTHER"
    return op, _kind(key, job_root), 0


def _kind(key: str, job_root: str) -> str:
    """The job store kind of ``key`` (``<job_root>/<job>/<first segment>...``)."""
    rest = key[len(job_root):].lstrip("/") if job_root and key.startswith(job_root) else key
    segments = rest.split("/")
    first = segments[1] if len(segments) > 1 else ""
    return PREFIXES.get(first, "other")


def _socket_owner(peer_port: int, server_port: int) -> int | None:
    """The pid holding the client end 127.0.0.1:peer_port -> 127.0.0.1:server_port, from /proc."""
    want_local, want_remote = f"0100007F:{peer_port:04X}", f"0100007F:{server_port:04X}"
    inode = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == want_local and fields[2] == want_remote:
                inode = fields[9]
                break
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == link:
                        return int(proc.name)
    return None


def role_of(pid: int | None) -> str:
    """driver (the Python driver: runtime/entrypoint.py), supervisor (``ckpt run``), watch (this process)."""
    if pid is None:
        return "unknown"
    if pid == os.getpid():
        return "watch"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "unknown"
    if any(a.endswith(b"entrypoint.py") for a in argv):
        return "driver"
    if b"airflow_ckpt_provider.cli" in argv:
        return "supervisor"
    return Path(argv[0].decode(errors="replace")).name or "unknown"


class CountingProxy:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``target_port`` and keeps every ``Hit`` (``hits``)."""

    def __init__(self, target_port: int, *, job_root: str = "", capture_list_keys: bool = True) -> None:
        self.target_port = target_port
        self.job_root = job_root.strip("/")
        self.capture = capture_list_keys
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="s3-count-proxy", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CountingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # open client connections: boto3 keeps them for reuse
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def mark(self, settle: float = 0.1) -> int:
        """An index into ``hits``: ``since(mark)`` are the requests after it. Waits ``settle`` s first: the proxy
        records a request just after relaying its answer, so the caller may see the answer a moment earlier."""
        time.sleep(settle)
        with self._lock:
            return len(self.hits)

    def since(self, mark: int, until: int | None = None, role: Callable[[str], bool] | None = None) -> list[Hit]:
        with self._lock:
            found = self.hits[mark:until]
        return [h for h in found if role is None or role(h.role)]

    # -- relaying ---------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_port = writer.get_extra_info("peername")[1]
        try:
            # before the first request is relayed: a hit must be recorded by the time its caller has the answer
            role = role_of(await asyncio.get_running_loop().run_in_executor(None, _socket_owner, peer_port, self.port))
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except (OSError, asyncio.CancelledError):
            writer.close()
            return
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ", 2)
                headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
                names = {k.lower(): v for k, v in headers}
                if names.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                up_writer.write((lines[0] + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n")
                                .encode("latin-1"))
                keep_body = method == "POST"
                sent, body = await _relay_body(reader, up_writer, names, keep=keep_body, request=True)
                await up_writer.drain()
                while True:
                    rhead = await up_reader.readuntil(b"\r\n\r\n")
                    status = int(rhead.split(b" ", 2)[1])
                    writer.write(rhead)
                    if status >= 200 or status == 101:
                        break
                rnames = {k.strip().lower(): v.strip() for k, _, v in
                          (line.partition(":") for line in rhead.decode("latin-1").split("\r\n")[1:] if line)}
                op, prefix, keys = classify(method, target, body, self.job_root)
                no_body = method == "HEAD" or status in (204, 304)
                received, rbody = await _relay_body(up_reader, writer, rnames, keep=self.capture and op == "LIST",
                                                    request=False, no_body=no_body)
                await writer.drain()
                if op == "LIST":
                    keys = rbody.count(b"<Key>")
                with self._lock:
                    self.hits.append(Hit(time.time(), role, op, prefix, status, sent, received, keys))
                if "close" in (names.get("connection", "").lower(), rnames.get("connection", "").lower()):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError, asyncio.CancelledError):
            return  # a closed connection, a malformed message, or the proxy stopping
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()


async def _relay_body(src: asyncio.StreamReader, dst: asyncio.StreamWriter, headers: dict[str, str], *,
                      keep: bool, request: bool, no_body: bool = False) -> tuple[int, bytes]:
    """Forward one message body (Content-Length, chunked, or to EOF for a response): (bytes, kept bytes)."""
    if no_body:
        return 0, b""
    kept = bytearray()
    total = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await src.readuntil(b"\r\n")
            dst.write(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (trailer := await src.readuntil(b"\r\n")) != b"\r\n":
                    dst.write(trailer)
                dst.write(b"\r\n")
                return total, bytes(kept)
            data = await src.readexactly(size + 2)
            dst.write(data)
            total += size
            if keep:
                kept += data[:-2]
    length = headers.get("content-length")
    if length is not None:
        left = int(length)
        while left > 0:
            data = await src.read(min(left, 1 << 20))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            dst.write(data)
            left -= len(data)
            total += len(data)
            if keep:
                kept += data
            await dst.drain()
        return total, bytes(kept)
    if request:
        return 0, b""
    while data := await src.read(1 << 20):  # a response without a length ends with the connection
        dst.write(data)
        total += len(data)
        if keep:
            kept += data
    return total, bytes(kept)
