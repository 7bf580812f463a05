"""The connectivity tracker and the client hooks, fed synthetic librdkafka errors, log calls and stats."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from airflow_ckpt_provider.kafka import clientlog
from airflow_ckpt_provider.kafka.clientlog import (
    ClientHooks,
    ConnectionEvent,
    ConnectivityTracker,
    _Deduplicator,
    configured,
    parse_connection_text,
)

ADDR = "127.0.0.1:9092"
REFUSED = f"{ADDR}/bootstrap: Connect to ipv4#{ADDR} failed: Connection refused (after 0ms in state CONNECT)"
STATE_LOGGER = "airflow_ckpt_provider.kafka.clientlog"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeError:
    """The part of confluent_kafka.KafkaError that error_cb uses."""

    code_name: str
    text: str
    is_fatal: bool = False

    def name(self) -> str:
        return self.code_name

    def str(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return self.is_fatal


def stats(taken_at: float, *brokers: tuple[str, str, float]) -> str:
    """A librdkafka stats JSON: (name, state, seconds in that state) per broker."""
    return json.dumps({"ts": int(taken_at * 1e6), "brokers": {
        name: {"name": name, "nodename": name.split("/")[0], "state": state, "stateage": int(age * 1e6)}
        for name, state, age in brokers}})


def state_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STATE_LOGGER and r.levelno >= logging.INFO]


def hooks(clock: Clock, tracker: ConnectivityTracker | None = None) -> ClientHooks:
    return ClientHooks(ADDR, "job orders", tracker or ConnectivityTracker(clock=clock),
                       _Deduplicator(60.0, clock), clock)


def test_parse_connection_text_finds_address_and_reason_of_each_form() -> None:
    assert parse_connection_text(REFUSED) == ConnectionEvent(ADDR, True, "Connection refused")
    assert parse_connection_text(f"[thrd:{ADDR}/bootstrap]: {REFUSED}") == ConnectionEvent(ADDR, True,
                                                                                          "Connection refused")
    assert parse_connection_text(f"GroupCoordinator: {ADDR}: Connect to ipv4#{ADDR} failed: Connection refused "
                                 "(after 0ms in state CONNECT)") == ConnectionEvent(ADDR, True, "Connection refused")
    assert parse_connection_text("kafka:9092/1: Failed to resolve 'kafka:9092': Name or service not known "
                                 "(after 2ms in state CONNECT)") == ConnectionEvent(
        "kafka:9092", True, "Failed to resolve 'kafka:9092': Name or service not known")
    assert parse_connection_text(f"{ADDR}/111: Disconnected: connection reset by peer (after 5002ms in state UP)") \
        == ConnectionEvent(ADDR, False, "Disconnected: connection reset by peer")
    assert parse_connection_text(f"GroupCoordinator: Connect to ipv4#{ADDR} failed: Connection refused (after 0ms "
                                 "in state CONNECT)") == ConnectionEvent(None, True, "Connection refused")
    assert parse_connection_text("1/1 brokers are down") is None
    assert parse_connection_text("Topic t1 partition count changed from 1 to 4") is None


def test_an_outage_is_one_unreachable_line_and_one_reachable_line_with_duration_and_count(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    h = hooks(clock)
    h.stats(stats(999.5, (f"{ADDR}/1", "UP", 30.0)))  # healthy before
    clock.now = 1001.0
    for _ in range(500):  # what one client reports during the outage: 1000 error events, all suppressed
        h.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", f"[thrd:{ADDR}/bootstrap]: {REFUSED}")
        h.error(FakeError("_TRANSPORT", REFUSED))
        h.error(FakeError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
        h.stats(stats(clock.now, (f"{ADDR}/bootstrap", "INIT", 1.0)))
        clock.now += 0.04
    # back: the learned broker's connection is UP since 1021.3 (1.2 s before this snapshot)
    h.stats(stats(1022.5, (f"{ADDR}/bootstrap", "INIT", 20.0), (f"{ADDR}/1", "UP", 1.2)))
    assert state_lines(caplog) == [
        f"kafka {ADDR} unreachable: Connection refused (job orders; further errors suppressed until it is back)",
        f"kafka {ADDR} reachable again after 20.3 s (1000 errors suppressed; job orders)",
    ]


def test_clients_of_one_process_share_the_state_of_an_address(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    tracker = ConnectivityTracker(clock=clock)
    producer, admin = hooks(clock, tracker), hooks(clock, tracker)
    producer.error(FakeError("_TRANSPORT", REFUSED))
    clock.now += 1
    admin.error(FakeError("_TRANSPORT", REFUSED))
    admin.stats(stats(clock.now + 1, (f"{ADDR}/1", "UP", 0.5)))
    producer.stats(stats(clock.now + 2, (f"{ADDR}/1", "UP", 1.5)))  # already back: nothing new
    assert [line.split(":")[0] for line in state_lines(caplog)] == ["kafka 127.0.0.1", "kafka 127.0.0.1"]
    assert state_lines(caplog)[1] == f"kafka {ADDR} reachable again after 1.5 s (1 errors suppressed; job orders)"
    assert tracker.unreachable() == frozenset()


def test_a_snapshot_taken_before_the_outage_does_not_end_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    h = hooks(clock)
    h.error(FakeError("_TRANSPORT", REFUSED))
    h.stats(stats(clock.now - 0.5, (f"{ADDR}/1", "UP", 10.0)))  # queued before the failure, served after it
    assert len(state_lines(caplog)) == 1
    assert h.tracker.unreachable() == {ADDR}


def test_failures_replayed_by_a_client_not_served_since_the_recovery_do_not_reopen_the_outage(
        caplog: pytest.LogCaptureFixture) -> None:
    """A client polled first after the recovery gets its queued stats, then its old failures, in one poll."""
    caplog.set_level(logging.INFO)
    clock = Clock()
    tracker = ConnectivityTracker(clock=clock)
    live, late = hooks(clock, tracker), hooks(clock, tracker)
    late.stats(stats(clock.now, (f"{ADDR}/1", "UP", 30.0)))  # served once, before the outage
    clock.now += 1
    live.error(FakeError("_TRANSPORT", REFUSED))
    clock.now += 10
    live.stats(stats(clock.now, (f"{ADDR}/1", "UP", 0.2)))
    clock.now += 5
    late.stats(stats(clock.now - 8, (f"{ADDR}/bootstrap", "INIT", 3.0)))  # its queue, in one poll
    late.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-3", REFUSED)
    late.error(FakeError("_TRANSPORT", REFUSED))
    late.stats(stats(clock.now - 0.1, (f"{ADDR}/1", "UP", 4.0)))
    assert len(state_lines(caplog)) == 2
    assert tracker.unreachable() == frozenset()
    clock.now += 3  # the next poll: a failure now is a new outage
    late.error(FakeError("_TRANSPORT", REFUSED))
    assert tracker.unreachable() == {ADDR}
    assert state_lines(caplog)[-1].startswith(f"kafka {ADDR} unreachable")


def test_a_live_client_reports_a_new_outage_after_a_recovery(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    h = hooks(clock)
    for _ in range(2):  # two outages, each seen by a client polled all along
        clock.now += 1
        h.error(FakeError("_TRANSPORT", REFUSED))
        clock.now += 5
        h.stats(stats(clock.now, (f"{ADDR}/1", "UP", 0.5)))
    assert [line.split(" ")[2] for line in state_lines(caplog)] == ["unreachable:", "reachable", "unreachable:",
                                                                    "reachable"]


def test_a_disconnect_that_heals_is_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    h = hooks(clock)
    h.log(logging.INFO, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
          f"[thrd:{ADDR}/1]: {ADDR}/1: Disconnected: connection closed by peer (after 600000ms in state UP)")
    h.stats(stats(clock.now + 1, (f"{ADDR}/1", "UP", 0.5)))
    assert state_lines(caplog) == []
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_other_errors_are_logged_once_per_window_with_the_count_of_repeats(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    h = hooks(clock)
    auth = FakeError("_AUTHENTICATION", "SASL authentication error: Authentication failed")
    for _ in range(5):
        h.error(auth)
        clock.now += 1
    h.error(FakeError("_UNKNOWN_TOPIC", "Subscribed topic not available: orders"))  # another text passes at once
    clock.now += 60
    h.error(auth)
    h.error(FakeError("_FENCED", "producer fenced", is_fatal=True))
    h.error(FakeError("_FENCED", "producer fenced", is_fatal=True))  # fatal: never deduplicated
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    lib = "airflow_ckpt_provider.kafka.librdkafka"
    assert lines == [
        (lib, "WARNING", f"kafka {ADDR} client error (job orders): _AUTHENTICATION: SASL authentication error: "
                         "Authentication failed"),
        (lib, "WARNING", f"kafka {ADDR} client error (job orders): _UNKNOWN_TOPIC: Subscribed topic not available: "
                         "orders"),
        (lib, "WARNING", f"kafka {ADDR} client error (job orders): _AUTHENTICATION: SASL authentication error: "
                         "Authentication failed (and 4 identical lines in the last 60 s)"),
        (lib, "ERROR", f"kafka {ADDR} fatal client error (job orders): _FENCED: producer fenced"),
        (lib, "ERROR", f"kafka {ADDR} fatal client error (job orders): _FENCED: producer fenced"),
    ]


def test_other_log_lines_keep_their_level_and_text_deduplicated_across_clients(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    dedup = _Deduplicator(60.0, clock)
    tracker = ConnectivityTracker(clock=clock)
    a = ClientHooks(ADDR, "job a", tracker, dedup, clock)
    b = ClientHooks(ADDR, "job a", tracker, dedup, clock)
    text = "[thrd:main]: Topic orders partition count changed from 1 to 4"
    a.log(logging.INFO, "%s [%s] %s", "PARTCNT", "rdkafka#consumer-1", text)
    b.log(logging.INFO, "%s [%s] %s", "PARTCNT", "rdkafka#consumer-2", text)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"PARTCNT [rdkafka#consumer-1] {text}")]


def test_unreadable_stats_change_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    h = hooks(clock)
    h.error(FakeError("_TRANSPORT", REFUSED))
    h.stats("{not json")
    h.stats(json.dumps({"brokers": {}}))
    assert h.tracker.unreachable() == {ADDR}


def test_configured_adds_the_hooks_and_stats_only_for_polled_clients() -> None:
    conf = {"bootstrap.servers": ADDR, "client.id": "ckpt-kafka-source"}
    polled = configured(conf)
    assert isinstance(polled["logger"], ClientHooks)
    assert polled["error_cb"] == polled["logger"].error
    assert polled["stats_cb"] == polled["logger"].stats
    assert polled["statistics.interval.ms"] == clientlog.STATS_INTERVAL_MS
    assert polled["logger"].label == "client ckpt-kafka-source"
    assert conf == {"bootstrap.servers": ADDR, "client.id": "ckpt-kafka-source"}  # not modified
    quiet = configured({**conf, "statistics.interval.ms": 5000}, job="orders", stats=False)
    assert "stats_cb" not in quiet and quiet["statistics.interval.ms"] == 5000
    assert quiet["logger"].label == "job orders"
    assert configured({**conf, "statistics.interval.ms": 250})["statistics.interval.ms"] == 250
