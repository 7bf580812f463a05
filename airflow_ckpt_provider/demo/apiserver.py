"""An Airflow api-server on 127.0.0.1 over the demo's Airflow home, for ``scripts/demo --keep``: the UI shows the
DAG runs the demo made, and the provider's pages, with a generated admin password.

The same settings as the system tests' harness (tests/system/airflow_server.py), for the api-server alone: the
DAG runs are already in the home's database, so no scheduler, dag-processor or triggerer is needed to browse them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from airflow_ckpt_provider.embedded.process import HOST, free_port

USERNAME = "admin"


def auth_env(home: Path, port: int, username: str, password: str) -> dict[str, str]:
    """The simple auth manager with ``username`` as admin and ``password`` pre-seeded in ``<home>/passwords.json``
    (the manager only generates passwords for users missing from that file), on ``http://127.0.0.1:<port>``."""
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({username: password}))
    passwords.chmod(0o600)
    base_url = f"http://{HOST}:{port}"
    return {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{username}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
    }


class DemoApiServer:
    """``airflow api-server`` for an Airflow home (its environment ``env``), in a process group of its own; use as
    a context manager. ``url``, ``username`` and ``password`` once started; its log is ``<home>/api-server.log``."""

    def __init__(self, home: Path, env: Mapping[str, str], *, startup_timeout: float = 180.0) -> None:
        self.home, self.env, self.startup_timeout = home, dict(env), startup_timeout
        self.username, self.password = USERNAME, secrets.token_urlsafe(12)
        self.port = 0
        self.log = home / "api-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> DemoApiServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port()
        env = {**self.env, **auth_env(self.home, self.port, self.username, self.password)}
        argv = [sys.executable, "-m", "airflow", "api-server", "--host", HOST, "--port", str(self.port)]
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(argv, env=env, cwd=self.home, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        """Until /api/v2/monitor/health answers 200 with a healthy metadatabase (nothing else runs here)."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"airflow api-server exited ({self._proc.returncode}); log {self.log}:\n"
                                   f"{self.log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:  # noqa: S310 -- our own http://127.0.0.1 URL
                    body = json.loads(resp.read())
                if (body.get("metadatabase") or {}).get("status") == "healthy":
                    return
                last = str(body)
            except (OSError, ValueError) as err:  # URLError and refused connections are OSErrors
                last = repr(err)
            time.sleep(0.5)
        raise RuntimeError(f"airflow api-server at {self.url} not healthy after {self.startup_timeout:.0f} s: {last}; "
                           f"log {self.log}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM its process group (uvicorn and its worker), then SIGKILL what is left."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group may outlive its leader
        proc.wait(5)
