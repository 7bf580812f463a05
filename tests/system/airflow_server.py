"""A real Airflow 3.3 (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 for system tests.

``airflow standalone`` binds every interface and is hard to stop, so each component runs as its own
process in its own process group, with a temp AIRFLOW_HOME (sqlite, LocalExecutor, simple auth
manager with a known admin password). Everything is torn down on exit, even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psutil

AIRFLOW_BIN = Path(sys.executable).with_name("airflow")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
# Every process the harness starts carries this variable, so teardown also finds task processes that
# left the component's process group (the task supervisor puts each task in a group of its own).
MARKER_ENV = "CKPT_TEST_AIRFLOW_SERVER"
COMPONENTS: dict[str, list[str]] = {
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}


class AirflowServerError(RuntimeError):
    """The server did not start, or a run or DAG did not reach the expected state in time."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AirflowServer:
    """Runs Airflow on 127.0.0.1 with ``dags_folder``; use as a context manager.

    ``env`` is passed to every component on top of the harness's configuration (for example
    ``AIRFLOW_CONN_*`` URIs or JSON, ``AIRFLOW__SECTION__KEY`` overrides). Inherited ``AIRFLOW*``
    variables are dropped so the developer's own Airflow settings never leak in.
    """

    def __init__(
        self,
        dags_folder: Path,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        username: str = "admin",
        startup_timeout: float = 180.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self.dags_folder = Path(dags_folder).resolve()
        self._home_arg = home
        self._extra_env = dict(env or {})
        self.username = username
        self.password = secrets.token_urlsafe(12)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.home = Path()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._marker = secrets.token_hex(8)
        self._token: str | None = None
        self._client: httpx.Client | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> AirflowServer:
        try:
            self.start()
        except BaseException:
            self.print_log_tails()
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.print_log_tails()
        self.stop()

    def start(self) -> None:
        if self._home_arg is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="airflow-home-")
            self.home = Path(self._tmp.name)
        else:
            self.home = Path(self._home_arg).resolve()
            self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = self._environment()
        # Pre-seeded: the simple auth manager only generates passwords for users missing from this file.
        (self.home / "passwords.json").write_text(json.dumps({self.username: self.password}))
        started = time.monotonic()
        migrate = subprocess.run(
            [str(AIRFLOW_BIN), "db", "migrate"], env=env, capture_output=True, text=True, timeout=180, check=False
        )
        if migrate.returncode != 0:
            raise AirflowServerError(
                f"airflow db migrate failed ({migrate.returncode}):\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}"
            )
        for name, args in COMPONENTS.items():
            cmd = [str(AIRFLOW_BIN), *(a.format(port=self.port) for a in args)]
            with (self.home / f"{name}.log").open("wb") as log:
                self._procs[name] = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=self.home,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: killpg reaches its workers too
                )
        self._client = httpx.Client(base_url=self.base_url, timeout=30.0)
        self._wait_healthy(started + self.startup_timeout)

    def stop(self) -> None:
        """SIGTERM every component's process group, then SIGKILL whatever is left (also stray task processes)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group may outlive its leader
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._kill_marked()
        self._procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _kill_marked(self) -> None:
        stray = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and proc.environ().get(MARKER_ENV) == self._marker:
                    stray.append(proc)
        for proc in stray:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(stray, timeout=5)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        from cryptography.fernet import Fernet  # an Airflow dependency; imported here to keep the module light

        env.update(
            {
                MARKER_ENV: self._marker,
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.username}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__API__WORKERS": "1",
                # Shared by every component: the scheduler signs the task tokens the api-server checks.
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            }
        )
        env.update(self._extra_env)
        return env

    def _wait_healthy(self, deadline: float) -> None:
        last: object = "no answer"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                resp = self.client.get("/api/v2/monitor/health", timeout=5)
                last = resp.text
                if resp.status_code == 200:
                    body = resp.json()
                    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                    if all((body.get(p) or {}).get("status") == "healthy" for p in parts):
                        return
            except httpx.TransportError as err:
                last = repr(err)
            time.sleep(0.5)
        raise AirflowServerError(f"Airflow at {self.base_url} not healthy after {self.startup_timeout:.0f}s: {last}")

    def _check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self._procs.items() if p.poll() is not None}
        if dead:
            raise AirflowServerError(f"Airflow components exited: {dead}; see logs in {self.home}")

    # -- diagnostics -----------------------------------------------------------------------------

    def log_tails(self, lines: int = 60) -> str:
        out = []
        for name in COMPONENTS:
            path = self.home / f"{name}.log"
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"----- {name} ({path}) last {len(tail)} lines -----\n" + "\n".join(tail))
        return "\n".join(out)

    def print_log_tails(self, lines: int = 60) -> None:
        if self.home != Path():
            print(self.log_tails(lines), file=sys.stderr)

    # -- REST ------------------------------------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            raise AirflowServerError("the server is not running")
        return self._client

    def token(self) -> str:
        """A JWT for the admin user from the simple auth manager (POST /auth/token), cached."""
        if self._token is None:
            resp = self.client.post("/auth/token", json={"username": self.username, "password": self.password})
            resp.raise_for_status()
            self._token = str(resp.json()["access_token"])
        return self._token

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An authenticated request to ``/api/v2{path}``; the caller checks the status."""
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        return self.client.request(method, f"/api/v2{path}", headers=headers, **kwargs)

    def api_json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.api(method, path, **kwargs)
        if resp.is_error:
            raise AirflowServerError(f"{method} {path} -> {resp.status_code}: {resp.text}")
        return resp.json()

    def wait_dag_parsed(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The DAG's details once the dag-processor has stored it; fails early on an import error."""
        deadline = time.monotonic() + timeout
        while True:
            resp = self.api("GET", f"/dags/{dag_id}")
            if resp.status_code == 200:
                return resp.json()  # type: ignore[no-any-return]
            errors = self.api_json("GET", "/importErrors")["import_errors"]
            if errors:
                raise AirflowServerError(f"DAG {dag_id} not parsed; import errors: {errors}")
            if time.monotonic() > deadline:
                raise AirflowServerError(
                    f"DAG {dag_id} not parsed after {timeout:.0f}s: {resp.status_code} {resp.text}"
                )
            self._check_alive()
            time.sleep(0.5)

    def unpause(self, dag_id: str) -> None:
        self.api_json("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str | None = None) -> httpx.Response:
        """POST a manual run; returns the response as is (400 when the conf fails the DAG's Params)."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf)}
        if run_id is not None:
            body["dag_run_id"] = run_id
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.api_json("GET", f"/dags/{dag_id}/dagRuns")["dag_runs"]  # type: ignore[no-any-return]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 120.0) -> str:
        """The run's final state (success or failed); raises if it is not final within ``timeout``."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.api_json("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in TERMINAL_RUN_STATES:
                return str(state)
            self._check_alive()
            time.sleep(0.5)
        raise AirflowServerError(
            f"run {dag_id}/{run_id} still {state} after {timeout:.0f}s; tasks: {self.task_states(dag_id, run_id)}"
        )

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """task_id (``task_id[i]`` for mapped tasks) -> state."""
        tis = self.api_json("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {
            ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]": ti["state"] for ti in tis
        }

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.api_json("GET", path)["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        resp = self.api("GET", path, headers={"Accept": "text/plain"})
        return resp.text

    # -- browser ---------------------------------------------------------------------------------

    def ui_login(self, page: Any, timeout_ms: float = 30_000) -> None:
        """Log a playwright ``Page`` in through the simple auth manager's login form."""
        page.goto(f"{self.base_url}/auth/login", timeout=timeout_ms)
        page.get_by_label("Username").fill(self.username)
        page.get_by_label("Password").fill(self.password)
        page.get_by_role("button", name="Sign in").click()
        # The form stores the JWT in the _token cookie and leaves for the React UI.
        page.wait_for_url(lambda url: "/auth/" not in url, timeout=timeout_ms)


@contextlib.contextmanager
def chromium_browser() -> Iterator[Any]:
    """Debian's headless chromium driven by playwright (its own browser download is not reachable here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
