"""`ckpt service run|status`: the supervision service's instances, and what they own (docs/service.md).

`ckpt service run --store URL` starts one instance in the foreground (run two or more, on different hosts); a job is
handed to the service with `ckpt run JOB_FILE --job NAME --store URL --service`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from airflow_ckpt_provider.cli.common import add_store_args, emit, s3_options, table
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.policy.settings import check_metrics
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.ownership import Timings, read_instances, read_owner
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import Storage, open_storage
from airflow_ckpt_provider.launcher.handover import handed_jobs
from airflow_ckpt_provider.launcher.service import FULL_LOOK_EVERY, LOOK_EVERY, SupervisionService


def _root(args: argparse.Namespace) -> Storage:
    if not args.store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE")
    return open_storage(args.store, s3_options(args))


def cmd_service_run(args: argparse.Namespace) -> int:
    logging.getLogger("airflow_ckpt_provider").setLevel(logging.INFO)  # one line per event, for operators
    timings = Timings(renew_every=args.renew_every, renew_deadline=args.renew_deadline,
                      lease_duration=args.lease_duration)
    service = SupervisionService(_root(args), store_url=args.store, s3=s3_options(args), timings=timings,
                                 instance=args.instance, start_timeout=args.start_timeout, look_every=args.look_every)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("supervision service instance %s: %s received, stopping",
                                         service.instance, signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    check_metrics(args.metrics_address, args.metrics_otlp, args.metrics_interval)
    try:  # an address this host cannot bind: ConfigError, exit 2, before anything is claimed
        if args.metrics_address is not None:
            service.metrics.serve(args.metrics_address)
        if args.metrics_otlp is not None:
            service.metrics.export(args.metrics_otlp, args.metrics_interval)
        service.run(stop)  # a store it cannot write: StorageError, exit 1 with the error's message
    finally:
        service.metrics.close()
    return 0


def cmd_service_status(args: argparse.Namespace) -> int:
    root = _root(args)
    instances: list[dict[str, Any]] = []
    for record, age in read_instances(root):
        state = "stopped" if record.stopped else ("live" if age <= record.lease_duration else "silent")
        instances.append({"instance": record.instance, "host": record.host, "pid": record.pid, "state": state,
                          "renewed_s_ago": round(age, 1), "lease_duration": record.lease_duration})
    jobs: list[dict[str, Any]] = []
    for job in handed_jobs(root):
        store = JobStore(root, job)
        owner, last = read_owner(store), read_launch(store)
        jobs.append({"job": job, "owner": owner.instance if owner and not owner.released else None,
                     "owner_epoch": owner.epoch if owner else None, "launch_id": last.launch_id if last else None,
                     "launched_by": last.launched_by if last else None,
                     "ended": last.ending if last else None})

    def human() -> str:
        top = table([[i["instance"], i["host"], str(i["pid"]), i["state"], f"{i['renewed_s_ago']:g} s ago"]
                     for i in instances], ["instance", "host", "pid", "state", "renewed"])
        below = table([[j["job"], j["owner"] or "-", str(j["owner_epoch"] or "-"), j["launch_id"] or "-",
                        j["ended"] or "not ended"] for j in jobs], ["job", "owner", "epoch", "launch", "launch state"])
        return f"{top}\n\n{below}"

    emit(args, {"instances": instances, "jobs": jobs}, human)
    return 0


def add_service_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    service = groups.add_parser("service", help="the supervision service: run an instance, see what it owns",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = service.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("run", cmd_service_run, "run one instance in the foreground until SIGTERM or ^C"),
                            ("status", cmd_service_status, "the instances and the jobs handed to the service")):
        p = sub.add_parser(name, help=help_)
        p.set_defaults(fn=fn)
        add_store_args(p, job=False)
        if name == "run":
            defaults = Timings()
            p.add_argument("--instance", help="this instance's name (default HOST-PID-RANDOM)")
            p.add_argument("--renew-every", type=float, default=defaults.renew_every, metavar="S",
                           help=f"seconds between renewals of its lease (default {defaults.renew_every:g})")
            p.add_argument("--renew-deadline", type=float, default=defaults.renew_deadline, metavar="S",
                           help="seconds without a renewal after which it takes no step (default "
                                f"{defaults.renew_deadline:g})")
            p.add_argument("--lease-duration", type=float, default=defaults.lease_duration, metavar="S",
                           help="seconds the others wait after its last renewal before they take its jobs "
                                f"(default {defaults.lease_duration:g})")
            p.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                           help="seconds a launch started by another instance gets to report (default 60)")
            p.add_argument("--look-every", type=float, default=LOOK_EVERY, metavar="S",
                           help=f"seconds between looks at a job with nothing in progress (default {LOOK_EVERY:g}; "
                           f"a GET of its supervisor's record, all of it every {FULL_LOOK_EVERY:g} s); a hand-over "
                           "or an operation asked for rings the service's bell, a silent owner is noticed at each "
                           "renewal: both bring a full look at once")
            p.add_argument("--metrics-address", metavar="ADDRESS",
                           help="serve this instance's metrics for Prometheus at http://ADDRESS/metrics: HOST:PORT, or "
                           "HOST for a free port (its URL in its lease record; `ckpt metrics targets --service` "
                           "lists them); default none: not served")
            p.add_argument("--metrics-otlp", metavar="URL",
                           help="export this instance's metrics over OTLP/HTTP to URL (http://HOST:4318/v1/metrics)")
            p.add_argument("--metrics-interval", type=float, default=15.0, metavar="S",
                           help="seconds between OTLP exports (default 15)")

