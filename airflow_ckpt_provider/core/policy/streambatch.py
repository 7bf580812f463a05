"""What code in a streaming batch can learn about it, how it logs from Spark's Python workers, and where the sinks
tell what they did with each batch.

Spark sets these local properties in every task of a micro-batch and in the foreachBatch thread;
the exactly-once sinks key their commits by them. No pyspark import.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from enum import StrEnum

#: Spark's local properties of a streaming batch: set in every task and in the foreachBatch thread.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: The writer option the runtime sets on the job's query: its driver's lease epoch, the fencing token the
#: exactly-once sinks record with each commit (a commit of an older epoch never hides a newer one's batch).
EPOCH_OPTION = "ckpt.epoch"


def epoch_option(options: dict[str, str]) -> int | None:
    """The epoch the runtime passed in the writer options (their names lower-cased, as Spark passes them), None
    without it."""
    text = options.get(EPOCH_OPTION, "").strip()
    return int(text) if text.isdigit() else None


#: The writer option the runtime sets on the job's query when its metrics are on: a file of the driver's host the
#: sinks append one line to per batch they commit, skip, abort or refuse (Spark runs a Python sink's commit and
#: abort in a Python worker of the driver, not in the driver's own process; runtime/metrics.py reads the file).
OUTCOMES_OPTION = "ckpt.outcomes"

log = logging.getLogger(__name__)


class SinkOutcome(StrEnum):
    """What a sink did with one batch."""

    COMMITTED = "committed"  # its output became visible
    SKIPPED = "skipped"  # a replay of a batch already committed: nothing written again
    ABORTED = "aborted"  # Spark aborted the batch's write (a task or the commit failed): it is replayed
    FENCED = "fenced"  # the commit was refused: a newer driver holds the job (Spark then aborts the batch)


#: Where sinks in the driver's own process (foreachBatch: the ledger, ``JobContext.fenced``) tell their outcomes;
#: set by the runtime with its metrics (``tell_outcomes_to``).
_OUTCOMES: list[str] = []


def tell_outcomes_to(path: str | None) -> None:
    """Where ``sink_outcome`` appends when it is given no path (None: nowhere)."""
    _OUTCOMES[:] = [path] if path else []


def outcomes_option(options: Mapping[str, str]) -> str | None:
    """The outcomes file the runtime passed in the writer options (names lower-cased, as Spark passes them)."""
    return options.get(OUTCOMES_OPTION) or None


def sink_outcome(sink: str, outcome: SinkOutcome, batch_id: int, rows: int | None = None, *,
                 path: str | None = None) -> None:
    """Append what ``sink`` did with ``batch_id`` to the outcomes file (``path``, else the one the runtime set);
    nothing without one. One short line per write with O_APPEND: lines of several workers never interleave. A
    write that fails is logged, never raised: counting must not fail a batch."""
    where = path or (_OUTCOMES[0] if _OUTCOMES else None)
    if where is None:
        return
    line = json.dumps({"sink": sink, "outcome": outcome.value, "batch": batch_id, "rows": rows}) + "\n"
    try:
        fd = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as err:
        log.warning("sink %s batch %d: could not count its outcome (%s) in %s: %s", sink, batch_id, outcome.value,
                    where, err)


#: The loggers whose commit and replay lines must reach the worker's stderr.
_WORKER_LOGGERS = ("airflow_ckpt_provider.sinks", "airflow_ckpt_provider.kafka")


def worker_logging() -> None:
    """Let the sinks' commit and replay lines reach stderr from Spark's Python workers, which configure no
    logging (a batch's commit runs in a fresh worker whose root logger drops INFO)."""
    if logging.getLogger().handlers:
        return
    for name in _WORKER_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler(sys.stderr)
        # The worker's pid: which Python worker ran a task (Spark moves a sink partition's tasks between them).
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [worker %(process)d]: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


#: What sinks set up in the job's build function asked to run before each start of its query (after the lease
#: is taken, so a refused start never touches a running job's sink): (name, action) in the order registered.
_BEFORE_START: list[tuple[str, Callable[[], object]]] = []


def before_query_start(name: str, action: Callable[[], object]) -> None:
    """Run ``action`` before every start of the driver's query (the first and each in-driver restart).

    The ckpt-kafka sink aborts the transactions a killed driver left open here. A name registered again
    replaces its action (a job's build function may run more than once in a process).
    """
    _BEFORE_START[:] = [(n, a) for n, a in _BEFORE_START if n != name]
    _BEFORE_START.append((name, action))


def forget_before_query_start() -> None:
    """Drop every registered action: the runtime does this before it runs a job's build function, so a process
    that ran another job before never runs that job's actions."""
    _BEFORE_START.clear()
    _DURABLE_PLANS.clear()


#: Sinks that commit a batch only once the job store can replay it (core/snapshots/durableplan.py): name -> True
#: (always) or None (where the live checkpoint is on the driver host's own disk, which a lost host takes along).
_DURABLE_PLANS: dict[str, bool | None] = {}


def commit_after_snapshot(name: str, when: bool | None) -> None:
    """Ask the runtime for durable plans (``when`` True: always; None: for a live checkpoint on local disk)."""
    _DURABLE_PLANS[name] = when


def wants_durable_plans(local_checkpoint: bool) -> bool:
    """Whether a sink of the job asked for durable plans, given where the live checkpoint is."""
    return any(when or (when is None and local_checkpoint) for when in _DURABLE_PLANS.values())


def run_before_query_start() -> None:
    """The runtime calls this right before ``DataStreamWriter.start()``; an action's error fails the start."""
    for _name, action in list(_BEFORE_START):
        action()
