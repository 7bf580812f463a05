"""The demo: a PySpark streaming job operated from Airflow like a Flink job, on the embedded default: keep-alive,
savepoint and restore, upgrade, stop, exact totals (``--cluster``: on a Spark standalone cluster).

Design notes: docs/embedded.md#design-notes-demostorypy."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from airflow_ckpt_provider.core.errors import CkptError
from airflow_ckpt_provider.core.records.control import RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.status import JobStatus
from airflow_ckpt_provider.core.snapshots.catalog import list_snapshots, load_manifest
from airflow_ckpt_provider.demo.keep import explore, keep_service_logs
from airflow_ckpt_provider.demo.progress import DagTestLines, elapsed_status
from airflow_ckpt_provider.demo.summary import Proof, Resumed, Summary
from airflow_ckpt_provider.demo.world import EXAMPLES, TIMEOUT, AirflowHome, RestartSeen, World, say
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster

KEEP_HINT = "run `scripts/demo --keep` to explore what it leaves running (Airflow UI, the job, its snapshots)"


@dataclass(frozen=True)
class Told:
    """What the three DAGs did, for the closing summary."""

    restart: RestartSeen
    restored: Resumed
    upgraded: Resumed
    code_version: str | None


def _run_dag(home: AirflowHome, dag_id: str, conf: dict[str, object] | None = None) -> str:
    """``airflow dags test`` of ``dag_id``, its progress lines shown as they come, indented under the step;
    RuntimeError unless the run succeeded. Its whole output."""
    picked = DagTestLines()

    def show(line: str) -> None:
        for shown in picked.feed(line):
            say(f"    {shown}")

    with elapsed_status(f"airflow dags test {dag_id}"):
        done = home.dags_test(dag_id, conf, on_line=show)
    if done.returncode != 0:
        raise RuntimeError(f"DAG {dag_id} failed (exit {done.returncode}); last lines:\n{done.stdout[-4000:]}")
    say(f"DAG {dag_id}: success")
    return done.stdout


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
    if any(" 2/3 starting " in line for line in lines):  # its restart operation's lines (launcher/upgrade.py)
        return "the DAG's restart task launched the job"
    if any("nothing to launch: the job is" in line for line in lines):
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


def _resumed(world: World, status: JobStatus) -> Resumed:
    """Which snapshot the driver of ``status`` restored, and the batch that snapshot was taken at."""
    batch = None
    if status.restored_from:
        with contextlib.suppress(CkptError):  # disposed meanwhile: the id alone still says it
            batch = load_manifest(world.store, status.restored_from).batch_id
    return Resumed(status.restored_from, batch, status.epoch, status.batch_id)


def scenario(world: World, home: AirflowHome, cluster: EmbeddedSparkCluster | None = None) -> Told:
    world.produce(3000)
    say(f"produced 3,000 orders to topic {world.topic}")

    say("1. DAG ckpt_keep_alive: submit the job supervised, watch its health; the driver gets killed meanwhile"
        + (" (an executor first)" if cluster else ""))
    seen: list[RestartSeen] = []
    killer = _kill_when_running(world, seen, cluster)
    output = _run_dag(home, "ckpt_keep_alive")
    killer.join(TIMEOUT)
    if not seen:
        raise RuntimeError("no restart seen: the driver was not killed, or no newer driver committed a batch in time")
    for line in [*seen[0].lines(), _restart_task(output)]:
        say(line)

    say("2. DAG ckpt_savepoint_restore: a savepoint on demand, then the job restored from it")
    _run_dag(home, "ckpt_savepoint_restore", {"job": world.job})
    restored = _resumed(world, world.wait("the restored driver", lambda s: s.state == "RUNNING"))
    say(f"running again: {restored.line()}")

    say("3. DAG ckpt_upgrade_job: upgrade to orders_v2.py (savepoint mode), state kept; orders keep arriving")
    conf = {"job": world.job, "job_file": str(EXAMPLES / "orders_v2.py"), "code_version": "v2",
            "upgrade_mode": "savepoint", "verify_batches": 2}
    with world.flowing():
        _run_dag(home, "ckpt_upgrade_job", conf)
    say(f"orders produced while upgrading: total {world.produced:,}")
    status = world.wait_all_consumed()
    upgraded = _resumed(world, status)
    say(f"v2 runs (code {status.code_version}): {upgraded.line()}; all {world.produced:,} orders consumed")
    return Told(seen[0], restored, upgraded, status.code_version)


def _snapshot_table(world: World) -> None:
    """The job's snapshots as ``ckpt snapshot list`` prints them (that command, run here)."""
    args = ["snapshot", "list", "--store", world.store_url, "--job", world.job]
    done = subprocess.run([sys.executable, "-m", "airflow_ckpt_provider.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **world.env()}, timeout=120, check=False)
    print(f"$ ckpt {' '.join(args)}")
    print(done.stdout.rstrip() or done.stderr.rstrip())


def _finish(world: World, services: EmbeddedServices, told: Told, *, keep: bool, started: float) -> Summary:
    """Stop the job with a final savepoint (with ``keep``: leave it running), then check its totals."""
    status = world.status()
    assert status is not None
    if keep:
        final = (f"the job is left running: epoch {status.epoch} (code {status.code_version}) at batch "
                 f"{status.batch_id}; `ckpt job stop` would stop it with a final savepoint")
    else:
        ack = wait_ack(world.store, submit_request(world.store, RequestAction.STOP, status.epoch).id, TIMEOUT)
        if ack is None:
            raise RuntimeError(f"the driver of epoch {status.epoch} did not answer the stop request in {TIMEOUT:.0f} s")
        final = f"stopped with final savepoint {ack.snapshot_id} at batch {ack.batch_id}"
    proof = Proof.of(world.expected(), world.totals())
    from airflow_ckpt_provider.kafka.lag import consumer_group_lag

    lag = consumer_group_lag(services.kafka.bootstrap_servers, world.group, [world.topic]).total_lag
    snapshots = list_snapshots(world.store)
    return Summary(proof=proof, lag=lag, restart=told.restart.summary(), restored=told.restored,
                   upgraded=told.upgraded, code_version=told.code_version, final=final, store_url=world.store.url,
                   snapshots=len(snapshots), savepoints=sum(1 for m in snapshots if m.kind.value == "savepoint"),
                   seconds=time.monotonic() - started)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the finally blocks stop everything that was started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true",
                        help="leave SeaweedFS, tansu, the job and an Airflow UI running at the end, print how to "
                        "explore them, stop everything on Ctrl-C; the work directory (logs) stays")
    parser.add_argument("--cluster", action="store_true",
                        help="run the jobs on a Spark standalone cluster on 127.0.0.1 (a master, two workers)")
    parser.add_argument("--watch-seconds", type=float, default=45.0,
                        help="how long the keep-alive DAG watches the job's health (default 45)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    work = Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    started = time.monotonic()
    ok = False
    try:
        with EmbeddedServices() as services, contextlib.ExitStack() as stack:
            if args.keep:
                stack.callback(keep_service_logs, services, work / "services")  # runs last: the servers stopped
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
                summary = _finish(world, services, scenario(world, home, cluster), keep=args.keep, started=started)
                ok = summary.ok
                print()
                print("\n".join(summary.lines()))
                _snapshot_table(world)
                if args.keep:
                    explore(stack, world, home, cluster)  # until Ctrl-C or SIGTERM
            finally:
                world.stop_everything()
        if not args.keep:
            print(KEEP_HINT)
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("\ninterrupted: stopped everything it started", file=sys.stderr)
        return 0 if ok else 130
    finally:
        if args.keep:
            print(f"stopped everything; the logs are kept in {work}: airflow/ (each DAG run's output, "
                  "the Airflow components' logs), ckpt-home/jobs/*/logs/ (the supervisors' and drivers' logs), "
                  "services/ (SeaweedFS, tansu)")
        else:
            shutil.rmtree(work, ignore_errors=True)
