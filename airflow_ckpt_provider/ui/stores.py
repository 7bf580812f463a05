"""Which job stores the page shows: the ``ckpt_store`` connections Airflow knows.

Connections live in the metadata database, in ``AIRFLOW_CONN_*`` variables, or in a secrets backend that
cannot be listed; ``[ckpt] ui_store_conn_ids`` (comma-separated) names the last kind. A connection that
cannot be opened is shown with its error, never hidden.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import urlparse

from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.core.views.jobview import job_names
from airflow_ckpt_provider.hooks.job_store import JobStoreHook

log = logging.getLogger(__name__)

CONN_TYPE = JobStoreHook.conn_type
#: Extra connection ids to show (for secrets backends, which cannot be listed): ``[ckpt] ui_store_conn_ids``.
CONN_IDS_OPTION = ("ckpt", "ui_store_conn_ids")
_ENV_PREFIX = "AIRFLOW_CONN_"


@dataclass(frozen=True)
class StoreJobs:
    """The jobs of one ``ckpt_store`` connection, or why they could not be listed."""

    conn_id: str
    url: str
    jobs: tuple[str, ...]
    problem: str | None = None
    root: Storage | None = None  # the store's root, opened once for all its jobs

    def job_store(self, job: str) -> JobStore:
        assert self.root is not None, self.problem
        return JobStore(self.root, job)


def _env_conn_type(value: str) -> str | None:
    """The conn_type of an ``AIRFLOW_CONN_*`` value (JSON or URI), None if it has none."""
    text = value.strip()
    if text.startswith("{"):
        try:
            body = json.loads(text)
        except ValueError:
            return None
        return str(body.get("conn_type")) if isinstance(body, dict) and body.get("conn_type") else None
    scheme = urlparse(text).scheme
    return scheme.replace("-", "_") if scheme else None


def store_conn_ids() -> list[str]:
    """Every ``ckpt_store`` connection id: metadata database, environment, and ``[ckpt] ui_store_conn_ids``."""
    found: set[str] = set()
    for name, value in os.environ.items():
        if name.startswith(_ENV_PREFIX) and _env_conn_type(value) == CONN_TYPE:
            found.add(name[len(_ENV_PREFIX):].lower())
    from airflow.configuration import conf

    found.update(c.strip() for c in conf.get(*CONN_IDS_OPTION, fallback="").split(",") if c.strip())
    try:
        from airflow.models.connection import Connection
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            found.update(session.scalars(select(Connection.conn_id).where(Connection.conn_type == CONN_TYPE)))
    except Exception as err:  # a database the page cannot read still leaves the environment's stores
        log.warning("cannot list the %s connections of the metadata database: %s", CONN_TYPE, err)
    return sorted(found)


def open_store(conn_id: str, job: str) -> JobStore:
    return JobStoreHook(conn_id).job_store(job)


def list_jobs(conn_id: str) -> StoreJobs:
    """The jobs in the store of ``conn_id``; a StoreJobs carrying ``problem`` if it cannot be read."""
    url = "?"
    try:
        hook = JobStoreHook(conn_id)
        url = hook.store_url
        root = hook.storage()
        return StoreJobs(conn_id, url, tuple(job_names(root)), root=root)
    except Exception as err:  # CkptError, AirflowNotFoundException...: shown on the page, never a 500
        return StoreJobs(conn_id, url, (), f"{type(err).__name__}: {err}")
