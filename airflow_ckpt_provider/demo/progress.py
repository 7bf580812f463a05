"""The demo's live view of an ``airflow dags test`` run: the few lines of its output that tell the story.

``airflow dags test`` prints Airflow's own structured log (DAG bag, XCom, execution API, run bookkeeping) around
our operators' and triggers' lines. ``DagTestLines`` keeps an allow-list: the provider's loggers, each task's
start and final state, and the exception a failed task raised; a trigger's repeated ``waiting:`` line only when
what it has seen changes, or every ``WAIT_EVERY`` seconds. One event is one line without control characters, so
the output reads the same in a terminal, a pipe or a CI log.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from datetime import datetime

# A record of Airflow's console log: "2026-11-26T06:36:19.657985Z [info     ] event [logger] key=value ...".
# A multi-line event (a driver's log tail) carries its [logger] on its last line.
_RECORD = re.compile(r"^(?P<at>\d{4}-\d\d-\d\dT[\d:.]+Z) \[(?P<level>\w+)\s*\] (?P<rest>.*)$")
_TAIL = re.compile(r"^(?P<text>.*)\s\[(?P<logger>[A-Za-z_][\w.]*)\](?P<extra>(?: [\w.]+=.*)?)$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure): .+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")
_STARTING = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")
_NEW_STATE = re.compile(r"\bnew_state=(\w+)")
_REASON = re.compile(r"\breason=(['\"])(.*)\1")
_JOB = re.compile(r"^(waiting: )?(?:job [\w.-]+: |upgrade of job [\w.-]+[,:] )")  # one job in the demo: said once

#: Loggers whose lines are ours: operators and sensors (under Airflow's task logger) and triggers.
OWN_LOGGERS = ("airflow.task.operators.airflow_ckpt_provider.", "airflow_ckpt_provider.")
#: Final states of a task try worth a line (``deferred`` too: the task waits in the triggerer, no worker held).
SHOWN_STATES = frozenset({"success", "failed", "skipped", "up_for_retry", "upstream_failed", "deferred"})
WAIT_EVERY = 30.0
MAX_CHARS = 300


def _clean(text: str) -> str:
    return _ANSI.sub("", text).strip()


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class DagTestLines:
    """Feed the output of one ``airflow dags test`` run line by line; ``feed`` answers the lines to show."""

    def __init__(self) -> None:
        self.task = "-"
        self._record: tuple[str, str, str] | None = None  # (at, level, first line of the event) of an open record
        self._last_wait = ""
        self._last_shown_at = 0.0
        self._last_line = ""
        self._skip_reason = ""

    def feed(self, line: str) -> list[str]:
        line = _ANSI.sub("", line.rstrip("\r\n"))
        record = _RECORD.match(line)
        if record is not None:
            self._record = (record["at"], record["level"], record["rest"])
            rest = record["rest"]
        elif self._record is not None:
            rest = line  # a continuation: only its last line names the logger
        else:
            return [f"{self.task}: {_clean(line)}"[:MAX_CHARS]] if _EXCEPTION.match(line) else []
        tail = _TAIL.match(rest)
        if tail is None:
            return []
        assert self._record is not None
        at, level, first = self._record
        self._record = None
        text = tail["text"] if record is not None else first
        return self._event(at, level, _clean(_JOB.sub(r"\1", text.strip())), tail["logger"], tail["extra"])

    def _event(self, at: str, level: str, text: str, logger: str, extra: str) -> list[str]:
        if not logger.startswith(OWN_LOGGERS):
            return self._airflow(at, text, extra)
        if text.startswith("waiting: "):
            seen = re.sub(r"\d+", "#", text)
            if seen == self._last_wait and _seconds(at) - self._last_shown_at < WAIT_EVERY:
                return []
            self._last_wait = seen
        marker = "" if level in ("info", "debug") else f"{level.upper()} "
        return self._shown(at, f"{self.task}: {marker}{text}")

    def _airflow(self, at: str, text: str, extra: str) -> list[str]:
        """Of Airflow's own lines, those about the task: its start, why it was skipped, its new state."""
        if starting := _STARTING.search(text):
            self.task = starting[1]
            return self._shown(at, f"{self.task}: started")
        if text == "Skipping task.":
            reason = _REASON.search(extra)
            self._skip_reason = reason[2] if reason else ""
            return []
        state = _NEW_STATE.search(extra) if text == "Task instance state updated" else None
        if state is None or state[1] not in SHOWN_STATES:
            return []
        why = f" ({self._skip_reason})" if state[1] == "skipped" and self._skip_reason else ""
        return self._shown(at, f"{self.task}: {state[1]}{why}")

    def _shown(self, at: str, line: str) -> list[str]:
        """``line``, cut to MAX_CHARS; nothing when it repeats the line before (a sensor logs its trigger's
        verdict again)."""
        line = line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "…"
        if line == self._last_line:
            return []
        self._last_shown_at, self._last_line = _seconds(at), line
        return [line]


@contextlib.contextmanager
def elapsed_status(what: str) -> Iterator[None]:
    """On a terminal, a spinner with the elapsed time of ``what`` below the lines printed meanwhile (from any
    thread: rich redirects stdout); elsewhere nothing, so a pipe gets plain lines."""
    if not sys.stdout.isatty():
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True) as bar:
        bar.add_task(what, total=None)
        yield
