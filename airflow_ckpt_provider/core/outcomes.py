"""The closed sets of the watches' event statuses, apart from the watches themselves.

The triggers' modules read these at import time, and Airflow's triggerer imports a trigger's module on its
event loop: this module stays light (no IO, nothing heavier than the enum of health verdicts) so that import
does not hold the loop up. The watches (core/watches/) produce these statuses.
"""

from __future__ import annotations

from enum import StrEnum

from airflow_ckpt_provider.core.restart import Health


class RequestOutcome(StrEnum):
    """How a control request ended, as the driver acknowledged it."""

    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"


#: The closed sets of event statuses, one per watch (the triggers add "timeout" and "error").
HEALTH_EVENTS = frozenset(h.value for h in Health)
REQUEST_EVENTS = frozenset(o.value for o in RequestOutcome)
SNAPSHOT_EVENTS = frozenset({"completed"})
