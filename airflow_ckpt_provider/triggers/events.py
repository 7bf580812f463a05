"""Asset watchers' event triggers: a DAG scheduled on "a new savepoint of job X" or "lag of group G above N".

Design notes: docs/airflow.md#design-notes-triggerseventspy."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_ckpt_provider.kafka.lag import DEFAULT_TIMEOUT
from airflow_ckpt_provider.triggers.base import DEFAULT_STORE_CONN

if TYPE_CHECKING:
    from airflow_ckpt_provider.core.watches.events import SnapshotEventWatch
    from airflow_ckpt_provider.kafka.lag import LagAboveWatch

#: Seconds between yielding an event and recording it in the cursor: the triggerer's runner hands events to
#: its supervisor, which stores them, within about a second each (triggerer_job_runner: both loops wait 1 s).
CONFIRM_DELAY = 5.0


class CursorWatch(Protocol):
    """A watch with a cursor (core/watches/events.py)."""

    def poll(self, now: float | None = None) -> dict[str, Any] | None: ...

    def waiting_for(self) -> str: ...

    def cursor(self) -> dict[str, Any] | None: ...


class EventWatchTrigger(BaseEventTrigger):
    """Polls ``build_watch(cursor)``'s watch every ``poll_interval`` s, yields every event it announces, and
    persists its cursor as the module docstring says."""

    #: The statuses of this trigger's events.
    STATUSES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, poll_interval: float = 10.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseEventTrigger.__init__(**kwargs) is unannotated
        self.poll_interval = float(poll_interval)
        self._memory: dict[str, Any] | None = None  # the cursor, outside a watcher
        self._watch: CursorWatch | None = None

    @abstractmethod
    def arguments(self) -> dict[str, Any]:
        """The subclass's own constructor arguments, by name."""

    @abstractmethod
    def build_watch(self, cursor: dict[str, Any] | None) -> CursorWatch:
        """The watch, resuming from ``cursor`` (None: none stored). Blocking: called in a thread."""

    @abstractmethod
    def cursor_key(self) -> str:
        """The key of the cursor in the watched asset's state store."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**self.arguments(), "poll_interval": self.poll_interval})

    # -- the cursor ---------------------------------------------------------------------------------

    async def load_cursor(self) -> dict[str, Any] | None:
        """The stored cursor; None if none. Raises what the state store raises (retried by ``run``)."""
        if self.asset_state_store is None:
            return self._memory
        value = await self.asset_state_store.aget(self.cursor_key())
        return value if isinstance(value, dict) else None

    async def save_cursor(self, value: dict[str, Any]) -> None:
        self._memory = value
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(self.cursor_key(), value)

    # -- the loop -----------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent]:
        saved: dict[str, Any] | None = None
        errors = _Errors(self)
        while True:
            events: list[dict[str, Any]] = []
            try:
                if self._watch is None:
                    saved = await self.load_cursor()
                    self._watch = await asyncio.to_thread(self.build_watch, saved)
                    self.log.info("watching: %s (cursor %s: %s)", self._watch.waiting_for(), self.cursor_key(),
                                  "stored" if saved is not None else "none stored: begins now")
                events, failed = await asyncio.to_thread(_drain, self._watch)
                if saved is None and not events and (cursor := self._watch.cursor()) is not None:
                    await self.save_cursor(cursor)  # a baseline announces nothing: stored at once
                    saved = cursor
                if failed is not None:
                    raise failed
                errors.clear()
            except Exception as err:
                errors.log(err)
            for event in events:
                self.log.info("%s", event.get("message", event["status"]))
                yield TriggerEvent(event)  # type: ignore[no-untyped-call]  # unannotated in Airflow
            await asyncio.sleep(max(self.poll_interval, CONFIRM_DELAY) if events else self.poll_interval)
            if self._watch is not None and (cursor := self._watch.cursor()) is not None and cursor != saved:
                try:
                    await self.save_cursor(cursor)
                    saved = cursor
                except Exception as err:
                    errors.log(err)

    async def cleanup(self) -> None:
        """The watches hold no connection between polls; drop the one this trigger built."""
        self._watch = None


def _drain(watch: CursorWatch) -> tuple[list[dict[str, Any]], Exception | None]:
    """Every event the watch has now, and the error that stopped it, if any: the events it announced before
    failing are in its cursor already, so they must be yielded, not dropped with the error."""
    events: list[dict[str, Any]] = []
    while True:
        try:
            event = watch.poll()
        except Exception as err:
            if not events:
                raise
            return events, err
        if event is None:
            return events, None
        events.append(event)


class _Errors:
    """Logs each distinct failure once (with its traceback), and when polling works again."""

    def __init__(self, trigger: EventWatchTrigger) -> None:
        self.trigger, self.last = trigger, ""

    def log(self, err: Exception) -> None:
        text = f"{type(err).__name__}: {err}"
        if text != self.last:
            self.trigger.log.warning("%s: will retry every %.0f s: %s", type(self.trigger).__name__,
                                     self.trigger.poll_interval, text, exc_info=err)
        self.last = text

    def clear(self) -> None:
        if self.last:
            self.trigger.log.info("polling again after: %s", self.last)
        self.last = ""


class SnapshotEventTrigger(EventWatchTrigger):
    """One event per new completed snapshot of ``job`` of ``kinds`` (default savepoints only), oldest first.

    Payload: status ``completed``, job, snapshot_id, kind, batch_id, uri, created_at, trigger (periodic,
    manual, stop, upgrade) and message. The snapshots present when the trigger first polls (no cursor stored
    for its asset yet) are not announced.
    """

    STATUSES: ClassVar[frozenset[str]] = frozenset({"completed"})

    def __init__(
        self,
        *,
        job: str,
        kinds: Sequence[str] = ("savepoint",),
        ckpt_store_conn_id: str = DEFAULT_STORE_CONN,
        store_url: str | None = None,
        poll_interval: float = 10.0,
    ) -> None:
        super().__init__(poll_interval=poll_interval)
        from airflow_ckpt_provider.core.errors import ConfigError
        from airflow_ckpt_provider.core.watches.events import parse_kinds

        try:
            self.kinds = [k.value for k in parse_kinds(kinds)]
        except ConfigError as err:  # the DAG fails to parse, naming the allowed kinds
            raise ValueError(f"SnapshotEventTrigger: {err}") from err
        self.job = job
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self.store_url = store_url

    def arguments(self) -> dict[str, Any]:
        return {"job": self.job, "kinds": self.kinds, "ckpt_store_conn_id": self.ckpt_store_conn_id,
                "store_url": self.store_url}

    def cursor_key(self) -> str:
        from airflow_ckpt_provider.core.watches.events import snapshot_cursor_key

        return snapshot_cursor_key(self.job, self.kinds)

    def build_watch(self, cursor: dict[str, Any] | None) -> SnapshotEventWatch:
        from airflow_ckpt_provider.core.watches.events import SnapshotEventWatch
        from airflow_ckpt_provider.hooks.job_store import JobStoreHook

        store = JobStoreHook(self.ckpt_store_conn_id, store_url=self.store_url).job_store(self.job)
        return SnapshotEventWatch(store, kinds=self.kinds, cursor=cursor)


class KafkaLagEventTrigger(EventWatchTrigger):
    """One event each time the total lag of consumer ``group`` rises above ``threshold``; re-armed once it is
    back below ``rearm_below`` (default ``threshold``), so a lasting lag is one event, not one per poll.

    Payload: status ``above``, group, total_lag, threshold, rearm_below, partitions, message. Brokers and
    client settings as ``KafkaLagTrigger``'s (``kafka_conn_id`` and/or ``bootstrap_servers``).
    """

    STATUSES: ClassVar[frozenset[str]] = frozenset({"above"})

    def __init__(
        self,
        *,
        group: str,
        threshold: int,
        rearm_below: int | None = None,
        topics: Sequence[str] | None = None,
        bootstrap_servers: str | None = None,
        kafka_conn_id: str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__(poll_interval=poll_interval)
        if rearm_below is not None and rearm_below > threshold:
            raise ValueError(f"KafkaLagEventTrigger: expected rearm_below <= threshold, found {rearm_below} > "
                             f"{threshold}: a lag between them would fire at every poll")
        if kafka_conn_id is None and not bootstrap_servers:
            raise ValueError("KafkaLagEventTrigger: no Kafka brokers: pass kafka_conn_id (a kafka connection) "
                             "or bootstrap_servers")
        self.group = group
        self.threshold = int(threshold)
        self.rearm_below = None if rearm_below is None else int(rearm_below)
        self.topics = list(topics) if topics is not None else None
        self.bootstrap_servers = bootstrap_servers
        self.kafka_conn_id = kafka_conn_id
        self.request_timeout = float(request_timeout)

    def arguments(self) -> dict[str, Any]:
        return {"group": self.group, "threshold": self.threshold, "rearm_below": self.rearm_below,
                "topics": self.topics, "bootstrap_servers": self.bootstrap_servers,
                "kafka_conn_id": self.kafka_conn_id, "request_timeout": self.request_timeout}

    def cursor_key(self) -> str:
        return f"ckpt.lag_above.{self.group}"

    def build_watch(self, cursor: dict[str, Any] | None) -> LagAboveWatch:
        from airflow_ckpt_provider.hooks.kafka import KafkaConfigHook
        from airflow_ckpt_provider.kafka.lag import LagAboveWatch

        if self.kafka_conn_id is not None:
            servers, conf = KafkaConfigHook(self.kafka_conn_id).client_config(self.bootstrap_servers)
        else:
            servers, conf = str(self.bootstrap_servers), {}
        return LagAboveWatch(servers, self.group, self.topics, threshold=self.threshold,
                             rearm_below=self.rearm_below, conf=conf, timeout=self.request_timeout,
                             cursor=cursor)
