"""``ckpt job rescale``: the rescale of a recorded deployment from a terminal, one step after another.

The same steps as RescaleStreamingJobOperator (operators/upgrade.py), in the foreground: each waits here
instead of in Airflow's triggerer, and each says what it does on one line.

1. check: the job's code runs on a copy of its latest state repartitioned into N partitions (refused here,
   before anything stops: stateless, HDFS-backed state, the same count, Spark's own refusal);
2. stop with savepoint S;
3. repartition S on a copy and save it as savepoint R (trigger ``rescale``), once the job's empty batch ran
   on it;
4. start the deployment from R and verify ``verify_batches`` batches;
5. anything failing after the stop: R disposed, the deployment started again from S (the old partitions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from airflow_ckpt_provider.core.control import Ack, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.deployments import Launch, mark_stable, read_launch
from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.faults import crash_point
from airflow_ckpt_provider.core.health import HealthCriteria
from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.jobview import JobView, check_can_request, observe
from airflow_ckpt_provider.core.manifest import Kind
from airflow_ckpt_provider.core.modes import LATEST_STATE, RestoreMode, RestoreSpec
from airflow_ckpt_provider.core.rescaling import snapshot_problem, stopped_source
from airflow_ckpt_provider.core.snapshots import dispose_snapshot, latest_completed, list_snapshots
from airflow_ckpt_provider.core.storage import S3Options
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.launcher.deploy import launch, submit_spec
from airflow_ckpt_provider.launcher.restorecheck import check_restore, check_spec
from airflow_ckpt_provider.runtime.restoreverdict import RestoreCheck

log = logging.getLogger(__name__)


class RescaleFailed(CkptError):
    """The rescale failed after the job stopped; the message says where the job is now (rolled back or not).
    ``rescaled``: the savepoint of the new partitions, if it was saved."""

    def __init__(self, message: str, rescaled: str | None = None) -> None:
        super().__init__(message)
        self.rescaled = rescaled


@dataclass(frozen=True)
class RescaleOptions:
    partitions: int
    check_timeout: float = 600.0
    stop_timeout: float = 300.0
    verify_batches: int = 2
    verify_timeout: float = 300.0
    poll: float = 1.0


class JobRescale:
    """One rescale of ``store``'s job; ``run()`` returns the result or raises ConfigError (refused, nothing
    changed) or RescaleFailed (after the stop; rolled back when possible)."""

    def __init__(self, store: JobStore, store_url: str, s3: S3Options | None, options: RescaleOptions, *,
                 say: Callable[[str], None], launched_by: str) -> None:
        self.store, self.store_url, self.s3, self.options = store, store_url, s3, options
        self.say, self.launched_by = say, launched_by
        self.job = store.job

    def run(self) -> dict[str, Any]:
        n = self.options.partitions
        old = read_launch(self.store)
        if old is None:
            raise ConfigError(f"job {self.job} has no recorded deployment (spec/last.json): `ckpt job rescale` "
                              "restarts the job as it was launched, so it must have been launched by an operator or "
                              "`ckpt job rescale` before. For a job you run yourself: stop it with a savepoint, then "
                              "`ckpt run ... --check-restore --restore SAVEPOINT --rescale-to N --save-rescaled`, and "
                              "start it from the savepoint that prints")
        view = observe(self.store)
        if not view.live:  # stopped: rescale from its final savepoint, or finish a rescale that was interrupted
            return self._stopped(old, view)
        status = check_can_request(view, RequestAction.STOP)  # running, or refused here
        latest = latest_completed(list_snapshots(self.store))
        problem = snapshot_problem(latest, n) if latest is not None else None
        if problem:  # the same count, no state, HDFS-backed: known from the manifest, no Spark needed
            raise self._refused(f"snapshot {latest.snapshot_id if latest else '-'}: {problem}")
        if latest is None:
            self.say(f"1/5 job {self.job} has no snapshot to check against: taking a savepoint (it keeps running)")
            self._request(RequestAction.SAVEPOINT, status.epoch)
        self.say(f"1/5 checking that {old.deployment.job_file} runs on its latest state repartitioned into {n} "
                 "partitions (on a copy)")
        try:
            checked = self._check(old, LATEST_STATE, save=False)
        except ConfigError as err:  # bad input: Spark or the check refused
            raise self._refused(err) from err
        if not checked.compatible:
            raise self._refused(f"{checked.outcome.value}: {checked.reason}")
        self.say(f"1/5 compatible: snapshot {checked.snapshot_id} (batch {checked.batch_id}) in {n} partitions, "
                 f"{checked.seconds} s")
        status = check_can_request(observe(self.store), RequestAction.STOP)  # it may have changed meanwhile
        self.say(f"2/5 stopping the driver of epoch {status.epoch} with a savepoint")
        ack = self._request(RequestAction.STOP, status.epoch)
        source = ack.snapshot_id
        assert source is not None  # _request checked it
        self.say(f"2/5 stopped with savepoint {source} at batch {ack.batch_id}")
        crash_point("rescale.after-stop")
        return self._rescale_or_roll_back(old, source)

    def _rescale_or_roll_back(self, old: Launch, source: str, rescaled: str | None = None) -> dict[str, Any]:
        try:
            return self._rescale(old, source, rescaled)
        except RescaleFailed as err:
            return self._roll_back(old, source, err)

    def _stopped(self, old: Launch, view: JobView) -> dict[str, Any]:
        """A stopped job: rescale it from the savepoint it stopped with and start it on the new partitions
        (core/rescaling.stopped_source decides)."""
        try:
            start = stopped_source(view.status, list_snapshots(self.store, Kind.SAVEPOINT), self.options.partitions)
        except ConfigError as err:
            raise self._refused(err, stopped=True) from err
        self.say(start.describe(self.options.partitions))
        return self._rescale_or_roll_back(old, start.source.snapshot_id,
                                          start.rescaled.snapshot_id if start.rescaled else None)

    def _refused(self, why: object, *, stopped: bool = False) -> ConfigError:
        return ConfigError(f"rescale of job {self.job} to {self.options.partitions} partitions refused before anything "
                           f"was stopped: {why}; " + ("nothing was changed" if stopped else "the job runs as before"))

    def _request(self, action: RequestAction, epoch: int) -> Ack:
        """A savepoint or stop with savepoint of the driver of ``epoch``, completed with its snapshot."""
        request = submit_request(self.store, action, epoch, requested_by=self.launched_by)
        ack = wait_ack(self.store, request.id, self.options.stop_timeout, poll=self.options.poll)
        if ack is None or ack.outcome is not Outcome.COMPLETED or not ack.snapshot_id:
            why = "no answer" if ack is None else f"{ack.outcome.value}: {ack.message}"
            if action is RequestAction.SAVEPOINT:
                raise self._refused(f"the savepoint to check against did not complete ({why})")
            raise RescaleFailed(f"rescale of job {self.job}: the stop with savepoint did not complete ({why}); the "
                                f"stop may still be under way: check `ckpt job status --job {self.job}`; nothing "
                                "was repartitioned")
        return ack

    def _check(self, old: Launch, restore: RestoreSpec, *, save: bool) -> RestoreCheck:
        spec = check_spec(submit_spec(old.deployment, self.job, self.store_url, restore, self.s3,
                                      check_restore=True, rescale_to=self.options.partitions,
                                      save_rescaled=save),
                          self.options.check_timeout)
        return check_restore(spec, self.options.check_timeout, env=old.deployment.env)

    def _rescale(self, old: Launch, source: str, rescaled: str | None) -> dict[str, Any]:
        n = self.options.partitions
        if rescaled is None:
            self.say(f"3/5 repartitioning savepoint {source} into {n} partitions on a copy")
            try:
                report = self._check(old, RestoreSpec(RestoreMode.SNAPSHOT, source), save=True)
            except ConfigError as err:
                raise RescaleFailed(str(err)) from err
            if not report.compatible or not report.rescaled_snapshot_id:
                raise RescaleFailed(f"the rescale of savepoint {source}: {report.outcome.value}: {report.reason}")
            rescaled = report.rescaled_snapshot_id
            self.say(f"3/5 saved savepoint {rescaled} ({n} partitions) in {report.seconds} s")
            crash_point("rescale.after-save")
        self.say(f"4/5 starting {old.deployment.job_file} from {rescaled}")
        try:
            record = self._start(old, RestoreSpec(RestoreMode.SNAPSHOT, rescaled))
            crash_point("rescale.after-start")
            event = self._verify(record)
        except CkptError as err:
            raise RescaleFailed(f"{err}", rescaled) from err
        if event.get("status") != "healthy":
            raise RescaleFailed(f"the job on {n} partitions failed verification: {event.get('message')}", rescaled)
        mark_stable(self.store, record)
        self.say(f"4/5 verified: epoch {event.get('epoch')} at batch {event.get('batch_id')}, {n} partitions")
        return {"job": self.job, "partitions": n, "snapshot_id": source, "rescaled_snapshot_id": rescaled,
                "epoch": event.get("epoch"), "batch_id": event.get("batch_id")}

    def _start(self, old: Launch, restore: RestoreSpec) -> Launch:
        return launch(self.store, old.deployment, restore=restore, store_url=self.store_url, s3=self.s3,
                      launched_by=self.launched_by)

    def _verify(self, record: Launch, *, batches: int | None = None) -> dict[str, Any]:
        timeout = self.options.verify_timeout
        criteria = HealthCriteria(started_after=record.launched_at, start_timeout=timeout, max_restarts=1,
                                  health_window=timeout,
                                  min_batches=self.options.verify_batches if batches is None else batches)
        watch = JobHealthWatch(self.store, criteria)
        deadline = time.monotonic() + timeout
        while (event := watch.poll()) is None:
            if time.monotonic() >= deadline:
                return {"status": "timeout", "message": f"no verdict within {timeout:.0f} s: {watch.waiting_for()}"}
            time.sleep(self.options.poll)
        return event

    def _roll_back(self, old: Launch, source: str, failure: RescaleFailed) -> NoReturn:
        why, rescaled = str(failure), failure.rescaled
        if rescaled:  # a restore strategy must not pick the new partitions up again (the newest savepoint)
            try:
                dispose_snapshot(self.store, rescaled, force=True)
            except CkptError as dispose_err:
                log.warning("job %s: savepoint %s (the new partitions) was not disposed: %s", self.job, rescaled,
                            dispose_err)
        self.say(f"5/5 rolling back: starting {old.deployment.job_file} from {source} (the old partitions): {why}")
        record = self._start(old, RestoreSpec(RestoreMode.SNAPSHOT, source))
        event = self._verify(record, batches=0)
        if event.get("status") != "healthy":
            raise RescaleFailed(f"rescale of job {self.job} failed ({why}) and the rollback from {source} ALSO failed "
                                f"({event.get('message')}); the job's state is in savepoint {source}: check `ckpt "
                                f"job status --job {self.job}`")
        raise RescaleFailed(f"rescale of job {self.job} to {self.options.partitions} partitions failed ({why}); rolled "
                            f"back: the job runs on its old partitions from savepoint {source} (epoch "
                            f"{event.get('epoch')})")
