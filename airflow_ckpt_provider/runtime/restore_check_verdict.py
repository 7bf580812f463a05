"""The restore check's verdict: the closed set of outcomes, the one line that carries it, and how it
is reached from what Spark did (the empty batch, the operators that wrote state, Spark's refusal).

The driver (runtime/restore_check.py) prints its verdict as one stdout line, ``CKPT_RESTORE_CHECK
{json}``, among Spark's output; the launching host (launcher/restore_check.py) finds it there. Pure
logic: no pyspark, no Airflow.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome as CheckOutcome  # noqa: PLC0414  # re-exported: the verdict's home
from airflow_ckpt_provider.core.snapshots.manifest import Manifest
from airflow_ckpt_provider.core.store.storage import Storage
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_INCOMPATIBLE, EXIT_STOPPED

log = logging.getLogger(__name__)

#: How the driver's verdict starts on stdout: the prefix, then one JSON object, on one line.
REPORT_PREFIX = "CKPT_RESTORE_CHECK "

#: The driver's exit code for each verdict (CheckOutcome, core/policy/outcomes.py).
EXIT_CODES = {
    CheckOutcome.COMPATIBLE: EXIT_STOPPED,
    CheckOutcome.INCOMPATIBLE: EXIT_INCOMPATIBLE,
    CheckOutcome.INCONCLUSIVE: EXIT_FAILED,
    CheckOutcome.BAD_INPUT: EXIT_CONFIG,
}


@dataclass(frozen=True)
class RestoreCheck:
    """The verdict of one restore check.

    ``snapshot_id``/``batch_id``: the snapshot checked and its completed batch (the check runs batch
    ``batch_id + 1``, without data). ``snapshot_operators``: the stateful operators whose state the
    snapshot holds; ``new_operators``: those the new query ran (it wrote state for them);
    ``non_restored_operators``: in the snapshot but not in the new query (their state would be dropped).
    ``error_class``: Spark's error condition when Spark refused, e.g. STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE.
    ``seconds``: the check's wall time (from ``check_restore``: spark-submit's start included).
    """

    outcome: CheckOutcome
    reason: str
    snapshot_id: str | None = None
    batch_id: int | None = None
    snapshot_operators: tuple[int, ...] = ()
    new_operators: tuple[int, ...] = ()
    non_restored_operators: tuple[int, ...] = ()
    error_class: str | None = None
    seconds: float | None = None
    state_partitions: int | None = None  # the state's partitions the check ran with (after a rescale: the new)
    rescaled_snapshot_id: str | None = None  # --save-rescaled: the savepoint of the repartitioned state
    rewritten_snapshot_id: str | None = None  # --delete-keys: the savepoint without the deleted keys
    state_schema_changes: tuple[str, ...] = ()  # what the new code changed in transformWithState state schemas
    source_changes: tuple[str, ...] = ()  # named sources (offset log v2) the new code adds or no longer reads
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields of a newer driver, kept as they are

    @property
    def compatible(self) -> bool:
        return self.outcome is CheckOutcome.COMPATIBLE

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "compatible": self.compatible,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "snapshot_id": self.snapshot_id,
            "batch_id": self.batch_id,
            "snapshot_operators": list(self.snapshot_operators),
            "new_operators": list(self.new_operators),
            "non_restored_operators": list(self.non_restored_operators),
            "error_class": self.error_class,
            "seconds": self.seconds,
            "state_partitions": self.state_partitions,
            "rescaled_snapshot_id": self.rescaled_snapshot_id,
            "rewritten_snapshot_id": self.rewritten_snapshot_id,
            "state_schema_changes": list(self.state_schema_changes),
            "source_changes": list(self.source_changes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestoreCheck:
        """The check ``to_dict`` described; ValueError says what is missing or malformed."""
        try:
            outcome = CheckOutcome(d["outcome"]) if "outcome" in d else (
                CheckOutcome.COMPATIBLE if d["compatible"] is True else CheckOutcome.INCOMPATIBLE
            )
            known = {"compatible", "outcome", "reason", "snapshot_id", "batch_id", "snapshot_operators",
                     "new_operators", "non_restored_operators", "error_class", "seconds", "state_partitions",
                     "rescaled_snapshot_id", "rewritten_snapshot_id", "state_schema_changes",
                     "source_changes"}
            return cls(
                outcome=outcome,
                reason=str(d["reason"]),
                snapshot_id=None if d.get("snapshot_id") is None else str(d["snapshot_id"]),
                batch_id=None if d.get("batch_id") is None else int(d["batch_id"]),
                snapshot_operators=tuple(int(o) for o in d.get("snapshot_operators") or ()),
                new_operators=tuple(int(o) for o in d.get("new_operators") or ()),
                non_restored_operators=tuple(int(o) for o in d.get("non_restored_operators") or ()),
                error_class=None if d.get("error_class") is None else str(d["error_class"]),
                seconds=None if d.get("seconds") is None else float(d["seconds"]),
                state_partitions=None if d.get("state_partitions") is None else int(d["state_partitions"]),
                rescaled_snapshot_id=None if d.get("rescaled_snapshot_id") is None else str(d["rescaled_snapshot_id"]),
                rewritten_snapshot_id=None if d.get("rewritten_snapshot_id") is None
                else str(d["rewritten_snapshot_id"]),
                state_schema_changes=tuple(str(c) for c in d.get("state_schema_changes") or ()),
                source_changes=tuple(str(c) for c in d.get("source_changes") or ()),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a restore check report ({err!r}): {dict(d)!r:.300}") from err

    def to_line(self) -> str:
        """The line the driver prints: the prefix and the JSON object."""
        return REPORT_PREFIX + json.dumps(self.to_dict(), sort_keys=True)


def parse_report(lines: Iterable[str]) -> RestoreCheck | None:
    """The last report line among ``lines`` (a driver's whole output), or None if there is none."""
    found: RestoreCheck | None = None
    for line in lines:
        start = line.find(REPORT_PREFIX)
        if start < 0:
            continue
        try:
            body = json.loads(line[start + len(REPORT_PREFIX):])
            if isinstance(body, dict):
                found = RestoreCheck.from_dict(body)
        except ValueError as err:  # a line cut by another process's output: keep looking
            log.warning("ignoring a malformed restore check line: %s", err)
    return found


#: Lines of Spark's error message kept in the reason (the first ones say what; the rest is plan dumps).
ERROR_LINES = 6
_STREAM_FAILED = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")


# --------------------------------------------------------------------------------------------
# How the verdict is reached: the empty batch, the operators that ran, Spark's refusal
# --------------------------------------------------------------------------------------------


def plan_empty_batch(storage: Storage, batch_id: int) -> int:
    """Make the batch after completed ``batch_id`` an empty one; returns its id (``batch_id + 1``).

    Spark resumes a checkpoint whose newest ``offsets/M`` has no ``commits/M`` by running batch M
    with exactly the offsets logged (the write-ahead log), without asking the sources for new data.
    Logging ``offsets/N+1`` as a copy of ``offsets/N`` makes batch N+1 read from N's end to N's end:
    nothing. Entries after N (a write-ahead ``offsets/N+1`` the snapshot caught) are dropped first.
    """
    if not storage.exists(f"commits/{batch_id}"):
        raise CkptError(f"batch {batch_id} is not completed in {storage.url}: commits/{batch_id} is missing")
    drop_log_after(storage, batch_id)
    storage.write(f"offsets/{batch_id + 1}", storage.read(f"offsets/{batch_id}"))
    return batch_id + 1


def drop_log_after(storage: Storage, batch_id: int) -> None:
    """Delete the offsets and commits entries after ``batch_id`` (a copy's write-ahead batch)."""
    storage.delete([o.key for o in storage.list() if (n := _log_id(o.key)) is not None and n > batch_id])


def _log_id(key: str) -> int | None:
    """N of ``offsets/N`` and ``commits/N`` (and of their hidden ``.N.crc`` checksums), else None."""
    directory, _, name = key.partition("/")
    if directory not in ("offsets", "commits"):
        return None
    name = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name
    return int(name) if name.isdigit() else None


def state_files(keys: Iterable[str]) -> set[str]:
    """The keys under ``state/<op>/`` that Spark reads or writes (not its hidden checksum files)."""
    return {k for k in keys if re.match(r"state/\d+/", k) and not k.rsplit("/", 1)[-1].startswith(".")}


def operators_run(before: set[str], after: Iterable[str]) -> tuple[int, ...]:
    """The stateful operators a batch ran: those with files under ``state/<op>/`` it wrote.

    Every stateful operator commits a new version of each of its state stores when a batch runs,
    even an empty one (HDFS-backed: ``<v>.delta``; RocksDB: ``<v>.changelog`` or ``<v>.zip``).
    """
    return tuple(sorted({int(k.split("/")[1]) for k in state_files(after) - before}))


def snapshot_operators(manifest: Manifest) -> dict[int, str | None]:
    """The stateful operators whose state the snapshot holds: id -> Spark's name of the operator."""
    ops = {int(op["operator_id"]): op.get("name") for op in manifest.operators}
    for path in state_files(f.path for f in manifest.files):  # snapshots of checkpoints without metadata
        ops.setdefault(int(path.split("/")[1]), None)
    return dict(sorted(ops.items()))


def source_changes(before: Mapping[str, str | None] | None, after: Sequence[str] | None) -> tuple[str, ...]:
    """What the new query changes in the sources of an offset log v2 (Spark 4.2's source evolution: each source
    recorded by name): ``before`` the snapshot's sources and their offsets, ``after`` the new query's source names.
    Nothing when either is unknown (an offset log v1 records sources by position only)."""
    if before is None or after is None:
        return ()
    added = [f"source '{name}' added: Spark reads it from its starting offsets (its own options say where; "
             "nothing of it is in the state)" for name in after if name not in before]
    removed = [f"source '{name}' no longer read: its position {before[name] or '(none yet)'} is dropped, and "
               "reading it again later starts it over" for name in before if name not in after]
    return tuple(added + removed)


def judge(
    manifest: Manifest, job_file: str, ran: tuple[int, ...], *, allow_non_restored: bool
) -> RestoreCheck:
    """The verdict once Spark committed the empty batch: compatible unless state would be dropped."""
    held = snapshot_operators(manifest)
    dropped = tuple(op for op in held if op not in ran)
    fresh = tuple(op for op in ran if op not in held)
    what = f"{manifest.kind.value} {manifest.snapshot_id} (batch {manifest.batch_id})"
    restored = [op for op in held if op in ran]
    reason = (f"{job_file} can restore {what}: Spark loaded the state of "
              f"{_ops(restored, held) if restored else 'no operator (the snapshot holds none)'} "
              f"and ran batch {manifest.batch_id + 1} of the new query on it")
    if fresh:
        reason += f"; the new query's {_ops(fresh, {})} start(s) with empty state"
    outcome = CheckOutcome.COMPATIBLE
    if dropped and not allow_non_restored:
        outcome = CheckOutcome.INCOMPATIBLE
        reason = (f"{job_file} does not restore all the state of {what}: the new query has no stateful "
                  f"{_ops(dropped, held)}, so that state would be dropped (non-restored state). Keep those "
                  "operators in the new code, or pass --allow-non-restored-state to drop their state on purpose")
    elif dropped:
        reason += f"; the state of {_ops(dropped, held)} is dropped (--allow-non-restored-state)"
    return RestoreCheck(outcome, reason, manifest.snapshot_id, manifest.batch_id, snapshot_operators=tuple(held),
                        new_operators=ran, non_restored_operators=dropped)


def _ops(ids: Iterable[int], names: dict[int, str | None]) -> str:
    parts = [f"{op} ({names[op]})" if names.get(op) else str(op) for op in ids]
    return ("operator " if len(parts) == 1 else "operators ") + ", ".join(parts)


#: Spark's error when the new plan's stateful operators differ from the checkpoint's state metadata
#: (added, removed or replaced operators): Spark refuses non-restored state itself.
OPERATORS_MISMATCH = "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
_OPERATOR = re.compile(r"\(OperatorId: (\d+) -> OperatorName: ([^)]*)\)")


def operators_in_error(message: str) -> tuple[dict[int, str], dict[int, str]] | None:
    """(operators in the state metadata, operators of the new plan) from Spark's OPERATORS_MISMATCH message."""
    head, sep, tail = message.partition("Stateful operators in current batch:")
    if not sep or "Stateful operators in the metadata:" not in head:
        return None

    def ops(text: str) -> dict[int, str]:
        return {int(op): name.strip() for op, name in _OPERATOR.findall(text)}

    return ops(head.split("Stateful operators in the metadata:", 1)[1]), ops(tail)


def spark_error(err: BaseException) -> tuple[str, str | None]:
    """Spark's message without the query dump and stack frames, and its error condition if any."""
    text = _STREAM_FAILED.sub("", str(err).split("\n=== Streaming Query ===", 1)[0].strip())
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
    message = " ".join(lines[:ERROR_LINES]) or type(err).__name__
    match = _CONDITION.search(message)
    return message, match.group(1) if match else None
