"""The record of the last --full pass and the default run's line about it (tests/support/fullpass.py)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import fullpass
from tests.support.fullpass import Distance, Tree

SHA = "1441567" + "a" * 33
REC = {"commit": SHA, "date": "2026-11-28T10:00:00+00:00", "passed": 1640, "failed": 0, "skipped": 3,
       "duration_s": 2400.0}


def line(rec: object, far: Distance | None) -> str:
    asked: list[str] = []

    def distance(commit: str) -> Distance | None:
        asked.append(commit)
        return far

    text = fullpass.summary_line(json.dumps(rec), distance)
    assert asked in ([], [SHA])  # never with "-dirty"
    return text


def test_the_line_names_the_commit_and_how_many_commits_ago() -> None:
    assert line(REC, Distance(3, ancestor=True)) == (
        "--full tier: last passed on 1441567 (2026-11-28: 1640 passed, 0 failed, 3 skipped in 40.0 min), 3 commits "
        "ago; run `scripts/test --full` and commit tests/full-pass.json when that has grown")
    assert ", 1 commit ago;" in line(REC, Distance(1, ancestor=True))
    assert line(REC, Distance(0, ancestor=True)).endswith("40.0 min), this very commit (HEAD)")


def test_a_dirty_pass_is_counted_from_its_commit_and_says_it_had_uncommitted_changes() -> None:
    text = line({**REC, "commit": SHA + "-dirty"}, Distance(2, ancestor=True))
    assert text.startswith("--full tier: last passed on 1441567 with uncommitted changes (2026-11-28:")
    assert "2 commits ago" in text


def test_the_line_says_when_the_commit_is_unknown_or_not_behind_head() -> None:
    unknown = line(REC, None)
    assert "a commit this clone does not know: how many commits ago is unknown" in unknown
    assert unknown.endswith("run `scripts/test --full` and commit tests/full-pass.json")
    assert "not an ancestor of HEAD (HEAD has 1 commit not in it)" in line(REC, Distance(1, ancestor=False))
    assert "last passed on an unknown commit" in line({**REC, "commit": None}, None)


def test_the_line_says_when_the_record_is_missing_or_unreadable() -> None:
    missing = fullpass.summary_line(None, lambda _: None)
    assert "expected tests/full-pass.json" in missing and "found no such file" in missing
    assert missing.endswith("run `scripts/test --full` and commit tests/full-pass.json")
    for text in ("{not json", "[1, 2]", '{"date": "x"}', '{"commit": 3}'):
        bad = fullpass.summary_line(text, lambda _: Distance(0, ancestor=True))
        assert "expected tests/full-pass.json to hold a JSON object with the commit" in bad, text
        assert "found an unreadable record" in bad, text
    denied = fullpass.summary_line(PermissionError(13, "Permission denied"), lambda _: None)
    assert "Permission denied" in denied


def test_a_full_run_records_only_the_whole_suite_passing() -> None:
    def why(**kw: object) -> str | None:
        args: dict[str, object] = {"exitstatus": 0, "counts": {"passed": 5, "failed": 0, "skipped": 1},
                                   "narrowed": [], "stress_runs": 3, "stress_runs_full": 3}
        return fullpass.why_not_record(**{**args, **kw})  # type: ignore[arg-type]

    assert why() is None
    assert why(exitstatus=1, counts={"passed": 5, "failed": 1}) == "1 failure (errors included)"
    assert why(exitstatus=1, counts={"failed": 2}) == "2 failures (errors included)"
    assert (why(exitstatus=2, counts={"passed": 3}) or "").startswith("exit status 2 (interrupted")
    assert (why(exitstatus=5, counts={}) or "").startswith("exit status 5")
    assert why(narrowed=["tests/unit", "-k 'x'"]) == "a selection of the suite: tests/unit, -k 'x'"
    assert why(stress_runs=1) == "stress tests run 1 time (--stress-runs; the tier runs them 3)"
    assert why(stress_runs=10) is None


def test_what_narrows_a_run(tmp_path: Path) -> None:
    root = tmp_path
    (root / "tests" / "unit").mkdir(parents=True)

    def narrowed(args: list[str], base: Path = root, **kw: object) -> list[str]:
        return fullpass.narrowing(args, base=base, root=root, testpaths=["tests"], **kw)  # type: ignore[arg-type]

    assert narrowed(["tests"]) == []
    assert narrowed([str(root)]) == []
    assert narrowed(["."], base=root / "tests") == []
    assert narrowed(["tests/unit"]) == ["tests/unit"]
    assert narrowed(["tests/unit/x.py::test_a"]) == ["tests/unit/x.py::test_a"]
    assert narrowed(["tests"], keyword="snapshot", markexpr="not integration", deselect=["tests/a.py::b"]) == [
        "-k 'snapshot'", "-m 'not integration'", "--deselect tests/a.py::b"]


def test_the_record_holds_the_commit_dirty_or_not_the_date_counts_and_duration() -> None:
    now = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    counts = fullpass.counts_of({"passed": [1, 2], "failed": [1], "error": [1, 2], "skipped": [1], "": [1]})
    assert counts == {"passed": 2, "failed": 3, "skipped": 1}
    assert fullpass.record(Tree(SHA, dirty=False), {"passed": 9, "failed": 0, "skipped": 2}, 61.25, now) == {
        "commit": SHA, "date": "2026-11-28T10:00:00+00:00", "passed": 9, "failed": 0, "skipped": 2,
        "duration_s": 61.2}
    assert fullpass.record(Tree(SHA, dirty=True), {}, 0, now)["commit"] == SHA + "-dirty"
    assert fullpass.record(Tree(None, dirty=False), {}, 0, now)["commit"] is None
    rec = fullpass.record(Tree(SHA, dirty=False), {"passed": 9, "failed": 0, "skipped": 2}, 61.25, now)
    assert fullpass.recorded_line(rec).startswith(
        f"--full pass recorded in tests/full-pass.json: {SHA} (2026-11-28: 9 passed, 0 failed, 2 skipped in 1.0 min)")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_the_clone_state_and_distance_come_from_git(tmp_path: Path) -> None:
    assert fullpass.tree_state(tmp_path) == Tree(None, dirty=False)  # not a clone
    git(tmp_path, "init", "-q")
    (tmp_path / "tests").mkdir()
    (tmp_path / "a").write_text("1")
    git(tmp_path, "add", "a")
    git(tmp_path, "commit", "-qm", "one")
    first = git(tmp_path, "rev-parse", "HEAD")
    assert fullpass.tree_state(tmp_path) == Tree(first, dirty=False)
    (tmp_path / fullpass.RECORD_NAME).write_text("{}")  # the record itself does not make the tree dirty
    assert fullpass.tree_state(tmp_path) == Tree(first, dirty=False)
    (tmp_path / "a").write_text("2")
    assert fullpass.tree_state(tmp_path) == Tree(first, dirty=True)
    git(tmp_path, "commit", "-qam", "two")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "three")
    assert fullpass.distance(first, tmp_path) == Distance(2, ancestor=True)
    assert fullpass.distance("0" * 40, tmp_path) is None
    git(tmp_path, "checkout", "-q", "--orphan", "other")
    git(tmp_path, "commit", "-qm", "elsewhere")
    assert fullpass.distance(first, tmp_path) == Distance(1, ancestor=False)


def test_the_record_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "full-pass.json"
    assert fullpass.read_record(path) is None
    fullpass.write_record(REC, path)
    assert json.loads(path.read_text()) == REC and [p.name for p in tmp_path.iterdir()] == ["full-pass.json"]
    assert isinstance(fullpass.read_record(tmp_path), IsADirectoryError)


@pytest.mark.parametrize(("n", "text"), [(0, "0 commits"), (1, "1 commit"), (2, "2 commits")])
def test_plural(n: int, text: str) -> None:
    assert fullpass.plural(n, "commit") == text
