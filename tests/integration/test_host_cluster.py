"""Issue 41: a Spark standalone cluster on the test hosts (tests/support/sparkhosts.py), each node bound to its
host's address; scenario 3: a worker host killed, then the master cut from the workers for 30 s, under a stateful
exactly-once job submitted in client mode from the driver host (docs/reliability.md, scenario 3)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.embedded.process import port_accepts
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster
from airflow_ckpt_provider.runtime.exitcodes import EXIT_STOPPED
from tests.conftest import TEST_DRIVER_JVM
from tests.support import hosts
from tests.support.exactlyonce import EO_JOB, expected_rows
from tests.support.hostjobs import (
    COMPLETED,
    MAX_OFFSETS,
    Feed,
    Scenario,
    Stamped,
    check_left_behind,
    count_committed,
    ground,
)
from tests.support.hosts import Host, Topology
from tests.support.runtimejob import SPARK_CONF, snapshot_args
from tests.support.sparkhosts import (
    MASTER,
    WORKERS,
    HostCluster,
    listening,
    spark_log_lines,
    start_spark_cluster,
    wait_for,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

CUT = 30.0  # seconds the master is cut from both workers
FEEDS = 480  # one a second at most (hostjobs.Feed's 150 would end before the cut on a slow start): bounded anyway
WAIT = 240.0  # any one condition of the scenario (a driver's start on the loaded cluster included)
#: A batch job on the cluster: JVM-only work (no Python worker on the nodes' bare Python), both executors waited for.
SMOKE = """
import sys
from pyspark.sql import SparkSession
master, address = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master(master).appName("hosts-smoke")
         .config("spark.driver.host", address).config("spark.driver.bindAddress", address)
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").config("spark.cores.max", "2")
         .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
         .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "90s").getOrCreate())
total = spark.range(0, 1000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
print("RESULT", total, spark.sparkContext.applicationId, " ".join(sorted(str(i.host()) for i in infos)), flush=True)
spark.stop()
"""


def test_nodes_given_an_address_bind_and_advertise_it_and_the_default_stays_loopback(tmp_path: Path) -> None:
    cluster = EmbeddedSparkCluster(master_host="10.213.41.20", worker_hosts=["10.213.41.21", "10.213.41.22"],
                                   workdir=tmp_path / "hosts")
    assert len(cluster.workers) == 2
    assert cluster.master_url == f"spark://10.213.41.20:{cluster.master.port}"
    assert cluster.master.ui_url == f"http://10.213.41.20:{cluster.master.ui_port}"
    args, env = cluster.master._command()
    assert args[args.index("--host") + 1] == env["SPARK_LOCAL_IP"] == "10.213.41.20"
    for worker, address in zip(cluster.workers, ["10.213.41.21", "10.213.41.22"], strict=True):
        args, env = worker._command()
        assert args[args.index("--host") + 1] == env["SPARK_LOCAL_IP"] == address  # its executors bind it too
        assert cluster.master_url in args and worker.ui_url.startswith(f"http://{address}:")
    loopback = EmbeddedSparkCluster(workdir=tmp_path / "loopback")
    assert [loopback.master.host, *(w.host for w in loopback.workers)] == ["127.0.0.1"] * 3
    assert loopback.master_url.startswith("spark://127.0.0.1:")
    with pytest.raises(ValueError, match="to match the 2 worker_hosts"):
        EmbeddedSparkCluster(workers=3, worker_hosts=["10.213.41.21", "10.213.41.22"], workdir=tmp_path / "bad")


@pytest.mark.timeout(240)
def test_cluster_on_the_hosts_binds_each_node_to_its_host_and_runs_a_batch_job_from_the_driver_host(
        tmp_path: Path) -> None:
    pids: list[int] = []
    with Topology([MASTER, *WORKERS, "driver"]) as topo:
        hc: HostCluster | None = None
        try:
            started = time.monotonic()
            hc = start_spark_cluster(topo, tmp_path / "spark", java_opts=TEST_DRIVER_JVM)
            cluster_up = time.monotonic() - started
            master, driver = topo[MASTER], topo["driver"]
            assert hc.cluster.master_url.startswith(f"spark://{master.address}:"), hc.cluster.master_url
            # Each worker registered from its own host's address, and every node listens on that address only.
            assert hc.workers_seen() == {f"{topo[r].address}:{w.port}": "ALIVE"
                                         for r, w in zip(WORKERS, hc.cluster.workers, strict=True)}
            for role in (MASTER, *WORKERS):
                assert {addr for addr, _ in listening(topo[role])} == {topo[role].address}, (role,
                                                                                             listening(topo[role]))
            done = driver.run([sys.executable, "-c", SMOKE, hc.cluster.master_url, driver.address], timeout=150,
                              check=False, env=_driver_env(driver))
            job_took = time.monotonic() - started - cluster_up
            result = [line.split() for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            assert done.returncode == 0 and result, done.stdout[-3000:] + done.stderr[-3000:]
            _, total, app, *executor_hosts = result[0]
            assert int(total) == sum(range(1000))
            # the executors ran on the workers' hosts (the driver's own address is in the list too)
            assert sorted(executor_hosts) == sorted([driver.address, *(topo[r].address for r in WORKERS)]), result
            finished = {a["id"]: a for a in hc.state().get("completedapps", [])}
            assert app in finished, hc.state()
            print(f"cluster on the hosts up in {cluster_up:.1f} s; the batch job took {job_took:.1f} s")
        finally:
            pids = [p for role in topo.hosts for p in topo[role].pids()]
            if hc is not None:
                hc.close()
    check_left_behind(topo, pids)


def _driver_env(host: Host, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    return {**env, "SPARK_LOCAL_IP": host.address, **(extra or {})}


# -- scenario 3 -------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(900)
@pytest.mark.full(
    proven_by="integration/test_cluster.py::test_exactly_once_on_the_cluster_through_executor_worker_master_and_"
              "driver_kills_then_restored_in_local_mode (a worker and the master killed under the job on the "
              "loopback cluster, exact); test_host_cluster.py::test_cluster_on_the_hosts_binds_each_node_to_its_"
              "host_and_runs_a_batch_job_from_the_driver_host (the cluster on the hosts)")
@pytest.mark.parametrize("sink_name", ["files", "ledger", "kafka"])
def test_worker_host_killed_then_master_cut_from_the_workers_the_job_goes_on_exactly_once(
        sink_name: str, tmp_path: Path) -> None:
    """tests/jobs/eo_job.py (3-partition tansu topic on ``kafka``; the ckpt-files sink on the ``store``'s S3, the ledger
    on PostgreSQL on ``db``, or ckpt-kafka) under
    ``ckpt run --supervise`` on ``driver``, client mode on the cluster (an executor on each worker). The
    spark-worker-1 host dies silently (link down, then kill -9) while its executor runs a task; once the job has
    committed a batch without it, the host comes back empty and its worker is started again; then the master is cut
    from both workers for 30 s. Claims: the same driver and query go on (no restart), every input id is once in the
    sink's committed view after a stop with a savepoint, and nothing is left behind. The times (who noticed, the
    next committed batch) are printed and written to report.json."""
    pids: list[int] = []
    roles = ["store", "kafka", MASTER, *WORKERS, "launcher", "driver"] + (["db"] if sink_name == "ledger" else [])
    with Topology(roles) as topo:
        hc: HostCluster | None = None
        sc: Scenario | None = None
        feed: Feed | None = None
        try:
            sc = ground(topo, sink_name, tmp_path, "c3")
            hc = start_spark_cluster(topo, tmp_path / "spark", java_opts=TEST_DRIVER_JVM)
            feed = LongFeed(sc.clients, sc.env.kafka.bootstrap_servers, sc.env.topic)
            _scenario(sc, hc, feed)
        finally:
            if feed is not None:
                feed.halt()
            if sc is not None:
                for driver in sc.drivers:
                    driver.stop()
                (tmp_path / "report.json").write_text(json.dumps(sc.times, indent=1, default=str))
                print(f"scenario 3 ({sink_name}): {json.dumps(sc.times, indent=1, default=str)}")
            pids = [p for role in topo.hosts for p in topo[role].pids()]
            if hc is not None:
                hc.close()
    check_left_behind(topo, pids)


class LongFeed(Feed):
    """hostjobs.Feed (10 new ids a second plus the previous second's again) for up to ``FEEDS`` seconds: records
    keep arriving through every phase of the scenario, so that batches keep running."""

    def _loop(self) -> None:
        try:
            for _ in range(FEEDS):
                if self._stop.wait(1.0):
                    return
                self.feed()
        except BaseException as err:  # reported by finish()
            self.error = err


def start_driver(sc: Scenario, hc: HostCluster, name: str, host: Host, *args: str) -> Stamped:
    """``ckpt run --supervise`` of tests/jobs/eo_job.py on ``host``, in client mode on the cluster, Spark bound to the
    host's address; the executors' Python shipped (``--python-env auto``: the workers' own python3 has nothing
    installed, docs/cluster.md)."""
    env = sc.env.env(MAX_OFFSETS, sc.sink.env(), local=False)
    env.update(SPARK_LOCAL_IP=host.address, CKPT_HOME=str(sc.work / f"home-{name}"))
    argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(EO_JOB), "--job", sc.env.job,
            "--store", sc.env.store_url, "--checkpoint", str(sc.work / f"checkpoint-{name}"),
            "--master", hc.cluster.master_url, "-v", "--supervise", "--restart-strategy", "fixed-delay",
            "--restart-attempts", "5", "--restart-delay", "0.5", *snapshot_args(args)]
    settings = {**sc.sink.conf(), **hc.cluster.job_conf(), "spark.driver.host": host.address,
                "spark.driver.bindAddress": host.address}
    conf = [*SPARK_CONF, *(f"{k}={v}" for k, v in settings.items())]
    for setting in conf:
        argv += ["--conf", setting]
    driver = Stamped(name, host, argv, env, sc.work / f"{name}.log")
    sc.drivers.append(driver)
    return driver


_TASK = re.compile(r"(Running|Finished) task \S+ in stage \S+ \(TID (\d+)\)")


def _tasks(cluster: EmbeddedSparkCluster, app: str, worker: int) -> tuple[list[int], list[int]]:
    """(running, finished) task ids of the executors of ``app`` that run on ``worker`` now, from their logs."""
    running: set[int] = set()
    finished: set[int] = set()
    for executor in cluster.executors(app):
        if executor.worker != worker:
            continue
        log = cluster.workers[worker].workdir / "work" / app / executor.executor_id / "stderr"
        with contextlib.suppress(OSError):
            for kind, tid in _TASK.findall(log.read_text(errors="replace")):
                (running if kind == "Running" else finished).add(int(tid))
    return sorted(running - finished), sorted(finished)


def _task_running(cluster: EmbeddedSparkCluster, app: str, worker: int, timeout: float = 60.0) -> list[int]:
    """Wait until an executor of ``app`` on ``worker`` runs a task (its log shows a task started and not finished)
    and return the task ids running; [] if none did within ``timeout`` (the kill then lands between tasks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running := _tasks(cluster, app, worker)[0]:
            return running
        time.sleep(0.02)
    return []


def _completed_after(driver: Stamped, t: float) -> list[tuple[float, int]]:
    return [(when, int(m[2])) for when, m in driver.matching(COMPLETED) if when > t]


def _look(sc: Scenario, seen: list[tuple[float, str, int | None, int, int, int | None]]) -> JobStatus | None:
    try:
        status = sc.status()
    except Exception:  # the store answers again on the next look
        return None
    if status is not None:
        seen.append((time.time(), status.state.value, status.batch_id, status.restart_count, status.epoch,
                     status.pid))
    return status


def _next_batch(sc: Scenario, driver: Stamped, after: float, what: str,
                seen: list[tuple[float, str, int | None, int, int, int | None]]) -> tuple[float, int]:
    """The first batch the driver completed after ``after``, waiting for it (status looks go to ``seen``)."""
    deadline = time.monotonic() + WAIT
    while not (found := _completed_after(driver, after)):
        assert driver.proc.poll() is None, f"the driver exited with {driver.proc.returncode}\n{driver.tail()}"
        assert time.monotonic() < deadline, f"no batch completed within {WAIT:.0f} s {what}\n{driver.tail()}"
        _look(sc, seen)
        time.sleep(0.5)
    return found[0]


def _scenario(sc: Scenario, hc: HostCluster, feed: Feed) -> None:
    topo, times, cluster = sc.topo, sc.times, hc.cluster
    seen: list[tuple[float, str, int | None, int, int, int | None]] = []
    driver = start_driver(sc, hc, "driver", topo["driver"])
    started = time.time()
    feed.start()
    before = sc.wait_status("three batches and a snapshot on the cluster",
                            lambda s: s.batch_id is not None and s.batch_id >= 3 and s.last_snapshot is not None
                            and s.state is JobState.RUNNING, WAIT, driver)
    app = before.app_id
    assert app and app.startswith("app-"), before
    executors = cluster.wait_for_executors(app, 2, timeout=WAIT)
    assert {e.worker for e in executors} == {0, 1}, executors
    times["first batch after the driver's start, s"] = round(driver.matching(COMPLETED)[0][0] - started, 1)

    # 1. The spark-worker-1 host killed while its executor runs a task: its worker and its executor with it. Its link
    # goes down first (kill_host's default), so that no packet leaves the dying host, as at a power loss
    # (docs/reliability.md, scenario 3, finding 5).
    in_flight = _task_running(cluster, app, 0)
    victim = topo[WORKERS[0]]
    t_kill = time.time()
    killed = topo.kill_host(victim)
    times["kill at"] = t_kill
    times["tasks running on worker 1's executor at the kill (TIDs)"] = in_flight
    batch_at, batch = _next_batch(sc, driver, t_kill, "after the worker host was killed", seen)
    times["first batch completed after the kill (batch, s)"] = (batch, round(batch_at - t_kill, 1))
    lost = driver.containing("Lost executor")
    times["driver: 'Lost executor' lines (s after the kill)"] = [round(t - t_kill, 1) for t, _ in lost]
    times["driver: first 'Lost executor' line"] = lost[0][1][-200:] if lost else None
    for what in ("Lost task", "FetchFailed", "Resubmitted", "Resubmitting"):
        found = [round(t - t_kill, 1) for t, _ in driver.containing(what) if t >= t_kill]
        if found:
            times[f"driver: '{what}' lines (s after the kill)"] = found[:6]
    gone = wait_for("the master to drop the killed worker",
                    lambda: spark_log_lines(cluster.master.log_path, "Removing worker", since=t_kill)
                    or spark_log_lines(cluster.master.log_path, "disassociated", since=t_kill), WAIT)
    times["master: worker removed (s after the kill, whole seconds)"] = [(round(t - t_kill), m[-160:])
                                                                         for t, m in gone[:3]]
    assert {e.worker for e in cluster.executors(app)} == {1}, cluster.executors(app)
    status = _look(sc, seen)
    times["after the kill: driver pid, epoch, restart_count"] = (status.pid, status.epoch, status.restart_count) \
        if status else None

    # The host comes back empty; its worker is started again on it and the application gets an executor there.
    killed.heal()
    t_back = time.time()
    hc.start_worker(0)
    times["worker 1 back: registered, s after the heal"] = round(time.time() - t_back, 1)
    wait_for("an executor of the job on the restarted worker", lambda: {e.worker for e in cluster.executors(app)}
             == {0, 1}, WAIT)
    times["worker 1 back: executor running, s after the heal"] = round(time.time() - t_back, 1)
    # Its first task done (the shipped Python unpacked, a Python worker started: 10-15 s here), so that the cut
    # below is measured on a warm cluster.
    wait_for("a task finished on the restarted worker's executor", lambda: _tasks(cluster, app, 0)[1], WAIT)
    times["worker 1 back: first task finished, s after the heal"] = round(time.time() - t_back, 1)

    # 2. The master cut from both workers for CUT seconds (both directions); the driver still reaches all of them.
    t_cut = time.time()
    cuts = [topo.cut(MASTER, role, seconds=CUT) for role in WORKERS]
    times["cut at"] = t_cut
    during: list[tuple[float, int]] = []
    master = topo[MASTER]
    # The cut is real: a worker host no longer reaches the master, the driver host still does.
    assert not topo[WORKERS[1]].call(port_accepts, cluster.master.port, master.address)
    assert topo["driver"].call(port_accepts, cluster.master.port, master.address)
    heartbeat_age: dict[str, float] = {}  # the longest the master went without a worker's heartbeat, s
    while any(c.active for c in cuts):
        assert time.time() - t_cut < CUT + 30, "the cuts did not heal by themselves"
        assert driver.proc.poll() is None, f"the driver exited with {driver.proc.returncode}\n{driver.tail()}"
        _look(sc, seen)
        for w in hc.state().get("workers", []):
            if w["state"] == "ALIVE":
                key = f"{w['host']}:{w['port']}"
                heartbeat_age[key] = max(heartbeat_age.get(key, 0.0), time.time() - w["lastheartbeat"] / 1000)
        time.sleep(1.0)
    t_heal = time.time()
    during = [(round(t - t_cut, 1), b) for t, b in _completed_after(driver, t_cut) if t <= t_heal]
    times["cut lasted, s"] = [round(c.healed_after or 0.0, 1) for c in cuts]
    times["master: longest time without a worker's heartbeat during the cut, s"] = {
        k: round(v, 1) for k, v in heartbeat_age.items()}
    times["batches completed during the cut (s after the cut, batch)"] = during
    master_state = hc.state()
    times["master after the heal: workers"] = {f"{w['host']}:{w['port']}": w["state"]
                                               for w in master_state.get("workers", [])}
    times["master after the heal: active apps"] = [a["id"] for a in master_state.get("activeapps", [])]
    batch_at, batch = _next_batch(sc, driver, t_heal, "after the cut healed", seen)
    times["first batch completed after the heal (batch, s)"] = (batch, round(batch_at - t_heal, 1))
    for name in ("Removing worker", "disassociated", "timed out", "Re-registering", "re-register"):
        lines = [(t, m) for t, m in spark_log_lines(cluster.master.log_path, name, since=t_cut)
                 if topo["driver"].address not in m]  # the probe's connection from the driver host above
        if lines:
            times[f"master: '{name}' (s after the cut)"] = [(round(t - t_cut), m[-160:]) for t, m in lines[:3]]
    for index, worker in enumerate(cluster.workers):
        for name in ("Connecting to master", "Master with url", "Disconnected", "re-register", "Retrying"):
            lines = spark_log_lines(worker.log_path, name, since=t_cut)
            if lines:
                times[f"worker {index}: '{name}' (s after the cut)"] = [(round(t - t_cut), m[-160:])
                                                                         for t, m in lines[:3]]

    # 3. The rest of the feed, then a stop with a savepoint; every id once in the sink's committed view.
    feed.finish()
    final = sc.wait_status(f"all {feed.records} records consumed", lambda s: sc.consumed(s) == feed.records
                           and s.state is JobState.RUNNING, WAIT, driver)
    times["ids"] = feed.next_id
    times["records"] = feed.records
    times["end: driver pid, epoch, restart_count, restarts"] = (final.pid, final.epoch, final.restart_count,
                                                               final.restarts)
    times["drivers started by the supervisor"] = len([ln for _, ln in driver.containing("started (attempt")
                                                      if "launcher.supervisor" in ln])
    times["query restarts seen"] = sorted({s[3] for s in seen})
    # The same driver and query throughout: no process restart, no query restart (a ledger transaction held open
    # through the stalled batch once ended in one: finding 13).
    assert (final.pid, final.epoch, final.restart_count) == (before.pid, before.epoch, 0), final
    times["states seen"] = sorted({s[1] for s in seen})
    batches = [t for t, _ in driver.matching(COMPLETED) if t > t_kill]
    gaps = [b - a for a, b in zip([t_kill, *batches], batches, strict=False)]
    times["longest time without a completed batch after the kill, s"] = round(max(gaps), 1) if gaps else None
    ack = sc.in_launcher(sc.env.request, RequestAction.STOP, final.epoch)
    assert ack.outcome is Outcome.COMPLETED and ack.snapshot_id, ack
    assert driver.wait(WAIT) == EXIT_STOPPED, driver.tail()

    rows = count_committed(sc, feed)
    assert sorted(rows) == expected_rows(feed.next_id), (
        f"{times['duplicated ids']} ids duplicated, {times['missing ids']} missing of {feed.next_id}")
    times["uncommitted"] = sc.in_launcher(sc.sink.check_nothing_uncommitted)
