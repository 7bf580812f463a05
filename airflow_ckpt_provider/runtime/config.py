"""What the runtime needs to run one job: a frozen config that travels to the driver as arguments."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreMode, RestoreSpec, TimeTravel
from airflow_ckpt_provider.core.policy.settings import COUNT, RESTORE, SECONDS, SWITCH, TEXT, JobSettings, setting
from airflow_ckpt_provider.core.policy.stateedit import StateEdit, parse_edit
from airflow_ckpt_provider.core.policy.stepsettings import parse_partitions
from airflow_ckpt_provider.core.store.jobstore import check_job_name

__all__ = ["RestoreMode", "RestoreSpec", "RuntimeConfig", "TimeTravel", "default_checkpoint"]


def default_checkpoint(job: str) -> str:
    """The live checkpoint's default home: a local directory, off the job store."""
    base = os.environ.get("CKPT_HOME") or str(Path.home() / ".ckpt")
    return str(Path(base, "jobs", job, "checkpoint"))


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig(JobSettings):
    """One driver's configuration: the job's settings (core/policy/settings.py) and what is per launch. The restart
    settings are the driver's too: it restarts a failed query in its own SparkSession with the same strategy.

    ``check_restore`` makes the driver only check whether the job file can restore the state that
    ``restore`` names (runtime/restore_check.py), within ``check_timeout``; state of operators the new
    query no longer has fails the check unless ``allow_non_restored_state`` (Flink's flag)."""

    job: str = setting(kind=TEXT, help="the job's name")
    store: str = setting(kind=TEXT, help="the job store: s3://BUCKET/PREFIX or a directory")
    restore: RestoreSpec = setting(
        LATEST_STATE, kind=RESTORE, help="latest-state (default), latest-savepoint, none, or a snapshot id or URI; "
        "restarts resume from latest-state once a driver reported RUNNING")
    code_version: str | None = setting(None, kind=TEXT, none="unknown",
                                       help="the code version running the query, recorded in snapshots")
    endpoint_url: str | None = setting(None, kind=TEXT, none="the default", help="the S3 endpoint")
    region: str | None = setting(None, kind=TEXT, none="the default", help="the S3 region")
    check_restore: bool = setting(
        False, kind=SWITCH, help="do not run the job: check that JOB_FILE can restore the state --restore names, on a "
        "copy (prints a CKPT_RESTORE_CHECK line; exit 0 compatible, 5 incompatible, 2 bad input)")
    allow_non_restored_state: bool = setting(
        False, kind=SWITCH,
        help="with --check-restore: state of operators the new code no longer has may be dropped")
    check_timeout: float = setting(300.0, kind=SECONDS, metavar="S",
                                   help="seconds the check's batch may take (default 300)")
    rescale_to: int | None = setting(
        None, kind=COUNT, none="unchanged", metavar="N",
        help="with --check-restore: repartition the restored copy's state into N partitions first (Spark's offline "
        "repartition, RocksDB state only) and check the job on it")
    save_rescaled: bool = setting(
        False, kind=SWITCH, help="with --rescale-to: once the check passed, save the repartitioned state as a "
        "savepoint (trigger rescale)")
    delete_keys: str | None = setting(
        None, kind=TEXT, none="none", metavar="OP:PREDICATE",
        help="with --check-restore: delete from operator OP's state the keys a Spark SQL predicate over its key "
        "columns selects (`ckpt state read` names them) on the restored copy, check the job on it and, once the "
        "check passed, save it as a new savepoint; the snapshot restored is never touched")
    update_values: str | None = setting(
        None, kind=TEXT, none="none", metavar="JSON",
        help="with --check-restore: as --delete-keys, but set value columns of one table in the rows a predicate "
        "selects: {\"table\": \"0/default\", \"where\": PREDICATE, \"set\": {\"value_<column>\": EXPRESSION}}")
    save_edited: bool = setting(
        False, kind=SWITCH, help="with --delete-keys or --update-values: once the check passed, save the edited state "
        "as a new savepoint (without: a dry run)")

    def check(self) -> None:
        check_job_name(self.job)
        if not self.store:
            raise ConfigError("no job store given: expected s3://BUCKET/PREFIX or a directory (--store)")
        if not self.checkpoint:
            object.__setattr__(self, "checkpoint", default_checkpoint(self.job))
        super().check()
        if self.check_timeout <= 0:
            raise ConfigError(f"check_timeout must be > 0 seconds, found {self.check_timeout}")
        if (self.rescale_to is not None or self.save_rescaled) and not self.check_restore:
            raise ConfigError("--rescale-to and --save-rescaled go with --check-restore (a rescale runs on a copy of "
                              "the state, never on the live checkpoint); `ckpt job rescale` runs the whole rescale")
        if self.delete_keys is not None or self.update_values is not None:
            if not self.check_restore:
                raise ConfigError("--delete-keys and --update-values go with --check-restore (state is edited on a "
                                  "copy of a snapshot, never on the live checkpoint); `ckpt state delete|update` runs "
                                  "the whole edit")
            if self.rescale_to is not None:
                raise ConfigError("an edit of the state (--delete-keys, --update-values) and --rescale-to are separate "
                                  "steps: edit first, then rescale the savepoint the edit saved")
            if self.delete_keys is not None and self.update_values is not None:
                raise ConfigError("--delete-keys and --update-values are separate edits: expected one, found both")
            self.state_edit()
        elif self.save_edited:
            raise ConfigError("--save-edited needs --delete-keys or --update-values: the edit to save")
        if self.save_rescaled and self.rescale_to is None:
            raise ConfigError("--save-rescaled needs --rescale-to N: the partitions to save the state with")
        if self.rescale_to is not None:
            try:
                parse_partitions(self.rescale_to)
            except ValueError as err:
                raise ConfigError(str(err)) from None

    def state_edit(self) -> StateEdit | None:
        """The edit of the checked copy's state (--delete-keys, --update-values), None without one."""
        return parse_edit(self.delete_keys, self.update_values)

    @property
    def live_checkpoint(self) -> str:
        """The live checkpoint's location (``checkpoint``, defaulted on construction)."""
        return self.checkpoint or default_checkpoint(self.job)

    def restore_spec(self) -> RestoreSpec:
        return self.restore

    def to_args(self) -> list[str]:
        """Command-line arguments that ``from_args`` turns back into this config."""
        return self.to_argv(first=("job", "store"))

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        p = parser or argparse.ArgumentParser(prog="ckpt-driver", description="Run a job under the ckpt runtime.")
        cls.add_flags(p)
        return p

    @classmethod
    def from_args(cls, argv: Sequence[str]) -> RuntimeConfig:
        return cls.from_namespace(cls.parser().parse_args(list(argv)))
