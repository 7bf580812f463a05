"""Recovery inside a live driver, and failures no restart fixes: real Spark (local[2]), tansu, SeaweedFS.

A failed query is restarted in the same driver process (same pid, same epoch) from its latest completed
checkpoint; the supervisor around it starts no second driver. An outage of the job store is ridden out
without a restart when it is shorter than the lease's tolerance, and with exactly one in-driver restart
when it is longer; either way one log line when the store goes and one when it is back. Failures that
no restart fixes end the driver and its supervisor at once, with their exit code.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState, JobStatus, RestartOwner
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from airflow_ckpt_provider.embedded.process import free_port
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_INCOMPATIBLE,
    EXIT_REFUSED,
    EXIT_STOPPED,
)
from tests.support.runtimejob import JobEnv, Run, expected_counts, produce
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration

TIMEOUT = 180.0
#: Restarts a second apart at most, so that a test waits for recovery, not for a backoff.
OUTAGE_S = 12.0
FAST_RESTARTS = ("--restart-strategy", "fixed-delay", "--restart-attempts", "5", "--restart-delay", "0.5")


def batches_committed(env: JobEnv) -> list[int]:
    return sorted(b for entries in env.commits().values() for b, _t in entries)


def supervisor_lines(run: Run, text: str) -> list[str]:
    return [ln for ln in run.ckpt_lines() if "launcher.supervisor" in ln and text in ln]


def stop(env: JobEnv, run: Run, status: JobStatus) -> None:
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert run.wait(TIMEOUT) == EXIT_STOPPED


def test_a_task_failure_and_a_sink_failure_restart_the_query_in_the_same_driver_with_exact_counts(
    env: JobEnv, runs: list[Run],
) -> None:
    faults = env.work / "faults"
    faults.mkdir()
    produce(env.kafka.bootstrap_servers, env.topic, 0, 400)
    runs.append(run := env.run("job", env.work / "checkpoint", "--supervise", "--poll-interval", "1",
                                   "--lease-interval", "1", *FAST_RESTARTS,
                               extra_env={"CKPT_TEST_FAULT_DIR": str(faults)}))
    first = env.wait_status("400 records counted", lambda s: env.consumed(s) == 400, TIMEOUT, run)

    (faults / "task").touch()  # a Python UDF raises in a task of the next batch: local mode does not retry it
    produce(env.kafka.bootstrap_servers, env.topic, 400, 400)
    after_task = env.wait_status("800 records counted after one restart",
                                 lambda s: env.consumed(s) == 800 and s.restart_count == 1, TIMEOUT, run)
    assert not (faults / "task").exists()

    (faults / "sink").touch()  # the foreachBatch function raises once
    produce(env.kafka.bootstrap_servers, env.topic, 800, 400)
    final = env.wait_status("1200 records counted after a second restart",
                            lambda s: env.consumed(s) == 1200 and s.restart_count == 2, TIMEOUT, run)

    # The same driver process and epoch throughout: the query was restarted inside it.
    assert (after_task.pid, after_task.epoch) == (first.pid, first.epoch)
    assert (final.pid, final.epoch, final.state) == (first.pid, first.epoch, JobState.RUNNING)
    restarts = final.restarts
    assert [(r["by"], r["attempt"]) for r in restarts] == [(RestartOwner.DRIVER, 1), (RestartOwner.DRIVER, 2)]
    assert "injected task failure" in restarts[0]["cause"]
    assert "injected sink failure" in restarts[1]["cause"]
    for r in restarts:  # each resumed with the batch that had failed (it is replayed, not skipped)
        assert r["resumed_batch"] == r["from_batch"] + 1, r
    assert final.restart is None
    assert len(supervisor_lines(run, "started (attempt")) == 1, "the supervisor started exactly one driver"
    assert len([ln for ln in run.ckpt_lines() if "restarting it in this driver" in ln]) == 2

    stop(env, run, final)
    assert env.final_counts() == expected_counts(1200)
    committed = batches_committed(env)
    assert committed == list(range(len(committed))), "every batch committed exactly once"


@pytest.mark.parametrize(("fence_grace", "restarts"), [
    pytest.param(30.0, 0, id="short", marks=pytest.mark.full(
        proven_by="the [long] case: the same outage handling (one line each way, same driver, exact counts) with "
                  "the default grace; core/test_lease_outage.py proves the grace's tolerance")),
    pytest.param(3.0, 1, id="long"),
])
def test_a_job_store_outage_is_ridden_out_in_the_driver_with_one_line_when_it_goes_and_one_when_it_is_back(
    env: JobEnv, runs: list[Run], fence_grace: float, restarts: int,
) -> None:
    """12 s without S3: within the lease's tolerance (--fence-grace 30: 29 s) the query runs on; beyond it
    (the default, 2 s) the driver stops the query (nothing may commit without the lease) and restarts it once
    S3 answers."""
    with TcpProxy(env.s3.port) as proxy:
        produce(env.kafka.bootstrap_servers, env.topic, 0, 400)
        runs.append(run := env.run("job", env.work / "checkpoint", "--supervise", "--poll", "1", *FAST_RESTARTS,
                                   "--fence-grace", str(fence_grace), "--heartbeat-interval", "1",
                                   extra_env={"AWS_ENDPOINT_URL": proxy.url}))
        first = env.wait_status("400 records counted", lambda s: env.consumed(s) == 400, TIMEOUT, run)

        proxy.cut()
        produce(env.kafka.bootstrap_servers, env.topic, 400, 400)
        wait_for_log(run, "the job store is unreachable", 60.0)
        time.sleep(OUTAGE_S)  # the outage's length is the test's input, not a wait for something to happen
        proxy.restore()
        final = env.wait_status("800 records counted", lambda s: env.consumed(s) == 800, TIMEOUT, run)

        assert (final.pid, final.epoch, final.state) == (first.pid, first.epoch, JobState.RUNNING)
        assert final.restart_count == restarts
        assert len(supervisor_lines(run, "started (attempt")) == 1, "the supervisor started exactly one driver"
        unreachable = [ln for ln in run.ckpt_lines() if "the job store is unreachable:" in ln]
        back = [ln for ln in run.ckpt_lines() if "the job store is reachable again" in ln]
        assert (len(unreachable), len(back)) == (1, 1), "\n".join(unreachable + back)
        stop(env, run, final)
    assert env.final_counts() == expected_counts(800)
    committed = batches_committed(env)
    assert committed == list(range(len(committed))), "every batch committed exactly once"


def wait_for_log(run: Run, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in ln for ln in run.ckpt_lines()):
            return
        assert run.proc.poll() is None, f"{run.name} exited with {run.proc.returncode}\n{run.tail()}"
        time.sleep(0.2)
    raise AssertionError(f"no log line with {text!r} within {timeout} s\n{run.tail()}")


@pytest.mark.parametrize(("variant", "code", "message"), [
    ("secret", EXIT_DENIED, "refused the credentials (SignatureDoesNotMatch)"),
    pytest.param("append", EXIT_REFUSED,
                 "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: append",
                 marks=pytest.mark.full(proven_by="the [schema] case: the same supervisor path for an error Spark "
                                                  "raises at the query's start; the exit code of this one: "
                                                  "unit/runtime/test_failures.py")),
    ("schema", EXIT_INCOMPATIBLE, "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"),
    pytest.param("nomodule", EXIT_CONFIG, "No module named 'ckpt_test_missing_module'",
                 marks=pytest.mark.full(proven_by="integration/test_cluster.py::test_without_shipping_a_job_on_nodes_"
                                                  "lacking_its_modules_fails_once_... (a missing module: one driver, "
                                                  "exit code EXIT_CONFIG, no restart loop)")),
])
def test_a_failure_no_restart_fixes_ends_the_driver_and_its_supervisor_once_with_its_exit_code(
    env: JobEnv, runs: list[Run], variant: str, code: int, message: str,
) -> None:
    """A wrong S3 secret, an output mode Spark refuses, a state schema change, a module the sink lacks:
    the driver fails once with the message and its exit code; the supervisor (exponential-delay, unbounded)
    does not restart it and exits with the same code. A wrong secret is refused at the supervisor's first write
    to the store: no driver starts (issue 39, item 7)."""
    produce(env.kafka.bootstrap_servers, env.topic, 0, 200)
    checkpoint = env.work / "checkpoint"
    if variant == "schema":  # state of the original query first: a count per key
        runs.append(v1 := env.run("v1", checkpoint))
        status = env.wait_status("200 records counted", lambda s: env.consumed(s) == 200, TIMEOUT, v1)
        stop(env, v1, status)
        produce(env.kafka.bootstrap_servers, env.topic, 200, 200)  # a batch to run: Spark checks the state then
    extra = {"AWS_SECRET_ACCESS_KEY": "not-the-secret"} if variant == "secret" else {"CKPT_TEST_VARIANT": variant}
    runs.append(run := env.run(variant, checkpoint, "--supervise", "--poll", "1", extra_env=extra))
    assert run.wait(TIMEOUT) == code, run.tail()

    if variant == "secret":  # the supervisor's own first write is refused: it starts no driver at all
        assert supervisor_lines(run, "started (attempt") == [], "a driver started with refused credentials"
        errors = [ln for ln in run.ckpt_lines()
                  if "refused the supervisor's credentials" in ln and "not an outage" in ln]
    else:
        assert len(supervisor_lines(run, "started (attempt")) == 1, "the supervisor started exactly one driver"
        errors = [ln for ln in run.ckpt_lines() if "no restart can fix it" in ln or "cannot start" in ln]
    assert len(errors) == 1 and message in errors[0], "\n".join(errors) or run.tail()
    if variant != "secret":  # with the wrong secret nothing can be written to the store
        status = env.status()
        assert status is not None
        assert status.state is JobState.FAILED
        assert message in status.reason



@pytest.fixture
def proxied_env(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> Iterator[tuple[JobEnv, TcpProxy]]:
    """A job environment whose broker is reached through a proxy (tansu advertises the proxy's port): cutting
    the proxy is a broker outage, while the broker keeps its topic in memory."""
    broker_port = free_port()
    with TcpProxy(broker_port) as proxy, EmbeddedKafka(port=broker_port, advertised_port=proxy.port,
                                                        workdir=tmp_path / "tansu") as kafka:
        topic = f"t-{uuid.uuid4().hex[:10]}"
        kafka.create_topic(topic, partitions=3)
        yield JobEnv(s3_server, kafka, tmp_path, bucket, topic), proxy


def test_a_broker_outage_is_ridden_out_in_the_same_driver_with_one_line_when_it_goes_and_one_when_it_is_back(
    proxied_env: tuple[JobEnv, TcpProxy], runs: list[Run],
) -> None:
    """12 s without the broker (its proxy cut): the ckpt-kafka source waits, the query is not restarted, the
    driver logs one "unreachable" and one "reachable again" line per process instead of ~800 refused
    connections, and the records produced after it are counted exactly."""
    env, proxy = proxied_env
    produce(env.kafka.bootstrap_servers, env.topic, 0, 400)
    runs.append(run := env.run("job", env.work / "checkpoint", "--supervise", "--poll", "1", *FAST_RESTARTS))
    first = env.wait_status("400 records counted", lambda s: env.consumed(s) == 400, TIMEOUT, run)

    proxy.cut()
    wait_for_log(run, f"kafka {env.kafka.bootstrap_servers} unreachable", 60.0)
    time.sleep(OUTAGE_S)  # the outage's length is the test's input, not a wait for something to happen
    proxy.restore()
    produce(env.kafka.bootstrap_servers, env.topic, 400, 400)
    final = env.wait_status("800 records counted", lambda s: env.consumed(s) == 800, TIMEOUT, run)

    assert (final.pid, final.epoch, final.state) == (first.pid, first.epoch, JobState.RUNNING)
    assert len(supervisor_lines(run, "started (attempt")) == 1, "the supervisor started exactly one driver"
    assert final.restart_count == 0, final.restarts  # the source waits for the broker: nothing to restart
    text = run.log.read_text(errors="replace")
    lines = text.splitlines()
    down = [ln for ln in lines if f"kafka {env.kafka.bootstrap_servers} unreachable" in ln]
    back = [ln for ln in lines if f"kafka {env.kafka.bootstrap_servers} reachable again" in ln]
    # One pair per process whose clients saw the outage (the driver, Spark's Python workers), not per request.
    assert 1 <= len(down) == len(back) <= 4, "\n".join(down + back)
    assert not re.search(r"^%\d\|\d+\.\d+\|", text, re.M), "a raw librdkafka line reached the log"
    assert sum("Connection refused" in ln for ln in lines) <= len(down), "refused connections logged one by one"
    stop(env, run, final)
    assert env.final_counts() == expected_counts(800)
    committed = batches_committed(env)
    assert committed == list(range(len(committed))), "every batch committed exactly once"
