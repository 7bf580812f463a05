"""One log line when a dependency becomes unreachable and one when it is back, not one per failed request
(``Outage``); ``ReadableAgain``: when the store could be read again, for the readers of heartbeats.

Design notes: docs/runtime.md#design-notes-corepolicyoutagepy."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Outage:
    """The state of one dependency (``what``), as seen by ``job``'s requests to it."""

    def __init__(self, job: str, what: str, *, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log) -> None:
        self.job = job
        self.what = what
        self.clock = clock
        self.log = logger
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def seconds(self) -> float:
        """Seconds since the outage began (0 if there is none)."""
        since = self._since
        return 0.0 if since is None else self.clock() - since

    def failed(self, err: BaseException | str) -> None:
        """A request failed with ``err``: the first failure of an outage is logged, later ones counted."""
        with self._lock:
            self._failures += 1
            if self._since is not None:
                return
            self._since = self.clock()
        self.log.warning("job %s: %s is unreachable: %s (retrying; further failures are not logged until it is "
                         "back)", self.job, self.what, err)

    def ok(self) -> None:
        """A request succeeded: ends an outage (one line with its length and the failures it hid)."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, failures = self._since, self._failures
            if since is None:
                return
            self._since, self._failures = None, 0
        self.log.warning("job %s: %s is reachable again after %.1f s (%d failed requests)", self.job, self.what,
                         self.clock() - since, failures)


class ReadableAgain:
    """When a reader of heartbeats (the supervisor, the health watch) could read the store again after reads failed.

    An outage silences the writers as it blinds the reader: when the reader sees their records again, they are
    stale. ``within`` says whether a heartbeat limit has passed since the first read that worked (not since the last
    that failed: a failed request retries for seconds, so that one may be long before the store answered again).
    ``now`` is the caller's clock.
    """

    def __init__(self) -> None:
        self._failing = False
        self.since: float | None = None  # the first read that worked after one that failed; None: no outage yet

    def failed(self) -> None:
        self._failing = True

    def worked(self, now: float) -> None:
        if self._failing:
            self._failing, self.since = False, now

    def within(self, now: float, limit: float) -> bool:
        """Whether ``now`` is less than ``limit`` seconds after the store answered again."""
        return self.since is not None and now - self.since < limit
