"""One log line per Kafka broker state change instead of one per failed request (issue 15).

Design notes: docs/kafka.md#design-notes-kafkaclientlogpy."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_ckpt_provider.core.policy.streambatch import worker_logging

log = logging.getLogger(__name__)
#: librdkafka's own lines that are not connection state (auth, topics, fatal errors).
LIBRDKAFKA_LOG = logging.getLogger("airflow_ckpt_provider.kafka.librdkafka")

#: statistics.interval.ms of polled clients: the latency of a "reachable again" line.
STATS_INTERVAL_MS = 1000
#: Identical non-connection lines within this window are counted, not logged again.
DEDUP_WINDOW_S = 60.0
#: Callbacks of one client closer than this belong to one poll (they run back to back inside it).
POLL_GAP_S = 0.005
#: KafkaError names (error_cb) that report broker connectivity.
CONNECTION_ERRORS = frozenset({"_TRANSPORT", "_RESOLVE", "_ALL_BROKERS_DOWN"})

# "127.0.0.1:9092/bootstrap: ...", "127.0.0.1:9092/1: ...", "GroupCoordinator: 127.0.0.1:9092: ...", and
# "GroupCoordinator: Connect to ..." (a logical broker before it has an address: None)
_BROKER_PREFIX = re.compile(
    r"^(?:[A-Za-z]+: )?(?:(?P<address>\[?[^\s/\]]+\]?:\d+)(?:/[^\s:]+)?: )?(?P<rest>.*)$", re.S)
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]: ")
_AFTER_SUFFIX = re.compile(r" \(after \d+ms in state [A-Z_]+\)$")
_CONNECT_FAILED = ("Connect to ", "Failed to resolve", "Connection setup timed out")


@dataclass(frozen=True)
class ConnectionEvent:
    """A librdkafka message about one broker address (None: not named): a failed connect, or a disconnect."""

    address: str | None
    failed_connect: bool
    reason: str


def parse_connection_text(text: str) -> ConnectionEvent | None:
    """The broker address and reason of a librdkafka connection message; None for anything else."""
    match = _BROKER_PREFIX.match(_THREAD_PREFIX.sub("", text, count=1))
    if match is None:
        return None
    rest = match["rest"]
    failed = rest.startswith(_CONNECT_FAILED)
    if not failed and not rest.startswith("Disconnected"):
        return None
    reason = _AFTER_SUFFIX.sub("", rest)
    if rest.startswith("Connect to ") and " failed: " in reason:
        reason = reason.split(" failed: ", 1)[1]  # "Connection refused"
    return ConnectionEvent(match["address"], failed, reason)


@dataclass
class _Outage:
    address: str
    label: str
    reason: str
    since: float
    suppressed: int = 0


class ConnectivityTracker:
    """Per-process, thread-safe state of each broker address: logs each change once (see module doc)."""

    def __init__(self, logger: logging.Logger = log, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._lock = threading.Lock()
        self._down: dict[str, _Outage] = {}
        self._recovered: dict[str, float] = {}  # address -> when its last outage ended

    def unreachable(self) -> frozenset[str]:
        """Addresses currently in an outage."""
        with self._lock:
            return frozenset(self._down)

    def failure(self, address: str, reason: str, label: str, *, served_before: float | None = None,
                count: bool = True) -> None:
        """A failed connect to ``address``: the first one starts an outage, later ones are counted.

        ``served_before``: when the reporting client last ran a callback (None: never). A client not
        served since the address's last recovery may replay that outage's failures: ignored.
        """
        with self._lock:
            outage = self._down.get(address)
            if outage is not None:
                outage.suppressed += count
                return
            recovered = self._recovered.get(address)
            if recovered is not None and (served_before is None or served_before < recovered):
                self._log.debug("kafka %s: connect failure of a client not served since the last recovery "
                                "(a replay) ignored: %s", address, reason)
                return
            outage = self._down[address] = _Outage(address, label, reason, self._clock())
        self._log.warning("kafka %s unreachable: %s (%s; further errors suppressed until it is back)",
                          address, reason, label)

    def noise(self, addresses: Iterable[str], *, count: bool = True) -> bool:
        """A connection message that changes nothing (disconnect, all brokers down): counted against the
        first of ``addresses`` in an outage. False if none is (the caller logs it at DEBUG)."""
        with self._lock:
            for address in addresses:
                outage = self._down.get(address)
                if outage is not None:
                    outage.suppressed += count
                    return True
        return False

    def snapshot(self, taken_at: float, up_since: Mapping[str, float]) -> None:
        """A stats snapshot taken at ``taken_at`` (monotonic s) with the addresses of its UP connections
        and since when each is UP: ends the outages that began before it."""
        ended: list[tuple[_Outage, float]] = []
        with self._lock:
            for address, since in up_since.items():
                outage = self._down.get(address)
                if outage is None or taken_at <= outage.since:
                    continue  # reachable, or a snapshot from before the outage
                del self._down[address]
                self._recovered[address] = self._clock()
                back = since if since >= outage.since else taken_at
                ended.append((outage, back - outage.since))
        for outage, seconds in ended:
            self._log.info("kafka %s reachable again after %.1f s (%d errors suppressed; %s)",
                           outage.address, seconds, outage.suppressed, outage.label)


class _Deduplicator:
    """Identical texts within a window: the first is logged, repeats are counted and reported later."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}  # key -> (logged at, repeats since)

    def admit(self, level: int, text: str) -> int | None:
        """None: a repeat within the window (counted); else the repeats counted since it was last logged."""
        now = self._clock()
        with self._lock:
            if len(self._seen) > 1000:  # bound memory: forget texts not seen within the window
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._window}
            logged_at, repeats = self._seen.get((level, text), (None, 0))
            if logged_at is not None and now - logged_at < self._window:
                self._seen[(level, text)] = (logged_at, repeats + 1)
                return None
            self._seen[(level, text)] = (now, 0)
            return repeats


class ClientHooks:
    """The ``logger``, ``error_cb`` and ``stats_cb`` of one client (one instance per client)."""

    def __init__(self, bootstrap_servers: str, label: str, tracker: ConnectivityTracker,
                 dedup: _Deduplicator, clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.label = label
        self.tracker = tracker
        self._dedup = dedup
        self._clock = clock
        self._addresses = [a.strip() for a in bootstrap_servers.split(",") if a.strip()]
        self._last_callback: float | None = None  # when this client's last callback ended
        self._served: float | None = None  # when its previous poll (with callbacks) ended; None: never

    # confluent_kafka calls logger.log(level, "%s [%s] %s", facility, client name, message)
    def log(self, level: int, msg: str, *args: Any) -> None:
        self._poll_started()
        try:
            self._log(level, msg, *args)
        finally:
            self._last_callback = self._clock()

    def error(self, err: Any) -> None:
        """error_cb: connectivity goes to the tracker, anything else is logged (deduplicated, fatal not)."""
        self._poll_started()
        try:
            self._error(err)
        finally:
            self._last_callback = self._clock()

    def stats(self, text: str) -> None:
        """stats_cb: the UP connections of this snapshot, by address, and since when they are UP."""
        self._poll_started()
        try:
            self._stats(text)
        finally:
            self._last_callback = self._clock()

    def _poll_started(self) -> None:
        if self._last_callback is not None and self._clock() - self._last_callback > POLL_GAP_S:
            self._served = self._last_callback  # a new poll: the previous one ended then

    def _log(self, level: int, msg: str, *args: Any) -> None:
        facility, name, text = (str(a) for a in args) if len(args) == 3 else ("", "", msg % args if args else msg)
        event = parse_connection_text(text)
        if event is not None:
            self._connection(event, count=False)  # error_cb reports the same event: counted there
            return
        self._emit(level, f"{facility} [{name}] {text}", key=f"{facility} {text}")

    def _error(self, err: Any) -> None:
        text = str(err.str())
        if err.name() in CONNECTION_ERRORS:
            event = parse_connection_text(text)
            if event is not None:
                self._connection(event, count=True)
            elif not self.tracker.noise(self._addresses):  # "1/1 brokers are down": the connects tell which
                log.debug("kafka %s (%s): %s", self.bootstrap_servers, self.label, text)
            return
        if err.fatal():
            LIBRDKAFKA_LOG.error("kafka %s fatal client error (%s): %s: %s", self.bootstrap_servers, self.label,
                                 err.name(), text)
            return
        self._emit(logging.WARNING, f"kafka {self.bootstrap_servers} client error ({self.label}): {err.name()}: "
                   f"{text}", key=f"{err.name()} {text}")

    def _stats(self, text: str) -> None:
        try:
            data = json.loads(text)
            taken_at = int(data["ts"]) / 1e6
            up: dict[str, float] = {}
            for broker in data.get("brokers", {}).values():
                if broker.get("state") == "UP":
                    since = taken_at - int(broker.get("stateage", 0)) / 1e6
                    address = str(broker.get("nodename", ""))
                    up[address] = min(since, up.get(address, since))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            log.debug("unreadable librdkafka stats of %s: %s", self.bootstrap_servers, err)
            return
        self.tracker.snapshot(taken_at, up)

    def _connection(self, event: ConnectionEvent, *, count: bool) -> None:
        if event.address is None:  # the same failure is reported under the broker's own name too
            if not self.tracker.noise(self._addresses, count=count):
                log.debug("kafka %s (%s): %s", self.bootstrap_servers, self.label, event.reason)
        elif event.failed_connect:
            self.tracker.failure(event.address, event.reason, self.label, served_before=self._served, count=count)
        elif not self.tracker.noise([event.address], count=count):
            log.debug("kafka %s (%s): %s", event.address, self.label, event.reason)

    def _emit(self, level: int, text: str, *, key: str) -> None:
        repeats = self._dedup.admit(level, key)
        if repeats is None:
            return
        if repeats:
            LIBRDKAFKA_LOG.log(level, "%s (and %d identical lines in the last %.0f s)", text, repeats, DEDUP_WINDOW_S)
        else:
            LIBRDKAFKA_LOG.log(level, "%s", text)


#: The process's tracker and deduplicator: every client of this process reports to them.
TRACKER = ConnectivityTracker()
_DEDUP = _Deduplicator(DEDUP_WINDOW_S, time.monotonic)


def configured(conf: Mapping[str, Any], *, job: str | None = None, stats: bool = True,
               tracker: ConnectivityTracker | None = None) -> dict[str, Any]:
    """A copy of the librdkafka config ``conf`` with this module's logger and callbacks; one per client.

    ``stats=False`` for clients nobody polls (their stats would pile up in their queue);
    ``statistics.interval.ms`` set in ``conf`` (``kafka.statistics.interval.ms``) is kept. In a process
    without logging configured (Spark's Python workers) the lines go to stderr (worker_logging).
    """
    worker_logging()
    bootstrap = str(conf.get("bootstrap.servers", ""))
    label = f"job {job}" if job else f"client {conf.get('client.id', 'rdkafka')}"
    hooks = ClientHooks(bootstrap, label, tracker or TRACKER, _DEDUP)
    out = {**conf, "logger": hooks, "error_cb": hooks.error}
    if stats:
        out["stats_cb"] = hooks.stats
        out.setdefault("statistics.interval.ms", STATS_INTERVAL_MS)
    return out


def serve(client: Any) -> None:
    """Run the queued log lines and callbacks of an AdminClient (nothing else polls it); never raises."""
    try:
        client.poll(0)
    except Exception:  # a closed or broken client: its lines are lost, the caller's call is not
        log.debug("serving the callbacks of a Kafka client failed", exc_info=True)
