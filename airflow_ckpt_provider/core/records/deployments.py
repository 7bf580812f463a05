"""Launch records: what ran for a job and how each launch ended, kept in the job store.

```
<root>/<job>/spec/last.json     the deployment launched last (written BEFORE it is launched), and its end
<root>/<job>/spec/stable.json   the last deployment verified healthy (an upgrade's target)
```

launcher/deploy.py launches deployments; the supervisor, the driver, the watches and the operators read
these records. Pure data and job store IO: no Spark, no Airflow.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.modes import RestoreSpec
from airflow_ckpt_provider.core.policy.settings import JobSettings
from airflow_ckpt_provider.core.records.base import Record, record_fields
from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, SPEC_STABLE, JobStore

#: Tells the supervisor its launch id: it does not restart a driver once a newer launch is recorded.
LAUNCH_ENV = "CKPT_LAUNCH_ID"
#: Names of environment variables whose values must not be stored in the job store or shown in logs.
_SECRET_ENV = re.compile(
    r"secret|pass(wd|word|phrase)?($|_)|(^|_)pwd($|_)|token|credential|private|jaas|api_?key|(^|_)o?auth($|_)"
    r"|(^|_)key($|_)", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: An OpenLineage transport given whole (``OPENLINEAGE__TRANSPORT='{"auth": {"apiKey": ...}}'``) hides its secret
#: from the names: its value is looked at too.
_SECRET_OPENLINEAGE = re.compile(r"\"(auth|api_?key|token|password|secret)\"\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class Deployment(JobSettings):
    """One version of a job: its code, how Spark runs it, and its JobSettings (core/policy/settings.py). The restore
    decision is per launch, not part of it.

    ``env`` carries the job's own settings (topic, output path...) to the driver; credentials never go
    here (they would be stored in spec/last.json): give them to the launching process's environment or
    to the cluster's secret mechanism.

    Its JSON is flat (the settings beside the code and Spark fields), as records of earlier versions are:
    keys a newer version added are ignored, missing ones take their defaults.
    """

    job_file: str
    code_version: str | None = None
    master: str = "local[2]"
    deploy_mode: str = "client"
    conf: dict[str, str] = field(default_factory=dict)
    py_files: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    spark_submit: str | None = None
    python_env: str = "auto"  # the executors' Python: auto, ship, none or an archive (launcher/pyenv.py)
    env: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        super().check()
        if not self.job_file:
            raise ConfigError("a deployment needs a job file: the Python file defining the @streaming_job function")
        for name in self.env:
            if not _ENV_NAME.match(name):
                raise ConfigError(f"invalid environment variable name {name!r} in env: expected letters, digits, _")
            secret_value = name.startswith("OPENLINEAGE") and _SECRET_OPENLINEAGE.search(self.env[name])
            if _SECRET_ENV.search(name) or secret_value:
                raise ConfigError(
                    f"refusing env {name}{' (its value holds credentials)' if secret_value else ''}: a deployment's "
                    "env is stored in the job store (spec/last.json); give credentials to the launching process's "
                    "environment (e.g. the Airflow worker's) or the cluster's secret mechanism instead"
                )

    def to_dict(self) -> dict[str, Any]:
        return self.to_json()

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Deployment:
        lists = {name: tuple(body[name]) for name in ("py_files", "files") if body.get(name) is not None}
        return cls.from_json(body, **lists)

    def with_code(self, job_file: str, code_version: str | None, *, py_files: Sequence[str] | None = None,
                  files: Sequence[str] | None = None) -> Deployment:
        """The same deployment running other code (an upgrade's target); ``py_files`` and ``files`` replace the
        recorded ones when given (new code may need other helper modules), None keeps them."""
        return replace(self, job_file=job_file, code_version=code_version,
                       py_files=self.py_files if py_files is None else tuple(py_files),
                       files=self.files if files is None else tuple(files))


_ENCODER = msgspec.json.Encoder(order="sorted")


class Launch(Record, frozen=True):
    """One start of a deployment (``launch_id``): the deployment (its code, Spark and settings), what its driver
    restores (``restore``), who launched it when and where (``pid`` and ``log_file`` of its supervisor on ``host``)
    and, once its supervisor ended, how (``ending``, ``exit_code``, ``end_reason``: waiters stop waiting for a driver).
    Written to spec/last.json by launcher/deploy.py before the launch, its end by the supervisor (``record_end``,
    compare-and-swap), and to spec/stable.json once an upgrade verified it (``mark_stable``); read by the
    supervisor, the health watch, the job view, the upgrade and rescale steps and the operators. ``restore`` is
    written as its spelling (latest-state, latest-savepoint, none, or a snapshot id or URI); ``deployment`` as one
    flat object, the code and Spark fields beside the settings (docs/development.md, "Settings")."""

    WHAT = "deployment record"
    KEY = "spec/last.json, spec/stable.json"

    job: str
    deployment: Deployment
    restore: RestoreSpec  # a record's text is parsed on construction
    launched_at: float
    launched_by: str
    launch_id: str
    pid: int | None = None
    host: str | None = None
    log_file: str | None = None
    # The run that asked for it, the same for every try of one Airflow task run or Dagster op: a retry finds its launch.
    key: str = ""
    # Written by its supervisor when it ends (launcher/supervisor.py): waiters stop waiting for a driver.
    ended_at: float | None = None
    ending: str | None = None
    exit_code: int | None = None
    end_reason: str | None = None

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "restore", RestoreSpec.parse(self.restore))

    def to_dict(self) -> dict[str, Any]:
        return {**record_fields(self), "restore": str(self.restore)}  # its spelling, as it is written

    def to_bytes(self) -> bytes:
        return _ENCODER.encode({**self.to_dict(), self.version_key(): self.written_schema()})

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "restore": RestoreSpec.parse(body.get("restore"))} if "restore" in body else body


def new_launch_id(now: float | None = None) -> str:
    """A launch id: its UTC start time (so ids sort by time) and 6 random hex digits."""
    at = time.time() if now is None else now
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(at))}-{secrets.token_hex(3)}"


def read_launch(store: JobStore, key: str = SPEC_LAST) -> Launch | None:
    try:
        data = store.storage.read(key)
    except FileNotFoundError:
        return None
    return Launch.from_bytes(data, store.storage.uri(key))


def record_end(store: JobStore, launch_id: str, *, ending: str, exit_code: int, reason: str) -> bool:
    """Record in spec/last.json how launch ``launch_id`` ended, unless a newer launch replaced it meanwhile
    (compare-and-swap); True if recorded."""
    current = store.storage.read_versioned(SPEC_LAST)
    if current is None:
        return False
    last = Launch.from_bytes(current.data, store.storage.uri(SPEC_LAST))
    if last.launch_id != launch_id:
        return False
    ended = msgspec.structs.replace(last, ended_at=time.time(), ending=ending, exit_code=exit_code, end_reason=reason)
    return store.storage.write_if(SPEC_LAST, ended.to_bytes(), current.tag)


def mark_stable(store: JobStore, launch: Launch) -> None:
    """Record ``launch`` as the last verified deployment: what a rollback returns to."""
    store.storage.write(SPEC_STABLE, launch.to_bytes())
