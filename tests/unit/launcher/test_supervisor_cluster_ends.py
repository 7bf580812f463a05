"""A driver in the cluster says how it ended: in cluster mode spark-submit's exit code does not (0 however a
Kubernetes driver pod ends, 1 for any failed YARN application master), so the supervisor names each driver run,
the driver records its exit code (core/records/supervision.py DriverEnd) and the supervisor decides on that."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.records.supervision import DriverEnd, driver_end_key, write_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending
from tests.support.supervisorfakes import START, FakeClock, FakeProcess, Run, put_lease, put_status, supervise

K8S = "k8s://https://k8s:6443"
LAUNCH = "20261129T110000Z-abc123"


def _cluster(spec: SubmitSpec, master: str) -> SubmitSpec:
    # a cluster-mode driver needs a checkpoint and a job store the cluster shares (the test's store stands for it)
    shared = replace(spec.config, store="s3://bucket/jobs", checkpoint="s3a://bucket/ckpt/orders")
    conf = {"spark.kubernetes.file.upload.path": "s3a://bucket/uploads"} if master == K8S else {}
    return replace(spec, master=master, deploy_mode="cluster", config=shared, conf=conf, supervised=True)


def _ends(store: JobStore, attempt: int, code: int) -> Callable[[FakeProcess], None]:
    """A tick: the driver of run ``attempt`` records that it exits with ``code``, as the entrypoint does."""

    def tick(proc: FakeProcess) -> None:
        write_driver_end(store, DriverEnd(job="orders", run=f"{LAUNCH}-{attempt}", code=code, at=time.time(),
                                          host="pod-a", pid=1))

    return tick


def _runs_at(store: JobStore, epoch: int, state: JobState = JobState.RUNNING) -> Callable[[FakeProcess], None]:
    """A tick: the driver in the cluster took the lease at ``epoch`` and reports ``state`` from another host."""

    def tick(proc: FakeProcess) -> None:
        put_lease(store, epoch, START + 1)
        put_status(store, state, epoch, proc.clock.now, pid=77, host="pod-a")

    return tick


def test_a_k8s_driver_pod_lost_without_a_word_is_restarted_and_its_recorded_stop_ends_supervision(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    # spark-submit exits 0 both times; the first driver pod died running (no end record), the second stopped
    put_lease(store, 3, START - 60, released=True)
    runs = [Run(0, tick=_runs_at(store, 4)), Run(0, tick=_ends(store, 2, 0))]
    outcome, spawner = supervise(_cluster(spec, K8S), clock, runs, FixedDelay(attempts=5, clock=clock), store=store,
                                 launch_id=LAUNCH)
    assert (outcome.final, outcome.attempts, outcome.restarts) == (Ending.STOPPED, 2, 1)
    named = "spark.kubernetes.driverEnv.CKPT_DRIVER_RUN"
    assert [a for argv in spawner.argvs for a in argv if "CKPT_DRIVER_RUN" in a] == [
        f"{named}={LAUNCH}-1", f"{named}={LAUNCH}-2"]
    assert spawner.restores == ["latest-savepoint", "latest-state"]
    assert not store.storage.exists(driver_end_key(f"{LAUNCH}-2"))  # read once, then deleted


@pytest.mark.parametrize(("code", "ending"), [(2, Ending.CONFIG_ERROR), (5, Ending.INCOMPATIBLE), (3, Ending.FENCED)])
def test_a_yarn_driver_that_cannot_be_fixed_by_a_restart_ends_supervision_though_spark_submit_says_1(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, code: int, ending: Ending
) -> None:
    outcome, spawner = supervise(_cluster(spec, "yarn"), clock, [Run(1, tick=_ends(store, 1, code))],
                                 FixedDelay(attempts=5, clock=clock), store=store, launch_id=LAUNCH)
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (ending, 1, code)
    assert f"spark.yarn.appMasterEnv.CKPT_DRIVER_RUN={LAUNCH}-1" in spawner.argvs[0]


def test_a_stopped_driver_whose_end_record_was_lost_is_known_by_its_own_status(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    # the store failed as the driver exited: its last status (STOPPED at its own epoch) still tells a stop
    put_lease(store, 3, START - 60, released=True)
    outcome, _ = supervise(_cluster(spec, K8S), clock, [Run(0, tick=_runs_at(store, 4, JobState.STOPPED))],
                           FixedDelay(attempts=5, clock=clock), store=store, launch_id=LAUNCH)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 1)


def test_client_mode_keeps_the_process_exit_code_and_names_no_run(
    spec: SubmitSpec, clock: FakeClock, store: JobStore
) -> None:
    outcome, spawner = supervise(spec, clock, [Run(0)], FixedDelay(attempts=5, clock=clock), store=store,
                                 launch_id=LAUNCH)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 1)
    assert not [a for a in spawner.argvs[0] if "CKPT_DRIVER_RUN" in a]
    assert "CKPT_DRIVER_RUN" not in spawner.envs[0]
