"""The supervision service's decision for a job it owns (launcher/service.decide): every case, one function."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.deployments import Deployment, Launch
from airflow_ckpt_provider.core.records.supervision import Supervision, SupervisorRecord, SupervisorState
from airflow_ckpt_provider.launcher.service import Adopt, DriverSeen, Keep, Relaunch, Start, decide

LAUNCH = Launch("orders", Deployment(job_file="/jobs/orders.py"), LATEST_STATE, 1_800_000_000.0, "airflow", "L2")


def _supervisor(launch_id: str = "L2", state: SupervisorState = SupervisorState.WATCHING,
                epoch: int | None = None) -> SupervisorRecord:
    return SupervisorRecord(job="orders", launch_id=launch_id, pid=41, host="svc-a", state=state,
                            started_at=1_800_000_001.0, updated_at=1_800_000_060.0, interval=5.0, epoch=epoch)


@pytest.mark.parametrize(("last", "seen", "starting_here", "waited", "expected"), [
    pytest.param(None, Supervision(None, False), False, 0.0, Keep, id="no launch recorded"),
    pytest.param(replace(LAUNCH, ending="stopped", end_reason="driver stopped"), Supervision(None, False), False, 0.0,
                 Keep, id="the launch ended"),
    pytest.param(LAUNCH, Supervision(_supervisor(), True), False, 0.0, Keep, id="its supervisor runs"),
    pytest.param(LAUNCH, Supervision(_supervisor(state=SupervisorState.ENDED), False, "ended (gave-up)"), False, 0.0,
                 Keep, id="its supervisor ended (spec/last.json not yet told)"),
    pytest.param(LAUNCH, Supervision(_supervisor(), False, "is gone: no heartbeat for 41 s"), False, 0.0, Relaunch,
                 id="its supervisor is gone"),
    pytest.param(LAUNCH, Supervision(None, False), False, 0.0, Start, id="recorded, never started"),
    pytest.param(LAUNCH, Supervision(_supervisor("L1"), True), False, 0.0, Start,
                 id="recorded; only the previous launch's supervisor runs (it is superseded)"),
    pytest.param(LAUNCH, Supervision(None, False), True, 0.0, Keep, id="starting on this host"),
    pytest.param(replace(LAUNCH, pid=7, host="svc-b"), Supervision(None, False), False, 59.0, Keep,
                 id="started elsewhere, its first heartbeat awaited"),
    pytest.param(replace(LAUNCH, pid=7, host="svc-b"), Supervision(None, False), False, 60.0, Relaunch,
                 id="started elsewhere, no heartbeat within the start timeout"),
])
def test_the_owner_starts_keeps_or_relaunches_as_the_launch_and_its_supervisor_say(
        last: Launch | None, seen: Supervision, starting_here: bool, waited: float, expected: type) -> None:
    action = decide(last, seen, starting_here=starting_here, waited=waited, start_timeout=60.0)
    assert isinstance(action, expected), action
    if isinstance(action, Start):
        assert action.launch == last
    if isinstance(action, Relaunch):
        assert "is gone: no heartbeat for 41 s" in action.why or "wrote no supervisor heartbeat within 60 s" in \
            action.why


GONE = "is gone: no heartbeat for 41 s"


@pytest.mark.parametrize(("seen", "driver", "expected"), [
    pytest.param(Supervision(_supervisor(epoch=4), False, GONE), DriverSeen(4, True), Adopt,
                 id="its driver of the supervisor's epoch runs: adopted"),
    pytest.param(Supervision(_supervisor(epoch=4), False, GONE), DriverSeen(4, False), Relaunch,
                 id="its driver died too (their host lost): relaunched"),
    pytest.param(Supervision(_supervisor(epoch=4), False, GONE), DriverSeen(5, True), Relaunch,
                 id="a driver of another epoch runs, not the supervisor's"),
    pytest.param(Supervision(_supervisor(), False, GONE), DriverSeen(4, True), Relaunch,
                 id="the supervisor never saw its driver report"),
    pytest.param(Supervision(_supervisor(epoch=4), False, GONE), None, Relaunch, id="no status at all"),
    pytest.param(Supervision(_supervisor(epoch=4), False, GONE), DriverSeen(4, True, outlived=False), Keep,
                 id="its driver reported about when the supervisor last did: wait and see (stale soon, or outlives)"),
    pytest.param(Supervision(_supervisor(epoch=4, state=SupervisorState.ENDED), False, "ended (stopped)"),
                 DriverSeen(4, True), Keep, id="the supervisor ended: nothing to adopt"),
])
def test_a_lost_supervisor_s_running_driver_is_adopted_and_a_dead_one_relaunched(
        seen: Supervision, driver: DriverSeen | None, expected: type) -> None:
    action = decide(LAUNCH, seen, starting_here=False, waited=0.0, driver=driver)
    assert isinstance(action, expected), action
    # once this instance started the adopting supervisor, it waits for its first report instead of adopting twice
    assert isinstance(decide(LAUNCH, seen, starting_here=True, waited=0.0, driver=driver), Keep)
    if isinstance(action, Adopt):
        assert (action.launch, action.epoch) == (LAUNCH, 4)
        assert action.why.endswith(f"{GONE}, but its driver of epoch 4 runs")


def test_a_supervisor_that_keeps_dying_is_relaunched_five_times_an_hour_then_given_up(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.service import RELAUNCH_WINDOW, RELAUNCHES, SupervisionService

    now = [0.0]
    service = SupervisionService(LocalStorage(tmp_path), store_url=str(tmp_path), instance="svc-a",
                                 monotonic=lambda: now[0])
    for _ in range(RELAUNCHES):
        assert service._relaunch_budget("orders") == ""
        now[0] += 60.0
    why = service._relaunch_budget("orders")
    assert "its supervisor was lost 5 times in 60 min" in why and "hand the job over again" in why
    assert service._relaunch_budget("clicks") == ""  # per job
    now[0] += RELAUNCH_WINDOW
    assert service._relaunch_budget("orders") == ""  # the window moved on


def test_a_service_pointed_at_a_store_it_cannot_write_is_refused_with_what_to_check(tmp_path: Path) -> None:
    import threading

    from airflow_ckpt_provider.core.errors import StorageError
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.service import SupervisionService

    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (store_dir / "_service").write_text("a file where the service's folder goes\n")  # nothing can be written below
    service = SupervisionService(LocalStorage(store_dir), store_url=str(store_dir), instance="svc-a")
    with pytest.raises(StorageError, match=r"supervision service instance svc-a: expected to write its lease to .*"
                                           r"_service/instances/svc-a.json, found: .*check the store URL"):
        service.run(threading.Event())
    assert (store_dir / "_service").read_text() == "a file where the service's folder goes\n"  # nothing changed


def test_a_malformed_owner_record_or_a_job_without_a_launch_changes_nothing_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_ckpt_provider.core.records.ownership import OWNER, ServiceJob, handed_key
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.service import SupervisionService

    root = LocalStorage(tmp_path)
    for job in ("broken", "empty"):
        root.write(handed_key(job), ServiceJob(job=job, handed_at=1.0, handed_by="test").to_bytes())
    root.write(f"broken/{OWNER}", b"{not json")
    service = SupervisionService(root, store_url=str(tmp_path), instance="svc-a")
    service.me.renew()
    service.tick()  # one look at both: the broken one is reported, the other still looked at
    assert "job broken: supervision service instance svc-a could not look at it" in caplog.text
    assert "service owner record" in caplog.text and "is not JSON" in caplog.text
    assert root.read(f"broken/{OWNER}") == b"{not json"  # left as it was
    assert service.reconcile("empty") == Keep("no launch is recorded (spec/last.json): hand the job over again with "
                                              "its deployment")


def test_a_look_at_many_jobs_renews_the_lease_between_them_so_it_never_lapses(tmp_path: Path) -> None:
    """bench/service_capacity_bench.py: 300 jobs took ~6 s to look at, close to the 8 s deadline; the instance renews
    whenever renew_every has passed, between two jobs."""
    from airflow_ckpt_provider.core.records.ownership import ServiceJob, Timings, handed_key
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.service import SupervisionService

    root = LocalStorage(tmp_path)
    for i in range(6):
        root.write(handed_key(f"job-{i}"), ServiceJob(job=f"job-{i}", handed_at=1.0, handed_by="test").to_bytes())
    now = [0.0]
    service = SupervisionService(root, store_url=str(tmp_path), instance="svc-a", timings=Timings(),
                                 monotonic=lambda: now[0])
    renewals: list[float] = []
    real_renew = service.me.renew

    def renew(**kwargs: object) -> object:
        renewals.append(now[0])
        return real_renew(**kwargs)

    def slow_look(job: str) -> None:
        now[0] += 1.5  # each job's look takes 1.5 s: six take 9 s, past the 8 s deadline
        assert service.me.may_act(), f"{job}: the lease lapsed during the look"

    service.me.renew = renew  # type: ignore[method-assign]  # counting the renewals
    service.reconcile = slow_look  # type: ignore[assignment,method-assign]  # the looks' time, without the store
    service.tick()
    assert renewals == [0.0, 3.0, 6.0]  # at the start, then after 2 s had passed (between jobs)


def test_a_settled_job_is_looked_at_every_look_every_and_at_the_next_renewal_once_its_bell_rings(
        tmp_path: Path) -> None:
    """docs/scale.md: 4 GETs per job every 2 s renewal were 2,000 GETs a second for 1,000 jobs. A job whose look found
    nothing to wait for is looked at again after ``look_every``, or as soon as someone rings the bell for it (an
    operation asked for, a hand-over)."""
    from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key, ring_service
    from airflow_ckpt_provider.core.store.storage import LocalStorage
    from airflow_ckpt_provider.launcher.service import SupervisionService

    root = LocalStorage(tmp_path)
    for job in ("clicks", "orders"):
        root.write(handed_key(job), ServiceJob(job=job, handed_at=1.0, handed_by="test").to_bytes())
    now = [0.0]
    service = SupervisionService(root, store_url=str(tmp_path), instance="svc-a", look_every=30.0,
                                 monotonic=lambda: now[0])
    looked: list[str] = []
    reconcile = service.reconcile

    def spy(job: str) -> Keep | None:  # the looks, counted; each still done
        looked.append(job)
        return reconcile(job)  # type: ignore[return-value]  # Keep here: no launch recorded

    service.reconcile = spy  # type: ignore[method-assign]  # a test spy on one instance
    service.tick()
    assert looked == ["clicks", "orders"]  # the first look: every job (no launch recorded: settled, nothing to do)
    now[0] = 2.0
    service.tick()
    assert looked == ["clicks", "orders"]  # settled: not again before look_every
    assert ring_service(root, "orders")
    now[0] = 4.0
    service.tick()
    assert looked == ["clicks", "orders", "orders"]  # the bell: at the next renewal
    now[0] = 6.0
    service.tick()
    assert looked == ["clicks", "orders", "orders"]
    now[0] = 30.0
    service.tick()
    assert looked == ["clicks", "orders", "orders"]  # paced, a glance: no launch recorded, so nothing to read
    now[0] = 300.0
    service.tick()
    assert looked == ["clicks", "orders", "orders", "clicks"]  # clicks' full look (at 0 + 300); orders' a glance (4)
    now[0] = 330.0
    service.tick()
    assert looked == ["clicks", "orders", "orders", "clicks", "orders"]


def test_between_full_looks_a_paced_look_reads_the_supervisor_s_record_alone_and_a_change_brings_a_full_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/scale.md: a full look is 4 GETs (owner, operation, launch, supervisor) every 30 s, 480 an hour a job. The
    paced looks between full looks (every 300 s) read the supervisor's record; an ended one is looked at fully."""
    import time
    from collections import Counter

    from airflow_ckpt_provider.core.records.ownership import ServiceJob, handed_key
    from airflow_ckpt_provider.core.store.jobstore import SPEC_LAST, JobStore
    from airflow_ckpt_provider.core.store.storage import LocalStorage, Versioned
    from airflow_ckpt_provider.launcher.service import FULL_LOOK_EVERY, SupervisionService
    from tests.support.watchrecords import supervised

    root = LocalStorage(tmp_path)
    root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="test").to_bytes())
    store = JobStore(root, "orders")
    store.storage.write(SPEC_LAST, replace(LAUNCH, launch_id="L2", pid=41, host="host-b").to_bytes())
    supervised(store, time.time(), launch_id="L2")
    reads: Counter[str] = Counter()
    real_read, real_versioned = LocalStorage.read, LocalStorage.read_versioned

    def read(self: LocalStorage, key: str) -> bytes:
        reads[self.uri(key)] += 1
        return real_read(self, key)

    def read_versioned(self: LocalStorage, key: str) -> Versioned | None:
        reads[self.uri(key)] += 1
        return real_versioned(self, key)

    monkeypatch.setattr(LocalStorage, "read", read)  # counted, in a unit test
    monkeypatch.setattr(LocalStorage, "read_versioned", read_versioned)
    now = [0.0]
    service = SupervisionService(root, store_url=str(tmp_path), instance="svc-a", monotonic=lambda: now[0])

    def looked_at_orders() -> set[str]:
        prefix = store.storage.uri("")
        seen = {key.removeprefix(prefix).lstrip("/") for key in reads if key.startswith(prefix)}
        reads.clear()
        return seen

    service.tick()
    assert "orders" in service.owned
    full = looked_at_orders()
    assert full == {"service/owner.json", "operation.json", "spec/last.json", "supervisors/L2.json"}
    for at in range(30, int(FULL_LOOK_EVERY), 30):
        now[0] = float(at)
        supervised(store, time.time(), launch_id="L2")  # its heartbeat
        reads.clear()
        service.tick()
        assert looked_at_orders() == {"supervisors/L2.json"}, at
    now[0] = FULL_LOOK_EVERY
    service.tick()
    assert looked_at_orders() == full
    now[0] += 30.0
    supervised(store, time.time(), launch_id="L2", state=SupervisorState.ENDED, ending="gave-up")
    reads.clear()
    service.tick()
    assert looked_at_orders() == full  # the glance found it ended: the full look at once


def test_asking_for_an_operation_rings_the_service_bell_only_for_a_handed_job(tmp_path: Path) -> None:
    from airflow_ckpt_provider.core.records.operations import ask
    from airflow_ckpt_provider.core.records.ownership import SERVICE_BELL, ServiceJob, handed_key, read_rings
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.store.storage import LocalStorage

    root = LocalStorage(tmp_path)
    ask(JobStore(root, "clicks"), "restart", {}, requested_by="test")
    assert not root.exists(SERVICE_BELL)  # not handed: nothing written outside the job's own prefix
    root.write(handed_key("orders"), ServiceJob(job="orders", handed_at=1.0, handed_by="test").to_bytes())
    ask(JobStore(root, "orders"), "restart", {}, requested_by="test")
    assert [job for job, _at in read_rings(root)] == ["orders"]
