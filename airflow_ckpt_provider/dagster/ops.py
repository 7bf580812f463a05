"""Ops for a job's life, one verb each, as the Airflow operators: submit or reconnect, savepoint, stop, cancel,
restart, dispose of snapshots, wait until healthy, upgrade and rescale.

Design notes: docs/dagster.md#design-notes-dagsteropspy."""

# No ``from __future__ import annotations``: Dagster reads the ops' parameter annotations (the config class, the
# resource) at definition time and does not resolve them from strings.
import time
from collections.abc import Callable
from enum import Enum, StrEnum
from functools import partial
from typing import Any, TypeVar, get_type_hints

import dagster as dg
from pydantic import Field, create_model, field_validator, model_validator

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, ConflictError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.modes import RestoreSpec, StopMode, SupervisionMode
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.policy.settings import JobSettings, Settings, setting_fields
from airflow_ckpt_provider.core.policy.stepsettings import (
    STOP_TIMEOUT,
    RestartStepSettings,
    StepSettings,
    UpgradeSettings,
)
from airflow_ckpt_provider.core.records.control import STOP_ACTION, RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.snapshots.catalog import dispose_snapshots as dispose
from airflow_ckpt_provider.core.store.jobstore import JobStore, check_job_name
from airflow_ckpt_provider.core.views.jobview import (
    request_running,
    stop_check,
)
from airflow_ckpt_provider.core.views.submission import find_running, what_to_launch
from airflow_ckpt_provider.core.watches.base import wait_for
from airflow_ckpt_provider.core.watches.control import RequestWatch, request_failure, request_result
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.dagster.resources import CkptResource
from airflow_ckpt_provider.launcher.deploy import start_failure
from airflow_ckpt_provider.launcher.handover import start_job
from airflow_ckpt_provider.launcher.upgrade import UpgradeFailed, run_operation

#: The resource key every op of this module asks for.
CKPT_RESOURCE = "ckpt"
#: JobSettings the ``settings`` field takes: all but the driver's poll_interval (the ops' own poll_interval is
#: how often they look at the job store), as SubmitStreamingJobOperator's arguments.
_SETTINGS = {f.name: m for f, m in setting_fields(JobSettings) if f.name != "poll_interval"}
T = TypeVar("T")
S = TypeVar("S", bound=Settings)


def _config_error(check: Callable[[], object], value: T) -> T:
    """``value`` if ``check()`` passes; else a ValueError with the check's message, which Dagster reports."""
    try:
        check()
    except CkptError as err:
        raise ValueError(f"{err}. Fix the op's config") from err
    return value


class JobConfig(dg.Config):
    """The job an op acts on, and how often it looks at the job store while it waits."""

    job: str = Field(description="The job's name in the job store")
    poll_interval: float = Field(default=2.0, gt=0, description="Seconds between looks at the job store")

    @field_validator("job")
    @classmethod
    def _check_job(cls, value: str) -> str:
        return _config_error(lambda: check_job_name(value), value)


class SubmitConfig(JobConfig):
    """SubmitStreamingJobOperator's arguments (docs/airflow.md); ``settings``: JobSettings by name, as text."""

    job_file: str = Field(description="The Python file with the job's @streaming_job function")
    code_version: str | None = Field(default=None, description="The code's version label")
    restore: str = Field(default="latest-state", description="latest-state, latest-savepoint, none, or a snapshot")
    env: dict[str, str] = Field(default_factory=dict, description="The job's own settings (never credentials)")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Spark settings on top of the resource's")
    py_files: list[str] = Field(default_factory=list,
                                description="The job's own Python modules (.py, .zip, .egg), after the resource's; "
                                            "recorded with the deployment, so restarts and upgrades ship them too")
    files: list[str] = Field(default_factory=list, description="The job's data files, after the resource's")
    settings: dict[str, str] = Field(default_factory=dict,
                                     description="JobSettings by name, e.g. savepoint_interval: '600'")
    start_timeout: float = Field(default=600.0, gt=0, description="Seconds the driver gets to report RUNNING")
    keep_recorded_code: bool = Field(default=True, description="Start the code the job last ran (after an upgrade)")
    supervision: str = Field(default=SupervisionMode.AUTO.value,
                             description="auto (as the job had), launcher (its supervisor on this host) or service "
                                         "(handed to the supervision service: docs/service.md)")

    @field_validator("restore")
    @classmethod
    def _check_restore(cls, value: str) -> str:
        return _config_error(lambda: RestoreSpec.parse(value), value)

    @field_validator("supervision")
    @classmethod
    def _check_supervision(cls, value: str) -> str:
        return _config_error(lambda: SupervisionMode.parse(value), value)

    @field_validator("settings")
    @classmethod
    def _check_settings(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            meta = _SETTINGS.get(name)
            if meta is None:
                raise ValueError(f"unknown setting {name!r}: expected one of {', '.join(sorted(_SETTINGS))}")
            _config_error(partial(meta.parse, text, name), text)
        return value


class StopKind(StrEnum):
    """core/policy/modes.StopMode for Dagster's config: its enums take member names, so the names are the spellings."""

    savepoint = StopMode.SAVEPOINT.value
    cancel = StopMode.CANCEL.value


class StopConfig(JobConfig):
    mode: StopKind = Field(default=StopKind.savepoint, description="savepoint (stop with savepoint) or cancel")
    timeout: float = Field(default=STOP_TIMEOUT, gt=0, description="Seconds the driver gets to answer")


class RequestConfig(JobConfig):
    timeout: float = Field(default=STOP_TIMEOUT, gt=0, description="Seconds the driver gets to answer")


class DisposeConfig(JobConfig):
    snapshot_ids: list[str] = Field(default_factory=list, description="Dispose of these; none: apply retention")
    keep_checkpoints: int = Field(default=3, ge=1)
    keep_savepoints: int | None = Field(default=None, ge=1)
    max_savepoint_age: float | None = Field(default=None, gt=0, description="Seconds")
    preview: bool = False


class HealthyConfig(JobConfig):
    """JobHealthSensor(expect="healthy")'s arguments: the job RUNNING with ``min_batches`` new batches for
    ``healthy_for`` s; fails as soon as it is unhealthy, or after ``timeout`` s."""

    min_batches: int = Field(default=1, ge=0)
    healthy_for: float = Field(default=0, ge=0)
    start_timeout: float = Field(default=300.0, gt=0)
    timeout: float = Field(default=600.0, gt=0)


def _settings_config(name: str, doc: str, *, cls: type[StepSettings] = UpgradeSettings,
                     only: tuple[str, ...] | None = None, required: tuple[str, ...] = ()) -> type[JobConfig]:
    """A config class of ``cls``' fields (``only`` those), declared there once: the same names, defaults, help and
    checks as ``ckpt job upgrade|rescale|restart``'s flags and the Airflow operators' arguments. Modes and restore
    strategies are their spelling, paths a list."""
    hints = get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f, m in setting_fields(cls):
        if only is not None and f.name not in only:
            continue
        hint = hints[f.name]
        kind: Any = str if isinstance(hint, type) and issubclass(hint, Enum | RestoreSpec) else \
            {tuple[str, ...] | None: list[str] | None}.get(hint, hint)
        default = f.default.value if isinstance(f.default, Enum) else \
            str(f.default) if isinstance(f.default, RestoreSpec) else f.default
        fields[f.name] = (kind, Field(description=m.help[:1].upper() + m.help[1:]) if f.name in required else
                          Field(default=default, description=m.help[:1].upper() + m.help[1:]))
    def check(config: JobConfig) -> JobConfig:  # the combinations, at once (Dagster's launchpad shows the error)
        step_settings_of(cls, config, **({"job_file": None} if cls is UpgradeSettings and "job_file" not in fields
                                         else {}))
        return config

    return create_model(name, __base__=JobConfig, __doc__=doc,
                        # pydantic types __validators__ as plain callables; a decorated validator is what it takes
                        __validators__={"_check_settings": model_validator(mode="after")(check)},  # type: ignore[dict-item]
                        **fields)


def step_settings_of(cls: type[S], config: JobConfig, **more: Any) -> S:
    """The op's config as ``cls`` (``more``: values the op sets itself); ValueError says what is wrong."""
    names = {f.name for f, _ in setting_fields(cls)}
    values = {k: v for k, v in config.model_dump().items() if k in names} | more
    try:
        return cls(**values)
    except CkptError as err:
        raise ValueError(f"{err}. Fix the op's config") from err


def upgrade_settings(config: JobConfig, **more: Any) -> UpgradeSettings:
    return step_settings_of(UpgradeSettings, config, **more)


UpgradeConfig = _settings_config(
    "UpgradeConfig", "UpgradeStreamingJobOperator's arguments (core/policy/stepsettings.UpgradeSettings).",
    required=("job_file",))
RescaleConfig = _settings_config(
    "RescaleConfig", "RescaleStreamingJobOperator's arguments: the running code, its state in ``partitions``.",
    only=("partitions", "check_timeout", "stop_timeout", "verify_batches", "verify_timeout"), required=("partitions",))
RestartConfig = _settings_config(
    "RestartConfig", "RestartStreamingJobOperator's arguments (core/policy/stepsettings.RestartStepSettings); a "
    "snapshot given as the op's input wins over ``restore``.", cls=RestartStepSettings)


# -- what the ops share ----------------------------------------------------------------------------


def _paths(*lists: list[str]) -> tuple[str, ...]:
    """The resource's paths, then the op's, each once (comma-separated entries split)."""
    return tuple(dict.fromkeys(p.strip() for items in lists for item in items for p in item.split(",") if p.strip()))


def _failure(message: str, *, allow_retries: bool | None = None, **metadata: Any) -> dg.Failure:
    return dg.Failure(description=message, metadata={k: v for k, v in metadata.items() if v is not None},
                      allow_retries=allow_retries)


def _store(ckpt: CkptResource, job: str) -> JobStore:
    try:
        return ckpt.job_store(job)
    except CkptError as err:
        raise _failure(f"job {job}: {err}") from err


def _run_key(context: dg.OpExecutionContext) -> str:
    """This op's run, the same for each of its retries: a retry finds what its first try asked for."""
    return f"dagster:{context.run_id}.{context.op.name}"


def _launched_by(context: dg.OpExecutionContext) -> str:
    return f"dagster:{context.job_name}.{context.op.name} (run {context.run_id})"


def _request(context: dg.OpExecutionContext, store: JobStore, action: RequestAction, *, timeout: float,
             poll_interval: float, resume: bool = True) -> dict[str, Any]:
    """Ask the running driver for ``action`` (refused, with nothing written, when none could answer) and wait
    for its answer: the request's result, or dg.Failure. With ``resume`` a retry of the op waits for the request
    its first try wrote, unless that failed: one savepoint or stop per op run."""
    try:
        request = request_running(store, action, requested_by=_launched_by(context),
                                  key=_run_key(context) if resume else None)
    except CkptError as err:
        raise _failure(f"job {store.job}: {err}") from err
    context.log.info("job %s: requested %s of the driver of epoch %d (request %s); waiting up to %.0f s", store.job,
                     action, request.epoch, request.id, timeout)
    event = wait_for(RequestWatch(store, request.id, request.epoch), timeout=timeout, poll_interval=poll_interval,
                     what=f"job {store.job}")
    failure = request_failure(store.job, event)
    if failure:
        raise _failure(failure, request_id=request.id)
    result = request_result(store.job, event)
    context.log.info("job %s: %s completed at batch %s%s", store.job, result["action"], result["batch_id"],
                     f", snapshot {result['snapshot_uri']}" if result["snapshot_uri"] else "")
    return result


def _wait_running(context: dg.OpExecutionContext, store: JobStore, *, start_timeout: float, poll_interval: float,
                  started_after: float | None, min_epoch: int | None, launch_id: str | None) -> dict[str, Any]:
    """Wait until a driver of the launch (``started_after``/``min_epoch``) runs, as the submit operator does."""
    criteria = HealthCriteria(min_epoch=min_epoch, started_after=started_after, start_timeout=start_timeout)
    event = wait_for(JobHealthWatch(store, criteria), timeout=start_timeout + 60, poll_interval=poll_interval,
                     what=f"job {store.job}")
    if event["status"] != Health.HEALTHY.value:
        raise _failure(start_failure(store, event), reason=event.get("reason"), launch_id=launch_id)
    context.log.info("job %s: RUNNING, epoch %s, batch %s", store.job, event.get("epoch"), event.get("batch_id"))
    return {"job": store.job, "epoch": event.get("epoch"), "batch_id": event.get("batch_id"),
            "state": event.get("state"), "ui_url": event.get("ui_url"), "launch_id": launch_id}


def _launch(context: dg.OpExecutionContext, ckpt: CkptResource, store: JobStore, deployment: Deployment,
            restore: RestoreSpec, *, supervision: SupervisionMode = SupervisionMode.AUTO) -> tuple[str, float]:
    try:
        # ``auto``: as the job had, the supervision service once it was handed to it (launcher/handover.start_job).
        record = start_job(store, deployment, restore=restore, store_url=ckpt.store_url, s3=ckpt.s3_options(),
                           launched_by=_launched_by(context), supervision=supervision, key=_run_key(context))
    except CkptError as err:
        raise _failure(f"cannot launch job {store.job}: {err}") from err
    if record.pid is None:
        context.log.info("job %s: launch %s (code %s, restore %s) handed to the supervision service", store.job,
                         record.launch_id, deployment.code_version or "-", restore)
    else:
        context.log.info("job %s: launched %s (code %s, restore %s), supervisor pid %s on %s, log %s", store.job,
                         record.launch_id, deployment.code_version or "-", restore, record.pid, record.host,
                         record.log_file)
    return record.launch_id, record.launched_at


def _stop(context: dg.OpExecutionContext, store: JobStore, mode: StopMode, *, timeout: float,
          poll_interval: float) -> dict[str, Any]:
    try:  # a retry whose first try asked for the stop waits for that request
        status, nothing = stop_check(store, action=STOP_ACTION[mode], key=_run_key(context))
    except CkptError as err:  # its supervisor restarts it: retry once it runs
        raise _failure(str(err)) from err
    if nothing:
        context.log.info("%s", nothing)
        return {"job": store.job, "outcome": "not_running", "action": None, "snapshot_id": None,
                "snapshot_uri": None, "batch_id": status.batch_id if status else None}
    return _request(context, store, STOP_ACTION[mode], timeout=timeout, poll_interval=poll_interval)


# -- the ops -----------------------------------------------------------------------------------------

_AFTER = {"after": dg.In(dg.Nothing, description="Runs after this op (ordering only)")}


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def submit_streaming_job(context: dg.OpExecutionContext, config: SubmitConfig, ckpt: CkptResource) -> dict[str, Any]:
    """Start the job supervised, or reconnect to it (never a second driver), and wait until it runs.

    Output: ``{"job", "epoch", "batch_id", "state", "ui_url", "launch_id"}``."""
    store = _store(ckpt, config.job)
    target = ckpt.spark_target()
    settings: dict[str, Any] = dict(config.settings)  # text: each setting's parser reads it (core/policy/settings.py)
    try:
        restore = RestoreSpec.parse(config.restore)
        mine = Deployment(job_file=config.job_file, code_version=config.code_version, master=target.master,
                          deploy_mode=target.deploy_mode, spark_submit=target.spark_submit,
                          conf={**target.conf, **config.spark_conf}, python_env=target.python_env,
                          env=dict(config.env), py_files=_paths(ckpt.py_files, config.py_files),
                          files=_paths(ckpt.files, config.files), **settings)
        found = find_running(store, config.start_timeout)
    except CkptError as err:  # a bad setting or env name, a STOPPING job: nothing was launched
        raise _failure(f"job {config.job}: {err}") from err
    if found is not None:
        context.log.info("%s", found.message)
        ident = found.identity()
    else:
        deployment, warning = what_to_launch(read_launch(store), mine, keep_recorded_code=config.keep_recorded_code)
        if warning:
            context.log.warning("%s", warning)
        launch_id, launched_at = _launch(context, ckpt, store, deployment, restore,
                                         supervision=SupervisionMode.parse(config.supervision))
        ident = {"launch_id": launch_id, "launched_at": launched_at, "epoch": None}
    return _wait_running(context, store, start_timeout=config.start_timeout, poll_interval=config.poll_interval,
                         started_after=ident["launched_at"], min_epoch=ident["epoch"], launch_id=ident["launch_id"])


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def trigger_savepoint(context: dg.OpExecutionContext, config: RequestConfig, ckpt: CkptResource) -> dict[str, Any]:
    """A savepoint of the running job (Flink's ``flink savepoint``); the job keeps running.

    Output: ``{"job", "outcome", "action", "snapshot_id", "snapshot_uri", "batch_id"}``."""
    result = _request(context, _store(ckpt, config.job), RequestAction.SAVEPOINT, timeout=config.timeout,
                      poll_interval=config.poll_interval)
    context.add_output_metadata({"snapshot_id": result["snapshot_id"], "batch_id": result["batch_id"],
                                 "snapshot_uri": result["snapshot_uri"]})
    return result


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def stop_streaming_job(context: dg.OpExecutionContext, config: StopConfig, ckpt: CkptResource) -> dict[str, Any]:
    """Stop with a savepoint (``mode: savepoint``) or cancel; a job that does not run is left as it is."""
    return _stop(context, _store(ckpt, config.job), StopMode(config.mode.value), timeout=config.timeout,
                 poll_interval=config.poll_interval)


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def cancel_streaming_job(context: dg.OpExecutionContext, config: RequestConfig, ckpt: CkptResource) -> dict[str, Any]:
    """Cancel: stop now, the latest completed checkpoint stays valid; a job that does not run is left as it is."""
    return _stop(context, _store(ckpt, config.job), StopMode.CANCEL, timeout=config.timeout,
                 poll_interval=config.poll_interval)


@dg.op(ins={"snapshot": dg.In(dict, description="A savepoint op's output: restore that snapshot"),
            "after": _AFTER["after"]},
       out=dg.Out(dict), tags={"kind": "ckpt"})
def restart_from_snapshot(context: dg.OpExecutionContext, config: RestartConfig,  # type: ignore[valid-type]  # a class made by create_model
                          ckpt: CkptResource, snapshot: dict[str, Any]) -> dict[str, Any]:
    """Restart the job's last deployment from the snapshot a savepoint op returned (``snapshot_id``)."""
    return _restart(context, config, ckpt, str(snapshot["snapshot_id"]))


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def restart_streaming_job(context: dg.OpExecutionContext, config: RestartConfig,  # type: ignore[valid-type]  # as above
                          ckpt: CkptResource) -> dict[str, Any]:
    """Restart the job's last deployment from ``restore``; a running driver is stopped first (``stop_mode``).
    One owner per restart: a ``latest-state`` restart of a job its supervisor restarts already waits for that.

    Output: ``{"job", "epoch", "batch_id", "launch_id", "restore", "snapshot_id", "restarted_by"}``."""
    return _restart(context, config, ckpt, config.restore)  # type: ignore[attr-defined]  # a field made by create_model


def _restart(context: dg.OpExecutionContext, config: JobConfig, ckpt: CkptResource, restore: str) -> dict[str, Any]:
    """RestartStreamingJobOperator's run: the operation asked for and acted on here (launcher/upgrade.py), or waited
    for when the supervision service owns the job; a retry of the op resumes it."""
    settings = _checked(lambda: step_settings_of(RestartStepSettings, config, restore=restore))
    return _operate(context, ckpt, config.job, settings, config.poll_interval)


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def dispose_snapshots(context: dg.OpExecutionContext, config: DisposeConfig, ckpt: CkptResource) -> dict[str, Any]:
    """Dispose of the named snapshots, or apply retention (the newest completed savepoint always stays)."""
    store = _store(ckpt, config.job)
    try:
        disposed, line = dispose(store, config.snapshot_ids, keep_checkpoints=config.keep_checkpoints,
                                 keep_savepoints=config.keep_savepoints,
                                 max_savepoint_age_s=config.max_savepoint_age, preview=config.preview)
    except CkptError as err:
        raise _failure(f"job {config.job}: {err}") from err
    context.log.info("%s", line)
    return {"job": config.job, "disposed": disposed, "preview": config.preview}


@dg.op(ins={"started": dg.In(dict, description="A submit or restart op's output: its epoch is watched"),
            "after": _AFTER["after"]},
       out=dg.Out(dict), tags={"kind": "ckpt"})
def wait_until_healthy(context: dg.OpExecutionContext, config: HealthyConfig, ckpt: CkptResource,
                       started: dict[str, Any]) -> dict[str, Any]:
    """Wait until the driver of ``started``'s epoch (or a newer one) is healthy (core/watches/job_health.py);
    fail as soon as it is unhealthy. Output: the health watch's event."""
    store = _store(ckpt, config.job)
    criteria = HealthCriteria(expect=Health.HEALTHY, min_epoch=started.get("epoch"), min_batches=config.min_batches,
                              healthy_for=config.healthy_for, start_timeout=config.start_timeout)
    begun = time.monotonic()
    event = wait_for(JobHealthWatch(store, criteria), timeout=config.timeout, poll_interval=config.poll_interval,
                     what=f"job {config.job}")
    if event["status"] != Health.HEALTHY.value:
        raise _failure(str(event.get("message")), reason=event.get("reason"), state=event.get("state"))
    context.log.info("%s (after %.0f s)", event["message"], time.monotonic() - begun)
    return event


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def upgrade_streaming_job(context: dg.OpExecutionContext, config: UpgradeConfig,  # type: ignore[valid-type]  # a class made by create_model
                          ckpt: CkptResource) -> dict[str, Any]:
    """UpgradeStreamingJobOperator's run: the new code checked on a copy of the state before anything stops, the
    stop (with a savepoint in ``savepoint`` mode), the new code started and verified, rolled back if it fails;
    with ``partitions``, the state rescaled in the same run.

    Output: ``{"job", "from_version", "to_version", "upgrade_mode", "snapshot_id", "epoch", "batch_id",
    "partitions", "rescaled_snapshot_id"}``."""
    # the new code's py_files/files after the resource's, as the submit op records them; None keeps the recorded
    py_files, files = config.py_files, config.files  # type: ignore[attr-defined]  # fields made by create_model
    settings = _checked(lambda: upgrade_settings(
        config, py_files=None if py_files is None else _paths(ckpt.py_files, py_files),
        files=None if files is None else _paths(ckpt.files, files)))
    return _operate(context, ckpt, config.job, settings, config.poll_interval)  # type: ignore[attr-defined]  # JobConfig's fields


@dg.op(ins=_AFTER, out=dg.Out(dict), tags={"kind": "ckpt"})
def rescale_streaming_job(context: dg.OpExecutionContext, config: RescaleConfig,  # type: ignore[valid-type]  # as above
                          ckpt: CkptResource) -> dict[str, Any]:
    """RescaleStreamingJobOperator's run: the upgrade's steps with the running code, its state repartitioned into
    ``partitions`` through a savepoint (on a copy), back to the old partitions if it fails.

    Output: ``{"job", "partitions", "snapshot_id", "rescaled_snapshot_id", "epoch", "batch_id"}``."""
    return _operate(context, ckpt, config.job, _checked(lambda: upgrade_settings(config)),  # type: ignore[attr-defined]  # JobConfig's fields
                    config.poll_interval)  # type: ignore[attr-defined]  # JobConfig's field


def _checked(make: Callable[[], S]) -> S:
    try:
        return make()
    except ValueError as err:  # a combination of values no single field's check refuses
        raise _failure(str(err), allow_retries=False, outcome="refused") from err


def _operate(context: dg.OpExecutionContext, ckpt: CkptResource, job: str, settings: StepSettings,
             poll: float) -> dict[str, Any]:
    """Ask for the operation and act on it here (or wait for the supervision service): launcher/upgrade.py. A retry
    of the op (the same run) finds the operation and resumes it; its refusals (nothing stopped) and failures (after
    the stop: rolled back or not) become dg.Failure, not retried: a retry would find the same end."""
    store = _store(ckpt, job)
    try:
        result = run_operation(store, ckpt.store_url, ckpt.s3_options(), settings, say=context.log.info,
                               requested_by=_launched_by(context), key=_run_key(context), poll=poll,
                               submit_hint="submit it first with the op submit_streaming_job; nothing was stopped")
    except ConflictError as err:
        raise _failure(str(err), outcome="busy") from err
    except ConfigError as err:
        raise _failure(str(err), allow_retries=False, outcome="refused") from err
    except UpgradeFailed as err:
        raise _failure(str(err), allow_retries=False, outcome="failed") from err
    context.add_output_metadata({k: v for k, v in result.items() if v is not None and k in (
        "snapshot_id", "rescaled_snapshot_id", "epoch", "batch_id", "to_version", "partitions", "restarted_by")})
    return result
