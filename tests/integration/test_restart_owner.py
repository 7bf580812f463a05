"""One owner per restart (issue 15), end to end: a job launched as Airflow launches it (launcher/deploy.launch,
a detached supervisor, spark-submit local[2], tansu, SeaweedFS), its driver's process group killed with -9.

The supervisor restarts the driver; a health watch whose heartbeat timeout (5 s) is shorter than a cold start
never calls the job unhealthy meanwhile, the DAG's restart task (its operation's actor) leaves the restart to the
supervisor and waits for it, exactly
one driver start is added (by the same launch), nothing is superseded, and the counts are exact. Both drivers
send their OpenLineage RUNNING event in the launch's one run.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.lineagenames import RUN_FACET, launch_run_id
from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.operations import OperationState, read_operation
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, RestartOwner, read_status
from airflow_ckpt_provider.core.records.supervision import SupervisorState, read_supervisor
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS, SPEC_LAST
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.core.views.jobview import RestartDecision, observe, restart_decision
from airflow_ckpt_provider.core.watches.job_health import JobHealthWatch
from airflow_ckpt_provider.launcher.deploy import launch
from airflow_ckpt_provider.operators.restart import RestartStreamingJobOperator
from tests.support.operatorfakes import context
from tests.support.runtimejob import (
    JOB_FILE,
    SPARK_CONF,
    JobEnv,
    expected_counts,
    kill_driver,
    produce,
    stop_supervisor,
    wait_logged,
)

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
RECORDS = 1200


def _starts(env: JobEnv) -> list[dict[str, Any]]:
    storage = env.store().storage
    return [json.loads(storage.read(i.key)) for i in sorted(storage.list(DEPLOYMENTS), key=lambda i: i.key)]


@pytest.mark.full(proven_by="system/test_example_dags.py::test_keep_alive_dag_restarts_a_killed_driver_with_exact_"
                            "counts (the supervisor restarts a killed driver once, the DAG adds no epoch), "
                            "integration/test_dagster.py::test_a_job_submitted_through_dagster_ops_rides_out_a_kill_9_"
                            "... (the health watch sees the restart in progress and asks for none) and "
                            "unit/operators/test_restart_owner.py (the restart task leaves a supervised restart to "
                            "its owner)")
def test_a_killed_driver_is_restarted_once_by_its_supervisor_while_the_watch_and_the_dag_restart_wait(
    env: JobEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = S3Options(endpoint_url=env.s3.endpoint_url, region=env.s3.region, access_key_id=env.s3.access_key,
                   secret_access_key=env.s3.secret_key)
    monkeypatch.setenv("CKPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    # The restart task's job store connection, as Airflow would resolve it.
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT", json.dumps({
        "conn_type": "ckpt_store", "host": env.s3.endpoint_url, "login": env.s3.access_key,
        "password": env.s3.secret_key, "extra": {"store_url": env.store_url, "region_name": env.s3.region}}))
    store = env.store()
    produce(env.kafka.bootstrap_servers, env.topic, 0, RECORDS // 2)
    deployment = Deployment(
        job_file=str(JOB_FILE), checkpoint=str(tmp_path / "checkpoint"), heartbeat_interval=1.0,
        restart_strategy="fixed-delay", restart_attempts=3, restart_delay=1.0, lineage_interval=600.0,
        conf=dict(c.split("=", 1) for c in SPARK_CONF),
        env={"CKPT_TEST_TOPIC": env.topic, "CKPT_TEST_BOOTSTRAP": env.kafka.bootstrap_servers,
             "CKPT_TEST_OUT": str(env.out), "CKPT_TEST_MAX_OFFSETS": "200"},
    )
    # OpenLineage as the operators pass it (operators/lineage.py launch_env): in the launch's environment only
    events_file, parent_run = tmp_path / "lineage.jsonl", str(uuid.uuid4())
    lineage_env = {"OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                         "append": True}),
                   "OPENLINEAGE_PARENT_ID": f"default/keep_alive.submit/{parent_run}"}
    record = launch(store, deployment, restore=LATEST_STATE, store_url=env.store_url, s3=s3, launched_by="test",
                    unrecorded_env=lineage_env)
    assert "OPENLINEAGE" not in store.storage.read(SPEC_LAST).decode()
    log = Path(str(record.log_file))
    try:
        first: JobStatus = wait_logged("the first driver RUNNING with a batch", lambda: (
            (s := read_status(store)) is not None and s.state is JobState.RUNNING and s.batch_id is not None
            and s), TIMEOUT, log)
        supervisor = read_supervisor(store, record.launch_id)
        assert supervisor is not None and (supervisor.pid, supervisor.state) == (record.pid, SupervisorState.WATCHING)
        starts_before = _starts(env)
        assert [s["launch_id"] for s in starts_before] == [record.launch_id]

        watch = JobHealthWatch(store, HealthCriteria(expect=Health.UNHEALTHY, heartbeat_timeout=5.0))
        assert watch.poll() is None
        wait_logged("the first driver's RUNNING event",
                    lambda: events_file.exists() and events_file.read_text().strip(), 30.0, log)
        kill_driver(first)  # the driver's process group only: the supervisor lives on

        seen: list[str] = []
        decisions: list[RestartDecision] = []
        deferred: list[TaskDeferred] = []

        def back_running() -> JobStatus | None:
            event = watch.poll()
            assert event is None, f"the watch called the job unhealthy while its supervisor restarted it: {event}"
            s = read_status(store)
            if s is None:
                return None
            seen.append(s.state.value)
            if s.state is JobState.RESTARTING and not deferred:
                restart = s.current_restart()
                assert restart is not None and restart.by is RestartOwner.SUPERVISOR
                assert (s.pid, s.epoch) == (record.pid, first.epoch)  # the supervisor's pid, the dead driver's epoch
                decision, _ = restart_decision(observe(store), LATEST_STATE)
                decisions.append(decision)
                op = RestartStreamingJobOperator(task_id="restart", job=env.job, start_timeout=TIMEOUT, deferrable=True)
                with pytest.raises(TaskDeferred) as info:  # it waits for the supervisor's restart, launches none
                    op.execute(context())
                deferred.append(info.value)
            return s if s.state is JobState.RUNNING and s.epoch > first.epoch else None

        second: JobStatus = wait_logged("a driver of a newer epoch RUNNING", back_running, TIMEOUT, log)
        assert "RESTARTING" in seen
        assert decisions and set(decisions) == {RestartDecision.LEAVE_TO_OWNER}
        [waiting] = deferred  # on its restart operation, whose actor (a detached `ckpt job operate`) only waits
        operation_id = waiting.trigger.serialize()[1]["operation_id"]
        ended_op = wait_logged("the restart operation's end", lambda: (
            (f := read_operation(store)) is not None and f.operation.state.final and f.operation), 60.0, log)
        assert (ended_op.id, ended_op.state, ended_op.kind) == (operation_id, OperationState.SUCCEEDED, "restart")
        assert ended_op.plan is not None and (ended_op.plan["owner"], ended_op.plan["min_epoch"]) == (
            "supervisor", first.epoch + 1)
        assert ended_op.result is not None and (ended_op.result["restarted_by"], ended_op.result["launch_id"],
                                                ended_op.result["epoch"]) == ("supervisor", record.launch_id,
                                                                              second.epoch)

        last = read_launch(store)
        assert last is not None and last.launch_id == record.launch_id and last.ended_at is None
        starts = _starts(env)
        assert len(starts) == len(starts_before) + 1  # exactly one relaunch, by the same launch
        assert [s["launch_id"] for s in starts] == [record.launch_id] * len(starts)
        assert starts[-1]["epoch"] == second.epoch

        produce(env.kafka.bootstrap_servers, env.topic, RECORDS // 2, RECORDS // 2)
        done = wait_logged(f"all {RECORDS} records counted", lambda: (
            (s := read_status(store)) is not None and env.consumed(s) == RECORDS and s), TIMEOUT, log)
        assert watch.poll() is None
        ack = env.request(RequestAction.STOP, done.epoch)
        assert ack.outcome is Outcome.COMPLETED, ack
        ended = wait_logged("the supervisor's end", lambda: (
            (r := read_supervisor(store, record.launch_id)) is not None and r.state is SupervisorState.ENDED and r),
            60.0, log)
        assert (ended.ending, ended.exit_code) == ("stopped", 0)
    finally:
        stop_supervisor(store, record.launch_id)

    # Each driver of the launch sent its first RUNNING event at its start (the next only 600 s later), in one run.
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [(e["eventType"], e["run"]["facets"][RUN_FACET]["epoch"]) for e in events] == [
        ("RUNNING", first.epoch), ("RUNNING", second.epoch)]
    assert {e["run"]["runId"] for e in events} == {launch_run_id(record.launch_id)}
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in events} == {parent_run}
    assert {e["run"]["facets"][RUN_FACET]["launchedBy"] for e in events} == {"test"}

    text = log.read_text(errors="replace")
    assert "superseded" not in text, text[-3000:]
    died = [line for line in text.splitlines() if " died (" in line and "restarting in" in line]
    assert len(died) == 1, died
    assert env.final_counts() == expected_counts(RECORDS)
    committed = {b for entries in env.commits().values() for b, _t in entries}
    assert committed == set(range(max(committed) + 1)), "every batch id committed, none missing"
