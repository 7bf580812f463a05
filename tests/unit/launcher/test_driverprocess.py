"""Real (tiny, Spark-less) processes: the driver's process group, the immediate detection of an exit, and where
SIGTERM goes."""

from __future__ import annotations

import signal
import stat
import sys
import threading
import time
from pathlib import Path

from airflow_ckpt_provider.core.policy.restart import FixedDelay
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.launcher.submit import ENTRYPOINT_PY, SubmitSpec
from airflow_ckpt_provider.launcher.supervisor import Ending, Supervisor

# -- real processes (no Spark): the process group and the detection of an exit ----------------------


def _fake_spark_submit(tmp_path: Path, body: str) -> str:
    """An executable standing in for spark-submit; it appends its --restore value to runs.log."""
    path = tmp_path / "spark-submit"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys, time\n"
        f"log = {str(tmp_path / 'runs.log')!r}\n"
        "with open(log, 'a') as fh: fh.write(sys.argv[sys.argv.index('--restore') + 1] + '\\n')\n"
        "runs = len(open(log).read().split())\n" + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_real_driver_exit_is_detected_at_once(spec: SubmitSpec, tmp_path: Path) -> None:
    submit = _fake_spark_submit(tmp_path, "sys.exit(1 if runs == 1 else 0)\n")
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    started = time.monotonic()
    outcome = Supervisor(real, FixedDelay(attempts=1, delay=0.0), poll=30.0).run()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 2, 0)
    # no store: no driver was seen running, so the restart restores what the user chose again
    assert (tmp_path / "runs.log").read_text().split() == ["latest-savepoint", "latest-savepoint"]
    assert time.monotonic() - started < 10.0  # far below poll: wait() returns when the driver exits


def test_real_python_driver_in_the_group_switches_restarts_to_latest_state(spec: SubmitSpec, tmp_path: Path) -> None:
    # The "Python driver" runs in spark-submit's process group and reports RUNNING with its own pid.
    report = (
        "import os, socket, time\n"
        "from airflow_ckpt_provider.core.store.jobstore import JobStore\n"
        "from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status\n"
        f"store = JobStore.open({spec.config.store!r}, 'orders')\n"
        "now = time.time()\n"
        "write_status(store, JobStatus('orders', JobState.RUNNING, 1, now, now, pid=os.getpid(),"
        " host=socket.gethostname()))\n"
        "time.sleep(1.0)\n"
    )
    submit = _fake_spark_submit(
        tmp_path,
        f"if runs == 1:\n    subprocess.run([sys.executable, '-c', {report!r}])\n"
        "sys.exit(1 if runs == 1 else 0)\n",
    )
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    store = JobStore.open(spec.config.store, "orders")
    outcome = Supervisor(real, FixedDelay(attempts=1, delay=0.0), store=store, poll=0.1).run()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 2, 0)
    assert (tmp_path / "runs.log").read_text().split() == ["latest-savepoint", "latest-state"]


def _stop_when(path: Path, sup: Supervisor) -> threading.Thread:
    """A thread that asks ``sup`` to stop once the fake driver wrote ``path``."""

    def stop() -> None:
        # No deadline of its own: a stop asked before the driver runs is a test of something else (a loaded machine
        # once took over 20 s to start the stand-in); pytest's timeout bounds the wait.
        while not (path.exists() and path.read_text()):
            time.sleep(0.05)
        sup.request_stop()

    thread = threading.Thread(target=stop)
    thread.start()
    return thread


def test_real_sigterm_goes_to_the_python_driver_not_the_jvm(spec: SubmitSpec, tmp_path: Path) -> None:
    # The stand-in JVM starts a "Python driver" (a process whose argv holds entrypoint.py's path) and exits
    # with 7 when that one died of SIGTERM: had the JVM got SIGTERM as well, it would die of it (-15).
    started = tmp_path / "driver.pid"
    submit = _fake_spark_submit(
        tmp_path,
        f"driver = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {str(ENTRYPOINT_PY)!r}])\n"
        f"open({str(started)!r}, 'w').write(str(driver.pid))\n"
        "sys.exit(7 if driver.wait() == -15 else 1)\n",
    )
    sup = Supervisor(SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit),
                     FixedDelay(attempts=5, delay=0.0), poll=0.1)
    stopper = _stop_when(started, sup)
    outcome = sup.run()
    stopper.join()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 1, 7)


def test_real_stop_request_reaches_the_whole_process_group(spec: SubmitSpec, tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    submit = _fake_spark_submit(
        tmp_path,
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n",
    )
    real = SubmitSpec(job_file=spec.job_file, config=spec.config, spark_submit=submit)
    sup = Supervisor(real, FixedDelay(attempts=5, delay=0.0), poll=0.1)
    stopper = _stop_when(child_pid, sup)  # no entrypoint.py process here (as in cluster mode): the group gets it
    outcome = sup.run()
    stopper.join()
    assert (outcome.final, outcome.attempts, outcome.exit_code) == (Ending.STOPPED, 1, -signal.SIGTERM)
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the driver's child got SIGTERM too
