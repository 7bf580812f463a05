"""``ckpt state``: the State Processor (runtime/stateprocessor.py): the tables of a snapshot's state, one table's rows
into Parquet, CSV or JSON or a sample on the terminal, and keys deleted into a new savepoint the restore check
proves. A local Spark session works on a copy of the snapshot restored on this host; the snapshot is never
touched."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from airflow_ckpt_provider.cli.common import add_store_args, emit, store_and_snapshot, table
from airflow_ckpt_provider.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def _session(master: str | None) -> Iterator[SparkSession]:
    """Local Spark on 127.0.0.1 only (the embedded default's), or the given master's."""
    from pyspark.sql import SparkSession

    from airflow_ckpt_provider.embedded import local_spark

    spark = local_spark("ckpt-state") if master is None else (
        SparkSession.builder.master(master).appName("ckpt-state").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        yield spark
    finally:
        spark.stop()


def cmd_list(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.runtime.stateprocessor import snapshot_copy, state_tables

    store, snapshot_id = store_and_snapshot(args)
    with _session(args.master) as spark, snapshot_copy(store, snapshot_id) as (manifest, checkpoint):
        tables = state_tables(spark, checkpoint)
    data = [{"table": t.name, "operator_id": t.operator_id, "operator": t.operator, "store": t.store,
             "partitions": t.partitions, "variable": t.variable, "variable_type": t.variable_type} for t in tables]
    emit(args, data, lambda: f"snapshot {manifest.snapshot_id} (batch {manifest.batch_id}): "
         + (f"{len(tables)} state tables\n" + table(
             [[t.name, t.operator, str(t.partitions), t.variable_type or ""] for t in tables],
             ["table", "operator", "partitions", "variable type"]) if tables else "no state (a stateless query)"))
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.runtime.stateprocessor import (
        export_state,
        find_table,
        read_state,
        snapshot_copy,
        state_tables,
    )

    store, snapshot_id = store_and_snapshot(args)
    with _session(args.master) as spark, snapshot_copy(store, snapshot_id) as (manifest, checkpoint):
        chosen = find_table(state_tables(spark, checkpoint), args.table)
        frame = read_state(spark, checkpoint, manifest.batch_id, chosen)
        if args.output:
            rows = export_state(frame, args.format, args.output)
            emit(args, {"table": chosen.name, "rows": rows, "format": args.format, "output": args.output},
                 lambda: f"wrote {rows} rows of state table {chosen.name} ({chosen.operator}) of snapshot "
                 f"{manifest.snapshot_id} (batch {manifest.batch_id}) to {args.output} as {args.format}")
            return 0
        sample = [r.asDict() for r in frame.limit(args.sample).collect()]
    columns = list(sample[0]) if sample else []
    emit(args, sample, lambda: f"state table {chosen.name} ({chosen.operator}) of snapshot {manifest.snapshot_id} "
         f"(batch {manifest.batch_id}), first {len(sample)} rows\n"
         + table([[str(r[c]) for c in columns] for r in sample], columns))
    return 0


def _edit(args: argparse.Namespace, what: str, *, delete_keys: str | None = None,
          update_values: str | None = None) -> int:
    """Run the restore check of ``args.job_file`` on a copy of the snapshot with ``edit`` (``delete_keys`` or
    ``update_values``), which saves the copy as a new savepoint once the check passed; print what happened."""
    import io

    from airflow_ckpt_provider.core.policy.modes import RestoreSpec
    from airflow_ckpt_provider.runtime.config import RuntimeConfig
    from airflow_ckpt_provider.runtime.restore_check import RestoreChecker

    store, snapshot_id = store_and_snapshot(args)
    config = RuntimeConfig(job=store.job, store=store.root.url, restore=RestoreSpec.parse(snapshot_id),
                           check_restore=True, check_timeout=args.check_timeout, endpoint_url=args.endpoint_url,
                           region=args.region, code_version=args.code_version, delete_keys=delete_keys,
                           update_values=update_values, save_edited=True)
    config.check()
    with _session(args.master) as spark:
        checker = RestoreChecker(config, args.job_file, out=io.StringIO())
        code = checker.run(spark_factory=lambda: spark)
    report = checker.report
    assert report is not None  # run() gave its verdict
    done = checker.rewrite
    data = {**report.to_dict(), "rows_removed": done.rows_removed if done else 0,
            "rows_changed": done.rows_changed if done else 0}
    if report.rewritten_snapshot_id is None:
        if args.json:
            emit(args, data, str)
        else:
            print(f"error: no savepoint written: {report.outcome.value}: {report.reason}", file=sys.stderr)
        return code or 1
    emit(args, data, lambda: f"savepoint {report.rewritten_snapshot_id}: snapshot {snapshot_id} {what} "
         f"({data['rows_removed']} state rows removed, {data['rows_changed']} values changed); the restore check of "
         f"{args.job_file} passed on it. Start the job from it with --restore {report.rewritten_snapshot_id}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    return _edit(args, f"without the keys {args.where!r} of operator {args.operator}",
                 delete_keys=f"{args.operator}:{args.where}")


def cmd_update(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.core.policy.stateedit import ValueUpdate

    values: dict[str, str] = {}
    for item in args.set:
        column, sep, expression = item.partition("=")
        if not sep or not column.strip() or not expression.strip():
            raise ConfigError(f"invalid --set {item!r}: expected COLUMN=EXPRESSION, e.g. --set 'value_count=0'")
        values[column.strip()] = expression.strip()
    update = ValueUpdate(args.table, args.where, values)
    return _edit(args, f"with {', '.join(f'{c} = {e}' for c, e in values.items())} in table {args.table} where "
                 f"{args.where}", update_values=str(update))  # checked with the config


def cmd_sample(args: argparse.Namespace) -> int:
    import getpass
    import socket
    import time

    from airflow_ckpt_provider.core.records.statesample import StateSample, write_sample
    from airflow_ckpt_provider.runtime.stateprocessor import sample_state, snapshot_copy

    if args.rows < 1:
        raise ConfigError(f"--rows: expected at least 1 row per table, found {args.rows}")
    store, snapshot_id = store_and_snapshot(args)
    with _session(args.master) as spark, snapshot_copy(store, snapshot_id) as (manifest, checkpoint):
        tables = sample_state(spark, checkpoint, manifest.batch_id, args.rows)
    sample = StateSample(snapshot_id=manifest.snapshot_id, batch_id=manifest.batch_id, taken_at=time.time(),
                         taken_by=f"{getpass.getuser()}@{socket.gethostname()} (ckpt state sample)", tables=tables)
    write_sample(store, sample)
    emit(args, sample.to_dict(), lambda: f"state sample of snapshot {manifest.snapshot_id} (batch {manifest.batch_id}) "
         f"written to {store.storage.uri(sample.key)}: " + (", ".join(
             f"{t.name} {len(t.rows)} of {t.rows_total} rows" for t in tables) or "no state (a stateless query)")
         + "; the Streaming Jobs page shows it")
    return 0


def add_state_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = groups.add_parser("state", help="read a snapshot's keyed state, delete keys or change values into a new "
                              "savepoint (the State Processor)")
    sub = state.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        add_store_args(p)
        p.add_argument("snapshot", help="a snapshot id (or the URI `ckpt snapshot create` printed)")
        p.add_argument("--master", help="the Spark master reading the state (default: local[2] on 127.0.0.1)")
        p.set_defaults(fn=fn)
        return p

    add("list", cmd_list, "list the state tables of a snapshot: each operator's stores and state variables")
    p = add("sample", cmd_sample, "read the first rows of every state table of a snapshot into the job store, where "
            "the Streaming Jobs page shows them")
    p.add_argument("--rows", type=int, default=10, help="rows per table (default 10)")
    p = add("read", cmd_read, "read one state table: a sample, or all of it into Parquet, CSV or JSON")
    p.add_argument("--table", required=True, help="the table as `ckpt state list` names it: OPERATOR/STORE[/VARIABLE]")
    p.add_argument("--output", help="write every row here (a new directory); without it, print a sample")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv", "json"), help="with --output")
    p.add_argument("--sample", type=int, default=20, help="rows printed without --output (default 20)")

    def add_edit(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = add(name, fn, help_ + " into a NEW savepoint, which the restore check of the job file proves before it is "
                "written; the snapshot is never touched")
        p.add_argument("--job-file", required=True,
                       help="the job's file: its query runs a batch on the edited state before the savepoint is saved")
        p.add_argument("--code-version", help="the code version recorded in the new savepoint (default: the "
                       "snapshot's)")
        p.add_argument("--check-timeout", type=float, default=300.0, help="seconds the check's batch may take")
        return p

    p = add_edit("delete", cmd_delete, "delete keys from a snapshot's state (every store and variable of an operator)")
    p.add_argument("--operator", type=int, required=True, help="the operator id (`ckpt state list`)")
    p.add_argument("--where", required=True,
                   help="a Spark SQL predicate over the operator's key columns selecting the keys to delete, e.g. "
                   "\"key_user = 'u-17'\" (`ckpt state read` shows the key columns)")
    p = add_edit("update", cmd_update, "set value columns of one state table in the rows a predicate selects")
    p.add_argument("--table", required=True, help="the table as `ckpt state list` names it (an operator's store or a "
                   "ValueState)")
    p.add_argument("--where", required=True, help="a Spark SQL predicate over the table's key and value columns")
    p.add_argument("--set", action="append", required=True, metavar="COLUMN=EXPRESSION",
                   help="a value column and its new value, a Spark SQL expression over the table's columns (repeat "
                   "for more), e.g. --set 'value_count=0'")
