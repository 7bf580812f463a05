"""The restore check's verdict: the closed set of outcomes and the one line that carries it.

The driver (runtime/restorecheck.py) prints its verdict as one stdout line, ``CKPT_RESTORE_CHECK
{json}``, among Spark's output; the launching host (launcher/restorecheck.py) finds it there. Pure
data: no pyspark, no Airflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_INCOMPATIBLE, EXIT_STOPPED

log = logging.getLogger(__name__)

#: How the driver's verdict starts on stdout: the prefix, then one JSON object, on one line.
REPORT_PREFIX = "CKPT_RESTORE_CHECK "


class CheckOutcome(StrEnum):
    """The closed set of verdicts; ``EXIT_CODES`` maps each to the driver's exit code."""

    COMPATIBLE = "compatible"  # Spark restored the state and ran a batch of the new query on it
    INCOMPATIBLE = "incompatible"  # Spark refused it, or state of the snapshot would be dropped
    INCONCLUSIVE = "inconclusive"  # no verdict: timeout, crash, unreachable storage (retry may help)
    BAD_INPUT = "bad-input"  # nothing to check: unknown snapshot, broken job file, no snapshot of the state


EXIT_CODES = {
    CheckOutcome.COMPATIBLE: EXIT_STOPPED,
    CheckOutcome.INCOMPATIBLE: EXIT_INCOMPATIBLE,
    CheckOutcome.INCONCLUSIVE: EXIT_FAILED,
    CheckOutcome.BAD_INPUT: EXIT_CONFIG,
}


@dataclass(frozen=True)
class RestoreCheck:
    """The verdict of one restore check.

    ``snapshot_id``/``batch_id``: the snapshot checked and its completed batch (the check runs batch
    ``batch_id + 1``, without data). ``snapshot_operators``: the stateful operators whose state the
    snapshot holds; ``new_operators``: those the new query ran (it wrote state for them);
    ``non_restored_operators``: in the snapshot but not in the new query (their state would be dropped).
    ``error_class``: Spark's error condition when Spark refused, e.g. STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE.
    ``seconds``: the check's wall time (from ``check_restore``: spark-submit's start included).
    """

    outcome: CheckOutcome
    reason: str
    snapshot_id: str | None = None
    batch_id: int | None = None
    snapshot_operators: tuple[int, ...] = ()
    new_operators: tuple[int, ...] = ()
    non_restored_operators: tuple[int, ...] = ()
    error_class: str | None = None
    seconds: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields of a newer driver, kept as they are

    @property
    def compatible(self) -> bool:
        return self.outcome is CheckOutcome.COMPATIBLE

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "compatible": self.compatible,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "snapshot_id": self.snapshot_id,
            "batch_id": self.batch_id,
            "snapshot_operators": list(self.snapshot_operators),
            "new_operators": list(self.new_operators),
            "non_restored_operators": list(self.non_restored_operators),
            "error_class": self.error_class,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestoreCheck:
        """The check ``to_dict`` described; ValueError says what is missing or malformed."""
        try:
            outcome = CheckOutcome(d["outcome"]) if "outcome" in d else (
                CheckOutcome.COMPATIBLE if d["compatible"] is True else CheckOutcome.INCOMPATIBLE
            )
            known = {"compatible", "outcome", "reason", "snapshot_id", "batch_id", "snapshot_operators",
                     "new_operators", "non_restored_operators", "error_class", "seconds"}
            return cls(
                outcome=outcome,
                reason=str(d["reason"]),
                snapshot_id=None if d.get("snapshot_id") is None else str(d["snapshot_id"]),
                batch_id=None if d.get("batch_id") is None else int(d["batch_id"]),
                snapshot_operators=tuple(int(o) for o in d.get("snapshot_operators") or ()),
                new_operators=tuple(int(o) for o in d.get("new_operators") or ()),
                non_restored_operators=tuple(int(o) for o in d.get("non_restored_operators") or ()),
                error_class=None if d.get("error_class") is None else str(d["error_class"]),
                seconds=None if d.get("seconds") is None else float(d["seconds"]),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a restore check report ({err!r}): {dict(d)!r:.300}") from err

    def to_line(self) -> str:
        """The line the driver prints: the prefix and the JSON object."""
        return REPORT_PREFIX + json.dumps(self.to_dict(), sort_keys=True)


def parse_report(lines: Iterable[str]) -> RestoreCheck | None:
    """The last report line among ``lines`` (a driver's whole output), or None if there is none."""
    found: RestoreCheck | None = None
    for line in lines:
        start = line.find(REPORT_PREFIX)
        if start < 0:
            continue
        try:
            body = json.loads(line[start + len(REPORT_PREFIX):])
            if isinstance(body, dict):
                found = RestoreCheck.from_dict(body)
        except ValueError as err:  # a line cut by another process's output: keep looking
            log.warning("ignoring a malformed restore check line: %s", err)
    return found
