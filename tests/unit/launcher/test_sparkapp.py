"""Drivers as SparkApplications (launcher/sparkapp.py): the supervisor holds one resource per driver run through
kubectl (created, watched until the operator reports a final state, deleted; deleted at once on SIGTERM), with
``restartPolicy: Never`` so the supervisor alone restarts. No Kubernetes here: the holder's loop runs against a
scripted kubectl (pure logic), and the real module as a process against a fake ``kubectl`` program that records
its calls; the supervisor against fake spark-submit processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.supervision import DriverEnd, write_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.sparkapp import Kubectl, driver_command, hold, manifest
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending
from tests.support.supervisorfakes import FakeClock, FakeProcess, Run, supervise

K8S = "k8s://https://k8s:6443"
LAUNCH = "20261129T120000Z-abc123"
APP_CONF = {"spark.ckpt.submitter": "sparkapplication", "spark.kubernetes.container.image": "reg/ckpt:1",
            "spark.kubernetes.namespace": "streaming"}


def _spec(spec: SubmitSpec, **conf: str) -> SubmitSpec:
    shared = replace(spec.config, store="s3://bucket/jobs", checkpoint="s3a://bucket/ckpt/orders")
    return replace(spec, master=K8S, deploy_mode="cluster", config=shared, conf={**APP_CONF, **conf},
                   job_file="local:///opt/jobs/orders.py", supervised=True)


class ScriptedKubectl(Kubectl):
    """kubectl whose answers are scripted: the states ``get`` returns in turn (an exception: that call fails)."""

    def __init__(self, states: list[Any], *, create_fails: bool = False) -> None:
        super().__init__("ckpt-orders-run-1", "streaming")
        self.states, self.create_fails = list(states), create_fails
        self.calls: list[str] = []

    def create(self, resource: dict[str, Any]) -> None:
        self.calls.append("create")
        if self.create_fails:
            raise RuntimeError("kubectl create of SparkApplication ckpt-orders-run-1 failed: forbidden")

    def state(self) -> str | None:
        self.calls.append("get")
        state = self.states.pop(0)
        if isinstance(state, Exception):
            raise state
        return state  # type: ignore[no-any-return]  # the script's entries are states or exceptions

    def delete(self) -> None:
        self.calls.append("delete")


@pytest.mark.parametrize(("states", "code", "gets"), [
    (["", "SUBMITTED", "RUNNING", "COMPLETED"], 0, 4),
    (["RUNNING", "FAILED"], 0, 2),  # how it failed is the driver's end record's to say, not kubectl's
    (["SUBMITTED", "SUBMISSION_FAILED"], 0, 2),
    (["RUNNING", RuntimeError("kubectl get ... failed: i/o timeout"), "RUNNING", "COMPLETED"], 0, 4),
    (["RUNNING", None], 1, 2),  # deleted by someone else: no end record will come either
])
def test_the_holder_creates_watches_until_a_final_state_and_deletes_the_resource(
        states: list[Any], code: int, gets: int) -> None:
    kubectl, sleeps = ScriptedKubectl(states), []
    assert hold(kubectl, {"metadata": {}}, poll=5.0, sleep=sleeps.append) == code
    assert kubectl.calls == ["create", *(["get"] * gets), "delete"]
    assert sleeps == [5.0] * (gets - 1)


def test_the_holder_deletes_at_once_when_stopped_and_creates_nothing_when_refused() -> None:
    kubectl = ScriptedKubectl(["RUNNING"] * 10)
    looks = iter([False, False, True])
    assert hold(kubectl, {}, poll=1.0, sleep=lambda _s: None, stopping=lambda: next(looks)) == 143
    assert kubectl.calls == ["create", "get", "get", "delete"]
    refused = ScriptedKubectl([], create_fails=True)
    assert hold(refused, {}, poll=1.0, sleep=lambda _s: None) == 1
    assert refused.calls == ["create"]  # nothing was created: nothing to delete


FAKE_KUBECTL = """#!/bin/sh
# records each call; "get" answers RUNNING (the operator's state of a running application)
echo "$*" >> "$CALLS"
case "$3" in
  create) cat > "$CALLS.manifest" ;;
  get) printf RUNNING ;;
esac
"""


def test_the_holder_process_deletes_its_resource_on_sigterm(spec: SubmitSpec, tmp_path: Path) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    calls = tmp_path / "calls"
    argv, _ = driver_command(replace(_spec(spec), driver_run=f"{LAUNCH}-1"))
    proc = subprocess.Popen([*argv, "--kubectl", str(kubectl), "--poll", "0.05"],
                            env={**os.environ, "CALLS": str(calls)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (calls.exists() and "get" in calls.read_text()):  # created, and watched once
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    lines = calls.read_text().splitlines()
    name = "ckpt-orders-20261129t120000z-abc123-1"
    assert lines[0] == "-n streaming create -f -"
    state = "jsonpath={.status.applicationState.state}"
    assert set(lines[1:-1]) == {f"-n streaming get sparkapplication {name} -o {state}"}
    assert lines[-1] == f"-n streaming delete sparkapplication {name} --ignore-not-found --wait=false"
    created = json.loads((tmp_path / "calls.manifest").read_text())
    assert created["metadata"]["name"] == name and created["spec"]["restartPolicy"] == {"type": "Never"}


def test_a_supervised_sparkapplication_driver_is_held_and_judged_by_its_end_record(
        spec: SubmitSpec, clock: FakeClock, store: JobStore) -> None:
    def ends(code: int, attempt: int) -> Any:
        def tick(proc: FakeProcess) -> None:
            write_driver_end(store, DriverEnd(job="orders", run=f"{LAUNCH}-{attempt}", code=code, at=time.time(),
                                              host="pod", pid=1))
        return tick

    outcome, spawner = supervise(_spec(spec), clock, [Run(0, tick=ends(1, 1)), Run(0, tick=ends(0, 2))],
                                 FixedDelay(attempts=3, clock=clock), store=store, launch_id=LAUNCH)
    assert (outcome.final, outcome.attempts) == (Ending.STOPPED, 2)  # the first run failed (1), the second stopped
    names = []
    for argv in spawner.argvs:
        assert argv[:4] == [sys.executable, "-m", "airflow_ckpt_provider.launcher.sparkapp", "--manifest"]
        resource = json.loads(argv[4])
        names.append(resource["metadata"]["name"])
        assert resource["spec"]["sparkConf"]["spark.kubernetes.driverEnv.CKPT_DRIVER_RUN"] == \
            f"{LAUNCH}-{len(names)}"
    assert names == ["ckpt-orders-20261129t120000z-abc123-1", "ckpt-orders-20261129t120000z-abc123-2"]
    restores = [json.loads(argv[4])["spec"]["arguments"] for argv in spawner.argvs]
    # the first driver never reported RUNNING: the restart keeps the launch's restore (as for any driver)
    assert [a[a.index("--restore") + 1] for a in restores] == ["latest-savepoint", "latest-savepoint"]


@pytest.mark.parametrize(("change", "message"), [
    ({"job_file": "/home/me/orders.py"}, "the Spark operator submits from its own pod and reads no file of this host"),
    ({"conf": {"spark.ckpt.submitter": "sparkapplication"}}, "without spark.kubernetes.container.image"),
    ({"deploy_mode": "client", "job_file": "local"}, "a SparkApplication runs its driver in a Kubernetes cluster"),
    ({"conf": {**APP_CONF, "spark.ckpt.submitter": "helm"}}, "expected one of spark-submit, sparkapplication"),
    ({"conf": {**APP_CONF, "spark.executor.instances": "many"}}, "expected a whole number of executors"),
], ids=["host-file", "no-image", "client-mode", "unknown-submitter", "bad-instances"])
def test_bad_sparkapplication_settings_are_refused_before_anything_runs(
        spec: SubmitSpec, tmp_path: Path, change: dict[str, Any], message: str) -> None:
    job = tmp_path / "orders.py"
    job.write_text("# a job\n")
    bad = replace(_spec(spec), **{**change, **({"job_file": str(job)} if "job_file" in change else {})})
    with pytest.raises(ConfigError, match=message):
        manifest(bad)


def test_an_adopted_sparkapplication_driver_s_resource_is_deleted_once_it_ends(
        spec: SubmitSpec, clock: FakeClock, store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt_provider.core.records.status import JobState
    from airflow_ckpt_provider.core.records.supervision import SupervisorRecord, SupervisorState, write_supervisor
    from tests.support.supervisorfakes import START, put_lease, put_status

    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{kubectl.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    # the lost supervisor held run 2's SparkApplication; its driver (epoch 4, a pod) runs on, then stops
    write_supervisor(store, SupervisorRecord(job="orders", launch_id=LAUNCH, pid=4321, host="svc-a",
                                             state=SupervisorState.WATCHING, started_at=START - 300,
                                             updated_at=START - 60, interval=5.0, attempt=2, epoch=4))
    put_lease(store, 4, START - 120)
    put_status(store, JobState.RUNNING, 4, START, pid=1, host="driver-pod")
    real = clock.sleep

    def sleep(seconds: float) -> None:
        real(seconds)
        put_status(store, JobState.STOPPED if clock.now > START + 20 else JobState.RUNNING, 4, clock.now, pid=1,
                   host="driver-pod")

    clock.sleep = sleep  # type: ignore[method-assign]  # the driver's reports ride on the fake clock
    outcome, spawner = supervise(_spec(spec), clock, [], FixedDelay(attempts=3, clock=clock), store=store,
                                 launch_id=LAUNCH, adopt_epoch=4)
    assert (outcome.final, spawner.argvs) == (Ending.STOPPED, [])
    assert calls.read_text().splitlines() == [
        "-n streaming delete sparkapplication ckpt-orders-20261129t120000z-abc123-2 --ignore-not-found --wait=false"]
