"""A real Airflow 3.3 (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 for system tests.

``airflow standalone`` binds every interface and is hard to stop, so each component runs as its own
process in its own process group, with a temp AIRFLOW_HOME (sqlite, LocalExecutor, simple auth
manager with a known admin password). Everything is torn down on exit, even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
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
    ``AIRFLOW_CONN_*`` URIs or JSON, ``AIRFLOW__SECTION__KEY`` overrides); ``component_env`` adds variables
    to one component only (e.g. ``{"triggerer": {"PYTHONASYNCIODEBUG": "1"}}``). Inherited ``AIRFLOW*``
    variables are dropped so the developer's own Airflow settings never leak in.
    """

    def __init__(
        self,
        dags_folder: Path,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        component_env: Mapping[str, Mapping[str, str]] | None = None,
        username: str = "admin",
        users: Mapping[str, str] | None = None,
        startup_timeout: float = 180.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self.dags_folder = Path(dags_folder).resolve()
        self._home_arg = home
        self._extra_env = dict(env or {})
        self._component_env = {name: dict(extra) for name, extra in (component_env or {}).items()}
        self.username = username
        self.password = secrets.token_urlsafe(12)
        # More users of the simple auth manager, name -> role (viewer, user, op, admin), each with its password.
        self.roles = {username: "admin", **dict(users or {})}
        self.passwords = {name: self.password if name == username else secrets.token_urlsafe(12)
                          for name in self.roles}
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.home = Path()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._marker = secrets.token_hex(8)
        self._tokens: dict[str, str] = {}
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
        (self.home / "passwords.json").write_text(json.dumps(self.passwords))
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
                    env={**env, **self._component_env.get(name, {})},
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
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{n}:{r}" for n, r in self.roles.items()),
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

    def token(self, user: str | None = None) -> str:
        """A JWT for ``user`` (default: the admin) from the simple auth manager (POST /auth/token), cached."""
        name = user or self.username
        if name not in self._tokens:
            resp = self.client.post("/auth/token", json={"username": name, "password": self.passwords[name]})
            resp.raise_for_status()
            self._tokens[name] = str(resp.json()["access_token"])
        return self._tokens[name]

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An authenticated request to ``/api/v2{path}``; the caller checks the status."""
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        return self.client.request(method, f"/api/v2{path}", headers=headers, **kwargs)

    def api_json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.api(method, path, **kwargs)
        if resp.is_error:
            why = ""
            if resp.status_code >= 500:  # the api-server logged the cause
                path_log = self.home / "api-server.log"
                lines = path_log.read_text(errors="replace").splitlines() if path_log.is_file() else []
                why = "\n----- api-server.log, last lines -----\n" + "\n".join(lines[-60:])
            raise AirflowServerError(f"{method} {path} -> {resp.status_code}: {resp.text}{why}")
        return resp.json()

    def wait_dag_parsed(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The DAG's details once the dag-processor has stored it; fails early on an import error."""
        deadline = time.monotonic() + timeout
        while True:
            resp = self.api("GET", f"/dags/{dag_id}")
            if resp.status_code == 200:
                return resp.json()  # type: ignore[no-any-return]  # httpx's json() is Any: a DAG's details
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
        # ignore[no-any-return] below: api_json is Any: the REST API's JSON
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
        """The task's log as text: from the REST API (Airflow 3.3 serves only ``application/json`` and
        ``application/x-ndjson``), else from the log files in the Airflow home, saying why."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        why = ""
        try:
            resp = self.api("GET", path, params={"full_content": "true"}, headers={"Accept": "application/json"})
            if resp.status_code == 200:
                text = "\n".join(render_log_line(item) for item in resp.json().get("content") or [])
                if text.strip():
                    return text
                why = "the API returned an empty log"
            else:
                why = f"GET {path} -> {resp.status_code}: {resp.text[:300]}"
        except (httpx.HTTPError, ValueError, AirflowServerError) as err:
            why = f"GET {path} failed: {err!r}"
        return f"({why}; the log files instead)\n" + self.task_log_files(dag_id, run_id, task_id, try_number)

    def task_log_files(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The try's log files under ``<home>/logs`` (the worker's, and the triggerer's ``.trigger.*`` ones)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        files = sorted(folder.glob(f"attempt={try_number}.log*")) if folder.is_dir() else []
        if not files:
            return f"(no log files in {folder})"
        out = []
        for path in files:
            lines = [render_log_line(line) for line in path.read_text(errors="replace").splitlines()]
            out.append(f"----- {path.name} -----\n" + "\n".join(lines))
        return "\n".join(out)

    def component_lines(self, component: str, *needles: str, last: int = 40) -> list[str]:
        """The last ``last`` lines of a component's log that contain every one of ``needles``."""
        path = self.home / f"{component}.log"
        if not path.is_file():
            return []
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if all(n in ln for n in needles)]
        return lines[-last:]

    def trigger_events(self, dag_id: str, run_id: str, last: int = 20) -> list[str]:
        """The last lines the run's triggers logged (started, waiting, held, fired), from their log files
        (``attempt=N.log.trigger.<triggerer job>.log``: Airflow starts it over at each deferral of a try),
        then what the triggerer itself said about the run."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        lines = []
        for path in sorted(folder.glob("task_id=*/attempt=*.log.trigger.*")) if folder.is_dir() else []:
            lines += [f"{path.parent.name}/{path.name}: {render_log_line(line)}"[:800]  # events carry the plan
                      for line in path.read_text(errors="replace").splitlines()]
        return [*lines[-last:], *self.component_lines("triggerer", run_id, last=last)]

    def defer_report_delays(self, run_id: str) -> list[float]:
        """For each deferral of the run's tasks, the seconds until the scheduler received the executor's report
        of that attempt's exit: how long a resume sooner than that would be failed (docs/airflow.md)."""
        delays, deferred_at = [], None
        for line in self.component_lines("scheduler", run_id, last=100_000):
            stamp = line.split(" [", 1)[0].strip()
            if "Pausing task as DEFERRED" in line:
                deferred_at = stamp
            elif "Received executor event with state success" in line and deferred_at is not None:
                with contextlib.suppress(ValueError):
                    delays.append(round((datetime.fromisoformat(stamp) - datetime.fromisoformat(deferred_at))
                                        .total_seconds(), 2))
                deferred_at = None
        return delays

    def slow_loop_steps(self) -> list[str]:
        """asyncio's debug reports (PYTHONASYNCIODEBUG=1) of coroutine steps that held the triggerer's loop over
        0.1 s: the task's name (a trigger's is ``dag/run/task/map/try (ID n)``) and how long."""
        found = []
        for line in self.component_lines("triggerer", "Executing <", "took", last=1000):
            name = re.search(r"name='([^']*)'", line)
            took = re.search(r"took ([0-9.]+) seconds", line)
            found.append(f"{name.group(1) if name else '?'}: {took.group(1) if took else '?'} s")
        return found

    def blocked_loop_warnings(self) -> list[str]:
        """The triggerer's warnings that its event loop was blocked (Airflow's block watchdog)."""
        return self.component_lines("triggerer", "async thread was blocked", last=1000)

    def diagnose(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Everything that explains a run's outcome: the task's states and tries, each try's log, the trigger's
        last events, and what the scheduler and the execution API said about the task instance."""
        parts = []
        try:
            tis = self.api_json("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
            parts.append("task instances: " + ", ".join(
                f"{ti['task_id']}={ti['state']} (try {ti.get('try_number')})" for ti in tis))
            tries = max([int(ti.get("try_number") or 1) for ti in tis if ti["task_id"] == task_id] or [1])
        except (httpx.HTTPError, AirflowServerError, KeyError, ValueError) as err:
            parts.append(f"task instances: unavailable ({err!r})")
            tries = 1
        for try_number in range(1, tries + 1):
            parts.append(f"===== log of {task_id}, try {try_number} =====\n"
                         + "\n".join(self.task_log(dag_id, run_id, task_id, try_number).splitlines()[-150:]))
        parts.append("===== the trigger's last events (triggerer) =====\n"
                     + ("\n".join(self.trigger_events(dag_id, run_id)) or "(none)"))
        parts.append("===== the scheduler on this run =====\n"
                     + ("\n".join(self.component_lines("scheduler", run_id)) or "(none)"))
        parts.append("===== the api-server on refused state changes =====\n"
                     + ("\n".join(self.component_lines("api-server", "invalid state", last=10)) or "(none)"))
        parts.append(f"deferral -> executor report of the exit (s): {self.defer_report_delays(run_id)}")
        warnings = self.blocked_loop_warnings()
        parts.append(f"===== triggerer event loop blocked: {len(warnings)} warnings; slow steps: "
                     f"{self.slow_loop_steps()} =====\n" + "\n".join(warnings[-5:]))
        return "\n".join(parts)

    # -- browser ---------------------------------------------------------------------------------

    def ui_login(self, page: Any, timeout_ms: float = 30_000, user: str | None = None) -> None:
        """Log a playwright ``Page`` in as ``user`` (default: the admin) through the simple auth manager's form."""
        name = user or self.username
        page.goto(f"{self.base_url}/auth/login", timeout=timeout_ms)
        page.get_by_label("Username").fill(name)
        page.get_by_label("Password").fill(self.passwords[name])
        page.get_by_role("button", name="Sign in").click()
        # The form stores the JWT in the _token cookie and leaves for the React UI.
        page.wait_for_url(lambda url: "/auth/" not in url, timeout=timeout_ms)


def render_log_line(item: Any) -> str:
    """One structured log record of Airflow 3 (a dict from the API, or a JSON line from a log file) as text."""
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except ValueError:
            return item
    if not isinstance(item, dict):
        return str(item)
    fields = {k: v for k, v in item.items() if k not in ("timestamp", "level", "event", "logger")}
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    head = " ".join(str(item[k]) for k in ("timestamp", "level", "logger") if item.get(k))
    return f"{head} {item.get('event', '')}" + (f" {extra}" if extra else "")


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
