"""How a front-end starts a deployment: launched on its host with its own supervisor (the single-host form), or handed
to the supervision service (launcher/service.py), which starts it on one of its instances' hosts.

Design notes: docs/service.md#design-notes-launcherservicepy."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

from airflow_ckpt_provider.core.policy.modes import RestoreSpec, SupervisionMode
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.ownership import HANDED, ServiceJob, handed_key, ring_service
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, Storage
from airflow_ckpt_provider.launcher.deploy import check_deployment, launch, record_launch

log = logging.getLogger(__name__)


def hand_over(store: JobStore, deployment: Deployment, *, restore: RestoreSpec, store_url: str,
              s3: S3Options | None = None, handed_by: str = "", key: str = "") -> Launch:
    """Hand the job to the supervision service and record ``deployment`` as its launch (checked first: bad input
    raises, nothing recorded); an instance starts it within a renewal or two. Returns the recorded launch.

    The hand-over is written first: if this process dies before the launch is recorded, the service keeps the job's
    previous launch as it was (running, or ended), and a retry records the new one."""
    check_deployment(deployment, store.job, store_url, restore, s3)
    handed_by = handed_by or f"{os.environ.get('USER', '?')}@{socket.gethostname()}"
    store.root.write(handed_key(store.job), ServiceJob(job=store.job, handed_at=time.time(),
                                                       handed_by=handed_by).to_bytes())
    recorded = record_launch(store, deployment, restore=restore, store_url=store_url, s3=s3, launched_by=handed_by,
                             checked=True, key=key)
    ring_service(store.root, store.job)  # an instance looks at it at its next renewal
    return recorded


def start_job(store: JobStore, deployment: Deployment, *, restore: RestoreSpec, store_url: str,
              s3: S3Options | None = None, launched_by: str = "", unrecorded_env: Mapping[str, str] | None = None,
              supervision: SupervisionMode = SupervisionMode.AUTO, key: str = "") -> Launch:
    """How every front-end (the operators, Dagster, ``ckpt job``) starts a deployment: launched here
    with its own supervisor, or handed to the service (``supervision``; ``auto``: as the job was before). A job
    handed to the service gets no ``unrecorded_env``: the service's instances run it with their own environment.
    ``key``: the run that asks (Launch.key), so that its retry finds this launch."""
    handed = supervision is SupervisionMode.SERVICE or (
        supervision is SupervisionMode.AUTO and store.root.exists(handed_key(store.job)))
    if not handed:
        return launch(store, deployment, restore=restore, store_url=store_url, s3=s3, launched_by=launched_by,
                      unrecorded_env=unrecorded_env, key=key)
    if unrecorded_env:
        log.info("job %s: handed to the supervision service without this launch's unrecorded environment (%s): its "
                 "instances' own environment applies", store.job, ", ".join(sorted(unrecorded_env)))
    return hand_over(store, deployment, restore=restore, store_url=store_url, s3=s3, handed_by=launched_by, key=key)


def handed_jobs(root: Storage) -> list[str]:
    """The jobs handed to the service (one LIST of ``_service/jobs/``)."""
    return sorted(info.key[len(HANDED):-len(".json")] for info in root.list(HANDED) if info.key.endswith(".json"))


