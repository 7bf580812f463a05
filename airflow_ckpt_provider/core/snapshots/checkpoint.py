"""The Spark Structured Streaming checkpoint model: completed batches and the files that restore one.

Pure Python over :class:`Storage` (no pyspark). A batch N is completed when ``commits/N`` exists; a
restore at N needs ``metadata``, the offsets/commits entries Spark reads on restart, the source logs
(this module), and, for every state store, exactly the files that load state version N+1
(core/snapshots/statestore.py). Each rule, where it comes from in Spark 4.3 and how it was confirmed:
docs/spark-checkpoint-internals.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import CheckpointError
from airflow_ckpt_provider.core.snapshots.ckptfiles import LogEntry, json_object, parse_log_entry
from airflow_ckpt_provider.core.snapshots.statestore import StateOperator, state_operators, state_partitions
from airflow_ckpt_provider.core.snapshots.viewplan import ViewPlan, numbered
from airflow_ckpt_provider.core.store.storage import Storage

_MAX_PROBLEMS_SHOWN = 8
_MAX_LOG_VERSION = 2  # OffsetSeqLog.MAX_VERSION and CommitLog.MAX_VERSION in Spark 4.3


@dataclass(frozen=True)
class CheckpointFile:
    """One file a restore needs: its key relative to the checkpoint root, and its size in bytes."""

    path: str
    size: int



@dataclass(frozen=True)
class BatchView:
    """What a snapshot at completed batch N must hold so that Spark resumes at batch N+1."""

    batch_id: int
    query_id: str
    files: tuple[CheckpointFile, ...]
    offsets: list[str | None]
    next_offsets: list[str | None] | None
    operators: tuple[StateOperator, ...]
    conf: dict[str, str]
    batch_watermark_ms: int = 0
    batch_timestamp_ms: int = 0
    state_format: int = 1  # 2: the commit names the unique ids of state checkpoint format v2
    # Broken files of the live checkpoint the view works around (e.g. a truncated snapshot
    # replaced by an older one and more deltas), and stale absolute paths: worth a log line.
    warnings: tuple[str, ...] = ()

    @property
    def state_version(self) -> int:
        """The state store version every store is loaded at on resume (batch N commits N+1)."""
        return self.batch_id + 1


# --------------------------------------------------------------------------------------------
# The listing: one point-in-time view of the checkpoint's files.
# --------------------------------------------------------------------------------------------


def _ignored(key: str) -> bool:
    # Hidden files are Hadoop's ".<name>.crc" checksums and in-flight ".<name>.<uuid>.tmp" files
    # (CheckpointFileManager.createAtomic renames them into place); Spark never reads either.
    return key.rsplit("/", 1)[-1].startswith(".")


class SparkCheckpoint:
    """A Spark checkpoint location, read through ``storage``; safe on a query that is running."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def completed_batches(self) -> list[int]:
        """Every batch whose ``commits/N`` file exists, ascending."""
        return sorted(numbered(self._sizes("commits/"), "commits"))

    def latest_completed_batch(self) -> int | None:
        """The newest completed batch; None when no batch completed yet. The one definition."""
        batches = self.completed_batches()
        return batches[-1] if batches else None

    def state_format(self) -> tuple[int | None, int | None]:
        """(state checkpoint format, batch) of the newest completed batch: 2 if its commit names unique ids
        (``stateUniqueIds``), else 1; (None, None) for a checkpoint without a completed batch. One read."""
        batch = self.latest_completed_batch()
        if batch is None:
            return None, None
        try:
            entry = parse_log_entry(self.storage.read(f"commits/{batch}"), kind="commits")
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(f"commits/{batch} of {self.storage.url} is truncated or corrupt: {err}") from err
        return (1 if entry.metadata.get("stateUniqueIds") is None else 2), batch

    def view(self, batch_id: int | None = None, *, write_ahead: bool = True, verify: bool = False) -> BatchView:
        """The files and facts a snapshot at ``batch_id`` (default: latest completed) must hold.

        ``write_ahead`` includes ``offsets/N+1`` when Spark already wrote it (see the docs for why).
        ``verify`` also reads every state file and checks it is complete (LZ4 end mark, zip CRCs,
        SST footer); without it only small files are read (logs, zips). Raises CheckpointError.
        """
        view, plan = self._build(batch_id, write_ahead=write_ahead, verify=verify)
        if view is None or plan.problems:
            raise CheckpointError(_problem_message(self.storage.url, plan))
        return view

    def validate(self, batch_id: int | None = None, *, write_ahead: bool = True) -> list[str]:
        """Problems found at ``batch_id``, reading every file it needs; empty if consistent.

        Also lists broken files of the live checkpoint that the view avoids (e.g. a truncated
        snapshot it replaces with an older one and more deltas): Spark itself may trip on them.
        """
        _view, plan = self._build(batch_id, write_ahead=write_ahead, verify=True)
        return plan.problems + plan.warnings

    # -- building -------------------------------------------------------------------------

    def _sizes(self, prefix: str = "") -> dict[str, int]:
        return {o.key: o.size for o in self.storage.list(prefix) if not _ignored(o.key)}

    def _build(self, batch_id: int | None, *, write_ahead: bool, verify: bool) -> tuple[BatchView | None, ViewPlan]:
        # Commits are listed first, then everything: all a batch needs is written before its
        # commit file, so the second listing holds it even if the walk itself is not atomic.
        commits = sorted(numbered(self._sizes("commits/"), "commits"))
        plan = ViewPlan(self._sizes(), self.storage.read, self.storage.uri, verify)
        if "metadata" not in plan.sizes:
            plan.problems.append(_not_a_checkpoint(plan.sizes))
            return None, plan
        batch = _pick_batch(commits, batch_id)
        if isinstance(batch, str):
            plan.problems.append(batch)
            return None, plan
        plan.batch = batch
        return _build_view(plan, batch, write_ahead=write_ahead), plan


def is_spark_checkpoint(storage: Storage) -> bool:
    """True if ``storage`` holds a Spark checkpoint (its ``metadata`` file names a query id)."""
    return checkpoint_query_id(storage) is not None


def checkpoint_query_id(storage: Storage) -> str | None:
    """The query id in the checkpoint's ``metadata`` (Spark writes it when the query first starts); None without."""
    try:
        meta = json.loads(storage.read("metadata").decode("utf-8"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    query_id = meta.get("id") if isinstance(meta, dict) else None
    return query_id if isinstance(query_id, str) else None


def _problem_message(url: str, plan: ViewPlan) -> str:
    shown = plan.problems[:_MAX_PROBLEMS_SHOWN]
    more = len(plan.problems) - len(shown)
    text = "; ".join(shown) + (f"; and {more} more problems" if more > 0 else "")
    at = f" at batch {plan.batch}" if plan.batch is not None else ""
    return f"no restorable view of checkpoint {url}{at}: {text}"


def _not_a_checkpoint(sizes: dict[str, int]) -> str:
    found = f"{len(sizes)} other files" if sizes else "no files"
    return (
        f"not a Spark checkpoint: expected a 'metadata' file with the query id, found {found}; "
        "pass the directory given as checkpointLocation to the query"
    )


def _pick_batch(commits: list[int], batch_id: int | None) -> int | str:
    """The batch to view, or a problem description."""
    if not commits:
        return "no batch has completed yet: commits/ is empty; wait until the query commits its first batch"
    if batch_id is None:
        return commits[-1]
    if batch_id not in commits:
        return (
            f"batch {batch_id} is not completed: commits/{batch_id} is missing; completed batches "
            f"still in the checkpoint: {id_ranges(commits)}"
        )
    return batch_id


def id_ranges(ids: Iterable[int]) -> str:
    """Compact "0-4, 7" text for batch ids (any order); "none" for none."""
    ordered = sorted(ids)
    if not ordered:
        return "none"
    parts: list[str] = []
    start = prev = ordered[0]
    for i in [*ordered[1:], -2]:
        if i != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ", ".join(parts)


def _build_view(plan: ViewPlan, batch: int, *, write_ahead: bool) -> BatchView | None:
    query_id = _query_id(plan)
    logs = _logs(plan, batch, write_ahead=write_ahead)
    if logs is None or query_id is None:
        return None
    current, following = logs
    conf = {str(k): str(v) for k, v in (current.metadata.get("conf") or {}).items()}
    _source_logs(plan, following or current)
    operators = state_operators(plan, batch, conf)
    return BatchView(
        batch_id=batch,
        query_id=query_id,
        files=tuple(CheckpointFile(k, plan.sizes[k]) for k in sorted(plan.chosen)),
        offsets=current.offsets,
        next_offsets=following.offsets if following else None,
        operators=operators,
        conf=conf,
        batch_watermark_ms=int(current.metadata.get("batchWatermarkMs", 0)),
        batch_timestamp_ms=int(current.metadata.get("batchTimestampMs", 0)),
        state_format=1 if plan.state_ids is None else 2,
        warnings=tuple(plan.warnings),
    )


def _query_id(plan: ViewPlan) -> str | None:
    plan.chosen.add("metadata")
    data = plan.load("metadata")
    if data is None:
        return None
    try:
        query_id = json_object(data.decode("utf-8"), "metadata file").get("id")
    except (ValueError, UnicodeDecodeError) as err:
        query_id = None
        plan.problems.append(f"metadata is corrupt: {err}")
    if not isinstance(query_id, str):
        plan.problems.append('metadata has no query id: expected {"id": "<uuid>"}')
        return None
    return query_id


# --------------------------------------------------------------------------------------------
# offsets/ and commits/: what MicroBatchExecution.populateStartOffsets reads on restart.
# --------------------------------------------------------------------------------------------


def _logs(plan: ViewPlan, batch: int, *, write_ahead: bool) -> tuple[LogEntry, LogEntry | None] | None:
    """Choose and parse the log entries Spark reads when it resumes after ``batch``."""
    commit = _read_log(plan, f"commits/{batch}", "commits", "it marks the batch completed")
    current = _read_log(plan, f"offsets/{batch}", "offsets", f"the offsets of completed batch {batch}")
    following = None
    if write_ahead and f"offsets/{batch + 1}" in plan.sizes:
        # Spark resumes by re-running batch N+1 with exactly these offsets.
        following = _read_log(plan, f"offsets/{batch + 1}", "offsets", "write-ahead entry")
        if following is not None and current is not None and _unfinished_repartition(plan, batch, current, following):
            plan.chosen.discard(f"offsets/{batch + 1}")
            following = None
    if following is None and batch > 0:
        # populateStartOffsets (validateOffsetLogAndGetPrevOffset) reads the entry before the
        # latest one: without offsets/N+1 the latest is N, so offsets/N-1 must be there.
        _read_log(plan, f"offsets/{batch - 1}", "offsets", "Spark reads the entry before the latest")
    if commit is None or current is None:
        return None
    _check_commit(plan, batch, commit)
    _check_source_count(plan, batch, current, following)
    return current, following


def _unfinished_repartition(plan: ViewPlan, batch: int, current: LogEntry, following: LogEntry) -> bool:
    """``offsets/N+1`` with other state partitions than ``offsets/N`` and no commit: an offline repartition
    (StreamingCheckpointManager.repartition) that did not finish. Spark refuses to restart on it
    (STREAMING_UNFINISHED_REPARTITION_DETECTED), so a view leaves it out and resumes as from batch N."""
    now = state_partitions({str(k): str(v) for k, v in (current.metadata.get("conf") or {}).items()})
    then = state_partitions({str(k): str(v) for k, v in (following.metadata.get("conf") or {}).items()})
    if now is None or then is None or now == then:
        return False
    plan.warnings.append(f"offsets/{batch + 1} is an unfinished repartition of the state from {now} to {then} "
                         f"partitions (no commits/{batch + 1}); left out: Spark would refuse to restart on it")
    return True


def _read_log(plan: ViewPlan, key: str, kind: str, why: str) -> LogEntry | None:
    if not plan.need(key, f"{why}; Spark cannot resume without it"):
        return None
    data = plan.load(key)
    if data is None:
        return None
    try:
        entry = parse_log_entry(data, kind=kind)
    except (ValueError, UnicodeDecodeError) as err:
        plan.problems.append(f"{key} is truncated or corrupt: {err}")
        return None
    if entry.version > _MAX_LOG_VERSION:
        plan.problems.append(
            f"{key} has log format v{entry.version}; this provider reads v1 and v2 only (written by a newer Spark?)"
        )
    return entry


def _check_commit(plan: ViewPlan, batch: int, commit: LogEntry) -> None:
    """Keep the unique ids of state checkpoint format v2 (``stateUniqueIds``: the files of state version N+1)."""
    ids = commit.metadata.get("stateUniqueIds")
    if ids is None:
        return
    if not (isinstance(ids, dict) and all(
            isinstance(parts, list) and all(isinstance(p, list) and all(isinstance(u, str) for u in p) for p in parts)
            for parts in ids.values())):
        plan.add(f"commits/{batch} is corrupt: expected stateUniqueIds as operator id -> [partition] -> [store] -> "
                 f"unique id, found {str(ids)[:200]}")
        return
    plan.state_ids = ids


def _check_source_count(plan: ViewPlan, batch: int, current: LogEntry, following: LogEntry | None) -> None:
    if following is not None and len(following.offsets) != len(current.offsets):
        plan.problems.append(
            f"offsets/{batch} has {len(current.offsets)} source offsets but offsets/{batch + 1} "
            f"has {len(following.offsets)}: one of them is truncated"
        )


# --------------------------------------------------------------------------------------------
# sources/: the logs some sources keep (FileStreamSource's file log, Kafka's initial offsets).
# --------------------------------------------------------------------------------------------


def _source_logs(plan: ViewPlan, entry: LogEntry) -> None:
    """Choose the files under ``sources/<i>/`` that match the newest chosen offsets entry."""
    dirs = sorted({k.split("/")[1] for k in plan.sizes if k.startswith("sources/") and k.count("/") >= 2})
    for source in dirs:
        keys = [k for k in plan.sizes if k.startswith(f"sources/{source}/")]
        log_offset = _file_log_offset(entry, source)
        if log_offset is None:
            plan.chosen.update(keys)  # unknown source: keep its whole log
        else:
            _file_source_log(plan, source, keys, log_offset)


def _file_log_offset(entry: LogEntry, source: str) -> int | None:
    """The FileStreamSourceOffset ``{"logOffset": k}`` of source ``source``, if it is one."""
    if entry.source_ids is not None:
        texts = dict(zip(entry.source_ids, entry.offsets, strict=True))
        text = texts.get(source)
    else:
        index = int(source) if source.isdigit() else -1
        text = entry.offsets[index] if 0 <= index < len(entry.offsets) else None
    if text is None:
        return None
    value = json.loads(text)
    offset = value.get("logOffset") if isinstance(value, dict) and len(value) == 1 else None
    return offset if isinstance(offset, int) else None


def _file_source_log(plan: ViewPlan, source: str, keys: list[str], log_offset: int) -> None:
    # CompactibleFileStreamLog.allFiles: the newest "<c>.compact" holds every entry up to c; the
    # plain entries after it, up to the offset the batch read, complete the log.
    ids: dict[int, str] = {}
    compacts: dict[int, str] = {}
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        if name.isdigit():
            ids[int(name)] = key
        elif name.endswith(".compact") and name[: -len(".compact")].isdigit():
            compacts[int(name[: -len(".compact")])] = key
    usable = [c for c in compacts if c <= log_offset]
    start = max(usable) + 1 if usable else 0
    if usable:
        plan.chosen.add(compacts[max(usable)])
    for i in range(start, log_offset + 1):
        plan.need(f"sources/{source}/{i}", f"file source log entry up to logOffset {log_offset}")
