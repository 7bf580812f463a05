"""The options of the operations (an upgrade, a rescale, a restart), declared once (as the job's settings are): the
CLI's flags, the Airflow operators' arguments, the Dagster ops' config and the operation record in the job store all
come from ``UpgradeSettings`` and ``RestartStepSettings``, so they cannot drift (one stop timeout, one meaning of
``verify_batches``, one refusal of a bad value, before anything stops).

Design notes: docs/operations.md#design-notes-corepolicystepsettingspy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE, RestoreSpec, StopMode, SupervisionMode, UpgradeMode
from airflow_ckpt_provider.core.policy.settings import (
    COUNT,
    RESTORE,
    SECONDS,
    SWITCH,
    TEXT,
    Kind,
    Settings,
    mode,
    setting,
)
from airflow_ckpt_provider.core.policy.stateedit import edit_settings, parse_edit

#: More than this many partitions is taken for a typo (Spark would write a RocksDB store for each).
MAX_PARTITIONS = 10_000
#: Seconds a driver gets to answer a stop (a final savepoint uploads state), a cancel or a savepoint.
STOP_TIMEOUT = 600.0
#: The batches a verification waits for when none are asked for; a job caught up with no new input passes without.
VERIFY_BATCHES = 2

UPGRADE = "upgrade"
RESCALE = "rescale"
EDIT = "edit"  # the running code, its state edited (keys deleted, values set) through a savepoint
RESTART = "restart"
#: Seconds a restarted driver gets to run (its launch, spark-submit, a JVM, the restore).
START_TIMEOUT = 600.0
#: Seconds the wait for an operation may take beyond its steps' own timeouts (starting drivers, the actor's start).
OPERATION_GRACE = 600.0


def parse_partitions(value: object) -> int:
    """A requested partition count: a whole number in [1, MAX_PARTITIONS]; ValueError says what was found."""
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if str(value).strip() != str(n) or not 1 <= n <= MAX_PARTITIONS:
        raise ValueError(f"partitions: expected a whole number from 1 to {MAX_PARTITIONS}, found {value!r}")
    return n


def _paths(value: object) -> tuple[str, ...]:
    """Paths as a list (or a repeated flag) whose items may be comma-separated; '' is no path."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
        raise TypeError(value)
    return tuple(p.strip() for item in items for p in item.split(",") if p.strip())


PARTITIONS = Kind(f"a whole number from 1 to {MAX_PARTITIONS}", parse_partitions)
PATHS = Kind("paths (a list, or comma-separated)", _paths, ",".join, repeat=True)


@dataclass(frozen=True, kw_only=True)
class UpgradeSettings(Settings):
    """What an upgrade or a rescale is asked to do: ``job_file`` given, an upgrade (with ``partitions``: also a
    rescale); without, a rescale of the running code to ``partitions``."""

    job_file: str | None = setting(
        None, kind=TEXT, none="the running code", metavar="F",
        help="the new code: the Python file defining the job (default: the running code, for a rescale)")
    code_version: str | None = setting(
        None, kind=TEXT, none="none", metavar="V", help="the new code's version (recorded, shown in the status)")
    upgrade_mode: UpgradeMode = setting(
        UpgradeMode.SAVEPOINT, kind=mode(UpgradeMode), metavar="{savepoint,last-state,stateless}",
        help="savepoint (stop with savepoint, restore it; default), last-state (cancel, restore the latest "
        "checkpoint) or stateless (cancel, start without state)")
    partitions: int | None = setting(
        None, kind=PARTITIONS, none="keep them", metavar="N",
        help=f"rescale the state to N partitions (1-{MAX_PARTITIONS}, RocksDB state, upgrade mode savepoint)")
    allow_non_restored_state: bool = setting(
        False, kind=SWITCH, help="let the new code drop state of operators it no longer has")
    delete_keys: str | None = setting(
        None, kind=TEXT, none="none", metavar="OP:PREDICATE",
        help="edit the state in the same run: delete from operator OP the keys a Spark SQL predicate over its key "
        "columns selects (`ckpt state read` names them); checked on a copy first, applied to the stop's savepoint")
    update_values: str | None = setting(
        None, kind=TEXT, none="none", metavar="JSON",
        help="edit the state in the same run: set value columns of one table where a predicate holds, "
        "{\"table\": \"0/default\", \"where\": PREDICATE, \"set\": {\"value_<column>\": EXPRESSION}}")
    py_files: tuple[str, ...] | None = setting(
        None, kind=PATHS, none="the recorded deployment's", metavar="A,B",
        help="the new code's own Python modules (spark-submit --py-files; repeatable), instead of the recorded "
        "deployment's; default: keep those; '' ships none. A rollback ships the old ones")
    files: tuple[str, ...] | None = setting(
        None, kind=PATHS, none="the recorded deployment's", metavar="A,B",
        help="the new code's data files (spark-submit --files; repeatable), instead of the recorded deployment's; "
        "default: keep those; '' ships none")
    check_timeout: float = setting(
        600.0, kind=SECONDS, metavar="S", help="seconds for each of the restore check and the repartition "
        "(default 600)")
    stop_timeout: float = setting(
        STOP_TIMEOUT, kind=SECONDS, metavar="S",
        help=f"seconds the driver gets to stop with a savepoint or cancel (default {STOP_TIMEOUT:.0f})")
    verify_batches: int | None = setting(
        None, kind=COUNT, none=f"{VERIFY_BATCHES}, or none on a job caught up with no new input", metavar="N",
        help=f"wait for N batches of the new deployment within --verify-timeout, even if no input comes (0: none). "
        f"Default: {VERIFY_BATCHES} batches, or none on a job caught up with no new input, which is then reported "
        "as verified without a batch")
    verify_timeout: float = setting(
        300.0, kind=SECONDS, metavar="S", help="seconds for the verification, and for the rollback's (default 300)")

    def check(self) -> None:
        super().check()
        if self.partitions is not None and self.upgrade_mode is not UpgradeMode.SAVEPOINT:
            raise ConfigError(f"partitions={self.partitions} with upgrade_mode {self.upgrade_mode}: a rescale goes "
                              "through a savepoint; expected upgrade_mode savepoint. Nothing was changed")
        edit = parse_edit(self.delete_keys, self.update_values)
        if edit is not None and self.partitions is not None:
            raise ConfigError("an edit of the state (delete_keys, update_values) and partitions are separate runs: "
                              "edit first, then rescale. Nothing was changed")
        if edit is not None and self.upgrade_mode is not UpgradeMode.SAVEPOINT:
            raise ConfigError(f"an edit of the state with upgrade_mode {self.upgrade_mode}: an edit goes through a "
                              "savepoint; expected upgrade_mode savepoint. Nothing was changed")
        if self.job_file is None and self.partitions is None and edit is None:
            raise ConfigError("expected the new code's job_file (an upgrade), partitions (a rescale) or an edit of "
                              "the state (delete_keys, update_values), found none. Nothing was changed")
        if self.job_file is None and (self.py_files is not None or self.files is not None):
            raise ConfigError("py_files/files given without job_file, but a rescale keeps the running code and the "
                              "files it ships; expected none: upgrade instead (job_file with py_files/files) to "
                              "change them. Nothing was changed")
        if self.job_file is not None and not self.job_file.strip():
            raise ConfigError("job_file: expected the new code's Python file, found an empty string. Nothing was "
                              "changed")
        if self.verify_batches is not None and self.verify_batches < 0:
            raise ConfigError(f"verify_batches: expected a whole number >= 0 (0: no batch), found "
                              f"{self.verify_batches}. Nothing was changed")
        _positive(self, "check_timeout", "stop_timeout", "verify_timeout")

    @property
    def what(self) -> str:
        """upgrade, rescale or edit."""
        if self.job_file:
            return UPGRADE
        return RESCALE if self.partitions is not None else EDIT

    @property
    def edit(self) -> dict[str, str] | None:
        """The state edit asked for, as the settings that ask for it (``edit_settings``), None without one."""
        edit = parse_edit(self.delete_keys, self.update_values)
        return None if edit is None else edit_settings(edit)

    @property
    def wait_timeout(self) -> float:
        """Seconds a front-end waits for the whole operation: every step's timeout, and a grace."""
        return 2 * self.check_timeout + self.stop_timeout + 2 * self.verify_timeout + OPERATION_GRACE

    @property
    def batches(self) -> int:
        """The batches the verification waits for."""
        return VERIFY_BATCHES if self.verify_batches is None else self.verify_batches

    @property
    def require_batches(self) -> bool:
        """Wait for the batches even on a job caught up with no new input (they were asked for)."""
        return self.verify_batches is not None and self.verify_batches > 0


@dataclass(frozen=True, kw_only=True)
class RestartStepSettings(Settings):
    """What a restart of a job's last deployment is asked to do (RestartStreamingJobOperator, the Dagster restart ops,
    ``ckpt job restart``): from ``restore``, a running driver stopped first with ``stop_mode``. (RestartSettings,
    core/policy/settings.py, is the supervisor's restart strategy, not this.)"""

    restore: RestoreSpec = setting(
        LATEST_STATE, kind=RESTORE, metavar="SPEC",
        help="what the job restarts from: latest-state (default), latest-savepoint, none, or a snapshot id or URI")
    stop_mode: StopMode = setting(
        StopMode.CANCEL, kind=mode(StopMode), metavar="{cancel,savepoint}",
        help="how a running driver is stopped first: cancel (default: now; the latest checkpoint stays valid) or "
        "savepoint (a final savepoint, then the restart restores it when restore is latest-state)")
    stop_timeout: float = setting(
        STOP_TIMEOUT, kind=SECONDS, metavar="S",
        help=f"seconds the driver gets to stop with a savepoint or cancel (default {STOP_TIMEOUT:.0f})")
    start_timeout: float = setting(
        START_TIMEOUT, kind=SECONDS, metavar="S",
        help=f"seconds the restarted driver gets to run (default {START_TIMEOUT:.0f})")
    supervision: SupervisionMode = setting(
        SupervisionMode.AUTO, kind=mode(SupervisionMode), metavar="{auto,launcher,service}",
        help="who keeps the restarted job running: auto (default: as it had; the supervision service once it was "
        "handed to it), launcher (a supervisor on the host that acts on the restart) or service")

    def check(self) -> None:
        super().check()
        _positive(self, "stop_timeout", "start_timeout")

    what = RESTART
    # What the actor's shared steps read of an upgrade's settings, for a restart (launcher/upgrade.py):
    partitions = None  # no rescale
    batches = 0  # the restarted driver is verified once it runs, as a submit is
    require_batches = False

    @property
    def verify_timeout(self) -> float:
        return self.start_timeout

    @property
    def upgrade_mode(self) -> UpgradeMode:
        """The stop as an upgrade mode names it (the actor's stop step): savepoint, or last-state (a cancel)."""
        return UpgradeMode.SAVEPOINT if self.stop_mode is StopMode.SAVEPOINT else UpgradeMode.LAST_STATE

    @property
    def wait_timeout(self) -> float:
        return self.stop_timeout + self.start_timeout + OPERATION_GRACE


StepSettings = UpgradeSettings | RestartStepSettings


def _positive(settings: Settings, *names: str) -> None:
    """ConfigError naming the first of ``names`` (seconds) that is not above 0."""
    for name in names:
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{name}: expected seconds > 0, found {getattr(settings, name)}. Nothing was changed")


def step_settings(kind: str, body: dict[str, Any]) -> StepSettings:
    """An operation's settings of ``kind`` from its record (``to_json``)."""
    if kind == RESTART:
        return RestartStepSettings.from_json(body)
    return UpgradeSettings.from_json(body)
