"""OpenLineage RUNNING events of a running job, sent by its driver.

Design notes: docs/airflow.md#design-notes-runtimelineagepy."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_ckpt_provider.core.policy.lineagenames import (
    NAMESPACE_ENV,
    PARENT_ENV,
    ROOT_PARENT_ENV,
    DatasetName,
    RunRef,
    job_name,
    launch_run_id,
    parse_run_ref,
)
from airflow_ckpt_provider.core.records.deployments import LAUNCH_ENV
from airflow_ckpt_provider.core.records.status import JobStatus
from airflow_ckpt_provider.kafka.offsets import kafka_inputs

log = logging.getLogger(__name__)

#: Seconds between two warnings about failed emissions (the failures in between are counted).
WARN_EVERY = 3600.0
#: Seconds the driver's end waits for an event being sent.
CLOSE_TIMEOUT = 2.0


def configured_by(environ: Mapping[str, str]) -> str | None:
    """What configures OpenLineage in ``environ`` (for the log), or None: then nothing is sent. The client's own
    switches: ``OPENLINEAGE_DISABLED=true`` wins; a transport comes from ``OPENLINEAGE__TRANSPORT...`` variables,
    the ``OPENLINEAGE_CONFIG`` file or ``OPENLINEAGE_URL``."""
    if environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return None
    transport = sorted(k for k in environ if k.startswith("OPENLINEAGE__TRANSPORT") and environ[k].strip())
    if transport:
        return transport[0] if len(transport) == 1 else f"OPENLINEAGE__TRANSPORT__* ({len(transport)} variables)"
    if environ.get("OPENLINEAGE_CONFIG", "").strip():
        return "OPENLINEAGE_CONFIG"
    if environ.get("OPENLINEAGE_URL", "").strip():
        return "OPENLINEAGE_URL"
    return None


@dataclass(frozen=True)
class LineageRun:
    """Who reports: the job's OpenLineage job (namespace, name), the launch's run, and the run it descends from."""

    job: str
    namespace: str
    run_id: str
    launch_id: str | None
    launched_by: str | None = None
    parent: RunRef | None = None
    root: RunRef | None = None

    @classmethod
    def of(cls, job: str, environ: Mapping[str, str], epoch: int, launched_by: str | None = None) -> LineageRun:
        """From the driver's environment: ``CKPT_LAUNCH_ID`` (set by launcher/deploy.py; a driver started without
        it, e.g. ``ckpt run`` unsupervised, is a run of its own epoch), the namespace and the parent run."""
        launch_id = environ.get(LAUNCH_ENV) or None
        parent = parse_run_ref(environ.get(PARENT_ENV))
        if environ.get(PARENT_ENV) and parent is None:
            log.warning("job %s: %s=%r is not NAMESPACE/JOB/RUN_UUID: the lineage events name no parent run", job,
                        PARENT_ENV, environ.get(PARENT_ENV))
        return cls(job=job, namespace=environ.get(NAMESPACE_ENV) or "default",
                   run_id=launch_run_id(launch_id or f"{job}/epoch-{epoch}"), launch_id=launch_id,
                   launched_by=launched_by, parent=parent,
                   root=parse_run_ref(environ.get(ROOT_PARENT_ENV)) if parent else None)


@dataclass(frozen=True)
class RunningReport:
    """One RUNNING event's content (runtime/lineageevent.py turns it into OpenLineage's classes)."""

    run_id: str
    namespace: str
    job_name: str
    at: float
    inputs: tuple[DatasetName, ...]
    facet: dict[str, Any]  # CkptStreamingJobRunFacet's fields
    parent: RunRef | None = None
    root: RunRef | None = None


def running_report(run: LineageRun, status: JobStatus, at: float) -> RunningReport:
    """What the driver reports of its job at ``at``: its status (epoch, last batch, the Kafka topics of that
    batch's end offsets, its query restarts, code version) in the launch's run."""
    inputs, unnamed = kafka_inputs(status.offsets)
    facet = {"job": run.job, "epoch": status.epoch, "codeVersion": status.code_version, "launchId": run.launch_id,
             "batchId": status.batch_id, "restarts": status.restart_count, "launchedBy": run.launched_by,
             "unnamedTopics": unnamed}
    return RunningReport(run_id=run.run_id, namespace=run.namespace, job_name=job_name(run.job), at=at,
                         inputs=tuple(inputs), facet=facet, parent=run.parent, root=run.root)


class FailureLog:
    """Failed emissions as log lines: the first at once, then at most one every ``every`` seconds, counting the
    failures it did not log."""

    def __init__(self, job: str, *, every: float = WARN_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.every = every
        self.clock = clock
        self._last: float | None = None
        self._unlogged = 0
        self._lock = threading.Lock()  # the driver loop and the sending thread both report failures

    def failed(self, err: BaseException) -> bool:
        """Count one failure; True if it was logged."""
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last < self.every:
                self._unlogged += 1
                return False
            more = f" ({self._unlogged} more failed since the last warning)" if self._unlogged else ""
            self._last, self._unlogged = now, 0
        log.warning("job %s: OpenLineage event not sent: %s: %s%s; the job runs on, the next is tried in its "
                    "lineage_interval", self.job, type(err).__name__, err, more)
        return True


class Client(Protocol):
    def emit(self, event: Any) -> None: ...


def _openlineage_client() -> Client:
    from openlineage.client import OpenLineageClient

    client: Client = OpenLineageClient()
    return client


def _to_event(report: RunningReport) -> Any:
    from airflow_ckpt_provider.runtime import lineageevent

    return lineageevent.running_event(report)


class LineageEmitter:
    """Sends the driver's RUNNING events from a daemon thread: the driver loop asks ``due()`` and hands the status
    to ``offer()``, which never blocks nor raises; the event is built and sent in the thread. A status offered
    while the previous one is still being sent is dropped (the next comes one interval later)."""

    def __init__(self, run: LineageRun, interval: float, *, client_factory: Callable[[], Client] = _openlineage_client,
                 to_event: Callable[[RunningReport], Any] = _to_event, clock: Callable[[], float] = time.monotonic,
                 failures: FailureLog | None = None) -> None:
        self.run = run
        self.interval = interval
        self.clock = clock
        self.failures = failures or FailureLog(run.job, clock=clock)
        self.sent = 0
        self.dropped = 0
        self._client_factory = client_factory
        self._to_event = to_event
        self._client: Client | None = None
        self._next: float = clock()  # the first at once
        self._queue: queue.Queue[tuple[JobStatus, float] | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._send_all, name=f"ckpt-lineage-{run.job}", daemon=True)
        self._thread.start()

    def due(self) -> bool:
        return self.clock() >= self._next

    def queued(self) -> int:
        """Statuses offered and not yet taken by the sending thread (0 or 1)."""
        return self._queue.qsize()

    def offer(self, status: JobStatus, at: float) -> None:
        """Queue a RUNNING event of ``status`` (a frozen value) at wall time ``at``; the next is due one interval
        from now."""
        self._next = self.clock() + self.interval
        try:
            self._queue.put_nowait((status, at))
        except queue.Full:
            self.dropped += 1
            self.failures.failed(TimeoutError("the previous event is still being sent"))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Let an event being sent finish (at most ``timeout`` s), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return  # the thread is stuck in a send: a daemon, it ends with the process
        self._thread.join(timeout)

    def _send_all(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if self._client is None:
                    self._client = self._client_factory()
                self._client.emit(self._to_event(running_report(self.run, *item)))
                self.sent += 1
            except Exception as err:  # any transport's (or a malformed status') failure: the job must not notice
                self.failures.failed(err)


def start_emitter(job: str, interval: float, epoch: int, launched_by: Callable[[], str | None] = lambda: None,
                  environ: Mapping[str, str] | None = None) -> LineageEmitter | None:
    """The driver's emitter, or None when no events are to be sent: ``interval`` 0, OpenLineage not configured in
    the environment (a debug line), or openlineage-python not installed (one warning; the import check costs some
    0.3 s once, at the driver's start). ``launched_by`` is asked only if events are to be sent (it reads the launch
    record)."""
    env = os.environ if environ is None else environ
    if interval <= 0:
        return None
    source = configured_by(env)
    if source is None:
        log.debug("job %s: no OpenLineage events: the environment configures no OpenLineage transport", job)
        return None
    try:
        import openlineage.client  # noqa: F401  # only whether it is installed; the thread imports it again
    except ImportError as err:
        log.warning("job %s: OpenLineage is configured (%s) but openlineage-python is not installed (%s): no "
                    "lineage events; install openlineage-python in the driver's Python to send them", job, source,
                    err)
        return None
    run = LineageRun.of(job, env, epoch, launched_by())
    log.info("job %s: OpenLineage RUNNING events every %.0f s (configured by %s), run %s of job %s/%s%s", job,
             interval, source, run.run_id, run.namespace, job_name(job),
             f", parent {run.parent.namespace}/{run.parent.name}/{run.parent.run_id}" if run.parent else "")
    return LineageEmitter(run, interval)
