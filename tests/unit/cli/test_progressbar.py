"""Long transfers in the CLI: a rich progress bar (bytes, files, rate) when stderr is a terminal, the log lines of
core/store/progress.py as before when it is not."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.cli.progressbar import TransferBar
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.progress import Progress
from airflow_ckpt_provider.core.store.storage import LocalStorage
from tests.support.ckptfactory import make_checkpoint

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen(raw: str) -> list[str]:
    """What a terminal last shows on each line: ANSI codes dropped, a line redrawn after \\r kept as its last draw."""
    return [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", raw).split("\n")]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_shows_bytes_files_and_rate_and_prints_only_the_final_line() -> None:
    now = [0.0]
    out = io.StringIO()
    with TransferBar(Console(file=out, force_terminal=True, width=120)) as bar:
        progress = Progress("snapshot s1", 3, 3072, report=bar, clock=lambda: now[0], every=0.0)
        now[0] = 1.0
        progress.add_bytes(1024)
        progress.file_done()
        progress.skipped(1024)  # an already stored file: counted in the bar, not in the rate
        now[0] = 2.0
        progress.add_bytes(1024)
        progress.file_done()
        progress.finish()
    lines = screen(out.getvalue())
    assert lines[:2] == [
        "snapshot s1: 3 files, 3.0 KiB",
        "snapshot s1: 3/3 files, 3.0 KiB/3.0 KiB (1 file already stored), 1.0 KiB/s, done in 2.00 s"]
    assert re.fullmatch(r"━+ 3\.0/3\.0 KiB 3/3 files 1\.0 KiB/s 0:00:0\d", lines[-2]), lines
    assert len(lines[-2]) == 120 and lines[-1] == ""  # the bar takes the terminal's width
    assert [line for line in lines if "already stored" in line] == [lines[1]]  # every=0, yet no other line


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "ckpt", 3)


LINE = r"job orders snapshot savepoint-2-\S+ \(batch 2\): 4/4 files, 347 B/347 B \(0 files already stored\), \S+ \S+/s"


def test_not_a_terminal_the_transfer_logs_its_lines_as_before(tmp_path: Path, checkpoint: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(tmp_path / "jobs"), "--job", "orders"]
    assert cli.main(["snapshot", "create", *store, "--checkpoint", str(checkpoint)]) == 0
    err = capsys.readouterr().err
    assert re.fullmatch(rf"{LINE}, done in \d+\.\d\d s\n", err), err


def test_on_a_terminal_create_and_restore_draw_a_bar(tmp_path: Path, checkpoint: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    store = ["--store", str(tmp_path / "jobs"), "--job", "orders"]
    assert cli.main(["snapshot", "create", *store, "--checkpoint", str(checkpoint)]) == 0
    [snapshot_id] = [s.name for s in (tmp_path / "jobs" / "orders" / "snapshots").iterdir()]
    assert JobStore(LocalStorage(tmp_path / "jobs"), "orders").snapshot_uri(snapshot_id) in capsys.readouterr().out
    lines = [line for line in screen(terminal.getvalue()) if line]
    assert re.fullmatch(r"job orders snapshot savepoint-2-\S+ \(batch 2\): 4 files, 347 B", lines[0]), lines
    assert re.fullmatch(rf"{LINE}, done in \d+\.\d\d s", lines[1]), lines
    assert re.fullmatch(r"━+ 347/347 bytes 4/4 files \S+ \S+/s 0:00:0\d", lines[2]), lines
    assert len(lines) == 3
    terminal.seek(0)
    terminal.truncate()
    assert cli.main(["snapshot", "restore", *store, snapshot_id, "--target", str(tmp_path / "restored")]) == 0
    lines = [line for line in screen(terminal.getvalue()) if line]
    assert re.fullmatch(r"restore job orders snapshot savepoint-2-\S+ \(batch 2\): 4 files, 347 B", lines[0]), lines
    assert re.fullmatch(rf"restore {LINE}, done in \d+\.\d\d s", lines[1]), lines
    assert re.fullmatch(r"━+ 347/347 bytes 4/4 files \S+ \S+/s 0:00:0\d", lines[2]), lines
    assert len(lines) == 3
