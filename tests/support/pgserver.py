"""A throwaway PostgreSQL server for tests, from Debian's binaries (/usr/lib/postgresql/*/bin).

initdb into a fresh directory under /tmp, trust auth on 127.0.0.1 only, a free port, the unix socket
inside the directory, fsync off. initdb and postgres refuse to run as root: as uid 0 both run as the
``postgres`` user through ``runuser``. An ``EmbeddedProcess`` (airflow_ckpt_provider/embedded/process.py)
like the package's own servers: its own session and log, a start that another process took the port from
meanwhile tried again on a fresh port, stopped with SIGTERM then SIGKILL; ``close`` removes the directory.

    with PgServer() as pg:
        psycopg.connect(pg.dsn)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from airflow_ckpt_provider.embedded.process import EmbeddedProcess, EmbeddedServiceError, free_port


def find_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and postgres; RuntimeError if none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError(
            "no PostgreSQL server binaries: expected /usr/lib/postgresql/<version>/bin/postgres (Debian's "
            "postgresql package); run scripts/bootstrap, or apt-get install postgresql"
        )
    return Path(found[-1]).parent


class PgServer(EmbeddedProcess):
    """Start on ``__enter__`` (ready to accept connections), stop and delete on ``__exit__``."""

    name = "postgres"

    def __init__(self, *, start_timeout: float = 60.0, stop_timeout: float = 15.0) -> None:
        self.bin = find_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-pg-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # postgres must traverse it when we are root
        super().__init__(self.root, start_timeout, stop_timeout)
        self.port = free_port()
        self.data = self.root / "data"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def _as_postgres(self, *args: str) -> list[str]:
        if os.getuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        return self._as_postgres(
            str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=50", "-c", "shared_buffers=32MB",
        ), dict(os.environ)

    def _initdb(self) -> None:
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        done = subprocess.run(
            self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                              "--no-sync", "-E", "UTF8", "--locale=C"),
            check=False, capture_output=True, timeout=120,
        )
        if done.returncode != 0:
            raise EmbeddedServiceError(f"Expected initdb to create {self.data}, it exited with code "
                                       f"{done.returncode}:\n{done.stderr.decode(errors='replace')[-2000:]}")
        (self.data / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\nlocal all all trust\n")

    def _ready(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.dsn).close()
        except psycopg.OperationalError:
            return False
        return True

    def _describe(self) -> str:
        return f"127.0.0.1:{self.port}, data {self.data}"

    def _fresh_ports(self) -> str | None:
        gave_up, self.port = str(self.port), free_port()
        return gave_up

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.root, ignore_errors=True)
