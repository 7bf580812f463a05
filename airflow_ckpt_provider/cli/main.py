"""`ckpt`: the command line over the core, for humans (tables) and scripts (--json)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from importlib import metadata
from typing import Any, TextIO

from airflow_ckpt_provider import __version__
from airflow_ckpt_provider.cli.common import EXIT_ERROR, EXIT_VERIFY_FAILED
from airflow_ckpt_provider.cli.job import add_job_commands
from airflow_ckpt_provider.cli.kafka import add_kafka_commands
from airflow_ckpt_provider.cli.metrics import add_metrics_commands
from airflow_ckpt_provider.cli.recipe import add_recipe_command
from airflow_ckpt_provider.cli.run import add_run_command
from airflow_ckpt_provider.cli.service import add_service_commands
from airflow_ckpt_provider.cli.sink import add_sink_commands
from airflow_ckpt_provider.cli.snapshot import add_snapshot_commands
from airflow_ckpt_provider.cli.state import add_state_commands
from airflow_ckpt_provider.core.errors import CkptError

__all__ = ["EXIT_ERROR", "EXIT_VERIFY_FAILED", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt", description=__doc__)
    parser.add_argument("--version", action=_VersionAction, help="print the versions of ckpt, pyspark and Airflow")
    groups = parser.add_subparsers(dest="group", required=True)
    add_snapshot_commands(groups)
    add_state_commands(groups)
    add_job_commands(groups)
    add_kafka_commands(groups)
    add_sink_commands(groups)
    add_run_command(groups)
    add_service_commands(groups)
    add_recipe_command(groups)
    add_metrics_commands(groups)
    return parser


def version_line() -> str:
    """``ckpt 0.1.0 (pyspark 4.3.0, apache-airflow 3.3.2)``: from the installed distributions' metadata, without
    importing pyspark or Airflow (the CLI never imports Airflow)."""
    def installed(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"ckpt {__version__} (pyspark {installed('pyspark')}, apache-airflow {installed('apache-airflow')})"


class _VersionAction(argparse.Action):
    """``--version``: argparse's own, with the line built only when asked (it reads package metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def _warn_plainly(message: Warning | str, category: type[Warning], filename: str, lineno: int,  # noqa: PLR0917 -- warnings.showwarning's signature
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line for a person at a terminal (no source location)."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    # An old spelling of a mode or setting (core/policy/modes.py) still works and says what to write instead; Python
    # hides DeprecationWarning outside __main__, so the command shows its own.
    with warnings.catch_warnings():
        warnings.simplefilter("default", DeprecationWarning)
        warnings.showwarning = _warn_plainly
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.fn(args))
    except CkptError as err:
        return _fail(args, type(err).__name__, str(err))
    except OSError as err:  # local files: a missing path, no permission, a full disk
        return _fail(args, type(err).__name__, f"{err.strerror or err} ({err.filename or 'no file name'}); check "
                     "the path and its permissions")


def _fail(args: argparse.Namespace, kind: str, message: str) -> int:
    """A failed command: ``error: MESSAGE`` on stderr, or with ``--json`` ``{"error": {"type", "message",
    "exit_code"}}`` on stdout, where a script reads the result. Returns the exit code."""
    if getattr(args, "json", False):
        print(json.dumps({"error": {"type": kind, "message": message, "exit_code": EXIT_ERROR}}, indent=2,
                         sort_keys=True))
    else:
        print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR
