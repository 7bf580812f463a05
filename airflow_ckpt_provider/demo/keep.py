"""``scripts/demo --keep``: what the demo leaves running, how to look at it, and stopping it all on Ctrl-C.

SeaweedFS, tansu and the job keep running; a whole Airflow runs over the demo's Airflow home (its DAG runs, the
provider's "Streaming jobs" page, ``ckpt_on_savepoint`` unpaused: a savepoint from the page schedules it). The
``ckpt`` settings go to ``<work>/demo.env`` (mode 0600: it holds the S3 secret), as docs/embedded.md's local
session does.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import signal
import sys
from pathlib import Path

from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.watches.events import snapshot_cursor_key
from airflow_ckpt_provider.demo.apiserver import DemoApiServer
from airflow_ckpt_provider.demo.world import AirflowHome, World, say
from airflow_ckpt_provider.embedded import EmbeddedServices
from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster


def env_file(world: World, path: Path) -> Path:
    """``export`` lines of everything ``ckpt`` needs to reach the demo's job (mode 0600)."""
    path.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(world.env().items())))
    path.chmod(0o600)
    return path


def ckpt_command() -> str:
    """``ckpt`` of this environment (its full path when that is not the one on PATH)."""
    here = Path(sys.executable).with_name("ckpt")
    return "ckpt" if not here.exists() or shutil.which("ckpt") == str(here) else str(here)


def explore_lines(world: World, server: DemoApiServer, env: Path, ckpt: str,
                  cluster: EmbeddedSparkCluster | None) -> list[str]:
    """What is left running, where, and the commands to look at it."""
    status, launch = world.status(), read_launch(world.store)
    s3 = world.services.s3
    where = f"--store {world.store_url} --job {world.job}"
    job = (f"job {world.job}: {status.state} at epoch {status.epoch} (code {status.code_version}), batch "
           f"{status.batch_id}, driver pid {status.pid}" if status else f"job {world.job}: no status")
    if launch is not None:
        job += f"; supervisor pid {launch.pid}, its log {launch.log_file}"
    return [
        "",
        "=== left running (--keep) ===",
        f"Airflow UI      {server.url}/   user {server.username}, password {server.password}",
        f"Streaming jobs  {server.url}/ckpt-jobs/   (its Trigger savepoint schedules DAG ckpt_on_savepoint through "
        "the savepoint asset's watcher)",
        f"SeaweedFS S3    {s3.endpoint_url}   tansu Kafka {world.services.kafka.bootstrap_servers}",
        *([f"Spark master    {cluster.master_url} (UI {cluster.master.ui_url})"] if cluster else []),
        job,
        "in another shell:",
        f"  source {env}",
        f"  # or: export AWS_ENDPOINT_URL={s3.endpoint_url} AWS_ACCESS_KEY_ID={s3.access_key} "
        f"AWS_SECRET_ACCESS_KEY={shlex.quote(s3.secret_key)} AWS_REGION={s3.region} "
        f"KAFKA_BOOTSTRAP_SERVERS={world.services.kafka.bootstrap_servers}",
        f"  {ckpt} snapshot list {where}",
        f"  {ckpt} job status {where}",
        f"  {ckpt} kafka lag --group {world.group} --topic {world.topic}",
        "press Ctrl-C to stop everything (job, supervisor, Airflow, tansu, SeaweedFS"
        + (", Spark cluster)" if cluster else ")"),
    ]


def explore(stack: contextlib.ExitStack, world: World, home: AirflowHome,
            cluster: EmbeddedSparkCluster | None) -> None:
    """Start an api-server over ``home`` (``stack`` stops it), print how to explore, then wait for Ctrl-C or
    SIGTERM (the caller stops the rest)."""
    say("starting Airflow (api-server, scheduler, dag-processor, triggerer) over the demo's Airflow home")
    server = stack.enter_context(DemoApiServer(home.path, home.env))
    server.unpause("ckpt_on_savepoint")  # its asset watcher: each new savepoint of the job runs it
    server.wait_asset_state(f"ckpt://ckpt_store_default/{world.job}/savepoints",
                            snapshot_cursor_key(world.job, ["savepoint"]))
    env = env_file(world, world.work / "demo.env")
    print("\n".join(explore_lines(world, server, env, ckpt_command(), cluster)), flush=True)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        say("stopping everything: the job and its supervisor, Airflow, tansu, SeaweedFS")


def keep_service_logs(services: EmbeddedServices, dest: Path) -> None:
    """Stop both servers and copy their logs to ``dest`` (their own work dirs go when they close)."""
    services.stop()
    dest.mkdir(parents=True, exist_ok=True)
    for server in (services.s3, services.kafka):
        with contextlib.suppress(OSError):
            shutil.copy(server.log_path, dest / server.log_path.name)
