"""``ckpt state``: the State Processor's reading side (runtime/stateprocessor.py): the tables of a snapshot's state,
and one table's rows into Parquet, CSV or JSON, or a sample on the terminal. A local Spark session reads a copy of
the snapshot restored on this host; the snapshot is never touched."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from airflow_ckpt_provider.cli.common import add_store_args, emit, store_and_snapshot, table

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


def add_state_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = groups.add_parser("state", help="read the keyed state of a snapshot (the State Processor)")
    sub = state.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        add_store_args(p)
        p.add_argument("snapshot", help="a snapshot id (or the URI `ckpt snapshot create` printed)")
        p.add_argument("--master", help="the Spark master reading the state (default: local[2] on 127.0.0.1)")
        p.set_defaults(fn=fn)
        return p

    add("list", cmd_list, "list the state tables of a snapshot: each operator's stores and state variables")
    p = add("read", cmd_read, "read one state table: a sample, or all of it into Parquet, CSV or JSON")
    p.add_argument("--table", required=True, help="the table as `ckpt state list` names it: OPERATOR/STORE[/VARIABLE]")
    p.add_argument("--output", help="write every row here (a new directory); without it, print a sample")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv", "json"), help="with --output")
    p.add_argument("--sample", type=int, default=20, help="rows printed without --output (default 20)")
