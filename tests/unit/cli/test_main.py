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


def test_version_names_ckpt_pyspark_and_airflow_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    from airflow_ckpt_provider import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    out, err = capsys.readouterr()
    assert done.value.code == 0 and err == ""
    assert out == (f"ckpt {__version__} (pyspark {metadata.version('pyspark')}, "
                   f"apache-airflow {metadata.version('apache-airflow')})\n")


def test_a_failed_command_under_json_prints_the_error_as_json_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.delenv("CKPT_STORE", raising=False)
    assert main(["snapshot", "list", "--job", "orders", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": {
        "type": "ConfigError", "exit_code": 1,
        "message": "no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE"}}
    assert err == ""
    assert main(["snapshot", "list", "--job", "orders"]) == 1  # without --json: the text on stderr, as before
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set "
                              "CKPT_STORE\n")

