"""Operators for a job's life: submit (crash-safe); the restart (an operation: operators/restart.py) and the stop
(a control request: operators/control.py) are importable from here too."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import KillPolicy, RestoreSpec, SupervisionMode
from airflow_ckpt_provider.core.policy.settings import JobSettings, names
from airflow_ckpt_provider.core.records.control import RequestAction, submit_request
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch, read_launch
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.views.jobview import (
    check_can_request,
    observe,
    starting_launch,
)
from airflow_ckpt_provider.core.views.submission import find_running, what_to_launch
from airflow_ckpt_provider.hooks.spark import CkptSparkHook
from airflow_ckpt_provider.launcher.deploy import start_failure
from airflow_ckpt_provider.launcher.handover import start_job
from airflow_ckpt_provider.links import SparkUILink, persist_empty_links
from airflow_ckpt_provider.operators import lineage
from airflow_ckpt_provider.operators.arguments import (
    mode_arg,
    parse_mode,
    parse_restore,
    path_list,
    restore_arg,
    settings_args,
    settings_of,
    with_settings,
)
from airflow_ckpt_provider.operators.base import JobOperator, check_event
from airflow_ckpt_provider.operators.control import (
    StopStreamingJobOperator,
)
from airflow_ckpt_provider.triggers.job_health import JobHealthTrigger

__all__ = ["StopStreamingJobOperator", "SubmitStreamingJobOperator"]  # and RestartStreamingJobOperator (__getattr__)

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import JsonValue

    from airflow_ckpt_provider.core.store.jobstore import JobStore

#: Settings that are not SubmitStreamingJobOperator arguments: JobOperator's poll_interval (how often a waiting
#: task looks) has the name of the driver's.
NOT_ARGUMENTS = ("poll_interval",)


class _LaunchMixin(lineage.LaunchingOperator):
    """Launching a deployment and waiting until its driver runs."""

    start_timeout: float
    #: Who keeps the launched job running (core/policy/modes.SupervisionMode): ``auto`` (as the job had: the service
    #: once it was handed to it), ``launcher`` (a supervisor on this worker) or ``service`` (docs/service.md).
    supervision: SupervisionMode | str = SupervisionMode.AUTO

    def _launch(self, store: JobStore, deployment: Deployment, restore: RestoreSpec, key: str = "") -> Launch:
        try:
            record = start_job(store, deployment, restore=restore, store_url=self.store_hook.store_url,
                               s3=self.store_hook.s3_options, launched_by=f"airflow:{self.dag_id}.{self.task_id}",
                               unrecorded_env=lineage.launch_env(self, deployment.env),
                               supervision=parse_mode(SupervisionMode, self.supervision), key=key)
        except CkptError as err:
            raise AirflowException(f"cannot launch job {self.job}: {err}") from err
        if record.pid is None:
            self.log.info("job %s: launch %s (code %s, restore %s) handed to the supervision service: nothing of "
                          "the job runs on this worker", self.job, record.launch_id,
                          deployment.code_version or "-", restore)
        else:
            self.log.info("job %s: launched %s (code %s, restore %s), supervisor pid %s on %s, log %s",
                          self.job, record.launch_id, deployment.code_version or "-", restore, record.pid,
                          record.host, record.log_file)
        return record

    def _wait_running(self, context: Context, store: JobStore, *, method_name: str, started_after: float | None,
                      min_epoch: int | None = None, kwargs: dict[str, Any] | None = None) -> Any:
        criteria = HealthCriteria(min_epoch=min_epoch, started_after=started_after, start_timeout=self.start_timeout)
        trigger = JobHealthTrigger(**self._store_args, criteria=criteria, timeout=self.start_timeout + 60)
        return self.wait(context, trigger=trigger, method_name=method_name, kwargs=kwargs)

    def _running_result(self, context: Context, event: dict[str, Any], launch_id: str | None) -> dict[str, Any]:
        event = check_event(event, ("healthy", "unhealthy"), f"job {self.job}")
        if event["status"] != "healthy":
            raise AirflowException(start_failure(self.job_store(), event))
        SparkUILink.persist(context, event.get("ui_url"))
        self.log.info("job %s: RUNNING, epoch %s, batch %s", self.job, event.get("epoch"), event.get("batch_id"))
        return {"job": self.job, "epoch": event.get("epoch"), "batch_id": event.get("batch_id"),
                "state": event.get("state"), "ui_url": event.get("ui_url"), "launch_id": launch_id}


class SubmitStreamingJobOperator(ResumableJobMixin, _LaunchMixin):
    """Start a streaming job under the runtime, supervised with a restart strategy, and wait until it runs.

    Crash-safe: a job whose driver already runs is reconnected to, never submitted twice (the job store's
    status and lease are the job's identity; the launch id is also kept in the task state store). The
    job keeps running after the task ends. ``on_kill_policy`` (core/policy/modes.py KillPolicy) says what happens to the
    job when the task is killed or marked failed while it waits: ``leave-running`` (default),
    ``stop-with-savepoint`` or ``cancel``.

    :param job_file: the Python file defining the job's @streaming_job function (on the worker, or a URI
        spark-submit fetches in cluster mode)
    :param restore: latest-state (default), latest-savepoint, none, or a snapshot id or URI
    :param env: the job's own settings for its driver (never credentials: they are stored with the deployment)
    :param conf: Spark settings on top of the Spark connection's
    :param py_files: the job's own Python modules (``.py``, ``.zip``, ``.egg``; paths on the worker or URIs the
        cluster reads), shipped to the driver and every executor with the provider's code (spark-submit's
        ``--py-files``); recorded with the deployment, so restarts and upgrades ship them too
    :param files: data files the job reads from its working directory (spark-submit's ``--files``), recorded too
    :param keep_recorded_code: when the job is not running and last ran other code than this task's (it was
        upgraded), start that code again (default) rather than this task's
    :param supervision: who keeps the job running: ``auto`` (default: as the job had, the supervision service once
        it was handed to it), ``launcher`` (a supervisor started on this worker, today's single-host form) or
        ``service`` (handed to the supervision service: nothing of the job runs on this worker; docs/service.md)

    Every field of core/policy/settings.py ``JobSettings`` is a keyword argument too, templated, with the same name
    and default (``checkpoint``, ``checkpoint_interval``, ``savepoint_interval``, ``keep_checkpoints``,
    ``restart_strategy``: exponential-delay, fixed-delay or failure-rate with Flink's defaults,
    ``time_travel``: fork or refuse, ...); the deployment records them (docs/development.md#settings).
    """

    template_fields = (*JobOperator.template_fields, "job_file", "code_version", "restore", "env", "conf",
                       "py_files", "files", *(name for name in names(JobSettings) if name not in NOT_ARGUMENTS),
                       "supervision")
    template_fields_renderers: ClassVar[dict[str, str]] = {"env": "json", "conf": "json"}
    operator_extra_links = (SparkUILink(),)
    external_id_key = "ckpt_launch"
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        job_file: str,
        code_version: str | None = None,
        restore: str = "latest-state",
        ckpt_spark_conn_id: str = CkptSparkHook.default_conn_name,
        conf: Mapping[str, str] | None = None,
        py_files: Sequence[str] | str | None = None,
        files: Sequence[str] | str | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 600.0,
        on_kill_policy: KillPolicy | str = KillPolicy.LEAVE_RUNNING,
        keep_recorded_code: bool = True,
        supervision: SupervisionMode | str = SupervisionMode.AUTO,
        **kwargs: Any,
    ) -> None:
        settings = settings_args(JobSettings, kwargs, skip=NOT_ARGUMENTS)  # the JobSettings fields, by name
        super().__init__(**kwargs)
        for name, value in settings.items():
            setattr(self, name, value)
        self.job_file = job_file
        self.code_version = code_version
        self.restore = restore_arg(restore)
        self.ckpt_spark_conn_id = ckpt_spark_conn_id
        self.conf = conf
        self.py_files = py_files
        self.files = files
        self.env = env
        self.start_timeout = start_timeout
        self.on_kill_policy = mode_arg(KillPolicy, on_kill_policy)
        self.keep_recorded_code = keep_recorded_code
        self.supervision = mode_arg(SupervisionMode, supervision)

    # The settings are parameters for Airflow (default_args, partial/expand) and help(), without a list here;
    # functions do take __signature__ (inspect.signature reads it), which typeshed does not declare.
    __init__.__signature__ = with_settings(__init__, JobSettings, skip=NOT_ARGUMENTS)  # type: ignore[attr-defined]

    @cached_property
    def spark_hook(self) -> CkptSparkHook:
        return CkptSparkHook(self.ckpt_spark_conn_id)

    def deployment(self) -> Deployment:
        """This task's deployment: the Spark connection's settings with this task's on top."""
        for name in ("env", "conf"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise ConfigError(f"{name} must be a mapping of names to values, found {type(value).__name__} "
                                  f"{str(value)[:80]!r}; a templated {name} needs the DAG's "
                                  "render_template_as_native_obj=True")
        spark = self.spark_hook.settings
        otlp = {} if getattr(self, "metrics_otlp", None) is not None else airflow_otlp()  # a setting: set in init
        if getattr(self, "metrics_interval", None) != Deployment.__dataclass_fields__["metrics_interval"].default:
            otlp.pop("metrics_interval", None)  # the task's own interval stands
        return settings_of(Deployment, self, skip=NOT_ARGUMENTS, **otlp, job_file=self.job_file,
                           code_version=self.code_version, master=spark["master"], deploy_mode=spark["deploy_mode"],
                           spark_submit=spark["spark_submit"], conf={**spark["conf"], **(self.conf or {})},
                           python_env=spark["python_env"], env=dict(self.env or {}),
                           py_files=path_list(self.py_files, "py_files"), files=path_list(self.files, "files"))

    def execute(self, context: Context) -> Any:
        persist_empty_links(context, self)  # before anything can fail or defer (links.py)
        try:
            parse_mode(KillPolicy, self.on_kill_policy)
            parse_mode(SupervisionMode, self.supervision)
            parse_restore(self.restore)
            self.deployment()  # bad input fails here, before anything is launched
        except CkptError as err:
            raise AirflowException(f"job {self.job}: {err}") from err
        return self.execute_resumable(context)

    # -- ResumableJobMixin -------------------------------------------------------------------------

    def submit_job(self, context: Context) -> JsonValue:
        store = self.job_store()
        running = self._running_driver(store)
        if running is not None:
            return running
        record = self._launch(store, self._what_to_launch(store), parse_restore(self.restore),
                              key=self.run_key(context))
        return {"launch_id": record.launch_id, "launched_at": record.launched_at, "epoch": None}

    def _what_to_launch(self, store: JobStore) -> Deployment:
        """This task's deployment, unless the job last ran other code (core/views/submission.what_to_launch)."""
        deployment, warning = what_to_launch(read_launch(store), self.deployment(),
                                             keep_recorded_code=self.keep_recorded_code)
        if warning:
            self.log.warning("%s", warning)
        return deployment

    def _running_driver(self, store: JobStore) -> dict[str, Any] | None:
        """The identity of a live driver of this job, or of a launch on its way: a second submit would fence it."""
        try:
            found = find_running(store, self.start_timeout)
        except ConflictError as err:  # STOPPING
            raise AirflowException(str(err)) from err
        if found is None:
            return None
        self.log.info("%s", found.message)
        return found.identity()

    def get_job_status(self, external_id: JsonValue, context: Context) -> str:
        store = self.job_store()
        try:
            view = observe(store)
        except ConfigError:
            view = None
        status = view.status if view else None
        if starting_launch(store, status, time.time(), self.start_timeout) is not None:
            return "STARTING"  # launched (the stored id), its driver has not reported yet
        if view is None:
            return "LOST"  # no driver ever took the lease, and no launch is on its way: launch again
        if status is None:
            return "STARTING"
        if view.restarter is not None:
            return JobState.RESTARTING.value  # its supervisor (or driver) brings it back: reconnect
        return "STALE" if view.stale else status.state.value

    def is_job_active(self, status: str) -> bool:
        return status in (JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)

    def is_job_succeeded(self, status: str) -> bool:
        return False  # a streaming job runs until stopped: a stopped or failed one is submitted again

    def poll_until_complete(self, external_id: JsonValue, context: Context) -> Any:
        ident: dict[str, Any] = dict(external_id) if isinstance(external_id, dict) else {}
        # Deferrable: raises TaskDeferred and execute_complete returns the result; else the result is kept
        # for get_job_result, whose value execute_resumable returns after a submit.
        self._result = self._wait_running(context, self.job_store(), method_name="execute_complete",
                                          started_after=ident.get("launched_at"), min_epoch=ident.get("epoch"),
                                          kwargs={"launch_id": ident.get("launch_id")})
        return self._result  # the mixin returns this when it reconnects to a running job

    def get_job_result(self, external_id: JsonValue, context: Context) -> Any:
        return getattr(self, "_result", None)

    def execute_complete(self, context: Context, event: dict[str, Any], launch_id: str | None = None) -> Any:
        return self._running_result(context, event, launch_id)

    def on_kill(self) -> None:
        try:
            policy = parse_mode(KillPolicy, self.on_kill_policy)
        except CkptError as err:
            self.log.warning("job %s: task killed; the job keeps running: %s", self.job, err)
            return
        action = {KillPolicy.STOP_WITH_SAVEPOINT: RequestAction.STOP,
                  KillPolicy.CANCEL: RequestAction.CANCEL}.get(policy)
        if action is None:
            self.log.info("job %s: task killed; the job keeps running (on_kill_policy %s)", self.job, policy)
            return
        try:
            store = self.job_store()
            status = check_can_request(observe(store), action)
            request = submit_request(store, action, epoch=status.epoch)
        except CkptError as err:
            self.log.warning("job %s: task killed; could not request %s: %s", self.job, action, err)
            return
        self.log.warning("job %s: task killed; requested %s of the driver of epoch %d (request %s)", self.job,
                         action, request.epoch, request.id)


def __getattr__(name: str) -> Any:
    """``RestartStreamingJobOperator`` from here, as before it became an operation (operators/restart.py imports this
    module, so it is looked up when asked for)."""
    if name == "RestartStreamingJobOperator":
        from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator

        return RestartStreamingJobOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def airflow_otlp() -> dict[str, Any]:
    """Where Airflow sends its own metrics over OpenTelemetry (``[metrics] otel_on``, ``otel_host``, ``otel_port``,
    ``otel_ssl_active``, ``otel_interval_milliseconds``), as the drivers' ``metrics_otlp`` and ``metrics_interval``
    for a task that sets no ``metrics_otlp`` of its own; {} when Airflow exports none (docs/metrics.md)."""
    from airflow.sdk.configuration import conf  # the module's __getattr__ makes it: typed Any

    if not conf.getboolean("metrics", "otel_on", fallback=False) or not conf.get("metrics", "otel_host", fallback=""):
        return {}
    scheme = "https" if conf.getboolean("metrics", "otel_ssl_active", fallback=False) else "http"
    port = conf.getint("metrics", "otel_port", fallback=4318)
    found: dict[str, Any] = {"metrics_otlp": f"{scheme}://{conf.get('metrics', 'otel_host')}:{port}/v1/metrics"}
    interval_ms = conf.getint("metrics", "otel_interval_milliseconds", fallback=0)
    if interval_ms > 0:
        found["metrics_interval"] = interval_ms / 1000
    return found
