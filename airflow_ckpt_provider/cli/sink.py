"""`ckpt sink ...`: committed batches, integrity and cleanup of a ckpt-files sink path."""

from __future__ import annotations

import argparse

from airflow_ckpt_provider.cli.common import EXIT_VERIFY_FAILED, emit, s3_options, table
from airflow_ckpt_provider.core.store.progress import human_bytes, human_count


def cmd_sink_verify(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filemaintenance import verify_sink

    report = verify_sink(args.path, s3_options(args), checksums=args.checksums)
    batches = sum(len(b) for b in report.batches.values())
    orphans = f"; {human_count(len(report.orphans), 'uncommitted file')} (gc deletes them)" if report.orphans else ""
    forks = [f"  query {q}: timeline {f['timeline']} from batch {f['fork_batch']} (fork of timeline {f['parent']} at "
             f"{f['created_at']}" + (")" if f["took_effect"] else "; its first batch never committed)")
             for q, fs in report.forks.items() for f in fs]
    abandoned = [f"  query {q}: abandoned batches " + ", ".join(f"{a['batch_id']}@t{a['timeline']}" for a in items)
                 + f" ({human_count(sum(a['rows'] for a in items), 'row')}, hidden from readers, deleted by gc)"
                 for q, items in report.abandoned.items()]
    emit(args, report.to_dict(), lambda: (
        f"sink {report.url}: OK, job {report.job}, {human_count(len(report.batches), 'query', 'queries')}, "
        f"{human_count(batches, 'batch', 'batches')} shown, {human_count(report.files, 'file')}, "
        f"{human_count(report.rows, 'row')}, {human_bytes(report.bytes)}"
        + (" checksummed" if args.checksums else " (sizes only)") + orphans
        + (f"\n{human_count(len(forks), 'fork')} (restores that went back in time):\n"
           + "\n".join(forks + abandoned) if forks else "")
        if report.ok else
        f"sink {report.url}: {human_count(len(report.problems), 'problem')}\n" + "\n".join(report.problems)
    ))
    return 0 if report.ok else EXIT_VERIFY_FAILED


def cmd_sink_ls(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filelayout import sink_view

    view = sink_view(args.path, s3_options(args))
    listed = [(m, "shown") for m in view.shown] + [(m, "abandoned") for m in view.abandoned]
    if not args.all:
        listed = listed[:len(view.shown)]
    rows = [[m.query_id, str(m.batch_id), str(m.timeline), status, m.committed_at, str(len(m.files)), str(m.rows),
             human_bytes(m.total_bytes), (m.coverage or "-")[:12]] for m, status in listed]
    data = [{"query_id": m.query_id, "batch_id": m.batch_id, "timeline": m.timeline, "status": status,
             "committed_at": m.committed_at, "files": len(m.files), "rows": m.rows, "bytes": m.total_bytes,
             "offsets_digest": m.coverage, "offsets": m.offsets} for m, status in listed]
    hidden = "" if args.all or not view.abandoned else (
        f"\n{human_count(len(view.abandoned), 'batch', 'batches')} of abandoned timelines not listed (--all lists "
        "them)")
    emit(args, data, lambda: (table(rows, ["QUERY", "BATCH", "TIMELINE", "STATUS", "COMMITTED", "FILES", "ROWS",
                                             "SIZE", "OFFSETS"]) if rows else "no committed batches") + hidden)
    return 0


def cmd_sink_gc(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filemaintenance import gc_sink

    result = gc_sink(args.path, s3_options(args), older_than_s=args.older_than, dry_run=args.dry_run)
    emit(args, result.to_dict(), lambda: (
        f"{'would delete' if args.dry_run else 'deleted'} "
        f"{human_count(len(result.deleted), 'uncommitted or abandoned file')} ({human_bytes(result.deleted_bytes)}) "
        f"and the manifests of {human_count(len(result.abandoned_batches), 'abandoned batch', 'abandoned batches')}, "
        f"kept {result.kept_young} younger than {args.older_than:g} s"
    ))
    return 0


def add_sink_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ckpt sink ...`: committed batches, integrity and cleanup of a ckpt-files sink path."""
    sink = groups.add_parser("sink", help="the ckpt-files exactly-once file sink")
    ssub = sink.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (
        ("verify", cmd_sink_verify, "check every committed file: presence, size (and SHA-256); exit 3 if broken"),
        ("ls", cmd_sink_ls, "list the shown batches: query id, batch, timeline, files, rows, size, offsets digest"),
        ("gc", cmd_sink_gc, "delete uncommitted data files and abandoned batches older than --older-than seconds"),
    ):
        p = ssub.add_parser(name, help=help_)
        p.set_defaults(fn=fn)
        p.add_argument("path", help="the sink path: s3://BUCKET/PREFIX or a directory")
        p.add_argument("--endpoint-url", help="S3 endpoint URL (env AWS_ENDPOINT_URL); credentials from AWS_* env")
        p.add_argument("--region", help="S3 region (env AWS_REGION)")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.add_argument("-v", "--verbose", action="store_true", help="log every step")
        if name == "verify":
            p.add_argument("--checksums", action="store_true", help="also read every file and compare its SHA-256")
        if name == "ls":
            p.add_argument("--all", action="store_true", help="also list batches of abandoned timelines")
        if name == "gc":
            p.add_argument("--older-than", type=float, required=True,
                           help="grace in seconds: keep younger uncommitted files (longer than any batch takes)")
            p.add_argument("--dry-run", action="store_true")
