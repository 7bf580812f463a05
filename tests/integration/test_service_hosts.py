"""Issue 42 on the namespace hosts of issue 41: the supervision service instance that owns a job cut from the store.

Topology: ``store`` (SeaweedFS: the job store and the files sink's bucket), ``kafka`` (tansu), ``launcher`` (where the
job is handed over, as an Airflow task would: it only writes records; the test's feed and readers), ``service-a`` and
``service-b`` (one ``ckpt service run`` each, with its own host name; the supervisors and drivers an instance starts
run on its host, with a CKPT_HOME and so a live checkpoint of their own). The job is tests/jobs/eo_job.py into the
ckpt-files sink, local[2], with the scenarios' lease settings (poll and lease 1 s, fence grace 4 s).

Once the job runs and has a snapshot, the owning instance's host is cut from the store for 60 s (both ways): its
instance stops acting once its lease is 8 s without a renewal, its driver stops committing once its lease cannot be
confirmed; the other instance takes the job over after the owner's lease (12 s) and, the supervisor's heartbeat gone,
relaunches the job on its own host from the newest snapshot. Claims: the takeover comes at the next ownership epoch,
from the other instance, once; the cut host's driver commits nothing once the new driver may; after the heal the old
driver exits fenced and its instance knows it no longer owns the job; one relaunch; every id once in the sink.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.policy.modes import LATEST_STATE
from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Deployment, read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.ownership import read_owner
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher.handover import hand_over
from tests.support import hosts
from tests.support.exactlyonce import EO_JOB, expected_rows
from tests.support.hostjobs import (
    FENCE_GRACE,
    POLL,
    WAIT,
    Feed,
    Lines,
    Scenario,
    commit_times,
    grace_end,
    run_scenario,
    start_services,
    stop_services,
)
from tests.support.runtimejob import SPARK_CONF

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

CUT = 60.0
SERVICES = ("service-a", "service-b")


def _deployment(sc: Scenario) -> Deployment:
    conf = dict(c.split("=", 1) for c in SPARK_CONF) | sc.sink.conf()
    return Deployment(job_file=str(EO_JOB), master="local[2]", conf=conf, poll_interval=POLL, lease_interval=POLL,
                      fence_grace=FENCE_GRACE, heartbeat_interval=1.0)


def _driver_lines(sc: Scenario, role: str, launch_id: str) -> Lines:
    """The lines of the supervisor and driver of ``launch_id`` started by ``role`` (their log under its CKPT_HOME)."""
    log = sc.work / f"home-{role}" / "jobs" / sc.env.job / "logs" / f"{launch_id}.log"
    return Lines.read(role, log) if log.exists() else Lines(role)


@pytest.mark.timeout(600)
@pytest.mark.full(proven_by="integration/test_service.py::test_a_handed_job_outlives_its_owning_instance_and_its_lost_"
                            "supervisor_is_relaunched_once_exact_counts (a takeover and a relaunch, on one host) and "
                            "integration/test_partitions.py::test_driver_cut_from_the_store_is_fenced_and_a_driver_"
                            "elsewhere_takes_over[files] (a cut driver commits nothing once a newer one may)")
def test_the_owning_instance_cut_from_the_store_is_taken_over_and_its_driver_fenced_exact(tmp_path: Path) -> None:
    run_scenario("service on hosts", "files", tmp_path, "svc", _run, roles=["store", "kafka", "launcher", *SERVICES])


def _run(sc: Scenario, feed: Feed) -> None:
    topo, times = sc.topo, sc.times
    services = start_services(sc, SERVICES, sc.sink.env())
    store = sc.env.store
    s3 = S3Options(endpoint_url=sc.env.s3.endpoint_url, region=sc.env.s3.region,
                   access_key_id=sc.env.s3.access_key, secret_access_key=sc.env.s3.secret_key)
    first = sc.in_launcher(lambda: hand_over(store(), _deployment(sc), restore=LATEST_STATE,
                                             store_url=sc.env.store_url, s3=s3, handed_by="airflow:test.submit"))
    try:
        feed.start()
        status = sc.wait_status("three batches and a snapshot", lambda s: s.batch_id is not None and s.batch_id >= 3
                                and s.last_snapshot is not None and s.state is JobState.RUNNING, WAIT)
        owner = sc.in_launcher(lambda: read_owner(store()))
        assert owner is not None and owner.epoch == 1 and owner.instance in SERVICES
        other = next(r for r in SERVICES if r != owner.instance)
        times["owner, other"] = [owner.instance, other]
        first_epoch = status.epoch

        cut = topo.cut(owner.instance, "store", seconds=CUT)
        t_cut = time.time()
        taken = _until("the other instance owning the job", lambda: (
            (o := sc.in_launcher(lambda: read_owner(store()))) is not None and o.instance == other and o), WAIT)
        times["takeover after the cut, s"] = round(time.time() - t_cut, 1)
        assert taken.epoch == 2
        lease = _until("a driver of a newer epoch holding the lease", lambda: (
            (le := sc.in_launcher(lambda: read_lease(store()))) is not None and le.epoch > first_epoch and le), WAIT)
        times["new driver's lease after the cut, s"] = round(lease.acquired_at - t_cut, 1)
        last = sc.in_launcher(lambda: read_launch(store()))
        assert last is not None and last.launch_id != first.launch_id
        assert last.launched_by.startswith(f"supervision service {other}: ")
        times["relaunch"] = last.launched_by

        cut.wait(CUT + 10)
        t_heal = time.time()
        _until("the cut host's driver fenced after the heal", lambda: _driver_lines(
            sc, owner.instance, first.launch_id).first("was fenced") is not None, WAIT)
        times["old driver fenced after the heal, s"] = round(time.time() - t_heal, 1)

        feed.finish()
        final = sc.wait_status(f"all {feed.records} records consumed", lambda s: s.epoch == lease.epoch
                               and sc.consumed(s) == feed.records and s.state is JobState.RUNNING, WAIT)
        ack = sc.in_launcher(sc.env.request, RequestAction.STOP, final.epoch)
        assert ack.outcome is Outcome.COMPLETED, ack
        _until("the relaunch stopped", lambda: (
            (la := sc.in_launcher(lambda: read_launch(store()))) is not None and la.ending == "stopped"), WAIT)
    finally:
        feed.halt()
        stop_services(services)

    old = _driver_lines(sc, owner.instance, first.launch_id)
    late = [(round(t - t_cut, 1), what) for t, what in commit_times(old, logged=True) if t >= grace_end(lease)]
    times["old driver: commits once the new one may commit"] = late
    logs = {role: log.read_text(errors="replace") for role, (_p, log) in services.items()}
    times["relaunches"] = sum(text.count("relaunched it from the latest state") for text in logs.values())
    times["cut instance: knows it lost the job"] = "no longer owns it" in logs[owner.instance]
    rows = sc.in_launcher(sc.sink.committed)
    counts = Counter(r[0] for r in rows)
    times["ids"], times["committed rows"] = feed.next_id, len(rows)
    times["duplicated ids"] = sum(1 for n in counts.values() if n > 1)
    times["missing ids"] = len(set(range(feed.next_id)) - set(counts))
    print(f"service on hosts: {json.dumps(times, default=str)}")
    assert not late, f"the cut host's driver committed after the new driver could: {late}"
    assert times["relaunches"] == 1, times
    assert times["cut instance: knows it lost the job"], logs[owner.instance][-3000:]
    assert sorted(rows) == expected_rows(feed.next_id), times
    times["uncommitted"] = sc.in_launcher(sc.sink.check_nothing_uncommitted)


def _until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # the store answers again on the next look
            found = None
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
