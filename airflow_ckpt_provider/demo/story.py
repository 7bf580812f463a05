"""The demo: a PySpark streaming job operated from Airflow like a Flink job, on the embedded default.

Starts SeaweedFS (S3) and tansu (Kafka) on 127.0.0.1, a throwaway Airflow home (sqlite), produces
orders, and runs the example DAGs in dags/ with ``airflow dags test`` (deferred tasks run in-process).
With ``--cluster`` the jobs run on a Spark standalone cluster on 127.0.0.1 (a master and two workers whose
own Python has none of the job's modules: the executors' Python is shipped):

1. ``ckpt_keep_alive``: submit the example job (orders_v1.py) supervised on local Spark (on the cluster:
   kill -9 an executor first, and see the same driver go on); while its health watch runs, kill -9 the
   driver; then say, from the job store's records, who restarted it (status.json's RESTARTING,
   deployments/<epoch>.json, spec/last.json), from which batch, in how long, and what the DAG did;
2. ``ckpt_savepoint_restore``: a savepoint on demand, and the job restored from it;
3. ``ckpt_upgrade_job``: upgrade to orders_v2.py keeping state (compatibility check, stop with
   savepoint, start v2 from it, verify);
4. stop with a final savepoint; the totals equal the produced stream exactly; where the snapshots are.

``World`` and ``AirflowHome`` (world.py) are also what the system tests (tests/system) drive.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.control import RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.snapshots import list_snapshots
from airflow_ckpt_provider.demo.world import CUSTOMERS, EXAMPLES, TIMEOUT, AirflowHome, RestartSeen, World, say
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster


def _expect_success(done: subprocess.CompletedProcess[str], dag_id: str) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"DAG {dag_id} failed (exit {done.returncode}); last lines:\n{done.stdout[-4000:]}")
    say(f"DAG {dag_id}: success")


def _kill_when_running(world: World, seen: list[RestartSeen],
                       cluster: EmbeddedSparkCluster | None) -> threading.Thread:
    """In the background: on a cluster, kill -9 an executor first and show the job going on; once the driver has
    committed two batches, kill -9 it, produce more orders meanwhile, and follow the job store until a driver of a
    newer epoch commits a batch (``seen``: what the records say)."""

    def run() -> None:
        if cluster is not None:
            _on_the_cluster(world, cluster)
        status = world.wait("two batches", lambda s: s.state == "RUNNING" and (s.batch_id or 0) >= 2)
        world.kill_driver(status)
        killed_at = time.time()
        say(f"kill -9 of the driver (pid {status.pid}, epoch {status.epoch}) at batch {status.batch_id}")
        producer = threading.Thread(target=world.produce, args=(2000,), name="demo-producer", daemon=True)
        producer.start()
        seen.append(world.watch_restart(status, killed_at))
        producer.join(TIMEOUT)
        say(f"produced 2000 more orders (total {world.produced})")

    thread = threading.Thread(target=run, name="demo-killer", daemon=True)
    thread.start()
    return thread


def _restart_task(output: str) -> str:
    """What the DAG's restart task did, from the run's log (the operator's own lines, or Airflow's skip)."""
    lines = [line for line in output.splitlines() if "RestartStreamingJobOperator" in line]
    if any(": launched " in line for line in lines):
        return "the DAG's restart task launched the job"
    if any("not launching" in line for line in lines):
        return "the DAG's restart task ran and left the restart to the supervisor (it launched nothing)"
    if "Skipping due to soft_fail" in output:
        return ("the DAG's restart task was skipped: its health watch saw no unhealthy job (a restart by a live "
                "supervisor is no dead job) until its watch ended")
    return "the DAG's restart task did not run"


def _on_the_cluster(world: World, cluster: EmbeddedSparkCluster) -> None:
    """Where the running job's executors are, then kill -9 one of them and show the job going on."""
    status = world.wait("a running driver", lambda s: s.state == "RUNNING" and (s.batch_id or 0) >= 1)
    app = status.app_id or ""
    running = cluster.wait_for_executors(app, 1)
    say(f"on the cluster: application {app}, executors " +
        ", ".join(f"{e.executor_id} (pid {e.pid}, worker {e.worker})" for e in running))
    killed = cluster.kill_executor(app)
    batch = status.batch_id or 0
    say(f"kill -9 of executor {killed.executor_id} (pid {killed.pid}) on worker {killed.worker} at batch {batch}")
    world.produce(500)
    after = world.wait("a batch after the executor kill", lambda s: (s.batch_id or 0) > batch + 1)
    now = cluster.executors(app)
    say(f"the same driver (epoch {after.epoch}, pid {after.pid}) went on to batch {after.batch_id}; executors now "
        + ", ".join(f"{e.executor_id} (worker {e.worker})" for e in now) + " (the master replaced the lost one)")


def scenario(world: World, home: AirflowHome, cluster: EmbeddedSparkCluster | None = None) -> dict[str, Any]:
    world.produce(3000)
    say(f"produced 3000 orders to topic {world.topic}")

    say("1. DAG ckpt_keep_alive: submit the job supervised, watch its health; the driver gets killed meanwhile"
        + (" (an executor first)" if cluster else ""))
    seen: list[RestartSeen] = []
    killer = _kill_when_running(world, seen, cluster)
    done = home.dags_test("ckpt_keep_alive")
    _expect_success(done, "ckpt_keep_alive")
    killer.join(TIMEOUT)
    if not seen:
        raise RuntimeError("no restart seen: the driver was not killed, or no newer driver committed a batch in time")
    for line in [*seen[0].lines(), _restart_task(done.stdout)]:
        say(line)

    say("2. DAG ckpt_savepoint_restore: a savepoint on demand, then the job restored from it")
    _expect_success(home.dags_test("ckpt_savepoint_restore", {"job": world.job}), "ckpt_savepoint_restore")
    status = world.wait("the restored driver", lambda s: s.state == "RUNNING")
    say(f"running again: epoch {status.epoch}, restored from {status.restored_from}")

    say("3. DAG ckpt_upgrade_job: upgrade to orders_v2.py (savepoint mode), state kept; orders keep arriving")
    conf = {"job": world.job, "job_file": str(EXAMPLES / "orders_v2.py"), "code_version": "v2",
            "upgrade_mode": "savepoint", "verify_batches": 2}
    with world.flowing():
        _expect_success(home.dags_test("ckpt_upgrade_job", conf), "ckpt_upgrade_job")
    say(f"orders produced while upgrading: total {world.produced}")
    status = world.wait_all_consumed()
    say(f"v2 runs: epoch {status.epoch}, code {status.code_version}, batch {status.batch_id}")
    return {"upgraded_epoch": status.epoch, "code_version": status.code_version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    parser.add_argument("--cluster", action="store_true",
                        help="run the jobs on a Spark standalone cluster on 127.0.0.1 (a master, two workers)")
    parser.add_argument("--watch-seconds", type=float, default=45.0,
                        help="how long the keep-alive DAG watches the job's health (default 45)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    started = time.monotonic()
    world = None
    try:
        with EmbeddedServices() as services, contextlib.ExitStack() as stack:
            say(f"SeaweedFS at {services.s3.endpoint_url}, tansu at {services.kafka.bootstrap_servers}")
            cluster = stack.enter_context(EmbeddedSparkCluster(workdir=work / "spark")) if args.cluster else None
            if cluster is not None:
                say(f"Spark standalone master {cluster.master_url} (UI {cluster.master.ui_url}), workers "
                    + ", ".join(f"{w.index} (UI {w.ui_url})" for w in cluster.workers)
                    + f"; the workers' python3 ({cluster.node_python}) has no pandas, pyarrow, confluent-kafka "
                    "or this provider")
            world = World(services, work)
            home = AirflowHome(world, work / "airflow", watch_seconds=args.watch_seconds,
                               master=cluster.master_url if cluster else "local[2]",
                               conf=cluster.job_conf(cores=1) if cluster else None)  # a core for the check
            home.migrate()
            say(f"Airflow home {home.path} (logs of each DAG run there)")
            try:
                result = scenario(world, home, cluster)
                status = world.status()
                assert status is not None
                ack = wait_ack(world.store, submit_request(world.store, RequestAction.STOP, status.epoch).id, TIMEOUT)
                exact = world.totals() == world.expected()
                from airflow_ckpt_provider.kafka.lag import consumer_group_lag

                lag = consumer_group_lag(services.kafka.bootstrap_servers, world.group, [world.topic]).total_lag
                snapshots = list_snapshots(world.store)
            finally:
                world.stop_everything()
        savepoints = [m for m in snapshots if m.kind.value == "savepoint"]
        print("\n=== airflow-ckpt-provider demo (through Airflow) ===")
        print(f"orders produced: {world.produced}; customers: {CUSTOMERS}")
        print(f"upgraded to code {result['code_version']} (epoch {result['upgraded_epoch']}); "
              f"stopped with final savepoint {ack.snapshot_id if ack else '-'}")
        print(f"snapshots in the job store {world.store.url}: {len(snapshots)} ({len(savepoints)} savepoints)")
        for m in savepoints:
            print(f"  {m.kind.value:10} batch {m.batch_id:>4}  {world.store.snapshot_uri(m.snapshot_id)}")
        print(f"consumer group {world.group} lag after the last batch: {lag}")
        print(f"final state equals the produced stream: {'YES' if exact else 'NO'}")
        print(f"total {time.monotonic() - started:.1f} s")
        return 0 if exact and lag == 0 and ack is not None else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

