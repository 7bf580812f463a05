"""Finding the job in a user's script: the function marked ``@streaming_job`` (or named ``build``)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ckpt_provider.core.errors import ConfigError

if TYPE_CHECKING:
    from airflow_ckpt_provider.runtime.driver import JobBuilder

_marked: list[JobBuilder] = []


def streaming_job(fn: JobBuilder) -> JobBuilder:
    """Mark the function that builds the job's query: ``(spark, ctx) -> DataStreamWriter``."""
    _marked.append(fn)
    return fn


def load_builder(path: str) -> JobBuilder:
    """Run the job file (not as ``__main__``) and return its one marked build function."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"job file {path} not found: expected a Python file defining a @streaming_job function")
    _marked.clear()
    namespace = runpy.run_path(str(file), run_name="__ckpt_job__")
    found = list(_marked) or ([namespace["build"]] if callable(namespace.get("build")) else [])
    if len(found) != 1:
        names = ", ".join(getattr(f, "__name__", "?") for f in found) or "none"
        raise ConfigError(
            f"job file {path}: expected exactly one function marked @streaming_job (or one named build), "
            f"found {names}; mark the function that returns the query's DataStreamWriter"
        )
    return found[0]
