"""A job store that refuses the supervisor's credentials is no outage (issue 39, item 7): at the start no driver is
started and supervision ends at once with exit 6; a refusal that appears while a driver runs is logged once as a
refusal, leaves that driver alone, and stops the supervisor from restarting it."""

from __future__ import annotations

import logging

import pytest

from airflow_ckpt_provider.core.errors import CredentialsError
from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.jobstore import STATUS, JobStore
from airflow_ckpt_provider.launcher.submit import SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, SupervisorOutcome
from airflow_ckpt_provider.runtime.exitcodes import EXIT_DENIED
from tests.support.supervisorfakes import HOST, START, FakeClock, FakeProcess, Run, supervise

SECRET = "wrong-secret-xyz"


def _refuse(store: JobStore, clock: FakeClock, *, since: float) -> None:
    """From ``since`` on, the store refuses every request as S3 does a wrong secret (the message names no secret)."""
    storage = store.storage
    real_read, real_write = storage.read, storage.write

    def refusing(what: str) -> None:
        if clock.now >= since:
            raise CredentialsError(f"{what}: S3 refused the credentials (SignatureDoesNotMatch) for bucket 'b' "
                                   "(access key id AKIA...XYZ, endpoint AWS); check the access key, secret and "
                                   "permissions")

    def read(key: str) -> bytes:
        refusing(f"read {key}")
        return real_read(key)

    def write(key: str, data: bytes) -> None:
        refusing(f"write {key}")
        real_write(key, data)

    storage.read = read  # type: ignore[method-assign]  # the fault, in a unit test
    storage.write = write  # type: ignore[method-assign]  # the fault, in a unit test


def test_refused_credentials_at_the_start_end_supervision_at_once_without_a_driver(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _refuse(store, clock, since=START)
    outcome, spawner = supervise(spec, clock, [], FixedDelay(attempts=3, delay=1.0, clock=clock), store=store,
                                 launch_id="launch-1")
    assert spawner.procs == []  # no driver started
    assert outcome.final is Ending.DENIED and outcome.final.exit_code == EXIT_DENIED
    assert (outcome.attempts, outcome.restarts, outcome.exit_code) == (0, 0, None)
    assert "no driver started" in outcome.reason and "fix the access key, secret or permissions" in outcome.reason
    refused = [r for r in caplog.records if "refused the supervisor's credentials" in r.getMessage()]
    assert [r.levelname for r in refused] == ["ERROR", "ERROR"]  # the refusal once, and how supervision ended
    assert refused[0].getMessage().startswith("job orders: the job store refused the supervisor's credentials: "
                                              "write supervisors/")
    assert "not an outage" in refused[0].getMessage()
    assert not [m for m in caplog.messages if "unreachable" in m]
    assert SECRET not in caplog.text
    assert not store.storage.list("")  # nothing written: no status.json, no supervisor record


def test_a_refusal_while_a_driver_runs_leaves_it_alone_and_ends_supervision_instead_of_a_restart(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    def tick(proc: FakeProcess) -> None:
        if clock.now < START + 10:
            store.storage.write(STATUS, JobStatus("orders", JobState.RUNNING, 4, clock.now, START, batch_id=7,
                                                  pid=5000, host=HOST).to_bytes())

    _refuse(store, clock, since=START + 10)
    outcome, spawner = supervise(spec, clock, [Run(1, runs_for=60.0, tick=tick)],
                                 FixedDelay(attempts=3, delay=1.0, clock=clock), store=store, poll=5.0)
    assert spawner.procs[0].signals == []  # not killed for the heartbeats the supervisor could not read
    assert spawner.procs[0].ended == START + 60
    assert outcome == SupervisorOutcome(Ending.DENIED, 1, 0, 1, outcome.reason)
    assert outcome.reason.startswith("the job store refuses the supervisor's credentials: not restarting the driver")
    assert len([m for m in caplog.messages if "the job store refused the supervisor's credentials" in m]) == 1
    assert not [m for m in caplog.messages if "unreachable" in m]


def test_credentials_that_work_again_before_the_driver_exits_allow_the_restart(
    spec: SubmitSpec, clock: FakeClock, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    storage = store.storage
    real_write = storage.write

    def write(key: str, data: bytes) -> None:
        if START + 10 <= clock.now < START + 20:
            raise CredentialsError(f"write {key}: S3 refused the credentials (AccessDenied)")
        real_write(key, data)

    storage.write = write  # type: ignore[method-assign]  # the fault, in a unit test
    outcome, spawner = supervise(spec, clock, [Run(1, runs_for=30.0), Run(0, runs_for=1.0)],
                                 FixedDelay(attempts=3, delay=1.0, clock=clock), store=store, poll=5.0)
    assert len(spawner.procs) == 2 and spawner.procs[0].signals == []
    assert outcome.final is Ending.STOPPED
    assert any("accepts the supervisor's credentials again" in m for m in caplog.messages)
