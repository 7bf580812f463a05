"""What the `ckpt` commands share: the job store and S3 flags, output as a table or JSON, exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.store.jobstore import JobStore, split_snapshot_ref
from airflow_ckpt_provider.core.store.storage import S3Options

EXIT_ERROR = 1
EXIT_VERIFY_FAILED = 3


def s3_options(args: argparse.Namespace) -> S3Options:
    return S3Options.from_env(args.endpoint_url, args.region)


def open_job_store(args: argparse.Namespace) -> JobStore:
    if not args.store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE")
    if not args.job:
        raise ConfigError("no job given: pass --job NAME or set CKPT_JOB")
    return JobStore.open(args.store, args.job, s3_options(args))


def store_and_snapshot(args: argparse.Namespace) -> tuple[JobStore, str]:
    """Accept a snapshot id, or its full URI ``<root>/<job>/snapshots/<id>`` as printed by create
    (also a relative path such as ``../../jobs/orders/snapshots/<id>``, normalised)."""
    ref = args.snapshot.strip().rstrip("/")
    root, job, snapshot_id = split_snapshot_ref(ref)
    if root is None or job is None:
        return open_job_store(args), snapshot_id
    if args.job and args.job != job:
        raise ConfigError(
            f"snapshot {ref} belongs to job {job!r}, not to job {args.job!r}: restoring another job's "
            f"state into this job is refused; pass --job {job} if that is really meant"
        )
    if "://" not in root and not os.path.isdir(os.path.join(root, job)):
        raise ConfigError(
            f"snapshot reference {ref} is a local path, and the job store directory it names, "
            f"{os.path.join(root, job)}, does not exist: expected ROOT/JOB/snapshots/ID with ROOT/JOB a job store "
            "directory; pass the URI `ckpt snapshot create` printed (e.g. s3://BUCKET/PREFIX/JOB/snapshots/ID), "
            "or the id with --store and --job"
        )
    return JobStore.open(root, job, s3_options(args)), snapshot_id


def emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else human())


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def progress(line: str) -> None:
    """Progress of long transfers (files, bytes, rate) goes to stderr; results go to stdout."""
    print(line, file=sys.stderr, flush=True)


@contextmanager
def transfer_report(stream: TextIO | None = None) -> Iterator[Callable[[str], None]]:
    """Where a long transfer reports: a progress bar when ``stream`` (stderr) is a terminal, else ``progress``'s
    lines (every few seconds, and a last one), as in a log."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield progress
        return
    from rich.console import Console

    from airflow_ckpt_provider.cli.progressbar import TransferBar  # rich only for a terminal

    with TransferBar(Console(file=stream)) as bar:
        yield bar


def add_store_args(p: argparse.ArgumentParser, *, job: bool = True) -> None:
    p.add_argument("--store", default=os.environ.get("CKPT_STORE"),
                   help="job store root: s3://BUCKET/PREFIX or a directory (env CKPT_STORE)")
    if job:
        p.add_argument("--job", default=os.environ.get("CKPT_JOB"), help="job name (env CKPT_JOB)")
    p.add_argument("--endpoint-url", help="S3 endpoint URL (env AWS_ENDPOINT_URL); credentials from AWS_* env")
    p.add_argument("--region", help="S3 region (env AWS_REGION)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
