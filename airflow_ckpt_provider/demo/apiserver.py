"""A whole Airflow on 127.0.0.1 over the demo's Airflow home, for ``scripts/demo --keep``: the api-server (the UI
with the DAG runs the demo made and the provider's Streaming jobs page, a generated admin password), and the
scheduler, dag-processor and triggerer, so what a user starts there runs: the upgrade DAG from the page's
*Upgrade...*, and ``ckpt_on_savepoint``, which the savepoint asset's watcher in the triggerer schedules.

The same settings as the system tests' harness (tests/system/airflow_server.py); each component in a process
group of its own, its log ``<home>/<component>.log``, all stopped together.
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.embedded.process import HOST, free_port

USERNAME = "admin"
#: Besides the api-server: what runs the DAGs (the LocalExecutor of the home's sqlite database).
WORKERS = {"scheduler": ["scheduler", "--skip-serve-logs"], "dag-processor": ["dag-processor"],
           "triggerer": ["triggerer", "--skip-serve-logs"]}


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
    """``airflow api-server`` and (``workers``) the scheduler, dag-processor and triggerer for an Airflow home (its
    environment ``env``), each in a process group of its own; use as a context manager. ``url``, ``username`` and
    ``password`` once started; the logs are ``<home>/<component>.log``."""

    def __init__(self, home: Path, env: Mapping[str, str], *, startup_timeout: float = 180.0,
                 workers: bool = True) -> None:
        self.home, self.env, self.startup_timeout = home, dict(env), startup_timeout
        self.username, self.password = USERNAME, secrets.token_urlsafe(12)
        self.port = 0
        self.log = home / "api-server.log"
        self.workers = workers
        self._proc: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []

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
        self._proc = self._spawn("api-server", ["api-server", "--host", HOST, "--port", str(self.port)], env)
        if self.workers:
            self._workers = [self._spawn(name, args, env) for name, args in WORKERS.items()]
        self._wait_healthy()

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with (self.home / f"{name}.log").open("wb") as out:
            return subprocess.Popen([sys.executable, "-m", "airflow", *args], env=env, cwd=self.home,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    @contextlib.contextmanager
    def _client(self) -> Iterator[Any]:
        """An httpx client of the REST API, logged in as the admin (a JWT from ``/auth/token``)."""
        import httpx  # an Airflow dependency

        with httpx.Client(base_url=self.url, timeout=10) as client:
            resp = client.post("/auth/token", json={"username": self.username, "password": self.password})
            resp.raise_for_status()
            client.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"
            yield client

    def unpause(self, dag_id: str, timeout: float = 120.0) -> None:
        """Unpause ``dag_id`` once the dag-processor has stored it (its asset watchers start then)."""
        with self._client() as client:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                resp = client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})
                if resp.status_code == 200:
                    return
                time.sleep(1)  # 404 until the dag-processor has parsed it
        raise RuntimeError(f"DAG {dag_id} not unpaused within {timeout:.0f} s ({resp.status_code} {resp.text[:200]}); "
                           f"see {self.home}/dag-processor.log")

    def wait_asset_state(self, uri: str, key: str, timeout: float = 180.0) -> None:
        """Until the watcher of asset ``uri`` has stored ``key`` in the asset's state store: from then on it
        announces every newer event (a savepoint taken before would never be)."""
        with self._client() as client:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                found = client.get("/api/v2/assets", params={"uri_pattern": uri}).json()
                ids = [a["id"] for a in found.get("assets", []) if a["uri"] == uri]
                if ids and client.get(f"/api/v2/assets/{ids[0]}/state-store/{key}").status_code == 200:
                    return
                time.sleep(1)
        raise RuntimeError(f"the watcher of asset {uri} stored no {key} within {timeout:.0f} s; see "
                           f"{self.home}/triggerer.log")

    def _wait_healthy(self) -> None:
        """Until /api/v2/monitor/health answers 200 with a healthy metadatabase (and, with ``workers``, healthy
        scheduler, triggerer and dag-processor)."""
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
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor") if self.workers else (
                    "metadatabase",)
                if all((body.get(p) or {}).get("status") == "healthy" for p in parts):
                    return
                last = str(body)
            except (OSError, ValueError) as err:  # URLError and refused connections are OSErrors
                last = repr(err)
            time.sleep(0.5)
        raise RuntimeError(f"airflow api-server at {self.url} not healthy after {self.startup_timeout:.0f} s: {last}; "
                           f"log {self.log}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM each component's process group (uvicorn and its worker, the executor's workers), then SIGKILL
        what is left."""
        procs = [p for p in (self._proc, *self._workers) if p is not None]
        self._proc, self._workers = None, []
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group may outlive its leader
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
