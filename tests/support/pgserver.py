"""A throwaway PostgreSQL server for tests, from Debian's binaries (/usr/lib/postgresql/*/bin).

initdb into a fresh directory under /tmp, trust auth on 127.0.0.1 only, a free port, the unix socket
inside the directory, fsync off. initdb and postgres refuse to run as root: as uid 0 both run as the
``postgres`` user through ``runuser``. Stopped with SIGTERM, then SIGKILL; the directory is removed.

    with PgServer() as pg:
        psycopg.connect(pg.dsn)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def find_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and postgres; RuntimeError if none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError(
            "no PostgreSQL server binaries: expected /usr/lib/postgresql/<version>/bin/postgres (Debian's "
            "postgresql package); run scripts/bootstrap, or apt-get install postgresql"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """Start on ``__enter__`` (ready to accept connections), stop and delete on ``__exit__``."""

    def __init__(self, *, start_timeout: float = 60.0, stop_timeout: float = 15.0) -> None:
        self.bin = find_bin_dir()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-pg-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # postgres must traverse it when we are root
        self.data = self.root / "data"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def _cmd(self, *args: str) -> list[str]:
        if os.getuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def start(self) -> None:
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            self._cmd(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--no-sync", "-E", "UTF8", "--locale=C"),
            check=True, capture_output=True, timeout=120,
        )
        (self.data / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\nlocal all all trust\n")
        log = open(self.root / "postgres.log", "wb")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            self._cmd(str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                      "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                      "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                      "-c", "max_connections=50", "-c", "shared_buffers=32MB"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                psycopg.connect(self.dsn).close()
                return
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres not ready within {self.start_timeout} s:\n{self.log_tail()}") from err
                time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        path = self.root / "postgres.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # runuser forwards it: "smart" shutdown
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
