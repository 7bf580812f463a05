"""The runnable examples of the user docs run as written (docs/embedded.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"
CKPT = [sys.executable, "-m", "airflow_ckpt_provider.cli"]


def _start(script: Path, home: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start the session script; return it and the environment it wrote once it says it is ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KAFKA_"))}
    proc = subprocess.Popen([sys.executable, str(script)], env={**env, "CKPT_HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the script prints one line when both servers are up
    assert "in another shell: source" in line, line + proc.stdout.read()
    env_file = home / "embedded" / "local.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    exported = dict(re.findall(r"^export (\w+)=(.*)$", env_file.read_text(), re.M))
    assert sorted(exported) == ["AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_REGION",
                                "AWS_SECRET_ACCESS_KEY", "KAFKA_BOOTSTRAP_SERVERS"]
    return proc, {**env, **exported}


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def _ckpt(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*CKPT, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_embedded_md_session_script_runs_as_documented_and_keeps_its_data(tmp_path: Path) -> None:
    text = (DOCS / "embedded.md").read_text()
    script = tmp_path / "local_services.py"
    script.write_text(re.findall(r"```python\n(.*?)```", text, re.S)[0])
    proc, env = _start(script, tmp_path)
    try:
        assert _ckpt(env, "snapshot", "list", "--store", "s3://jobs/dev", "--job", "orders") == "no snapshots\n"
        lag = _ckpt(env, "kafka", "lag", "--group", "orders-monitor", "--topic", "orders")
        documented = text.split("--group orders-monitor --topic orders\n", 1)[1].split("```", 1)[0]
        assert lag == documented
        first_key = env["AWS_ACCESS_KEY_ID"]
    finally:
        _stop(proc)
    # A second start finds the bucket and the topic again (data on disk, Kafka's log in S3)
    proc, env = _start(script, tmp_path)
    try:
        assert env["AWS_ACCESS_KEY_ID"] != first_key  # new keys at each start, as the docs say
        assert _ckpt(env, "kafka", "lag", "--group", "orders-monitor", "--topic", "orders") == documented
    finally:
        _stop(proc)
