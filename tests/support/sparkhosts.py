"""A Spark standalone cluster on the test hosts of tests/support/hosts.py (issue 41): the master on ``spark-master``,
one worker on each ``spark-worker-N``, each started inside its host and bound to its address only.

``start_spark_cluster(topo, workdir)`` returns a ``HostCluster`` (its ``cluster`` is an EmbeddedSparkCluster);
``state()`` reads the master's JSON from the master's own host, which reaches it whatever link is cut.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from airflow_ckpt_provider.embedded.sparkcluster import EmbeddedSparkCluster
from tests.support.hosts import Host, Topology

MASTER = "spark-master"
WORKERS = ("spark-worker-1", "spark-worker-2")
#: A Spark daemon's log line (log4j2's default pattern): its own time, level, logger and message.
_SPARK_LINE = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d) (\w+) (\S+): (.*)$")


@dataclass
class HostCluster:
    """The cluster of ``topo``: its master on ``MASTER``, worker ``i`` on ``worker_roles[i]``."""

    topo: Topology
    cluster: EmbeddedSparkCluster
    worker_roles: tuple[str, ...]
    started: list[int] = field(default_factory=list)  # every node pid started (for the nothing-left check)

    @property
    def master_host(self) -> Host:
        return self.topo[MASTER]

    def worker_host(self, index: int) -> Host:
        return self.topo[self.worker_roles[index]]

    def start(self) -> Self:
        """The master in its host, then each worker in its own; each ready when the master lists it ALIVE."""
        try:
            self.master_host.call(self.cluster.master.start)
            self._note(self.cluster.master.pid)
            for index in range(len(self.cluster.workers)):
                self.start_worker(index)
        except BaseException:
            self.close()
            raise
        return self

    def start_worker(self, index: int) -> None:
        """Start (or start again, on the same port) worker ``index`` inside its host."""
        worker = self.cluster.workers[index]
        self.worker_host(index).call(worker.start)
        self._note(worker.pid)

    def _note(self, pid: int | None) -> None:
        if pid is not None:
            self.started.append(pid)

    def state(self) -> dict[str, Any]:
        """The master's JSON view, read from the master's host; {} while it does not answer."""
        return self.master_host.call(self.cluster.state)

    def workers_seen(self) -> dict[str, str]:
        """``host:port`` -> state of every worker the master lists."""
        return {f"{w['host']}:{w['port']}": w["state"] for w in self.state().get("workers", [])}

    def close(self) -> None:
        self.cluster.close()


def start_spark_cluster(topo: Topology, workdir: Path, *, workers: Sequence[str] = WORKERS, java_opts: str = "",
                        worker_cores: int = 1, start_timeout: float = 120.0) -> HostCluster:
    """A master on ``MASTER`` and a worker on each role of ``workers``, started; close() (or the topology's end,
    which kills every process of its hosts) stops them."""
    cluster = EmbeddedSparkCluster(master_host=topo[MASTER].address, worker_hosts=[topo[r].address for r in workers],
                                   worker_cores=worker_cores, workdir=workdir, java_opts=java_opts,
                                   start_timeout=start_timeout)
    return HostCluster(topo, cluster, tuple(workers)).start()


def listening(host: Host) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening inside ``host`` (its namespace's /proc/PID/net tables)."""
    pids = host.pids()
    found: set[tuple[str, int]] = set()
    for pid in pids[:1]:  # every process of the host sees the same tables
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()
                if cols[3] == "0A":  # LISTEN
                    addr, port = cols[1].split(":")
                    found.add((_decode(addr), int(port, 16)))
    return found


def _decode(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host (little) order
    if len(words) == 4:
        return str(ipaddress.IPv4Address(words))
    v6 = ipaddress.IPv6Address(words)
    return str(v6.ipv4_mapped) if v6.ipv4_mapped else str(v6)


def spark_log_lines(path: Path, pattern: str, *, since: float = 0.0) -> list[tuple[float, str]]:
    """(time, message) of every line of a Spark daemon's log whose message contains ``pattern``, at or after
    ``since`` (epoch seconds; the log's times have whole seconds, local time)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        match = _SPARK_LINE.match(line)
        if match and pattern in match[4]:
            when = datetime.strptime(match[1], "%y/%m/%d %H:%M:%S").timestamp()
            if when >= int(since):
                found.append((when, f"{match[3]}: {match[4]}"))
    return found


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.5) -> Any:
    """``check()``'s first truthy value within ``timeout`` seconds, or an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return value


def pids_alive(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` that still run (not gone, not a zombie)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive

