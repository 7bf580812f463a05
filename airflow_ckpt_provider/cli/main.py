"""`ckpt`: the command line over the core, for humans (tables) and scripts (--json)."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from airflow_ckpt_provider.cli.common import EXIT_ERROR, EXIT_VERIFY_FAILED
from airflow_ckpt_provider.cli.job import add_job_commands
from airflow_ckpt_provider.cli.kafka import add_kafka_commands
from airflow_ckpt_provider.cli.run import add_run_command
from airflow_ckpt_provider.cli.sink import add_sink_commands
from airflow_ckpt_provider.cli.snapshot import add_snapshot_commands
from airflow_ckpt_provider.core.errors import CkptError

__all__ = ["EXIT_ERROR", "EXIT_VERIFY_FAILED", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt", description=__doc__)
    groups = parser.add_subparsers(dest="group", required=True)
    add_snapshot_commands(groups)
    add_job_commands(groups)
    add_kafka_commands(groups)
    add_sink_commands(groups)
    add_run_command(groups)
    return parser


def _warn_plainly(message: Warning | str, category: type[Warning], filename: str, lineno: int,  # noqa: PLR0917 -- warnings.showwarning's signature
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line for a person at a terminal (no source location)."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    # An old spelling of a mode or setting (core/modes.py) still works and says what to write instead; Python
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
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as err:  # local files: a missing path, no permission, a full disk
        print(f"error: {err.strerror or err} ({err.filename or 'no file name'}); check the path and "
              "its permissions", file=sys.stderr)
        return EXIT_ERROR
