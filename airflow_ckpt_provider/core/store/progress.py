"""Progress of long transfers: files and bytes done out of a total, and the rate, logged every few seconds.

``report`` takes the lines. A report that is a ``TransferDisplay`` (the CLI's progress bar on a terminal) is
also told of every change, with the counters, and takes only the final line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_count(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 file``, ``2 files``, ``0 files``; ``nouns`` when the plural is not ``noun`` + s (``1 query``,
    ``2 queries``)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


@dataclass(frozen=True)
class TransferStats:
    """The outcome of a transfer: what moved, what was skipped as already stored, and how fast."""

    files: int
    bytes: int
    skipped_files: int
    skipped_bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        """Bytes per second actually transferred."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


@runtime_checkable
class TransferDisplay(Protocol):
    """A live display of transfers (a progress bar): ``start`` once per transfer, ``update`` on every change
    (from the transfer's worker threads), then the final line through ``__call__``."""

    def __call__(self, line: str) -> None: ...

    def start(self, progress: Progress) -> None: ...

    def update(self, progress: Progress) -> None: ...


class Progress:
    """Thread-safe counters for one transfer; reports a line at most every ``every`` seconds."""

    def __init__(
        self,
        what: str,
        total_files: int,
        total_bytes: int,
        *,
        every: float = 2.0,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total_files = total_files
        self.total_bytes = total_bytes
        self._every = every
        self._report = report or log.info
        self._display = report if isinstance(report, TransferDisplay) else None
        self._clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._last = self._start
        self.files = self.bytes = self.skipped_files = self.skipped_bytes = 0
        if self._display is not None:
            self._display.start(self)

    def add_bytes(self, n: int) -> None:
        """Bytes transferred so far within a file (boto3 callback)."""
        with self._lock:
            self.bytes += n
        self._maybe_report()

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
        self._maybe_report()

    def skipped(self, size: int, files: int = 1) -> None:
        """A file not transferred because it is already stored (incremental snapshots); ``files=-1`` and a negative
        size take back one counted so that turned out missing after all."""
        with self._lock:
            self.skipped_files += files
            self.skipped_bytes += size
        self._maybe_report()

    def _maybe_report(self) -> None:
        if self._display is not None:  # the display shows every change; the lines would interleave with it
            self._display.update(self)
            return
        now = self._clock()
        with self._lock:
            if now - self._last < self._every:
                return
            self._last = now
        self._report(self.line())

    @property
    def done_files(self) -> int:
        """Files transferred or skipped as already stored."""
        return self.files + self.skipped_files

    @property
    def done_bytes(self) -> int:
        return self.bytes + self.skipped_bytes

    def rate(self) -> float:
        """Bytes per second actually transferred so far."""
        return self.bytes / max(self._clock() - self._start, 1e-9)

    def line(self) -> str:
        return (
            f"{self.what}: {self.done_files}/{self.total_files} files, "
            f"{human_bytes(self.done_bytes)}/{human_bytes(self.total_bytes)} "
            f"({human_count(self.skipped_files, 'file')} already stored), {human_bytes(self.rate())}/s"
        )

    def finish(self) -> TransferStats:
        stats = TransferStats(
            self.files, self.bytes, self.skipped_files, self.skipped_bytes, self._clock() - self._start
        )
        if self._display is not None:
            self._display.update(self)
        self._report(self.line() + f", done in {stats.seconds:.2f} s")
        return stats
