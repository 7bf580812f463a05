"""The progress bar of long transfers (snapshot create and restore) when stderr is a terminal: bytes, files, rate.

Not a terminal, the transfers report lines (cli/common.py ``progress``), as in a log.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.progress import BarColumn, DownloadColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from airflow_ckpt_provider.core.store.progress import Progress, human_bytes, human_count

if TYPE_CHECKING:
    from rich.console import Console


class TransferBar:
    """core/store/progress.py's ``TransferDisplay`` as a rich progress bar on ``console``: one bar per transfer,
    updated on every change (rich redraws a few times a second); what it transfers and its final line are printed
    above them."""

    def __init__(self, console: Console) -> None:
        # What is transferred (job, snapshot, batch) is too long for a bar's row on an 80-column terminal: it is
        # printed above the bar when the transfer starts.
        self._bars = RichProgress(
            BarColumn(bar_width=None), DownloadColumn(binary_units=True), TextColumn("{task.fields[files]} files"),
            TextColumn("{task.fields[rate]}/s"), TimeElapsedColumn(), console=console,
        )
        self._tasks: dict[Progress, TaskID] = {}

    def __enter__(self) -> TransferBar:
        self._bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._bars.stop()  # the bars stay on the terminal as they last were

    def start(self, progress: Progress) -> None:
        self(f"{progress.what}: {human_count(progress.total_files, 'file')}, {human_bytes(progress.total_bytes)}")
        self._tasks[progress] = self._bars.add_task(progress.what, total=progress.total_bytes,
                                                    files=f"0/{progress.total_files}", rate=human_bytes(0))

    def update(self, progress: Progress) -> None:
        self._bars.update(self._tasks[progress], completed=progress.done_bytes,
                          files=f"{progress.done_files}/{progress.total_files}", rate=human_bytes(progress.rate()))

    def __call__(self, line: str) -> None:
        self._bars.console.print(line, markup=False, highlight=False, soft_wrap=True)  # the terminal wraps it
