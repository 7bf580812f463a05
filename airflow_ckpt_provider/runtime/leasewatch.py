"""The lease watch: the query is stopped once the lease has gone unconfirmed for longer than its outage tolerance,
whatever the driver's loop is waiting for.

Design notes: docs/runtime.md#design-notes-runtimeleasewatchpy."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.lease import FencedError, Lease

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)


class LeaseWatch:
    """A daemon thread of the driver: reads the lease every ``poll`` seconds, and stops ``query()`` once the lease
    is not confirmed within its outage tolerance (or is lost). ``lapsed`` tells the driver's loop it did."""

    def __init__(self, job: str, lease: Lease, query: Callable[[], StreamingQuery | None], *, poll: float,
                 tick: float = 0.1) -> None:
        self.job = job
        self.lease = lease
        self.query = query
        self.poll = poll
        self.tick = tick
        self._fenced = False
        self.lapsed = threading.Event()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="ckpt-lease-read", daemon=True)
        self._stopper = threading.Thread(target=self._stop_loop, name="ckpt-lease-watch", daemon=True)

    def start(self) -> LeaseWatch:
        self._reader.start()
        self._stopper.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def take_lapsed(self) -> bool:
        """True once after the watch stopped the query (the loop then handles the unconfirmed lease)."""
        if self.lapsed.is_set():
            self.lapsed.clear()
            return True
        return False

    def _read_loop(self) -> None:
        # A read of its own: a confirmation that the loop, held by another request, could not make yet. A read that
        # hangs does not hold up the stopper thread, which only looks at the time of the last confirmation. Reads are
        # sent every ``poll`` s from the last one sent (not answered), so a confirmation is younger than a poll but
        # for a read's latency (``Lease.recent``: the commits between need no read of their own).
        sent = self.lease.monotonic()
        while not self._closed.wait(max(0.0, sent + self.poll - self.lease.monotonic())):
            sent = self.lease.monotonic()
            try:
                self.lease.check()
            except FencedError:
                self._fenced = True
            except StorageError:
                pass  # the loop's own checks log the outage (core/policy/outage.py); the stopper looks at the time
            except Exception:  # never let the thread die: the stopper still works without it
                log.debug("job %s: lease read failed", self.job, exc_info=True)

    def _stop_loop(self) -> None:
        while not self._closed.wait(self.tick):
            if self.lease.tolerating() and not self._fenced:
                continue
            query = self.query()
            try:
                if query is None or not query.isActive:
                    continue
                age = self.lease.monotonic() - self.lease.confirmed_at
                why = ("a newer driver holds the lease" if self._fenced else
                       f"the lease was last confirmed {age:.1f} s ago, beyond its outage tolerance of "
                       f"{self.lease.outage_tolerance:.1f} s")
                log.warning("job %s epoch %d: %s: stopping the query now, nothing may commit until the job store "
                            "confirms the lease", self.job, self.lease.epoch, why)
                self.lapsed.set()
                query.stop()
            except Exception:  # the session is going away; the driver's loop sees it
                log.debug("job %s: could not stop the query", self.job, exc_info=True)
