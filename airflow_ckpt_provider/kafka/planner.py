"""Offset planning of the ckpt-kafka source: each batch's end offsets and the ranges that read them.

Runs in the driver's source process. Pure decisions over a :class:`Snapshot` of the cluster (all
broker IO goes through ``Metadata``, kafka/metadata.py): startingOffsets resolved by batch 0,
maxOffsetsPerTrigger split over partitions, minOffsetsPerTrigger with maxTriggerDelay, new,
deleted and truncated partitions (failOnDataLoss), Trigger.AvailableNow's fixed end, and
minPartitions. A replayed batch gets the same ranges: they depend only on its start and end offsets.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.kafka.metadata import TP, Metadata, Snapshot, partition_name, partition_names
from airflow_ckpt_provider.kafka.offsets import DataLossError, Offsets, flatten, format_offsets
from airflow_ckpt_provider.kafka.options import SourceOptions
from airflow_ckpt_provider.kafka.reader import Range

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowLimits:
    """Admission control for one batch, counted in offsets as Spark's Kafka source counts them."""

    min_rows: int | None = None
    max_rows: int | None = None


class OffsetPlanner:
    """Decides each batch's end offsets and splits [start, end) into ranges; all broker IO goes through Metadata."""

    def __init__(
        self, options: SourceOptions, metadata: Metadata, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.options = options
        self.metadata = metadata
        self.clock = clock
        self.latest_seen: Offsets | None = None
        self._target: Snapshot | None = None
        self._last_trigger = clock()
        self._warned: set[str] = set()

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: fix the end of the run now; later data waits for the next run."""
        self._target = self.metadata.snapshot()
        log.info("available-now target: %s", format_offsets(_nest(self._target.high)))

    def latest(self, start: Offsets | None, limits: RowLimits) -> Offsets:
        """The end of the next batch starting at ``start`` (None: batch 0, which resolves startingOffsets)."""
        snap = self._target if self._target is not None else self.metadata.snapshot()
        self.latest_seen = _nest(snap.high)
        if start is None:
            resolved = self._starting_offsets(snap)
            log.info("startingOffsets %s resolved to %s", self.options.starting.kind, format_offsets(resolved))
            return resolved
        begin = flatten(start)
        snap = self._confirm_missing(snap, begin)
        end: dict[TP, int] = {}
        readable: dict[TP, int] = {}  # partition -> offset its next records start at
        reset = False
        for tp in sorted(set(begin) | set(snap.high)):
            offset, from_offset = self._partition_end(tp, begin.get(tp), snap)
            if offset is not None:
                end[tp] = offset
            if from_offset is not None:
                readable[tp] = from_offset
            elif offset is None or offset != begin.get(tp):
                reset = True  # data loss skipped with failOnDataLoss=false: record it in this batch
        available = {tp: end[tp] - s for tp, s in readable.items() if end[tp] > s}
        total = sum(available.values())
        if self._delay(total, limits, reset):
            return start
        if limits.max_rows is not None and total > limits.max_rows:
            for tp, n in allot(available, limits.max_rows).items():
                end[tp] = readable[tp] + n
        nested = _nest(end)
        if nested != start:
            self._last_trigger = self.clock()
        return nested

    def _confirm_missing(self, snap: Snapshot, begin: Mapping[TP, int]) -> Snapshot:
        """Ask again before calling a partition deleted: one metadata answer can miss a topic."""
        missing = {tp for tp in begin if not _known(tp, snap)}
        if not missing:
            return snap
        again = self.metadata.snapshot()
        transient = {tp for tp in missing if _known(tp, again)}
        if transient:
            log.info("partitions %s missing from metadata, then back: no progress this trigger",
                     partition_names(transient))
        return Snapshot(snap.low, snap.high, snap.unknown | transient, snap.unavailable_topics)

    def _partition_end(self, tp: TP, start: int | None, snap: Snapshot) -> tuple[int | None, int | None]:
        """(end offset or None to drop the partition, offset reading resumes from or None if nothing to read)."""
        if tp not in snap.high:
            if tp in snap.unknown or tp[0] in snap.unavailable_topics:
                return start, None  # no progress until the brokers answer again
            if start is not None:
                self._data_loss(
                    f"partition {partition_name(tp)} no longer exists; records from offset {start} on were not read"
                )
            return None, None
        low, high = snap.low[tp], snap.high[tp]
        if start is None:
            log.info("new partition %s: reading from offset 0", partition_name(tp))
            start = 0
        if start < low:
            self._data_loss(f"offsets [{start}, {low}) of {partition_name(tp)} were deleted before they were read")
            return low, None
        if start > high:
            self._data_loss(
                f"{partition_name(tp)} ends at offset {high} but the query already read up to {start}: the "
                "partition was truncated or the topic recreated; continuing from its earliest offset"
            )
            return low, None
        return high, start

    def ranges(self, start: Offsets | None, end: Offsets) -> list[Range]:
        """[start, end) per partition (new partitions from 0); batch 0 (start None) reads nothing."""
        if start is None:
            return []
        begin = flatten(start)
        planned = [
            Range(t, p, begin.get((t, p), 0), e)
            for (t, p), e in sorted(flatten(end).items())
            if e > begin.get((t, p), 0)
        ]
        planned = split(planned, self.options.min_partitions)
        log.debug("planned %d ranges: %s", len(planned), ", ".join(map(str, planned)))
        return planned

    def _delay(self, total: int, limits: RowLimits, reset: bool) -> bool:
        """minOffsetsPerTrigger: wait for more records until maxTriggerDelay passed (never in AvailableNow)."""
        if limits.min_rows is None or total >= limits.min_rows or reset or self._target is not None or total == 0:
            return False
        waited_ms = (self.clock() - self._last_trigger) * 1000
        if waited_ms >= self.options.max_trigger_delay_ms:
            return False
        log.debug(
            "%d of minOffsetsPerTrigger=%d offsets available after %.0f ms: waiting", total, limits.min_rows, waited_ms
        )
        return True

    def _starting_offsets(self, snap: Snapshot) -> Offsets:
        if snap.unknown or snap.unavailable_topics:
            raise DataLossError(
                f"Cannot resolve startingOffsets: offsets of {partition_names(snap.unknown)} and topics "
                f"{sorted(snap.unavailable_topics)} are unavailable on {self.options.bootstrap_servers}. Expected "
                "every subscribed partition to answer; check the brokers and restart the query"
            )
        starting = self.options.starting
        if starting.kind == "earliest":
            return _nest(snap.low)
        if starting.kind == "latest":
            return _nest(snap.high)
        if starting.kind == "timestamp":
            assert starting.timestamp_ms is not None
            found = self.metadata.offsets_for_timestamp(sorted(snap.high), starting.timestamp_ms)
            # -1: no record at or after the timestamp yet, so start at the end.
            return _nest({tp: snap.high[tp] if found.get(tp, -1) < 0 else found[tp] for tp in snap.high})
        assert starting.specific is not None
        return _nest(self._specific(flatten(starting.specific), snap))

    def _specific(self, given: dict[TP, int], snap: Snapshot) -> dict[TP, int]:
        unsubscribed = sorted({t for t, _ in given if not self.options.subscribed(t)})
        if unsubscribed:
            raise ConfigError(
                f"startingOffsets names topics {unsubscribed} outside {self.options.describe_subscription()}: "
                "expected only subscribed topics; remove them or subscribe to them"
            )
        missing, extra = sorted(set(snap.high) - set(given)), sorted(set(given) - set(snap.high))
        if missing or extra:
            raise ConfigError(
                f"startingOffsets must list every partition of the subscribed topics, as in Spark: missing "
                f"{partition_names(missing) or 'none'}, not existing {partition_names(extra) or 'none'}. Add the "
                "missing ones with -2 (earliest) or -1 (latest) and remove partitions that do not exist"
            )
        resolved: dict[TP, int] = {}
        for tp, offset in given.items():
            low, high = snap.low[tp], snap.high[tp]
            if offset in (-2, -1):
                resolved[tp] = low if offset == -2 else high
            elif low <= offset <= high:
                resolved[tp] = offset
            else:
                self._data_loss(
                    f"startingOffsets asks for offset {offset} of {partition_name(tp)}, which holds [{low}, {high}); "
                    "starting from its earliest offset"
                )
                resolved[tp] = low
        return resolved

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {message}. Expected every record since the last batch to still be on the broker. "
                "Set failOnDataLoss=false to skip lost records with a warning, or restore an older checkpoint"
            )
        if message not in self._warned:
            self._warned.add(message)
            log.warning("data loss (failOnDataLoss=false, skipping): %s", message)


def allot(available: Mapping[TP, int], max_rows: int) -> dict[TP, int]:
    """Split ``max_rows`` over partitions in proportion to what each has; the sum is exactly the bound."""
    total = sum(available.values())
    if total <= max_rows:
        return dict(available)
    shares = {tp: divmod(max_rows * n, total) for tp, n in available.items()}
    out = {tp: whole for tp, (whole, _) in shares.items()}
    rest = max_rows - sum(out.values())
    # Largest remainders first: no partition is starved for long, however small.
    for tp in sorted(shares, key=lambda tp: (-shares[tp][1], tp))[:rest]:
        out[tp] += 1
    return out


def split(ranges: list[Range], min_partitions: int | None) -> list[Range]:
    """minPartitions: split big ranges (proportionally) so a batch has at least that many tasks."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[Range] = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(size, round(size * min_partitions / total)))
        bounds = [r.start + size * i // parts for i in range(parts + 1)]
        out.extend(Range(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds))
    return out


def _known(tp: TP, snap: Snapshot) -> bool:
    """Whether ``snap`` shows the partition, or cannot tell (unknown offsets, topic with an error)."""
    return tp in snap.high or tp in snap.unknown or tp[0] in snap.unavailable_topics


def _nest(flat: Mapping[TP, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[partition] = offset
    return out
