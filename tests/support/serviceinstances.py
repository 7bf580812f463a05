"""`ckpt service run` processes for the tests of the supervision service (fast timings, output in a file)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support.runtimejob import JobEnv

#: Fast service timings for the tests (the product's: renew 2 s, deadline 8 s, lease 12 s).
FAST = ("--renew-every", "0.5", "--renew-deadline", "2", "--lease-duration", "3.5")


class Instance:
    """One `ckpt service run` process, its output in a file."""

    def __init__(self, name: str, env: JobEnv, work: Path, environ: dict[str, str], *extra: str) -> None:
        self.name, self.log = name, work / f"{name}.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_ckpt_provider.cli", "service", "run", "--store", env.store_url,
                 "--instance", name, "--endpoint-url", env.s3.endpoint_url, "--region", env.s3.region, *FAST, *extra],
                env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
