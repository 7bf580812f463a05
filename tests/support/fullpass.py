"""The record of the last ``--full`` pass (``tests/full-pass.json``) and the line every default run prints about it.

The ``--full`` tier (``scripts/test --full``: stress tests x3, the exactly-once proof with ten kills per sink, the
tests marked ``full``) takes 30+ minutes more, so it is run by hand, and a tier run by hand rots unnoticed. A
``--full`` run of the whole suite that ends with no failures writes the commit it ran on (``-dirty`` when the tree had
uncommitted changes), the date, the counts and its duration into ``tests/full-pass.json``, a tracked file: committed,
it reaches every clone, and every default run then says which commit the tier last passed on and how many commits
ago that is (tests/conftest.py: ``pytest_sessionstart``, ``pytest_terminal_summary``; on the controller only under
pytest-xdist).

The pure part (what to write, whether to write it, the line) is apart from the git calls, for tests/unit.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

#: The repository's root; the record's place in it.
ROOT = Path(__file__).resolve().parents[2]
RECORD_NAME = "tests/full-pass.json"
RECORD = ROOT / RECORD_NAME
DIRTY = "-dirty"
#: What to run for a new record.
RUN_FULL = "run `scripts/test --full` and commit tests/full-pass.json"


@dataclass(frozen=True)
class Tree:
    """The clone at a session's start: HEAD (None outside a git clone) and whether anything was uncommitted
    (the record itself aside)."""

    commit: str | None
    dirty: bool

    @property
    def label(self) -> str | None:
        return None if self.commit is None else self.commit + (DIRTY if self.dirty else "")


@dataclass(frozen=True)
class Distance:
    """How far HEAD is from a recorded commit: ``git rev-list --count <commit>..HEAD``, and whether the commit is
    an ancestor of HEAD (a rebased or other branch's commit is not)."""

    commits: int
    ancestor: bool


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def counts_of(stats: Mapping[str, Sequence[object]]) -> dict[str, int]:
    """passed, failed (failures and errors), skipped from a terminal reporter's ``stats``."""
    return {"passed": len(stats.get("passed", ())),
            "failed": len(stats.get("failed", ())) + len(stats.get("error", ())),
            "skipped": len(stats.get("skipped", ()))}


def narrowing(args: Sequence[str], *, base: Path, root: Path, testpaths: Sequence[str], keyword: str = "",
              markexpr: str = "", deselect: Sequence[str] = ()) -> list[str]:
    """What made a run less than the whole suite: arguments other than the root or a test path (``tests``),
    node ids, ``-k``, ``-m``, ``--deselect``. Empty for the whole suite."""
    whole = {root.resolve(), *((root / p).resolve() for p in testpaths)}
    found = [a for a in args if "::" in a or (base / a).resolve() not in whole]
    if keyword:
        found.append(f"-k {keyword!r}")
    if markexpr:
        found.append(f"-m {markexpr!r}")
    found.extend(f"--deselect {d}" for d in deselect)
    return found


def why_not_record(*, exitstatus: int, counts: Mapping[str, int], narrowed: Sequence[str], stress_runs: int,
                   stress_runs_full: int) -> str | None:
    """Why a ``--full`` run must not be recorded as a pass (what was found), or None to record it."""
    if counts.get("failed", 0):
        return f"{plural(counts['failed'], 'failure')} (errors included)"
    if exitstatus != 0:
        return f"exit status {exitstatus} (interrupted, an internal error or no tests collected)"
    if narrowed:
        return "a selection of the suite: " + ", ".join(narrowed)
    if stress_runs < stress_runs_full:
        return f"stress tests run {plural(stress_runs, 'time')} (--stress-runs; the tier runs them {stress_runs_full})"
    return None


def record(tree: Tree, counts: Mapping[str, int], seconds: float, now: datetime) -> dict[str, Any]:
    """The record a passing ``--full`` run writes."""
    return {"commit": tree.label, "date": now.isoformat(timespec="seconds"), "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0), "skipped": counts.get("skipped", 0),
            "duration_s": round(seconds, 1)}


def _what(rec: Mapping[str, Any]) -> str:
    date = str(rec.get("date", "?"))[:10]
    minutes = float(rec.get("duration_s", 0)) / 60
    return (f"{date}: {rec.get('passed', '?')} passed, {rec.get('failed', '?')} failed, {rec.get('skipped', '?')} "
            f"skipped in {minutes:.1f} min")


def recorded_line(rec: Mapping[str, Any]) -> str:
    """A ``--full`` run's line once it wrote the record."""
    return (f"--full pass recorded in {RECORD_NAME}: {rec['commit'] or 'an unknown commit'} ({_what(rec)}); commit "
            f"{RECORD_NAME} so that every default run can say how old the tier's last pass is")


def not_recorded_line(why: str) -> str:
    """A ``--full`` run's line when it did not write the record."""
    return (f"--full pass not recorded in {RECORD_NAME}: expected the whole suite to pass, found {why}; the "
            f"record stays as it was (to record a pass, run `scripts/test --full` with no selection of tests and no "
            f"lower --stress-runs)")


def summary_line(text: str | OSError | None, distance: Callable[[str], Distance | None]) -> str:
    """The default run's line on the last ``--full`` pass, from the record's text (None: no file; an OSError:
    unreadable) and ``distance(commit)`` (None: git does not know the commit)."""
    if text is None:
        return (f"--full tier: no pass on record: expected {RECORD_NAME} (written by a --full run of the whole "
                f"suite that passes), found no such file; {RUN_FULL}")
    try:
        if isinstance(text, OSError):
            raise ValueError(str(text))
        rec = json.loads(text)
        commit = rec["commit"] if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not (commit is None or isinstance(commit, str)):
            raise ValueError("not an object with a 'commit' string")
    except (ValueError, KeyError) as err:
        return (f"--full tier: expected {RECORD_NAME} to hold a JSON object with the commit of the last pass, found "
                f"an unreadable record ({err}); {RUN_FULL}")
    what = _what(rec)
    if not commit:
        return (f"--full tier: last passed on an unknown commit ({what}; the run was outside a git clone): how many "
                f"commits ago is unknown; {RUN_FULL}")
    dirty = commit.endswith(DIRTY)
    sha = commit.removesuffix(DIRTY)
    on = f"{sha[:7]}{' with uncommitted changes' if dirty else ''} ({what})"
    far = distance(sha)
    if far is None:
        return (f"--full tier: last passed on {on}, a commit this clone does not know: how many commits ago is "
                f"unknown; {RUN_FULL}")
    if not far.ancestor:
        return (f"--full tier: last passed on {on}, which is not an ancestor of HEAD (HEAD has "
                f"{plural(far.commits, 'commit')} not in it); {RUN_FULL}")
    if far.commits == 0:
        return f"--full tier: last passed on {on}, this very commit (HEAD)"
    return (f"--full tier: last passed on {on}, {plural(far.commits, 'commit')} ago; {RUN_FULL} when that has "
            f"grown")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                          check=False)


def tree_state(root: Path = ROOT) -> Tree:
    """HEAD and whether the clone has uncommitted changes, the record itself aside (None outside a clone)."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        if head.returncode != 0:
            return Tree(None, False)
        status = _git(root, "status", "--porcelain", "--", ".", f":!{RECORD_NAME}")
    except (OSError, subprocess.SubprocessError):
        return Tree(None, False)
    return Tree(head.stdout.strip(), status.returncode != 0 or bool(status.stdout.strip()))


def distance(commit: str, root: Path = ROOT) -> Distance | None:
    """How many commits HEAD is past ``commit``; None when git does not know it."""
    try:
        count = _git(root, "rev-list", "--count", f"{commit}..HEAD")
        if count.returncode != 0:
            return None
        ancestor = _git(root, "merge-base", "--is-ancestor", commit, "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return Distance(int(count.stdout.strip()), ancestor.returncode == 0)


def read_record(path: Path = RECORD) -> str | OSError | None:
    """The record's text; None when there is none, the error when it cannot be read."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        return err


def write_record(rec: Mapping[str, Any], path: Path = RECORD) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec, indent=2) + "\n")
    tmp.replace(path)
