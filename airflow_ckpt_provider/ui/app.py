"""The Streaming jobs page: a FastAPI app the Airflow API server mounts at ``/ckpt-jobs`` (ui/plugin.py).

Design notes: docs/airflow.md#design-notes-uiapppy."""

from __future__ import annotations

import logging
import re
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
from airflow.api_fastapi.logging.decorators import action_logging
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.stepsettings import RESTART, RestartStepSettings
from airflow_ckpt_provider.core.records.control import RequestAction, read_ack, submit_request
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.operations import ask, read_operation
from airflow_ckpt_provider.core.store.jobstore import JobStore, check_job_name
from airflow_ckpt_provider.core.views.jobreport import JobReport, job_report, job_summary, summary_dict
from airflow_ckpt_provider.core.views.jobview import check_can_request, observe
from airflow_ckpt_provider.launcher.upgrade import handed
from airflow_ckpt_provider.ui.charts import job_charts, size_text
from airflow_ckpt_provider.ui.stores import list_jobs, open_store, store_conn_ids

log = logging.getLogger(__name__)

#: The DAG the page's "Upgrade" button opens (its trigger form validates the upgrade's parameters).
UPGRADE_DAG_OPTION = ("ckpt", "ui_upgrade_dag_id")
UPGRADE_DAG = "ckpt_upgrade_job"
#: A request's id: new_request_id's, or keyed_request_id's (a task's or op's, core/records/control.py).
REQUEST_ID = re.compile(r"^(savepoint|stop|cancel)-(\d{8}T\d{6}Z-[0-9a-f]{6}|k[0-9a-f]{16}-\d+)$")
ACTIONS = {"savepoint": RequestAction.SAVEPOINT, "stop": RequestAction.STOP, "cancel": RequestAction.CANCEL}
#: Seconds a probe of the Spark UI may take (the job page links it only when it answers).
SPARK_UI_PROBE = 0.5

_templates = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")),
                         autoescape=select_autoescape(["html"]))


class ActionBody(BaseModel):
    action: str


class OperationBody(BaseModel):
    """An operation asked from the page: a restart (RestartStepSettings' ``restore`` and ``stop_mode``; unset: their
    defaults)."""

    kind: str
    restore: str | None = None
    stop_mode: str | None = None


UserDep = Annotated[BaseUser, Depends(get_user)]
#: Reading: permission to read DAGs. Acting: permission to trigger DAG runs.
READ = [Depends(requires_access_dag("GET"))]
ACT = [Depends(requires_access_dag("POST", DagAccessEntity.RUN)), Depends(action_logging("ckpt.request"))]


def _can_act(user: BaseUser) -> bool:
    return bool(get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN, user=user))


def _upgrade_dag() -> str:
    from airflow.configuration import conf

    return conf.get(*UPGRADE_DAG_OPTION, fallback=UPGRADE_DAG)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _when(ts: float | None) -> str:
    return "-" if not ts else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


_templates.filters.update(age=_age, size=size_text, when=_when)


def _reachable(url: str | None) -> bool:
    """Whether the Spark UI at ``url`` accepts a connection within SPARK_UI_PROBE s."""
    if not url:
        return False
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or 80), timeout=SPARK_UI_PROBE):
            return True
    except OSError:
        return False


def _job_store(conn_id: str, job: str) -> JobStore:
    try:
        check_job_name(job)
        known = store_conn_ids()
        if conn_id not in known:
            raise ConfigError(f"no {conn_id!r} connection of type ckpt_store: expected one of "
                              f"{', '.join(known) or '(none configured)'}")
        return open_store(conn_id, job)
    except ConfigError as err:
        raise HTTPException(404, str(err)) from err


def _report(conn_id: str, job: str) -> JobReport:
    store = _job_store(conn_id, job)
    try:
        return job_report(store)
    except ConfigError as err:
        raise HTTPException(404, str(err)) from err
    except CkptError as err:
        raise HTTPException(503, f"job store of {conn_id!r} cannot be read: {err}") from err


def _overview() -> list[dict[str, Any]]:
    stores = []
    for conn_id in store_conn_ids():
        listed = list_jobs(conn_id)
        jobs = [summary_dict(job_summary(listed.job_store(job))) for job in listed.jobs]
        stores.append({"conn_id": conn_id, "url": listed.url, "problem": listed.problem, "jobs": jobs})
    return stores


def _ask_restart(conn_id: str, job: str, name: str, body: OperationBody) -> dict[str, Any]:
    """Ask for a restart of a job handed to the supervision service: recorded in the job store, acted on by the
    instance that owns the job (this server runs nothing of it); the page then follows the record."""
    if body.kind != RESTART:
        raise HTTPException(422, f"unknown operation {body.kind!r}: expected restart (an upgrade or a rescale is "
                                 "asked through its DAG's trigger form, which checks its parameters)")
    given: dict[str, Any] = {k: v for k, v in (("restore", body.restore), ("stop_mode", body.stop_mode)) if v}
    try:
        settings = RestartStepSettings(**given)  # parsed and checked as every front-end's are
    except ConfigError as err:
        raise HTTPException(422, f"restart of job {job}: {err}") from err
    store = _job_store(conn_id, job)
    try:
        if not handed(store):
            last = read_launch(store)
            found = (f"launched by {last.launched_by} on {last.host or 'the host that launched it'}" if last
                     else "no recorded deployment")
            raise ConflictError(
                f"job {job}: expected a job handed to the supervision service, whose owning instance acts on a "
                f"restart asked here; found {found}, not handed over. Restart it with its DAG's restart task or "
                f"`ckpt job restart --job {job}` where it may run; nothing was changed")
        made, new = ask(store, RESTART, settings.to_json(), requested_by=f"{name} (Airflow UI)")
    except ConflictError as err:
        log.warning("job %s: restart asked from the Airflow UI by %s refused: %s", job, name, err)
        raise HTTPException(409, str(err)) from err
    except CkptError as err:
        raise HTTPException(503, f"job store of {conn_id!r} cannot be written: {err}") from err
    op = made.operation
    log.info("job %s: restart %s asked from the Airflow UI by %s (restore %s, stop %s)", job, op.id, name,
             settings.restore, settings.stop_mode)
    return {"operation_id": op.id, "kind": op.kind, "requested_by": op.requested_by,
            "message": (f"asked for restart {op.id} of job {job} from {settings.restore}: the supervision service "
                        "acts on it" if new else f"restart {op.id} was asked already: following it")}


def _operation_state(conn_id: str, job: str, operation_id: str) -> dict[str, Any]:
    store = _job_store(conn_id, job)
    try:
        found = read_operation(store)
    except CkptError as err:
        raise HTTPException(503, f"job store of {conn_id!r} cannot be read: {err}") from err
    if found is None or found.operation.id != operation_id:
        now = found.operation.describe() if found else "none"
        raise HTTPException(404, f"job {job}: expected operation {operation_id}, found {now}")
    op = found.operation
    return {"operation_id": op.id, "kind": op.kind, "state": op.state.value, "final": op.state.final,
            "text": op.describe(), "line": op.lines[-1] if op.lines else "", "message": op.message,
            "result": op.result}


def create_app() -> FastAPI:
    """The app; links between its pages and to Airflow's are relative, so it works behind any base URL."""
    app = FastAPI(title="Streaming jobs (airflow-ckpt-provider)",
                  description="Spark Structured Streaming jobs of the ckpt_store connections: status, snapshots, "
                              "restore lineage, and savepoint / stop / cancel requests.")

    @app.exception_handler(StarletteHTTPException)
    async def _errors(request: Request, exc: StarletteHTTPException) -> Response:
        if "/api/" in request.url.path or "text/html" not in request.headers.get("accept", ""):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        page = _templates.get_template("error.html").render(status=exc.status_code, detail=exc.detail)
        return HTMLResponse(page, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse, dependencies=READ)
    def job_list(user: UserDep) -> HTMLResponse:
        return HTMLResponse(_templates.get_template("list.html").render(stores=_overview(), can_act=_can_act(user)))

    @app.get("/jobs/{conn_id}/{job}", response_class=HTMLResponse, dependencies=READ)
    def job_page(user: UserDep, conn_id: str, job: str) -> HTMLResponse:
        report = _report(conn_id, job)
        reachable = _reachable(report.spark_ui)
        return HTMLResponse(_templates.get_template("job.html").render(
            r=report, s=report.summary, conn_id=conn_id, can_act=_can_act(user),
            spark_ui=report.spark_ui if reachable else None, spark_ui_down=bool(report.spark_ui) and not reachable,
            upgrade_dag=_upgrade_dag(), handed=report.service is not None,  # its Restart: the service's
            charts=job_charts(report.status, report.snapshots)))

    @app.get("/api/jobs", dependencies=READ)
    def api_jobs() -> list[dict[str, Any]]:
        return _overview()

    @app.get("/api/jobs/{conn_id}/{job}", dependencies=READ)
    def api_job(conn_id: str, job: str) -> dict[str, Any]:
        report = _report(conn_id, job)
        return report.to_dict() | {"spark_ui_reachable": _reachable(report.spark_ui)}

    @app.post("/api/jobs/{conn_id}/{job}/requests", status_code=202, dependencies=ACT)
    def api_request(user: UserDep, conn_id: str, job: str, body: ActionBody) -> dict[str, Any]:
        action = ACTIONS.get(body.action)
        if action is None:
            raise HTTPException(422, f"unknown action {body.action!r}: expected one of {', '.join(ACTIONS)}")
        store = _job_store(conn_id, job)
        name = user.get_name()
        try:
            status = check_can_request(observe(store), action)
            made = submit_request(store, action, epoch=status.epoch, requested_by=f"{name} (Airflow UI)")
        except ConflictError as err:
            log.warning("job %s: %s requested from the Airflow UI by %s refused: %s", job, action, name, err)
            raise HTTPException(409, str(err)) from err
        except ConfigError as err:
            raise HTTPException(404, str(err)) from err
        except CkptError as err:
            raise HTTPException(503, f"job store of {conn_id!r} cannot be written: {err}") from err
        log.info("job %s epoch %d: %s requested from the Airflow UI by %s (request %s)", job, made.epoch, action,
                 name, made.id)
        return {"request_id": made.id, "action": action.value, "epoch": made.epoch, "requested_by": made.requested_by,
                "message": f"requested {action} of job {job}: request {made.id} for the driver of epoch {made.epoch}"}

    @app.post("/api/jobs/{conn_id}/{job}/operations", status_code=202, dependencies=ACT)
    def api_operation(user: UserDep, conn_id: str, job: str, body: OperationBody) -> dict[str, Any]:
        return _ask_restart(conn_id, job, user.get_name(), body)

    @app.get("/api/jobs/{conn_id}/{job}/operations/{operation_id}", dependencies=READ)
    def api_operation_state(conn_id: str, job: str, operation_id: str) -> dict[str, Any]:
        return _operation_state(conn_id, job, operation_id)

    @app.get("/api/jobs/{conn_id}/{job}/requests/{request_id}", dependencies=READ)
    def api_request_state(conn_id: str, job: str, request_id: str) -> dict[str, Any]:
        if not REQUEST_ID.match(request_id):
            raise HTTPException(404, f"invalid request id {request_id!r}: expected ACTION-YYYYMMDDTHHMMSSZ-XXXXXX as "
                                     "the action's answer named it, or a task's ACTION-kHASH-N")
        store = _job_store(conn_id, job)
        try:
            ack = read_ack(store, request_id)
        except CkptError as err:
            raise HTTPException(503, f"job store of {conn_id!r} cannot be read: {err}") from err
        if ack is None:
            return {"request_id": request_id, "answered": False}
        return {"request_id": request_id, "answered": True, **ack.to_dict()}

    return app
