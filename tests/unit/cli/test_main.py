"""``ckpt``'s entry point: how it presents what it warns about."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.cli.main import main


def test_an_old_spelling_works_and_says_once_what_to_write_instead(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.py"
    job.write_text("# a job\n")
    code = main(["run", str(job), "--job", "j", "--store", str(tmp_path / "store"), "--supervise",
                 "--restart-strategy", "fixed_delay", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: restart strategy 'fixed_delay' is deprecated: use 'fixed-delay'"], err
    assert "spark-submit" in out
