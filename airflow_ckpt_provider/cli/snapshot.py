"""`ckpt snapshot ...`: create, list, show, verify, restore, dispose, retain and gc snapshots of a job."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from airflow_ckpt_provider.cli.common import (
    EXIT_VERIFY_FAILED,
    add_store_args,
    emit,
    open_job_store,
    s3_options,
    store_and_snapshot,
    table,
    transfer_report,
)
from airflow_ckpt_provider.core.policy.settings import INLINE_MAX, INLINE_TOTAL_MAX
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, Trigger, parse_enum
from airflow_ckpt_provider.core.store.progress import human_bytes, human_count
from airflow_ckpt_provider.core.store.storage import open_storage

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.snapshots.gc import GcResult


def _row(m: Manifest) -> list[str]:
    return [m.snapshot_id, m.kind.value, m.trigger.value, str(m.batch_id), m.created_at,
            str(len(m.files)), human_bytes(m.total_bytes)]


def inline_bytes(text: str) -> int:
    """``--inline-bytes``: a whole number from 0 to INLINE_TOTAL_MAX (argparse turns the error into a usage error)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= INLINE_TOTAL_MAX:
        raise argparse.ArgumentTypeError(f"expected a number of bytes from 0 to {INLINE_TOTAL_MAX}, found {text!r}")
    return value


def cmd_create(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot

    store, checkpoint = open_job_store(args), open_storage(args.checkpoint, s3_options(args))
    with transfer_report() as report:
        result = create_snapshot(store, checkpoint, kind=parse_enum(Kind, args.kind),
                                 trigger=parse_enum(Trigger, args.trigger), batch_id=args.batch,
                                 code_version=args.code_version, report=report, inline_max=args.inline_bytes)
    d = result.to_dict()
    emit(args, d, lambda: (
        f"created {d['kind']} {d['snapshot_id']} at batch {d['batch_id']}: {human_count(d['files'], 'file')}, "
        f"{human_bytes(d['bytes'])}; uploaded {human_count(d['uploaded_files'], 'file')} "
        f"({human_bytes(d['uploaded_bytes'])}), reused {d['reused_files']} in {d['seconds']} s\n{d['uri']}"
    ))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots

    kind = parse_enum(Kind, args.kind) if args.kind else None
    manifests = list_snapshots(open_job_store(args), kind)
    header = ["ID", "KIND", "TRIGGER", "BATCH", "CREATED", "FILES", "SIZE"]
    emit(args, [m.summary() for m in manifests],
          lambda: table([_row(m) for m in manifests], header) if manifests else "no snapshots")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import load_manifest

    store, snapshot_id = store_and_snapshot(args)
    m = load_manifest(store, snapshot_id)
    data = m.summary()
    data["uri"] = store.snapshot_uri(m.snapshot_id)
    if args.files:  # where each file's content is: an object of the store, or inline in the manifest
        data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256,
                          "content": "inline" if f.inline else store.object_key(f.sha256)} for f in m.files]

    def human() -> str:
        lines = [f"{k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}"
                 for k, v in sorted(data.items()) if k != "files"]
        if args.files:
            lines += [f"  {f['path']}  {f['size']}  {f['sha256'][:16]}{'  inline' if f['content'] == 'inline' else ''}"
                      for f in data["files"]]
        return "\n".join(lines)

    emit(args, data, human)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import verify_snapshot

    report = verify_snapshot(*store_and_snapshot(args), deep=not args.quick)
    data = {"snapshot_id": report.snapshot_id, "ok": report.ok, "files": report.files,
            "bytes_checked": report.bytes_checked, "problems": list(report.problems)}
    emit(args, data, lambda: (
        f"snapshot {report.snapshot_id}: OK, {human_count(report.files, 'file')}"
        + (f", {human_bytes(report.bytes_checked)} checksummed" if not args.quick else " (sizes only)")
        if report.ok else
        f"snapshot {report.snapshot_id}: {human_count(len(report.problems), 'problem')}\n"
        + "\n".join(report.problems)
    ))
    return 0 if report.ok else EXIT_VERIFY_FAILED


def cmd_restore(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.restore import restore_snapshot

    store, snapshot_id = store_and_snapshot(args)
    target = open_storage(args.target, s3_options(args))
    with transfer_report() as report:
        result = restore_snapshot(store, snapshot_id, target, replace=args.replace, report=report)
    d = result.to_dict()
    emit(args, d, lambda: (
        f"restored {d['snapshot_id']} (batch {d['batch_id']}) into {d['target']}: {human_count(d['files'], 'file')}, "
        f"{human_bytes(d['bytes'])}; Spark resumes at batch {d['resume_batch']}"
    ))
    return 0


def cmd_dispose(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import dispose_snapshot

    m = dispose_snapshot(*store_and_snapshot(args), force=args.force)
    emit(args, {"disposed": m.snapshot_id, "kind": m.kind.value, "batch_id": m.batch_id},
          lambda: f"disposed {m.kind.value} {m.snapshot_id} (batch {m.batch_id}); `ckpt snapshot gc` frees its objects")
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.catalog import apply_retention
    from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy

    policy = RetentionPolicy(
        checkpoints_keep=args.keep_checkpoints,
        savepoints_max_count=args.max_savepoints,
        savepoints_max_age=(timedelta(seconds=args.max_savepoint_age) if args.max_savepoint_age is not None
                            else None),
    )
    done = apply_retention(open_job_store(args), policy, dry_run=args.dry_run)
    data = [{"snapshot_id": d.snapshot_id, "kind": d.kind.value, "reason": d.reason} for d in done]
    verb = "would dispose" if args.dry_run else "disposed"
    emit(args, data, lambda: "\n".join(f"{verb} {d.snapshot_id}: {d.reason}" for d in done) or "nothing to dispose")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.snapshots.gc import collect_garbage

    result = collect_garbage(open_job_store(args), min_age_s=args.min_age, dry_run=args.dry_run,
                             clear_pending=args.clear_pending or ())
    emit(args, result.to_dict(), lambda: gc_summary(result, dry_run=args.dry_run))
    return 0


def gc_summary(result: GcResult, *, dry_run: bool) -> str:
    """gc's output: what it deleted and kept, and each pending marker it cleared (whose, and why it could go)."""
    if result.deferred:
        return f"gc deferred: {result.deferred}"
    text = (f"{'would delete' if dry_run else 'deleted'} {human_count(result.deleted_objects, 'object')} "
            f"({human_bytes(result.deleted_bytes)}), kept {result.kept_objects}")
    if result.cleared_pending:
        text += (f"; {'would clear' if dry_run else 'cleared'} "
                 f"{human_count(len(result.cleared_pending), 'pending marker')}:"
                 + "".join(f"\n  {m.snapshot_id}, written by {m.owner}: {m.reason}" for m in result.cleared_pending))
    return text


def add_snapshot_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    snap = groups.add_parser("snapshot", help="consistent snapshots of Spark checkpoints")
    sub = snap.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        add_store_args(p)
        p.set_defaults(fn=fn)
        return p

    p = add("create", cmd_create, "snapshot a checkpoint at its latest completed batch")
    p.add_argument("--checkpoint", required=True, help="the live checkpoint location (directory or s3://)")
    p.add_argument("--kind", default="savepoint", help="savepoint (default) or checkpoint")
    p.add_argument("--trigger", default="manual", help="periodic, manual (default), stop or upgrade")
    p.add_argument("--batch", type=int, help="a completed batch id (default: the latest completed)")
    p.add_argument("--code-version", help="the code version running the query, recorded in the manifest")
    p.add_argument("--inline-bytes", type=inline_bytes, default=INLINE_MAX, metavar="BYTES",
                   help=f"files up to this size go into the manifest instead of an object of their own (default "
                   f"{INLINE_MAX}, at most {INLINE_TOTAL_MAX}; 0: none), as the driver's --snapshot-inline-bytes")
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
