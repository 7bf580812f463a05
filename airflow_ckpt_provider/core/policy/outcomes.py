"""The closed sets of the watches' event statuses, apart from the watches themselves.

The triggers' modules read these at import time, and Airflow's triggerer imports a trigger's module on its
event loop: this module stays light (no IO, nothing heavier than the enum of health verdicts) so that import
does not hold the loop up. The watches (core/watches/) produce these statuses.
"""

from __future__ import annotations

from enum import StrEnum

from airflow_ckpt_provider.core.policy.restart import Health


class RequestOutcome(StrEnum):
    """How a control request ended, as the driver acknowledged it."""

    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"


class CheckOutcome(StrEnum):
    """The restore check's closed set of verdicts (runtime/restore_check_verdict.py maps each to the driver's
    exit code)."""

    COMPATIBLE = "compatible"  # Spark restored the state and ran a batch of the new query on it
    INCOMPATIBLE = "incompatible"  # Spark refused it, or state of the snapshot would be dropped
    INCONCLUSIVE = "inconclusive"  # no verdict: timeout, crash, unreachable storage (retry may help)
    BAD_INPUT = "bad-input"  # nothing to check: unknown snapshot, broken job file, no snapshot of the state


#: A restore check that ended without recording a verdict (its process is gone, or its deadline passed).
CHECK_FAILED = "failed"

#: The closed sets of event statuses, one per watch (the triggers add "timeout" and "error").
HEALTH_EVENTS = frozenset(h.value for h in Health)
REQUEST_EVENTS = frozenset(o.value for o in RequestOutcome)
SNAPSHOT_EVENTS = frozenset({"completed"})
CHECK_EVENTS = frozenset({*(o.value for o in CheckOutcome), CHECK_FAILED})
