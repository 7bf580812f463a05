"""The health watch's observation (core/watches/health_observe.py): each poll reads every record once at most, the
deployments/ records once in the watch's life, and the supervisor and spec/last.json only when they matter."""

from __future__ import annotations

from collections import Counter

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import ObjectInfo, Versioned
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch, Unhealthy
from tests.support.watchrecords import T0, deployed, leased, relaunch, report, supervised, unhealthy

LAUNCH = "20270115T080000Z-aaaaaa"  # the supervisor's launch (tests/support/watchrecords.supervised)


class Reads:
    """Counts the store requests of ``store`` by (operation, key or prefix), poll by poll (a versioned read is one
    request, though the local store's reads the object with ``read``)."""

    def __init__(self, store: JobStore) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self._versioned = False
        storage = store.storage
        real_read, real_versioned, real_list = storage.read, storage.read_versioned, storage.list

        def read(key: str) -> bytes:
            if not self._versioned:
                self.seen["read", key] += 1
            return real_read(key)

        def read_versioned(key: str) -> Versioned | None:
            self.seen["read", key] += 1
            self._versioned = True
            try:
                return real_versioned(key)
            finally:
                self._versioned = False

        def list_(prefix: str = "") -> list[ObjectInfo]:
            self.seen["list", prefix] += 1
            return real_list(prefix)

        storage.read = read  # type: ignore[method-assign]  # counted, in a unit test
        storage.read_versioned = read_versioned  # type: ignore[method-assign]  # counted, in a unit test
        storage.list = list_  # type: ignore[method-assign]  # counted, in a unit test

    def take(self) -> Counter[tuple[str, str]]:
        seen, self.seen = self.seen, Counter()
        return seen


def test_a_poll_reads_each_record_once_and_the_deployment_records_once_in_the_watch_s_life(store: JobStore) -> None:
    """A failed driver under a live supervisor of an Airflow launch: the judgement needs status.json, the lease,
    deployments/, spec/last.json (is a newer launch on its way? is the supervisor superseded?) and supervisors/,
    which the watch used to read spec/last.json for twice."""
    deployed(store, 1, T0 - 600, LAUNCH)
    deployed(store, 2, T0 - 100, LAUNCH)
    relaunch(store, T0 - 700, LAUNCH)  # the supervisor's own launch: not superseded, not a newer one
    report(store, T0, state=JobState.FAILED, epoch=2, reason="query failed: boom")
    supervised(store, T0 + 1, standalone=False)
    reads = Reads(store)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))

    assert watch.poll(T0 + 1) is None  # the supervisor restarts it
    assert watch.verdict is not None and watch.verdict.restarter is not None
    first = reads.take()
    assert max(first.values()) == 1, first
    assert {key for op, key in first if op == "read"} == {
        "status.json", "lease.json", "deployments/0000000001.json", "deployments/0000000002.json", "spec/last.json",
        f"supervisors/{LAUNCH}.json"}

    assert watch.poll(T0 + 2) is None
    second = reads.take()
    assert max(second.values()) == 1, second
    assert not [key for op, key in second if op == "read" and key.startswith("deployments/")]  # never rewritten


def test_a_running_driver_s_poll_reads_neither_its_supervisor_nor_the_launch(store: JobStore) -> None:
    report(store, T0, batch_id=4)
    supervised(store, T0)
    reads = Reads(store)
    assert JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY)).poll(T0 + 1) is None
    assert set(reads.take()) == {("read", "status.json"), ("read", "lease.json"), ("list", "deployments/")}


RUNNING_READS = {("read", "status.json"), ("read", "lease.json"), ("list", "deployments/")}


def test_while_the_same_driver_runs_and_reports_a_poll_reads_status_json_alone_and_all_every_five_minutes(
        store: JobStore) -> None:
    """The keep-alive DAG's fault watch of a healthy job: one GET a poll instead of three (docs/scale.md)."""
    deployed(store, 1, T0 - 100)
    leased(store, 1)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    report(store, T0, batch_id=4)
    reads = Reads(store)
    assert watch.poll(T0 + 1) is None
    assert set(reads.take()) - {("read", "deployments/0000000001.json")} == RUNNING_READS
    for i in range(1, 30):  # a poll every 10 s for 290 s, a heartbeat every 5
        report(store, T0 + 10 * i, batch_id=4 + i)
        reads.take()  # the heartbeat's own
        assert watch.poll(T0 + 10 * i + 1) is None
        assert reads.take() == Counter({("read", "status.json"): 1}), i
    assert watch.progress() == (29, False)  # every batch counted from status.json alone
    report(store, T0 + 300, batch_id=40)
    reads.take()
    assert watch.poll(T0 + 301) is None  # FULL_LOOK_EVERY after the first
    assert set(reads.take()) == RUNNING_READS


def test_a_new_driver_s_first_report_makes_the_next_poll_read_the_lease_and_its_deployment_record(
        store: JobStore) -> None:
    """A supervisor's restart while the watch polls steadily: the new epoch's status brings a full look, which
    finds the new start, so restarts are counted as before (max_restarts 1: the second start is one too many)."""
    deployed(store, 1, T0 - 100)
    leased(store, 1)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY, max_restarts=1, health_window=600))
    report(store, T0, batch_id=4)
    assert watch.poll(T0 + 1) is None
    reads = Reads(store)
    report(store, T0 + 10, batch_id=5)
    reads.take()
    assert watch.poll(T0 + 11) is None
    assert reads.take() == Counter({("read", "status.json"): 1})
    deployed(store, 2, T0 + 15)
    leased(store, 2)
    deployed(store, 3, T0 + 16)
    leased(store, 3)
    report(store, T0 + 20, epoch=3, started_at=T0 + 16, batch_id=6)
    reads.take()
    event = unhealthy(watch.poll(T0 + 21), Unhealthy.TOO_MANY_RESTARTS)
    assert event["epoch"] == 3
    assert {key for op, key in reads.take()} >= {"lease.json", "deployments/", "deployments/0000000003.json"}


def test_a_driver_that_stops_reporting_gets_a_full_look_with_its_supervisor(store: JobStore) -> None:
    deployed(store, 1, T0 - 100, LAUNCH)
    leased(store, 1)
    relaunch(store, T0 - 700, LAUNCH)
    supervised(store, T0 + 25, standalone=False)
    watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY))
    report(store, T0, batch_id=4)
    assert watch.poll(T0 + 1) is None
    reads = Reads(store)
    assert watch.poll(T0 + 25) is None  # beyond the heartbeat limit (20 s): its live supervisor's to restart
    assert {key for op, key in reads.take()} == {"status.json", "lease.json", "deployments/", "spec/last.json",
                                                  "supervisors/", f"supervisors/{LAUNCH}.json"}
