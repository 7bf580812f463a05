"""The job outlives the Airflow worker that launched it, and a lost host is relaunched once by the DAG.

The keep-alive DAG (dags/example_ckpt_keep_alive.py) runs with ``airflow dags test``: that process is the worker,
and its deferred tasks' triggers run inside it. Its submit launches ``ckpt run --supervise`` in a session of its
own, so a kill -9 of the worker's whole process group leaves the supervisor and the driver running. When the
supervisor and the driver die together (the host is lost), nobody writes RESTARTING and the supervisor's record
goes stale: the next run's deferrable health watch says NO_HEARTBEAT and its restart task launches the job once,
from the latest completed checkpoint.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.operations import read_operation
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.records.supervision import Supervision, latest_supervisor, observe_supervision
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS
from airflow_ckpt_provider.demo.world import AirflowHome, World, deferred

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

DAG = "ckpt_keep_alive"
#: The run reached its health watch and deferred it.
IN_HEALTH_WATCH = deferred("watch_health")
#: Each run's health watch lasts through the kills below (the module's 25 s would time out first).
LONG_WATCH = {"CKPT_EXAMPLE_WATCH_SECONDS": "600"}
T = TypeVar("T")


def until(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """The first truthy ``probe()`` within ``timeout`` s; fails the test naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")



def running(world: World) -> JobStatus:
    return world.wait("the job RUNNING with all records", lambda s: s.state == JobState.RUNNING
                      and world.consumed(s) == world.produced)


def deployment_keys(world: World) -> set[str]:
    return {o.key for o in world.store.storage.list(DEPLOYMENTS) if o.key.endswith(".json")}


def launch_logs(world: World) -> dict[str, str]:
    logs = Path(world.work, "ckpt-home", "jobs", world.job, "logs")
    return {p.name: p.read_text(errors="replace") for p in sorted(logs.glob("*.log"))}


def test_job_outlives_its_killed_worker_and_a_lost_host_is_relaunched_once_by_the_dags_health_watch(
        world: World, home: AirflowHome) -> None:
    world.produce(1000)

    # 1. The worker dies under a running job: kill -9 of the whole `airflow dags test` process group.
    worker = home.start_dags_test(DAG, env=LONG_WATCH)
    try:
        worker.wait_for_output("run 1 in its deferred health watch", IN_HEALTH_WATCH)
        before = running(world)
    finally:
        worker.kill()
    supervisor = latest_supervisor(world.store)
    assert supervisor is not None
    killed_worker_at = time.time()
    world.produce(500)
    after = world.wait("batches of the same driver after the worker died",
                       lambda s: world.consumed(s) == world.produced, timeout=120)
    assert (after.state, after.epoch, after.pid) == (JobState.RUNNING, before.epoch, before.pid)
    assert after.batch_id is not None and before.batch_id is not None and after.batch_id > before.batch_id

    def live_after_kill() -> Supervision | None:
        seen = observe_supervision(world.store, time.time())
        return seen if seen.record is not None and seen.record.updated_at > killed_worker_at + 1 else None

    seen = until("a heartbeat of the supervisor after the worker died", live_after_kill)
    assert seen.live and seen.record is not None and seen.record.pid == supervisor.pid, seen
    assert world.totals() == world.expected()

    # 2. The host is lost while the next run watches: the supervisor and the driver's group killed together.
    first_launch = read_launch(world.store)
    assert first_launch is not None and first_launch.launch_id == supervisor.launch_id
    deployments = deployment_keys(world)
    run = home.start_dags_test(DAG, env=LONG_WATCH)
    try:
        run.wait_for_output("run 2 in its deferred health watch", IN_HEALTH_WATCH)
        killed = running(world)
        killed_at = time.time()
        supervisor_pid, driver_pid = world.kill_host(killed)
        world.produce(500)
        restarted = world.watch_restart(killed, killed_at)
        done = run.wait(600)
    finally:
        if run.proc.poll() is None:
            run.kill()
    print("\n".join(restarted.lines()))
    assert done.returncode == 0, done.stdout[-6000:]
    out = done.stdout
    assert "reconnecting instead of submitting it again" in out  # run 2's submit launched nothing
    # The deferrable watch noticed the dead job: no heartbeat, and the supervisor gone.
    noticed = (f"its driver probably died, and its supervisor (pid {supervisor_pid} on {socket.gethostname()}, "
               f"launch {first_launch.launch_id}) is gone: its process no longer exists")
    assert noticed in out and "expected a heartbeat every" in out, out[-6000:]
    assert restarted.restarting is None  # nobody wrote RESTARTING: the supervisor died with its driver
    # Its restart task launched exactly once, from another process, from the latest completed checkpoint.
    assert out.count(" 2/3 starting ") == 1, out[-6000:]  # the restart's one launch, in the task's log
    launch = read_launch(world.store)
    assert launch is not None
    found = read_operation(world.store)  # the restart: an operation, acted on detached
    assert found is not None and found.operation.key.startswith(f"airflow:{DAG}.restart run "), found
    assert launch.launched_by.startswith(f"restart {found.operation.id} step "), launch
    assert launch.launch_id != first_launch.launch_id and launch.pid not in (supervisor_pid, None)
    assert launch.host == socket.gethostname() and str(launch.restore) == "latest-state"
    new = deployment_keys(world) - deployments
    assert new == {f"{DEPLOYMENTS}{restarted.first.epoch:010d}.json"}, new
    record = restarted.deployment
    assert (record.launch_id, record.restore) == (launch.launch_id, "latest-state"), record
    assert record.action == "keep-live" and f"at batch {killed.batch_id} " in record.reason, record
    assert killed.batch_id is not None and restarted.first.batch_id == killed.batch_id + 1
    assert restarted.first.epoch == killed.epoch + 1 and restarted.first.pid != driver_pid
    # Totals exact, and still exactly one new start once everything is consumed.
    status = running(world)
    assert status.epoch == restarted.first.epoch
    assert world.totals() == world.expected()
    assert deployment_keys(world) - deployments == new
    logs = {"run 1": worker.output(), "run 2": out, **launch_logs(world)}
    assert not [name for name, text in logs.items() if "superseded" in text.lower()], list(logs)

