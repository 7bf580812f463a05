"""A dead driver's application that still holds a standalone cluster's cores, released by the driver that replaces it:
before it waits for executors, a driver on a standalone master has the master kill its job's last application when
that driver is not live and the master still lists the application as active (a client-mode driver lost with its
host, whose end the master never hears of).

Design notes: docs/cluster.md#design-notes-runtimelostapppy."""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.records.status import JobStatus, driver_live, read_status

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_ckpt_provider.core.store.jobstore import JobStore

log = logging.getLogger(__name__)

#: Spark's default port of the standalone master's web UI (``spark.master.ui.port``).
DEFAULT_UI_PORT = 8080
#: States of an application the master still schedules executors for (ApplicationState).
ACTIVE = ("RUNNING", "WAITING")


@dataclass(frozen=True)
class LostApplication:
    """An application of the job's last driver that the master still lists as active while that driver is dead."""

    app_id: str
    cores: int
    status: JobStatus

    def describe(self, now: float) -> str:
        s = self.status
        return (f"application {self.app_id} of epoch {s.epoch} (its driver pid {s.pid} on {s.host}, silent for "
                f"{s.age(now):.0f} s) still holds {self.cores} cores")


def lost_application(status: JobStatus | None, active_apps: list[dict[str, Any]], own_app: str,
                     now: float) -> LostApplication | None:
    """The last driver's application if the master lists it as active (``active_apps``: the master JSON's
    ``activeapps``) while that driver is not live at ``now``; None otherwise (no status, no application recorded, our
    own application, a live driver, or the master no longer has it)."""
    if status is None or not status.app_id or status.app_id == own_app:
        return None
    if driver_live(status, now):
        return None
    for app in active_apps:
        if app.get("id") == status.app_id and app.get("state") in ACTIVE:
            return LostApplication(status.app_id, int(app.get("cores", 0)), status)
    return None


def master_ui_urls(master: str, ui_port: str | None) -> list[str]:
    """The web UIs of a standalone ``master`` (``spark://h1:7077,h2:7077``: one per host), on ``ui_port``."""
    port = int(ui_port) if ui_port else DEFAULT_UI_PORT
    hosts = [hp.rsplit(":", 1)[0] for hp in master.removeprefix("spark://").split(",") if hp]
    return [f"http://{host}:{port}" for host in hosts]


def release_lost_application(spark: SparkSession, store: JobStore, *, timeout: float = 5.0) -> str | None:
    """On a standalone master, kill the application of the job's last driver if that driver is dead and the master
    still lists its application as active; returns what was done (logged), or None when there was nothing to do.
    Failures to reach the master are logged and ignored: the executor check that follows reports a cluster that
    has no cores for this driver."""
    sc = spark.sparkContext
    master = str(sc.master)
    status = _last_status(store) if master.startswith("spark://") else None
    if status is None or not status.app_id:
        return None
    for ui in master_ui_urls(master, sc.getConf().get("spark.master.ui.port", None)):
        try:
            state = _get_json(f"{ui}/json/", timeout)
        except (OSError, ValueError) as err:
            log.info("job %s: the master's UI %s did not answer (%s)", store.job, ui, err)
            continue
        if state.get("status") not in (None, "ALIVE"):  # a standby master of an HA pair
            continue
        now = time.time()
        lost = lost_application(status, list(state.get("activeapps", [])), str(sc.applicationId), now)
        if lost is None:
            return None
        try:
            _post(f"{ui}/app/kill/", {"id": lost.app_id, "terminate": "true", **_csrf_token(ui, timeout)}, timeout)
            done = f"{lost.describe(now)} on {master}: killed it so that this driver gets them"
        except OSError as err:
            done = f"{lost.describe(now)} on {master}; killing it through {ui} failed: {err}"
        log.warning("job %s: %s", store.job, done)
        return done
    return None


def _last_status(store: JobStore) -> JobStatus | None:
    """status.json, or None when the store cannot be read now (plan_start read it a moment ago; the lease reads it
    next and says so)."""
    try:
        return read_status(store)
    except CkptError as err:
        log.info("job %s: its last driver's status could not be read (%s): no lost application looked for",
                 store.job, err)
        return None


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (the master's own http:// URL)
        return dict(json.loads(resp.read()))


#: The token Spark 4.3 (the version tested) puts in the master page's kill forms; a kill without it is refused (HTTP
#: 403).
_CSRF = re.compile(r'name="csrfToken"\s+value="([^"]+)"')


def _csrf_token(ui: str, timeout: float) -> dict[str, str]:
    """The master page's CSRF token as a form field, or nothing (a Spark whose page has none)."""
    with urllib.request.urlopen(f"{ui}/", timeout=timeout) as resp:  # noqa: S310 (the master's own http:// URL)
        page = resp.read().decode(errors="replace")
    match = _CSRF.search(page)
    return {"csrfToken": match[1]} if match else {}


def _post(url: str, form: dict[str, str], timeout: float) -> None:
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(url, data=data, timeout=timeout):  # noqa: S310 (the master's own http:// URL)
        pass
