"""`ckpt metrics targets|rules|dashboard`: what Prometheus and Grafana need for the drivers' metrics (docs/metrics.md).

A driver serves its metrics when its job sets `--metrics-address` (HOST:PORT, or HOST for a free port). `targets`
writes Prometheus' file_sd JSON of the drivers the job store lists as active (with `--every S`, again every S
seconds; `--service`: the supervision service's instances instead); `rules` prints the alert rules (`promtool check
rules` takes them); `dashboard` the Grafana dashboard.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path

from airflow_ckpt_provider.cli.common import add_store_args, emit, s3_options
from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.store.storage import open_storage
from airflow_ckpt_provider.launcher.monitoring import (
    AlertSettings,
    dashboard_json,
    rules_yaml,
    scrape_targets,
    service_targets,
)

log = logging.getLogger(__name__)


def _write(path: str, text: str) -> None:
    """Replace ``path`` at once (Prometheus reads file_sd files as they change: never a half-written one)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def cmd_targets(args: argparse.Namespace) -> int:
    if not args.store:
        raise ConfigError("no job store given: pass --store s3://BUCKET/PREFIX or a directory, or set CKPT_STORE")
    root = open_storage(args.store, s3_options(args))
    if args.every is not None and (args.every <= 0 or not args.out):
        raise ConfigError(f"--every: expected seconds > 0 with --out FILE, found {args.every} and "
                          f"{args.out or 'no --out'}")
    stop = threading.Event()
    if args.every is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while True:
        try:
            entries = service_targets(root) if args.service else scrape_targets(root)
        except StorageError as err:
            if args.every is None:
                raise
            log.warning("job store %s unreadable, the targets file is kept as it was: %s", args.store, err)
        else:
            if args.out:
                _write(args.out, json.dumps(entries, indent=2) + "\n")
            if args.every is None:
                emit(args, entries, lambda found=entries: (  # type: ignore[misc]  # bound now: B023
                    f"wrote {len(found)} targets to {args.out}" if args.out else json.dumps(found, indent=2)))
                return 0
        if stop.wait(args.every):
            return 0


def cmd_rules(args: argparse.Namespace) -> int:
    settings = AlertSettings(scrape_job=args.scrape_job, service_scrape_job=args.service_scrape_job,
                             hold=args.hold, snapshot_age_floor=args.snapshot_age_floor, lag_rising=args.lag_rising,
                             restarts=args.restarts, restart_window=args.restart_window)
    return _emit_file(args, rules_yaml(settings))


def cmd_dashboard(args: argparse.Namespace) -> int:
    return _emit_file(args, dashboard_json() + "\n")


def _emit_file(args: argparse.Namespace, text: str) -> int:
    if args.out:
        _write(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def add_metrics_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = groups.add_parser("metrics", help="Prometheus targets, alert rules and a Grafana dashboard for the drivers' "
                                          "metrics", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("targets", help="Prometheus file_sd targets of the active drivers serving metrics")
    add_store_args(t, job=False)
    t.add_argument("--out", metavar="FILE", help="write the file_sd JSON there (replaced at once)")
    t.add_argument("--every", type=float, metavar="S", help="with --out: write it again every S seconds until "
                                                             "stopped")
    t.add_argument("--service", action="store_true", help="the supervision service's instances serving metrics "
                   "(`ckpt service run --metrics-address`) instead of the drivers: a second scrape job")
    t.set_defaults(fn=cmd_targets)
    defaults = AlertSettings()
    r = sub.add_parser("rules", help="the alert rules as a Prometheus rules file")
    r.add_argument("--scrape-job", default=defaults.scrape_job,
                   help=f"Prometheus' scrape job of the drivers' targets (default {defaults.scrape_job})")
    r.add_argument("--service-scrape-job", default=defaults.service_scrape_job,
                   help="Prometheus' scrape job of the supervision service's targets (default "
                        f"{defaults.service_scrape_job})")
    r.add_argument("--hold", default=defaults.hold, help=f"how long a condition holds before it fires (default "
                                                         f"{defaults.hold})")
    r.add_argument("--snapshot-age-floor", type=float, default=defaults.snapshot_age_floor, metavar="S",
                   help="the snapshot age alert fires only beyond 3 checkpoint intervals and at least S seconds "
                        f"(default {defaults.snapshot_age_floor:g})")
    r.add_argument("--lag-rising", default=defaults.lag_rising,
                   help=f"how long the lag rises before it alerts (default {defaults.lag_rising})")
    r.add_argument("--restarts", type=int, default=defaults.restarts,
                   help=f"restarts within --restart-window that make a crash loop (default {defaults.restarts})")
    r.add_argument("--restart-window", default=defaults.restart_window,
                   help=f"the crash loop's window (default {defaults.restart_window})")
    r.add_argument("--out", metavar="FILE", help="write the rules there")
    r.add_argument("-v", "--verbose", action="store_true", help="log every step")
    r.set_defaults(fn=cmd_rules)
    d = sub.add_parser("dashboard", help="the Grafana dashboard (JSON model)")
    d.add_argument("--out", metavar="FILE", help="write the dashboard there")
    d.add_argument("-v", "--verbose", action="store_true", help="log every step")
    d.set_defaults(fn=cmd_dashboard)

