"""`ckpt`: the command line over the core, for humans (tables) and scripts (--json)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from airflow_ckpt_provider.cli_job import add_job_commands
from airflow_ckpt_provider.cli_run import add_run_command
from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.jobstore import JobStore, split_snapshot_ref
from airflow_ckpt_provider.core.manifest import Kind, Manifest, Trigger, parse_enum
from airflow_ckpt_provider.core.progress import human_bytes
from airflow_ckpt_provider.core.storage import S3Options, open_storage

log = logging.getLogger("airflow_ckpt_provider.cli")

EXIT_ERROR = 1
EXIT_VERIFY_FAILED = 3


def _s3_options(args: argparse.Namespace) -> S3Options:
    return S3Options.from_env(args.endpoint_url, args.region)


def _store(args: argparse.Namespace) -> JobStore:
    if not args.store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE")
    if not args.job:
        raise ConfigError("no job given: pass --job NAME or set CKPT_JOB")
    return JobStore.open(args.store, args.job, _s3_options(args))


def _store_and_snapshot(args: argparse.Namespace) -> tuple[JobStore, str]:
    """Accept a snapshot id, or its full URI ``<root>/<job>/snapshots/<id>`` as printed by create
    (also a relative path such as ``../../jobs/orders/snapshots/<id>``, normalised)."""
    ref = args.snapshot.strip().rstrip("/")
    root, job, snapshot_id = split_snapshot_ref(ref)
    if root is None or job is None:
        return _store(args), snapshot_id
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
    return JobStore.open(root, job, _s3_options(args)), snapshot_id


def _emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else human())


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _row(m: Manifest) -> list[str]:
    return [m.snapshot_id, m.kind.value, m.trigger.value, str(m.batch_id), m.created_at,
            str(len(m.files)), human_bytes(m.total_bytes)]


# -- snapshot commands -------------------------------------------------------------------------


def cmd_create(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots import create_snapshot

    result = create_snapshot(
        _store(args),
        open_storage(args.checkpoint, _s3_options(args)),
        kind=parse_enum(Kind, args.kind),
        trigger=parse_enum(Trigger, args.trigger),
        batch_id=args.batch,
        code_version=args.code_version,
        report=_progress,
    )
    d = result.to_dict()
    _emit(args, d, lambda: (
        f"created {d['kind']} {d['snapshot_id']} at batch {d['batch_id']}: {d['files']} files, "
        f"{human_bytes(d['bytes'])}; uploaded {d['uploaded_files']} files "
        f"({human_bytes(d['uploaded_bytes'])}), reused {d['reused_files']} in {d['seconds']} s\n{d['uri']}"
    ))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots import list_snapshots

    kind = parse_enum(Kind, args.kind) if args.kind else None
    manifests = list_snapshots(_store(args), kind)
    header = ["ID", "KIND", "TRIGGER", "BATCH", "CREATED", "FILES", "SIZE"]
    _emit(args, [m.summary() for m in manifests],
          lambda: _table([_row(m) for m in manifests], header) if manifests else "no snapshots")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots import load_manifest

    store, snapshot_id = _store_and_snapshot(args)
    m = load_manifest(store, snapshot_id)
    data = m.to_dict() if args.files else m.summary()
    data["uri"] = store.snapshot_uri(m.snapshot_id)

    def human() -> str:
        lines = [f"{k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}"
                 for k, v in sorted(data.items()) if k != "files"]
        if args.files:
            lines += [f"  {p}  {s}  {h[:16]}" for p, s, h in data["files"]]
        return "\n".join(lines)

    _emit(args, data, human)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots import verify_snapshot

    report = verify_snapshot(*_store_and_snapshot(args), deep=not args.quick)
    data = {"snapshot_id": report.snapshot_id, "ok": report.ok, "files": report.files,
            "bytes_checked": report.bytes_checked, "problems": list(report.problems)}
    _emit(args, data, lambda: (
        f"snapshot {report.snapshot_id}: OK, {report.files} files"
        + (f", {human_bytes(report.bytes_checked)} checksummed" if not args.quick else " (sizes only)")
        if report.ok else
        f"snapshot {report.snapshot_id}: {len(report.problems)} problems\n" + "\n".join(report.problems)
    ))
    return 0 if report.ok else EXIT_VERIFY_FAILED


def cmd_restore(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.restore import restore_snapshot

    result = restore_snapshot(*_store_and_snapshot(args), open_storage(args.target, _s3_options(args)),
                              replace=args.replace, report=_progress)
    d = result.to_dict()
    _emit(args, d, lambda: (
        f"restored {d['snapshot_id']} (batch {d['batch_id']}) into {d['target']}: {d['files']} files, "
        f"{human_bytes(d['bytes'])}; Spark resumes at batch {d['resume_batch']}"
    ))
    return 0


def cmd_dispose(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots import dispose_snapshot

    m = dispose_snapshot(*_store_and_snapshot(args), force=args.force)
    _emit(args, {"disposed": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id},
          lambda: f"disposed {m.kind.value} {m.snapshot_id} (batch {m.batch_id}); `ckpt snapshot gc` frees its objects")
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.retention import RetentionPolicy
    from airflow_ckpt_provider.core.snapshots import apply_retention

    policy = RetentionPolicy(
        checkpoints_keep=args.keep_checkpoints,
        savepoints_max_count=args.max_savepoints,
        savepoints_max_age=(timedelta(seconds=args.max_savepoint_age) if args.max_savepoint_age is not None
                            else None),
    )
    done = apply_retention(_store(args), policy, dry_run=args.dry_run)
    data = [{"snapshot_id": d.snapshot_id, "kind": d.kind.value, "reason": d.reason} for d in done]
    verb = "would dispose" if args.dry_run else "disposed"
    _emit(args, data, lambda: "\n".join(f"{verb} {d.snapshot_id}: {d.reason}" for d in done) or "nothing to dispose")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.gc import collect_garbage

    result = collect_garbage(_store(args), min_age_s=args.min_age, dry_run=args.dry_run,
                             clear_pending=args.clear_pending or ())
    d = result.to_dict()
    _emit(args, d, lambda: (
        f"gc deferred: {result.deferred}" if result.deferred else
        f"{'would delete' if args.dry_run else 'deleted'} {result.deleted_objects} objects "
        f"({human_bytes(result.deleted_bytes)}), kept {result.kept_objects}"
    ))
    return 0


# -- kafka commands ----------------------------------------------------------------------------


def _kafka_conf(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka settings from --config FILE (``key=value`` lines), e.g. SASL: secrets stay off argv."""
    if not args.config:
        return {}
    conf: dict[str, str] = {}
    with open(args.config, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith(("#", "!")):
                continue
            key, sep, value = text.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"{args.config} line {number}: expected key=value (a librdkafka setting), found {text!r}"
                )
            conf[key.strip()] = value.strip()
    return conf


def cmd_kafka_lag(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.kafka.lag import checkpoint_lag, consumer_group_lag

    if not args.bootstrap_servers:
        raise ConfigError("no Kafka cluster given: pass --bootstrap-servers HOST:PORT or set KAFKA_BOOTSTRAP_SERVERS")
    topics = args.topic or None
    if args.group:
        report = consumer_group_lag(args.bootstrap_servers, args.group, topics, _kafka_conf(args), args.timeout)
    else:
        report = checkpoint_lag(args.bootstrap_servers, open_storage(args.checkpoint, _s3_options(args)),
                                topics=topics, conf=_kafka_conf(args), timeout=args.timeout)
    d = report.to_dict()

    def human() -> str:
        if not report.partitions:
            return f"no committed offsets for {report.kind} {report.name}"
        rows = [[p.topic, str(p.partition), "-" if p.offset is None else str(p.offset), str(p.high), str(p.lag)]
                for p in report.partitions]
        at = f" at batch {report.batch_id}" if report.batch_id is not None else ""
        return (_table(rows, ["TOPIC", "PARTITION", "OFFSET", "HIGH", "LAG"])
                + f"\ntotal lag of {report.kind} {report.name}{at}: {report.total_lag}")

    _emit(args, d, human)
    return 0


# -- sink commands (ckpt-files) -----------------------------------------------------------------


def cmd_sink_verify(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filemaintenance import verify_sink

    report = verify_sink(args.path, _s3_options(args), checksums=args.checksums)
    batches = sum(len(b) for b in report.batches.values())
    orphans = f"; {len(report.orphans)} uncommitted files (gc deletes them)" if report.orphans else ""
    forks = [f"  query {q}: timeline {f['timeline']} from batch {f['fork_batch']} (fork of timeline {f['parent']} at "
             f"{f['created_at']}" + (")" if f["took_effect"] else "; its first batch never committed)")
             for q, fs in report.forks.items() for f in fs]
    abandoned = [f"  query {q}: abandoned batches " + ", ".join(f"{a['batch_id']}@t{a['timeline']}" for a in items)
                 + f" ({sum(a['rows'] for a in items)} rows, hidden from readers, deleted by gc)"
                 for q, items in report.abandoned.items()]
    _emit(args, report.to_dict(), lambda: (
        f"sink {report.url}: OK, job {report.job}, {len(report.batches)} queries, {batches} batches shown, "
        f"{report.files} files, {report.rows} rows, {human_bytes(report.bytes)}"
        + (" checksummed" if args.checksums else " (sizes only)") + orphans
        + (f"\n{len(forks)} forks (restores that went back in time):\n" + "\n".join(forks + abandoned) if forks else "")
        if report.ok else
        f"sink {report.url}: {len(report.problems)} problems\n" + "\n".join(report.problems)
    ))
    return 0 if report.ok else EXIT_VERIFY_FAILED


def cmd_sink_ls(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filelayout import sink_view

    view = sink_view(args.path, _s3_options(args))
    listed = [(m, "shown") for m in view.shown] + [(m, "abandoned") for m in view.abandoned]
    if not args.all:
        listed = listed[:len(view.shown)]
    rows = [[m.query_id, str(m.batch_id), str(m.timeline), status, m.committed_at, str(len(m.files)), str(m.rows),
             human_bytes(m.total_bytes), (m.coverage or "-")[:12]] for m, status in listed]
    data = [{"query_id": m.query_id, "batch_id": m.batch_id, "timeline": m.timeline, "status": status,
             "committed_at": m.committed_at, "files": len(m.files), "rows": m.rows, "bytes": m.total_bytes,
             "offsets_digest": m.coverage, "offsets": m.offsets} for m, status in listed]
    hidden = "" if args.all or not view.abandoned else (
        f"\n{len(view.abandoned)} batches of abandoned timelines not listed (--all lists them)")
    _emit(args, data, lambda: (_table(rows, ["QUERY", "BATCH", "TIMELINE", "STATUS", "COMMITTED", "FILES", "ROWS",
                                             "SIZE", "OFFSETS"]) if rows else "no committed batches") + hidden)
    return 0


def cmd_sink_gc(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.sinks.filemaintenance import gc_sink

    result = gc_sink(args.path, _s3_options(args), older_than_s=args.older_than, dry_run=args.dry_run)
    _emit(args, result.to_dict(), lambda: (
        f"{'would delete' if args.dry_run else 'deleted'} {len(result.deleted)} uncommitted or abandoned files "
        f"({human_bytes(result.deleted_bytes)}) and {len(result.abandoned_batches)} abandoned batches' manifests, "
        f"kept {result.kept_young} younger than {args.older_than:g} s"
    ))
    return 0


def _add_sink_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _progress(line: str) -> None:
    """Progress of long transfers (files, bytes, rate) goes to stderr; results go to stdout."""
    print(line, file=sys.stderr, flush=True)


# -- parser --------------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=os.environ.get("CKPT_STORE"),
                   help="job store root: s3://BUCKET/PREFIX or a directory (env CKPT_STORE)")
    p.add_argument("--job", default=os.environ.get("CKPT_JOB"), help="job name (env CKPT_JOB)")
    p.add_argument("--endpoint-url", help="S3 endpoint URL (env AWS_ENDPOINT_URL); credentials from AWS_* env")
    p.add_argument("--region", help="S3 region (env AWS_REGION)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")


def _add_kafka_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ckpt kafka ...`: offsets and lag (the Kafka client is imported only when a command runs)."""
    kafka = groups.add_parser("kafka", help="Kafka offsets of consumer groups and checkpoints")
    ksub = kafka.add_subparsers(dest="command", required=True)
    p = ksub.add_parser("lag", help="per-partition and total lag of a consumer group or a checkpoint")
    p.set_defaults(fn=cmd_kafka_lag)
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="HOST:PORT[,HOST:PORT] (env KAFKA_BOOTSTRAP_SERVERS)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--group", help="a consumer group: its committed offsets")
    which.add_argument("--checkpoint", help="a Spark checkpoint (directory or s3://): its latest completed batch")
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all the group or "
                   "checkpoint has offsets for)")
    p.add_argument("--config", help="a file of librdkafka settings, one key=value a line (e.g. SASL)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per broker request (default 10)")
    p.add_argument("--endpoint-url", help="S3 endpoint URL for an s3:// checkpoint (env AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="S3 region (env AWS_REGION)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt", description=__doc__)
    groups = parser.add_subparsers(dest="group", required=True)
    snap = groups.add_parser("snapshot", help="consistent snapshots of Spark checkpoints")
    sub = snap.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        _common(p)
        p.set_defaults(fn=fn)
        return p

    p = add("create", cmd_create, "snapshot a checkpoint at its latest completed batch")
    p.add_argument("--checkpoint", required=True, help="the live checkpoint location (directory or s3://)")
    p.add_argument("--kind", default="savepoint", help="savepoint (default) or checkpoint")
    p.add_argument("--trigger", default="manual", help="periodic, manual (default), stop or upgrade")
    p.add_argument("--batch", type=int, help="a completed batch id (default: the latest completed)")
    p.add_argument("--code-version", help="the code version running the query, recorded in the manifest")
    p = add("list", cmd_list, "list completed snapshots, oldest first")
    p.add_argument("--kind", help="only checkpoints or savepoints")
    p = add("show", cmd_show, "show one snapshot's manifest")
    p.add_argument("snapshot")
    p.add_argument("--files", action="store_true", help="also list every file")
    p = add("verify", cmd_verify, "check a snapshot's objects: presence, sizes and SHA-256 (exit 3 if broken)")
    p.add_argument("snapshot")
    p.add_argument("--quick", action="store_true", help="check presence and sizes only")
    p = add("restore", cmd_restore, "restore a snapshot into a fresh checkpoint location")
    p.add_argument("snapshot")
    p.add_argument("--target", required=True, help="the new checkpoint location (directory or s3://)")
    p.add_argument("--replace", action="store_true", help="discard what the target holds")
    p = add("dispose", cmd_dispose, "dispose of a snapshot (gc frees its objects)")
    p.add_argument("snapshot")
    p.add_argument("--force", action="store_true", help="allow disposing of the newest savepoint")
    p = add("retain", cmd_retain, "apply a retention policy")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="checkpoints to keep (default 3)")
    p.add_argument("--max-savepoints", type=int, help="savepoints to keep at most")
    p.add_argument("--max-savepoint-age", type=float, help="seconds after which savepoints go")
    p.add_argument("--dry-run", action="store_true")
    p = add("gc", cmd_gc, "delete objects no snapshot references")
    p.add_argument("--min-age", type=float, default=600.0,
                   help="keep unreferenced objects younger than this many seconds (default 600)")
    p.add_argument("--clear-pending", action="append", metavar="ID",
                   help="clear the pending marker of snapshot ID, whose writer you know is dead (repeatable); "
                   "gc clears markers of provably gone writers by itself")
    p.add_argument("--dry-run", action="store_true")
    add_job_commands(groups)
    _add_kafka_commands(groups)
    _add_sink_commands(groups)
    add_run_command(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
