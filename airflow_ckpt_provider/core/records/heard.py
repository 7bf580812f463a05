"""When this process saw each heartbeat written, on its own clock: measured by the store's clock, not the writer's.

A reader of status.json or a supervisor's record notes the object's age by the store (S3: its Date header minus
Last-Modified) with the heartbeat; liveness then compares that with this process's clock only, never the
writer host's wall clock with the reader's (docs/reliability.md, finding 8).
Design notes: docs/reliability.md#design-notes-corerecordsheardpy.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

#: Heartbeats remembered per process (the newest; a watch reads one job's few, the UI a few hundred jobs').
KEPT = 4096

_HEARD: OrderedDict[tuple[object, ...], float] = OrderedDict()
_LOCK = threading.Lock()


def note(key: tuple[object, ...], updated_at: float, age: float | None, now: float | None = None) -> None:
    """The heartbeat ``key`` written at ``updated_at`` (its writer's clock) was ``age`` s old by the store's clock
    when this process read it at ``now`` (its own clock). An unknown age (a store that tells none) notes nothing.
    The first note of a heartbeat stays: later reads (whole seconds again) would move it back and forth by one."""
    if age is None:
        return
    seen = (time.time() if now is None else now) - max(age, 0.0)
    with _LOCK:
        _HEARD.setdefault((*key, updated_at), seen)
        _HEARD.move_to_end((*key, updated_at))
        while len(_HEARD) > KEPT:
            _HEARD.popitem(last=False)


def heard_at(key: tuple[object, ...], updated_at: float) -> float:
    """When the heartbeat was written, on this process's clock: as noted when read, else its writer's ``updated_at``
    (a record made in this process, or read from a store that tells no age)."""
    with _LOCK:
        return _HEARD.get((*key, updated_at), updated_at)
