"""Issue 41, scenario 4: the launcher host lost under a running supervised job; the DAG's health watch on another
host relaunches it exactly once, and the counts are exact.

Topology (tests/support/hosts.py): ``store`` (SeaweedFS: the job store and the files sink's bucket), ``kafka`` (tansu,
memory storage), ``launcher`` and ``launcher-2`` (two Airflow workers, each with its own host name, Airflow home and
CKPT_HOME: nothing of one host's disk is read by the other's processes), the Spark standalone cluster
(``spark-master``, ``spark-worker-1``, ``spark-worker-2``; or ``local[2]``), and ``db`` for the ledger. The job is
tests/jobs/eo_job.py (``dropDuplicates(["id"])`` over a 3-partition topic into one exactly-once sink), launched by the
keep-alive example DAG (dags/example_ckpt_keep_alive.py, ``airflow dags test``) in client mode: its supervisor,
spark-submit and the driver run on the launcher that ran ``submit``, its executors on the workers.

1. Run 1 of the DAG on ``launcher``: ``submit`` launches the job there, the run waits in its health watch.
2. Run 2 on ``launcher-2`` (the next run, or the triggerer and another worker of the same Airflow): its ``submit``
   reconnects to the running job and its health watch defers.
3. ``launcher`` is lost: its link goes down, then every process in it is killed (kill -9: run 1, the supervisor,
   spark-submit, the driver and its Python workers); the feed goes on from ``launcher-2``.

The claims: (a) in client mode the driver died with the launcher (no line of its launch after the loss), and nobody
wrote RESTARTING (its supervisor died with it); (b) run 2's health watch saw the job silent with its supervisor's
heartbeat stale (it cannot see a process on another host) and its ``restart`` launched the job exactly once, on
``launcher-2``, from the latest state: one launch, one deployment record, the next epoch, resumed at the batch after
the newest snapshot; on the cluster, the new driver had the master kill the lost driver's application, which the
master had kept with all its cores (finding 12); (c) every id once in the sink's committed view; (d) nothing left
behind.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.deployments import Launch, read_launch
from airflow_ckpt_provider.core.records.operations import read_operation
from airflow_ckpt_provider.core.records.start import read_start
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.store.jobstore import DEPLOYMENTS
from airflow_ckpt_provider.demo.world import AirflowHome, deferred
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG
from tests.conftest import TEST_DRIVER_JVM
from tests.support import hosts
from tests.support.exactlyonce import EO_JOB, KafkaSink, expected_rows
from tests.support.hostjobs import (
    COMPLETED,
    MAX_OFFSETS,
    RESTORED,
    TASK_COMMIT,
    WAIT,
    Feed,
    Lines,
    Scenario,
    count_committed,
    run_scenario,
)
from tests.support.sparkhosts import MASTER, WORKERS, HostCluster, start_spark_cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

DAG = "ckpt_keep_alive"
#: The run reached its health watch and deferred it.
IN_HEALTH_WATCH = deferred("watch_health")
ROLES = ["store", "kafka", "launcher", "launcher-2"]
#: Run 1 waits in its health watch until the host is lost; run 2's watch lasts through the loss and the relaunch.
WATCH_RUN_1 = 900.0
WATCH_RUN_2 = 240.0
#: The variants beyond the default one.
FULL = pytest.mark.full(
    proven_by="integration/test_lost_launcher.py::test_a_lost_launcher_host_is_relaunched_once_by_the_dags_health_"
              "watch_on_another_host_with_exact_counts[files-standalone] (the same loss, watch and relaunch)")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("sink_name", "spark"), [
    pytest.param("files", "standalone", id="files-standalone"),
    pytest.param("ledger", "standalone", id="ledger-standalone", marks=FULL),
    pytest.param("kafka", "standalone", id="kafka-standalone", marks=FULL),
    pytest.param("files", "local", id="files-local", marks=FULL),
])
def test_a_lost_launcher_host_is_relaunched_once_by_the_dags_health_watch_on_another_host_with_exact_counts(
        sink_name: str, spark: str, tmp_path: Path) -> None:
    cluster = spark == "standalone"
    roles = [*ROLES, MASTER, *WORKERS] if cluster else ROLES
    run_scenario("scenario 4", sink_name, tmp_path, "p4", functools.partial(_run, cluster=cluster),
                 roles=roles, client="launcher-2")


def airflow_on(sc: Scenario, role: str, hc: HostCluster | None, migrated: Path | None = None) -> AirflowHome:
    """An Airflow worker on test host ``role``: a home of its own (sqlite; ``migrated``: a migrated database to copy),
    the job store and Spark connections (``local[2]``, or client mode on the cluster ``hc``), the job's settings,
    and every command in that host under its own name."""
    host, s3, sink = sc.topo[role], sc.env.s3, sc.sink
    master, conf = ("local[2]", sink.conf()) if hc is None else (hc.cluster.master_url,
                                                                 {**sink.conf(), **hc.cluster.job_conf()})
    job_env = {"CKPT_TEST_TOPIC": sc.env.topic, "CKPT_TEST_BOOTSTRAP": sc.env.kafka.bootstrap_servers,
               "CKPT_TEST_OUT": str(sc.env.out), "CKPT_TEST_MAX_OFFSETS": str(MAX_OFFSETS), **sink.env()}
    home = AirflowHome.for_job(
        sc.work / f"airflow-{role}", s3, sc.env.store_url, sc.env.job, job_env, ckpt_home=sc.work / f"home-{role}",
        watch_seconds=WATCH_RUN_1, master=master, conf=conf,
        # The worker's environment, not the deployment's (a relaunch on another worker records and reuses the
        # deployment's Spark settings, so a host's own address must not be one): the driver binds the host's
        # address and advertises it (not its name: the cluster's nodes do not use the topology's /etc/hosts); the
        # files sink finds the store's endpoint as the job store's client does.
        env={"SPARK_LOCAL_IP": host.address, "SPARK_LOCAL_HOSTNAME": host.address, "CKPT_EXAMPLE_JOB_FILE": str(EO_JOB),
             "AWS_ENDPOINT_URL": s3.endpoint_url, "AWS_REGION": s3.region},
        wrap=lambda argv: host.wrap(argv, own_hostname=True))
    if hc is not None:  # as in a user's shell: the executors run the shipped Python (--python-env auto)
        home.env.pop("PYSPARK_PYTHON")
    home.path.mkdir(parents=True)
    if migrated is None:
        home.migrate()
    else:
        shutil.copy(migrated, home.path / "airflow.db")
    return home



def _run(sc: Scenario, feed: Feed, *, cluster: bool = False) -> None:
    topo, times = sc.topo, sc.times
    hc = start_spark_cluster(topo, sc.work / "spark", java_opts=TEST_DRIVER_JVM) if cluster else None
    times["spark"] = "local[2]" if hc is None else f"standalone {hc.cluster.master_url}, {len(WORKERS)} workers"
    first_home = airflow_on(sc, "launcher", hc)
    second_home = airflow_on(sc, "launcher-2", hc, migrated=first_home.path / "airflow.db")
    feed.start()

    # 1. Run 1 on the launcher submits the job there and waits in its health watch.
    run1 = first_home.start_dags_test(DAG)
    run1.wait_for_output("run 1 in its deferred health watch", IN_HEALTH_WATCH, timeout=WAIT)
    sc.wait_status("three batches and a snapshot", lambda s: s.batch_id is not None and s.batch_id >= 3
                   and s.last_snapshot is not None and s.state is JobState.RUNNING, WAIT)
    first_launch = sc.in_launcher(lambda: read_launch(sc.env.store()))
    assert first_launch is not None and first_launch.host == topo["launcher"].hostname, first_launch
    assert first_launch.launched_by == f"airflow:{DAG}.submit", first_launch

    # 2. Run 2 on launcher-2 reconnects to the job and defers its health watch.
    run2 = second_home.start_dags_test(DAG, env={"CKPT_EXAMPLE_WATCH_SECONDS": str(WATCH_RUN_2)})
    run2.wait_for_output("run 2 in its deferred health watch", IN_HEALTH_WATCH, timeout=WAIT)
    assert "reconnecting instead of submitting it again" in run2.output(), run2.output()[-4000:]
    deployments = sc.in_launcher(deployment_keys, sc)

    # 3. The launcher is lost: link down, then kill -9 of everything in it.
    killed = sc.status()
    assert killed is not None and killed.state is JobState.RUNNING and killed.host == topo["launcher"].hostname
    t_kill = time.time()
    lost = topo.kill_host("launcher")
    t_dead = time.time()  # every process of the launcher killed (its link went down first)
    times["fault"] = "launcher host lost (link down, then kill -9 of every process in it)"
    times["killed driver: epoch, last batch"] = [killed.epoch, killed.batch_id]

    done = run2.wait(WATCH_RUN_2 + WAIT)
    out = done.stdout
    assert done.returncode == 0, out[-6000:]
    relaunch = sc.in_launcher(lambda: read_launch(sc.env.store()))
    assert isinstance(relaunch, Launch)
    resumed = sc.wait_status("a batch of the relaunched driver", lambda s: s.epoch > killed.epoch
                             and s.batch_id is not None and s.state is JobState.RUNNING, WAIT)

    # (a) The driver died with its launcher, its supervisor too: neither wrote a line after the loss.
    assert lost.active and topo["launcher"].pids() == [], "a process survived the host's loss"
    first_lines = launch_lines("first launch", first_launch)
    assert first_lines.lines and max(t for t, _ in first_lines.lines) <= t_dead, first_lines.lines[-5:]
    assert not first_lines.containing("RESTARTING") and not first_lines.containing("restarting the driver")
    noticed = _noticed(out)
    times["health watch noticed, s after the loss"] = round(noticed - t_kill, 1) if noticed else None
    # (b) Exactly one launch after the loss, by run 2's restart, on launcher-2, from the latest state.
    assert out.count(" 2/3 starting ") == 1, out[-6000:]  # the restart's one launch, in the task's log
    found = sc.in_launcher(lambda: read_operation(sc.env.store()))  # the restart: an operation, acted on detached
    assert found is not None and found.operation.key.startswith(f"airflow:{DAG}.restart run "), found
    assert relaunch.launched_by.startswith(f"restart {found.operation.id} step "), relaunch
    assert relaunch.host == topo["launcher-2"].hostname, relaunch
    assert relaunch.launch_id != first_launch.launch_id and str(relaunch.restore) == "latest-state", relaunch
    # The watch judged by heartbeats alone: the supervisor's process is on a host it cannot look into.
    lost_supervisor = (f"its supervisor (pid {first_launch.pid} on {topo['launcher'].hostname}, launch "
                       f"{first_launch.launch_id}) is gone: no heartbeat for ")
    assert f"job {sc.env.job}: expected a heartbeat every 5 s, found none for " in out, out[-6000:]
    assert lost_supervisor in out, out[-6000:]
    new = sc.in_launcher(deployment_keys, sc) - deployments
    assert new == {f"{DEPLOYMENTS}{resumed.epoch:010d}.json"}, new
    assert resumed.epoch == killed.epoch + 1 and resumed.host == topo["launcher-2"].hostname, resumed
    start = sc.in_launcher(lambda: read_start(sc.env.store(), resumed.epoch))
    assert start is not None and start.launch_id == relaunch.launch_id, start
    times["relaunched, s after the loss"] = round(relaunch.launched_at - t_kill, 1)
    times["relaunch restored"] = f"{start.action}: {start.reason}"
    relaunched = launch_lines("relaunch", relaunch)
    restored = [int(m[1]) for _, m in relaunched.matching(RESTORED)]
    batches = [(t, int(m[2])) for t, m in relaunched.matching(COMPLETED) if int(m[1]) == resumed.epoch]
    assert len(restored) == 1 and batches and batches[0][1] == restored[0] + 1, (restored, batches[:3])
    times["restored batch; the old driver's last"] = [restored[0], killed.batch_id]
    if hc is not None:  # finding 12: the master kept the lost driver's application; the new driver had it killed
        released = [(t, line) for t, line in relaunched.lines if "killed it so that this driver gets them" in line]
        assert len(released) == 1 and f"application {killed.app_id} of epoch {killed.epoch} " in released[0][1], \
            relaunched.lines[-40:]
        times["lost application killed, s after the loss"] = round(released[0][0] - t_kill, 1)
        active = [a["id"] for a in hc.state().get("activeapps", [])]
        assert killed.app_id not in active and resumed.app_id in active, (active, killed.app_id, resumed.app_id)
    times["first batch of the relaunched driver, s after the loss"] = round(batches[0][0] - t_kill, 1)

    # (c) Exact: the rest of the feed, everything consumed, a stop with a savepoint, the sink counted.
    feed.finish()
    final = sc.wait_status(f"all {feed.records} records consumed", lambda s: sc.consumed(s) == feed.records
                           and s.state is JobState.RUNNING, WAIT)
    assert final.epoch == resumed.epoch, final
    times["ids"], times["records"] = feed.next_id, feed.records
    ack = sc.in_launcher(sc.env.request, RequestAction.STOP, final.epoch)
    assert ack.outcome is Outcome.COMPLETED, ack
    ended = _ended(sc, relaunch)
    times["relaunch ended"] = f"{ended.ending} (exit {ended.exit_code})"
    assert (ended.ending, ended.exit_code) == ("stopped", 0), ended
    rows = count_committed(sc, feed)
    first_lines, second_lines = launch_lines("first launch", first_launch), launch_lines("relaunch", relaunch)
    twice: list[tuple[str, str, str]] = []
    if isinstance(sc.sink, KafkaSink):
        # A (batch, partition) committed by both drivers (the last-attempt view hides it): count the commits.
        commits = Counter((m[1], m[2], m[3]) for lines in (first_lines, second_lines)
                          for _, m in lines.matching(TASK_COMMIT))
        twice = sorted(k for k, n in commits.items() if n > 1)
        times["(batch, partition) committed by two transactions"] = len(twice)
    assert sorted(rows) == expected_rows(feed.next_id), json.dumps(times)
    assert not twice, twice
    times["uncommitted"] = sc.in_launcher(sc.sink.check_nothing_uncommitted)
    times["lost / duplicated"] = [times["missing ids"], times["duplicated ids"]]
    return


def deployment_keys(sc: Scenario) -> set[str]:
    return {o.key for o in sc.env.store().storage.list(DEPLOYMENTS) if o.key.endswith(".json")}


#: The time at the start of an Airflow log line (UTC).
_AIRFLOW_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z ")


def _noticed(out: str) -> float | None:
    """When run 2's health watch said the job is unhealthy (its trigger's log line's own time)."""
    for line in out.splitlines():
        if "expected a heartbeat every" in line and (match := _AIRFLOW_TIME.match(line)):
            return datetime.fromisoformat(match[1] + "+00:00").timestamp()
    return None


def launch_lines(name: str, launch: Launch) -> Lines:
    """The lines of a launch's log (its supervisor's, spark-submit's and the driver's, on its host's CKPT_HOME: the
    hosts share this machine's disk), timed by their log records."""
    assert launch.log_file is not None, launch
    return Lines.read(name, Path(launch.log_file))


def _ended(sc: Scenario, launch: Launch) -> Launch:
    """spec/last.json once the relaunch's supervisor recorded how it ended (the stop ends it)."""
    deadline = time.monotonic() + WAIT
    while True:
        last = sc.in_launcher(lambda: read_launch(sc.env.store()))
        if last is not None and last.launch_id == launch.launch_id and last.ended_at is not None:
            return last  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"the relaunch did not end within {WAIT:.0f} s: {last}"
        time.sleep(0.5)


@pytest.mark.timeout(120)
def test_a_relaunch_on_another_host_with_the_first_hosts_driver_address_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    """Finding 11: a deployment whose Spark settings name the first launcher's address, relaunched on the second
    (what the keep-alive DAG's restart did when the connection held ``spark.driver.bindAddress``), is refused before
    the launch with what to do, instead of a driver that fails to bind until the restart strategy gives up."""
    store = tmp_path / "store"
    with hosts.Topology(["launcher", "launcher-2"]) as topo:
        first = topo["launcher"].address
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(EO_JOB), "--job", "relaunched",
                "--store", store.as_uri(), "--checkpoint", str(tmp_path / "checkpoint"), "--master", "local[2]",
                "--conf", f"spark.driver.bindAddress={first}", "--supervise"]
        proc = topo["launcher-2"].popen(argv, own_hostname=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env={**os.environ, "CKPT_HOME": str(tmp_path / "home")})
        out = proc.communicate(timeout=90)[0].decode()
    assert proc.returncode == EXIT_CONFIG, out
    assert (f"--conf spark.driver.bindAddress={first}: in client mode the driver runs on this host "
            f"(ckh-launcher-2) and binds that address, but it is not an address of this host") in out, out
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("*.log")), "something was launched"
    assert not list(store.rglob("*.json")), "something was recorded"
