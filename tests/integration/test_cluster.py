"""Jobs on a real Spark standalone cluster on 127.0.0.1: a master and two workers (embedded/sparkcluster.py)
whose own python3 has nothing installed, so every job here runs only because its Python was shipped
(launcher/pyenv.py). Executors, a worker, the master and the driver are killed under a running job; its
savepoints move between the cluster and local mode; bad input is refused before anything is written.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster
from airflow_ckpt_provider.examples._orders import read_totals
from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG, EXIT_STOPPED
from tests.conftest import TEST_DRIVER_JVM
from tests.integration.test_embedded import _listening
from tests.integration.test_restore_check import EXAMPLES, expected_totals, produce_orders, store_contents
from tests.support.exactlyonce import EO_JOB, MAX_OFFSETS, WAIT, Feeder, FilesSink, expected_rows, wait_for
from tests.support.runtimejob import JobEnv, Run, kill_driver, produce

pytestmark = pytest.mark.integration

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
EXECUTOR_KILLS_FULL = 3  # executor kills in a row with --full (one in the default suite)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSparkCluster]:
    # the drivers' JVM options on every JVM of the cluster too: its daemons and executors live minutes at most here
    with EmbeddedSparkCluster(workdir=tmp_path_factory.mktemp("spark-cluster"), java_opts=TEST_DRIVER_JVM) as started:
        yield started


def test_master_whose_port_another_process_took_meanwhile_starts_again_on_fresh_ports(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cluster = EmbeddedSparkCluster(workers=0, workdir=tmp_path / "spark", java_opts=TEST_DRIVER_JVM)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: the master cannot bind it
        port = taken.getsockname()[1]
        cluster.master.port = port  # as if picked free, then another process bound it before the master did
        with cluster, caplog.at_level("WARNING"):
            assert cluster.master.port != port
            assert cluster.state()["status"] == "ALIVE"
            assert cluster.master_url == f"spark://127.0.0.1:{cluster.master.port}"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"spark-master failed to start on ports {port} (UI " in warnings[0]
    assert "BindException" in (tmp_path / "spark" / "master" / "spark-master.log").read_text()


def on_cluster(env: JobEnv, cluster: EmbeddedSparkCluster, name: str, checkpoint: Path, *args: str,
               **kwargs: object) -> Run:
    return env.run(name, checkpoint, *args, master=cluster.master_url, conf=cluster.job_conf(),
                   **kwargs)  # type: ignore[arg-type]  # the keywords of JobEnv.run, passed through


class EoJob:
    """The exactly-once proof's job (tests/jobs/eo_job.py) into the ckpt-files sink on S3, fed by ``feeder``."""

    def __init__(self, env: JobEnv, s3: S3Options, runs: list[Run]) -> None:
        self.env = env
        self.sink = FilesSink(f"s3://{env.bucket}/eo-out", s3)
        self.feeder = Feeder(env)
        self.runs = runs

    def start(self, name: str, checkpoint: Path, *args: str, cluster: EmbeddedSparkCluster | None) -> Run:
        common = ("--supervise", "--restart-strategy", "fixed-delay", "--restart-attempts", "5",
                  "--restart-delay", "0.5", "--poll", "1", *args)
        kwargs: dict[str, object] = {"max_offsets": MAX_OFFSETS, "job_file": EO_JOB, "extra_env": self.sink.env()}
        run = (on_cluster(self.env, cluster, name, checkpoint, *common, **kwargs) if cluster else
               self.env.run(name, checkpoint, *common, **kwargs))  # type: ignore[arg-type]  # JobEnv.run's keywords
        self.runs.append(run)
        return run

    def ids(self) -> int:
        return len({row[0] for row in self.sink.committed()})

    def feed_and_wait(self, run: Run, what: str) -> None:
        """Feed a chunk and wait until every id fed so far is in the sink's committed output."""
        self.feeder.feed()
        want = self.feeder.next_id
        wait_for(f"{want} ids committed {what}", lambda: self.ids() >= want, WAIT, run)

    def running(self, run: Run, epoch_above: int = 0) -> JobStatus:
        return self.env.wait_status(f"a running driver above epoch {epoch_above}",
                                    lambda s: s.state is JobState.RUNNING and s.epoch > epoch_above, WAIT, run)

    def drain_and_stop(self, run: Run) -> str:
        """Every record consumed, then stop-with-savepoint: the savepoint's id."""
        self.feeder.finish()
        total = self.feeder.records
        final = self.env.wait_status(f"all {total} records consumed",
                                     lambda s: self.env.consumed(s) == total and s.state is JobState.RUNNING,
                                     WAIT, run)
        ack = self.env.request(RequestAction.STOP, final.epoch)
        assert ack.outcome is Outcome.COMPLETED and ack.snapshot_id, ack
        assert run.wait(WAIT) == EXIT_STOPPED, run.tail()
        return ack.snapshot_id

    def assert_exactly_once(self) -> None:
        rows = sorted(self.sink.committed())
        assert rows == expected_rows(self.feeder.next_id), (
            f"{len(rows)} rows for {self.feeder.next_id} ids: duplicates "
            f"{len(rows) - len(set(rows))}, missing {sorted(set(expected_rows(self.feeder.next_id)) - set(rows))[:10]}")
        self.sink.check_nothing_uncommitted()


# A hang guard, not a speed check: 180-450 s on the slower 2-core VM (450 beside another test on two workers),
# too close to the suite's default 600.
@pytest.mark.timeout(1500)
def test_exactly_once_on_the_cluster_through_executor_worker_master_and_driver_kills_then_restored_in_local_mode(
        env: JobEnv, s3_options: S3Options, cluster: EmbeddedSparkCluster, runs: list[Run],
        pytestconfig: pytest.Config) -> None:
    job = EoJob(env, s3_options, runs)
    job.feeder.feed()
    run = job.start("on-cluster", env.work / "checkpoint-cluster", cluster=cluster)
    status = job.running(run)
    app = status.app_id
    assert app and app.startswith("app-"), status  # a standalone application, not local-*
    executors = cluster.wait_for_executors(app, 2)
    assert {e.worker for e in executors} == {0, 1}, executors
    # Every socket the cluster and the driver listen on (RPC, block managers, UIs) is on loopback.
    groups = {"master": cluster.master.pid, **{f"worker {w.index} and its executor": w.pid for w in cluster.workers},
              "driver": os.getpgid(status.pid or 0)}
    for name, group in groups.items():
        found = _listening(group or 0)
        assert found and {addr for _, addr, _ in found} <= LOOPBACK, (name, found)

    # kill -9 an executor while batches run; the master starts a new one (three times in a row with --full)
    for _ in range(EXECUTOR_KILLS_FULL if pytestconfig.getoption("--full", default=False) else 1):
        job.feeder.feed()
        killed = cluster.kill_executor(app)
        wait_for("a replacement executor", lambda k=killed: len(cluster.executors(app)) == 2
                 and k.pid not in {e.pid for e in cluster.executors(app)}, WAIT, run)
        job.feed_and_wait(run, f"after executor {killed.executor_id} was killed")

    cluster.kill_worker(1)  # a node lost: its executor goes with it, the job goes on with the other
    job.feed_and_wait(run, "with worker 1 dead")
    assert {e.worker for e in cluster.executors(app)} == {0}
    cluster.start_worker(1)
    wait_for("an executor on the restarted worker", lambda: {e.worker for e in cluster.executors(app)} == {0, 1},
             WAIT, run)

    cluster.kill_master()  # running work continues: the driver talks to its executors directly
    job.feed_and_wait(run, "with the master dead")
    cluster.start_master()  # recovers the application and the workers from its recovery directory
    wait_for("the restarted master to know the application again",
             lambda: app in {a["id"] for a in cluster.state().get("activeapps", [])}, WAIT, run)
    job.feed_and_wait(run, "after the master came back")

    driver = job.env.status()
    assert driver is not None and driver.app_id == app and driver.epoch == status.epoch, driver
    kill_driver(driver)  # the supervisor starts a new driver: a new application on the recovered master
    job.feeder.feed()
    restarted = job.running(run, epoch_above=driver.epoch)
    assert restarted.app_id and restarted.app_id != app, restarted
    job.feed_and_wait(run, "after the driver was killed")
    savepoint = job.drain_and_stop(run)
    job.assert_exactly_once()

    # The savepoint restored in local mode, elsewhere (a new live checkpoint): the same output, exactly.
    job.feeder.feed()
    local = job.start("local", env.work / "checkpoint-local", "--restore", savepoint, cluster=None)
    restored = job.running(local, epoch_above=restarted.epoch)
    assert restored.app_id and restored.app_id.startswith("local-"), restored
    job.feed_and_wait(local, "in local mode")
    job.drain_and_stop(local)
    job.assert_exactly_once()


@pytest.mark.full(proven_by="test_exactly_once_on_the_cluster_... (a snapshot moved between the cluster and local "
                            "mode, exact) and integration/test_restore_check.py (the restore check against the "
                            "running job's state); scripts/demo --cluster upgrades on the cluster")
def test_an_upgrade_on_the_cluster_from_a_local_savepoint_is_checked_there_first_and_keeps_the_state(
        env: JobEnv, cluster: EmbeddedSparkCluster, runs: list[Run]) -> None:
    """orders_v1 in local mode stops with a savepoint; on the cluster the restore check accepts v2 without touching
    the store (test_restore_check.py proves its refusals); v2 then restores the savepoint there: totals exact."""
    orders = {"ORDERS_BOOTSTRAP": env.kafka.bootstrap_servers, "ORDERS_TOPIC": env.topic, "ORDERS_OUT": str(env.out),
              "ORDERS_GROUP": f"ckpt-{env.job}", "ORDERS_MAX_PER_BATCH": "100"}
    produce_orders(env.kafka.bootstrap_servers, env.topic, 0, 300)
    runs.append(v1 := env.run("v1-local", env.work / "checkpoint-local", job_file=EXAMPLES / "orders_v1.py",
                              extra_env=orders))
    status = env.wait_status("300 orders in local mode", lambda s: env.consumed(s) == 300, WAIT, v1)
    stop = env.request(RequestAction.STOP, status.epoch)
    assert stop.outcome is Outcome.COMPLETED and stop.snapshot_id, stop
    assert v1.wait(WAIT) == EXIT_STOPPED, v1.tail()

    before = store_contents(env.store())
    checkpoint = env.work / "checkpoint-cluster"
    runs.append(check := on_cluster(env, cluster, "check-v2", checkpoint, "--check-restore", "--restore",
                                    stop.snapshot_id, job_file=EXAMPLES / "orders_v2.py", extra_env=orders))
    assert check.wait(WAIT) == 0, check.tail()
    assert "can restore savepoint" in check.log.read_text(errors="replace"), check.tail()
    assert store_contents(env.store()) == before  # the check changed nothing

    produce_orders(env.kafka.bootstrap_servers, env.topic, 300, 300)
    runs.append(v2 := on_cluster(env, cluster, "v2-cluster", checkpoint, "--restore", stop.snapshot_id,
                                 job_file=EXAMPLES / "orders_v2.py", extra_env=orders))
    status = env.wait_status("600 orders on the cluster", lambda s: env.consumed(s) == 600, WAIT, v2)
    assert status.app_id and status.app_id.startswith("app-") and status.restored_from == stop.snapshot_id, status
    assert env.request(RequestAction.STOP, status.epoch).outcome is Outcome.COMPLETED
    assert v2.wait(WAIT) == EXIT_STOPPED, v2.tail()
    assert read_totals(env.out) == expected_totals(600)  # v1's state went on in v2: every order once


def test_without_shipping_a_job_on_nodes_lacking_its_modules_fails_once_naming_the_module_and_the_fix(
        env: JobEnv, cluster: EmbeddedSparkCluster, runs: list[Run]) -> None:
    """The driver's host has the modules (python3 on its PATH is this venv's), the nodes' python3 has none."""
    env.out.mkdir(parents=True)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    run = on_cluster(env, cluster, "unshipped", env.work / "checkpoint", "--python-env", "none", "--supervise",
                     "--conf", "spark.task.maxFailures=1", extra_env={"PATH": path})  # fail at the first task
    runs.append(run)
    produce(env.kafka.bootstrap_servers, env.topic, 0, 50)
    assert run.wait(WAIT) == EXIT_CONFIG, run.tail()
    text = run.log.read_text(errors="replace")
    assert "No module named 'pyarrow'" in text or "No module named 'confluent_kafka'" in text, run.tail()
    assert len(re.findall(r"driver pid \d+ started", text)) == 1, run.tail()  # one driver, no restart loop
    assert "ship the job's Python environment (ckpt run --python-env ship" in text, run.tail()
    assert "0 restarts" in text, run.tail()


def test_bad_cluster_input_is_refused_before_any_lease_or_write(env: JobEnv, cluster: EmbeddedSparkCluster,
                                                               runs: list[Run]) -> None:
    """An unreachable master, a typo in the master URL, an executor larger than any worker: exit 2, a clear
    message, and the job store stays empty."""
    cases = {
        "unreachable": (("--master", f"spark://127.0.0.1:{_closed_port()}"), "is unreachable"),
        "typo": (("--master", cluster.master_url.replace("spark://", "sprak://")), "unknown Spark master"),
        "too-big": (("--conf", "spark.executor.memory=4g", "--executor-timeout", "8"), "no executor registered"),
    }
    for name, (args, message) in cases.items():
        run = on_cluster(env, cluster, name, env.work / f"checkpoint-{name}", *args)
        runs.append(run)
        assert run.wait(WAIT) == EXIT_CONFIG, run.tail()
        assert message in run.log.read_text(errors="replace"), (name, run.tail())
    assert list(env.store().storage.list("")) == []  # no lease, no status, no snapshot


def _closed_port() -> int:
    from airflow_ckpt_provider.embedded.process import free_port

    return free_port()  # nothing listens there once the probe socket closed
