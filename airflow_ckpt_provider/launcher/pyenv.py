"""The Python that executors run on a cluster, shipped with the job instead of assumed on the nodes.

Design notes: docs/cluster.md#design-notes-launcherpyenvpy."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from airflow_ckpt_provider.core.errors import ConfigError

log = logging.getLogger(__name__)

#: What executors import: the ckpt-kafka source and writer (its transaction-end lock: filelock), the sinks (their
#: records: msgspec), the state and Arrow exchange of PySpark.
EXECUTOR_REQUIREMENTS = (
    "pandas", "pyarrow", "confluent-kafka", "boto3", "tenacity", "protobuf", "msgspec", "filelock",
)
#: The directory each container unpacks the archive into (``--archives ENV#ALIAS``).
ALIAS = "ckpt-env"
#: ``python_env`` values besides the path or URI of an archive the user packed.
AUTO, SHIP, NONE = "auto", "ship", "none"
_PACKAGE = Path(__file__).absolute().parent.parent


def cache_dir() -> Path:
    """``$CKPT_ENV_CACHE``, else ``$XDG_CACHE_HOME/airflow-ckpt-provider``, else ``~/.cache/...``."""
    explicit = os.environ.get("CKPT_ENV_CACHE")
    if explicit:
        return Path(explicit).absolute()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "airflow-ckpt-provider").absolute()


@dataclass(frozen=True)
class ShippedEnv:
    """The archive and code zip one job ships. ``given``: the archive is the user's (``--python-env PATH_OR_URI``),
    shipped as it is and never built here; else this provider builds it into its cache. ``built`` says whether
    the provider built both already (no build needed); never for a given archive."""

    archive: str
    py_files: tuple[str, ...]
    requirements: tuple[str, ...] = ()  # name==version pins of the provider's dependencies
    requirements_file: str | None = None  # the job's own, installed with ``-r`` (pip's whole format)
    base_python: str = ""
    given: bool = False

    @property
    def python(self) -> str:
        """``spark.pyspark.python``: the interpreter inside the unpacked archive, relative to the container."""
        return f"./{ALIAS}/bin/python"

    @property
    def built(self) -> bool:
        return not self.given and all(Path(p).is_file() for p in (self.archive, *self.py_files))

    def driver_dir(self, python: str) -> str:
        """A working directory for a driver running here (client mode) where ``./ckpt-env`` is ``python``'s
        environment: Spark starts the Python workers of the driver itself (planning a Python data source's
        reads) with the same ``spark.pyspark.python`` as the executors' and resolves it against its cwd."""
        root = Path(python).parent.parent  # a venv's root: pyvenv.cfg is found through the linked directory
        if not (root / "bin" / "python").exists():
            raise ConfigError(f"cannot run a driver with {python} next to a shipped environment: expected "
                              f"{root}/bin/python (a virtual environment's layout); run ckpt from a venv")
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
        workdir = cache_dir() / f"driver-{digest}"
        link = workdir / ALIAS
        if not link.is_symlink():
            workdir.mkdir(parents=True, exist_ok=True)
            tmp = workdir / f".{ALIAS}.{uuid.uuid4().hex}"
            tmp.symlink_to(root, target_is_directory=True)
            tmp.replace(link)  # atomic: a racing launch finds the link or its own
        return str(workdir)

    def ensure(self) -> ShippedEnv:
        """Build what is missing (the environment takes seconds to a minute, once per key); returns self."""
        for path in self.py_files:
            if not Path(path).is_file():
                _zip_package(Path(path))
        if "://" not in self.archive and not Path(self.archive).is_file():
            if not self.base_python:
                raise ConfigError(f"python environment {self.archive} not found: expected a packed venv "
                                  "(venv-pack) at that path; build it or pass --python-env ship")
            _build_env(Path(self.archive), self.requirements, self.requirements_file, self.base_python)
        return self


def plan(python_env: str, master: str, *, requirements_file: str | None = None,
         cache: Path | None = None) -> ShippedEnv | None:
    """What to ship for ``python_env`` on ``master``, without building anything (dry runs print it).

    ``auto`` ships on cluster masters and not on ``local[N]`` (executors there run this interpreter);
    ``ship`` always; ``none`` never (the nodes' own python3, or ``spark.pyspark.python`` from --conf);
    anything else is an archive the user packed (a path, or a URI the cluster reads such as s3a://).
    """
    if python_env == NONE or (python_env == AUTO and master.startswith("local")):
        return None
    cache = cache or cache_dir()
    code = cache / f"ckpt-provider-{_package_digest()}.zip"
    if python_env not in (AUTO, SHIP):
        if "://" in python_env:
            return ShippedEnv(archive=python_env, py_files=(str(code),), given=True)
        if not Path(python_env).is_file():
            raise ConfigError(f"--python-env {python_env}: expected auto, ship, none or a packed environment "
                              "(a .tar.gz made by venv-pack, or a URI the cluster can read), found no such file")
        return ShippedEnv(archive=str(Path(python_env).absolute()), py_files=(str(code),), given=True)
    own = _read_requirements(requirements_file) if requirements_file else b""
    base = _base_python()
    pins = pinned(EXECUTOR_REQUIREMENTS)
    key = hashlib.sha256("\n".join([sys.version, platform.machine(), base, *pins, "--"]).encode() + own)
    archive = cache / f"ckpt-env-{key.hexdigest()[:16]}.tar.gz"
    return ShippedEnv(archive=str(archive), py_files=(str(code),), requirements=tuple(pins),
                      requirements_file=str(Path(requirements_file).absolute()) if requirements_file else None,
                      base_python=base)


def _read_requirements(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"--requirements {path}: cannot read it ({err}); expected a pip requirements file "
                          "with the job's own dependencies") from err


def _base_python() -> str:
    """The interpreter the packed venv links to: this venv's base (the nodes need it at the same path)."""
    return os.environ.get("CKPT_ENV_BASE_PYTHON") or str(Path(getattr(sys, "_base_executable", sys.executable)))


def pinned(names: Sequence[str]) -> list[str]:
    """``name==version`` for ``names`` and everything they require, as installed in this interpreter."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = _normal(name)
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as err:
            raise ConfigError(f"cannot ship {name}: it is not installed here; install it (pip install {name}) "
                              "so the executors get the same version as the driver") from err
        seen[key] = f"{dist.metadata['Name']}=={dist.version}"
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=str.lower)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _package_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _zip_package(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(_PACKAGE.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, Path(_PACKAGE.name, path.relative_to(_PACKAGE)))
    tmp.replace(target)  # never a partial zip under the final name
    log.info("packed this provider's code for the executors: %s (%d KB)", target, target.stat().st_size // 1024)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per key on this host; the others wait and then find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_env(archive: Path, requirements: Sequence[str], requirements_file: str | None, base_python: str) -> None:
    try:
        import venv_pack
    except ImportError as err:
        raise ConfigError("shipping the executors' Python needs venv-pack: pip install "
                          "'airflow-ckpt-provider[cluster]', or pass --python-env ARCHIVE.tar.gz / none") from err
    with _locked(archive.with_name(archive.name + ".lock")):
        if archive.is_file():
            return  # another launch built it while we waited
        started = time.monotonic()
        log.info("building the executors' Python environment (%d packages, once per lock): %s",
                 len(requirements), archive)
        with tempfile.TemporaryDirectory(prefix="ckpt-env-", dir=archive.parent) as tmp:
            prefix = Path(tmp, "venv")
            _install(prefix, [*requirements, *(["-r", requirements_file] if requirements_file else [])], base_python)
            partial = Path(tmp, archive.name)
            venv_pack.pack(prefix=str(prefix), output=str(partial), compress_level=1, verbose=False)
            partial.replace(archive)  # never a partial archive under the final name
        log.info("built the executors' Python environment in %.1f s: %s (%.0f MB)", time.monotonic() - started,
                 archive, archive.stat().st_size / 1e6)


def _install(prefix: Path, requirements: Sequence[str], base_python: str) -> None:
    """A venv at ``prefix`` with ``requirements`` (pip arguments): uv when it is on PATH (its cache makes this
    seconds). Only the command's first words reach an error message: a requirements file may hold an index URL
    with a token."""
    uv = shutil.which("uv")
    steps = ([[uv, "venv", "-q", "--python", base_python, str(prefix)],
              [uv, "pip", "install", "-q", "--python", str(prefix / "bin" / "python"), *requirements]] if uv else
             [[base_python, "-m", "venv", str(prefix)],
              [str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", *requirements]])
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"building the executors' Python environment failed: {' '.join(argv[:4])} ... "
                              f"exited with {done.returncode}: {done.stderr.strip()[-800:]}; expected the "
                              "requirements to install from the package index this host uses")
