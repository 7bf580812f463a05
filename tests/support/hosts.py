"""Test hosts as Linux network namespaces on this machine: servers apart, and faults between them (issue 41).

A ``Topology`` makes one network namespace per host role (``store``, ``kafka``, ``spark-master``,
``spark-worker-1``, ``spark-worker-2``, ``launcher``, ``driver``, ``db``, ``launcher-2``), each with a veth pair to
one bridge and a fixed address from ``SUBNET``, and removes all of it at the end (docs/reliability.md has the
picture)::

    with Topology(["store", "kafka", "launcher"]) as topo:
        s3 = topo.start_store()                      # SeaweedFS bound to 10.213.41.10 inside `store`
        kafka = topo.start_kafka()                   # tansu on 10.213.41.11, its log on that S3
        topo["launcher"].run([sys.executable, "client.py"], env=...)
        with topo.cut("launcher", "store", seconds=30):
            ...

The bridge lives in a namespace of its own, not in the root namespace: the root namespace gets no interface, address
or route in ``SUBNET`` (nothing in it can reach a test host by accident, and its firewall — Docker's FORWARD policy,
br_netfilter — never sees the traffic); two topologies of two test processes that run at once use the same
addresses without meeting; and deleting the namespaces removes every link with them.

Faults are ``Fault`` objects: context managers whose ``heal()`` undoes them, healed by themselves after ``seconds``
when given, and at the topology's end in any case. The kernel here has no ``sch_netem``/``sch_prio``/``act_gact``
(``tc`` has only htb, tbf, fifo, clsact), so cuts and loss are iptables rules inside the receiving host's namespace
(INPUT, so that the sender sees silence as on a cut wire, not the EPERM an OUTPUT drop gives), and delay is an
NFQUEUE rule whose packets ``NfqDelay`` holds (tests/support/nfqdelay.py). iptables is Debian's ``iptables``
package (scripts/bootstrap installs it).

Cleanup: ``close()`` (``with``'s exit, also on an exception) stops the servers, kills every process left in the
namespaces and deletes them; an atexit hook closes what a caller left open; and every new topology first removes the
leftovers of runs whose owner process is gone (a run records its owner in ``RECORD_DIR``), so a killed test run is
cleaned by the next one. ``python -m tests.support.hosts --cleanup`` does the same by hand (``--all`` also removes
the topologies of live runs).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import functools
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from airflow_ckpt_provider.embedded.seaweedfs import EmbeddedS3
from airflow_ckpt_provider.embedded.tansu import EmbeddedKafka
from tests.support.nfqdelay import NfqDelay
from tests.support.pgserver import PgServer

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "ckh"
#: Used only inside the topologies' namespaces; a start refuses when the root namespace has an address or a route in it.
SUBNET = ipaddress.ip_network("10.213.41.0/24")
#: role -> (code for link names, last octet of its address)
ROLES: dict[str, tuple[str, int]] = {
    "store": ("st", 10),
    "kafka": ("kf", 11),
    "db": ("db", 12),
    "spark-master": ("sm", 20),
    "spark-worker-1": ("w1", 21),
    "spark-worker-2": ("w2", 22),
    "launcher": ("ln", 30),
    "driver": ("dr", 31),
    "launcher-2": ("l2", 32),  # a second Airflow worker: relaunches what died with the first (scenario 4)
    "service-a": ("sa", 40),  # supervision service instances (issue 42: docs/service.md)
    "service-b": ("sb", 41),
}
RECORD_DIR = Path("/run/ckpt-hosts")  # one <run id>.json per live topology: its owner's pid and start time
WORK_ROOT = Path("/tmp")  # servers' work dirs go to /tmp/ckh-<run id>/
NETNS_DIR = Path("/run/netns")
_RUN_ID = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_open: set[Topology] = set()  # closed at exit if their owner did not


class HostsError(RuntimeError):
    """A topology cannot be made here (not root, no iproute2/iptables, its address range in use), or a step failed."""


def _cmd(args: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise HostsError(f"Expected `{' '.join(args)}` to succeed, it exited with code {done.returncode}: "
                         f"{done.stderr.strip()}")
    return done.stdout


def enter_namespace(path: Path) -> None:
    """Move the calling thread (only it) into the network namespace at ``path``; sockets it opens live there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def namespace_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (what `ip netns pids` lists), never this process."""
    try:
        target = os.stat(NETNS_DIR / name)
    except FileNotFoundError:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            ns = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:  # gone, or a zombie (its namespace links are gone with it)
            continue
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
            found.append(int(entry.name))
    return found


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _kill_all(name: str, timeout: float = 10.0) -> None:
    """kill -9 every process of namespace ``name`` until none is left (a process may fork while it is killed)."""
    deadline = time.monotonic() + timeout
    while pids := namespace_pids(name):
        _signal(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise HostsError(f"Expected no process left in namespace {name} after kill -9, found {pids}")
        time.sleep(0.05)


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T for stopped, Z...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _wait_stopped(pids: Iterable[int], timeout: float = 10.0) -> None:
    """Return once every process of ``pids`` is stopped (SIGSTOP is delivered asynchronously) or gone."""
    deadline = time.monotonic() + timeout
    while running := [pid for pid in pids if _state(pid) not in (None, "T", "t", "Z", "X")]:
        if time.monotonic() > deadline:
            raise HostsError(f"Expected processes {running} stopped within {timeout:.0f} s of SIGSTOP, found them "
                             "running")
        time.sleep(0.01)


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace ``netns`` whose interface ``link`` has ``address``."""

    role: str
    netns: str
    link: str  # inside the host's namespace
    bridge_port: str  # the veth peer, on the bridge
    address: str
    #: the topology's /etc/hosts (every host's name and address), seen by the commands run with ``own_hostname``
    hosts_file: Path = field(default=Path("/etc/hosts"), compare=False)
    #: every process popen() started, reaped at the topology's end (the namespace's processes are killed anyway)
    started: list[subprocess.Popen[Any]] = field(default_factory=list, compare=False, repr=False)

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def hostname(self) -> str:
        """The host name its processes see with ``own_hostname`` (``ckh-launcher``): the same for every run."""
        return f"{PREFIX}-{self.role}"

    def wrap(self, args: Sequence[str], *, own_hostname: bool = False) -> list[str]:
        """``args`` as a command that runs inside this host. Namespaces made by ``ip netns`` separate the network only:
        every host has this machine's name and sees its processes. ``own_hostname`` also gives the command a UTS
        namespace named ``hostname``, so that what records ``socket.gethostname()`` (a supervisor, a launch) names
        this host, and a process on another host cannot take a pid it records for one of its own; and a mount
        namespace whose /etc/hosts is the topology's, so that the name resolves (a JVM's getLocalHost needs it)."""
        if own_hostname:
            script = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'
            args = ["unshare", "--uts", "--mount", "sh", "-c", script, self.hostname, str(self.hosts_file), *args]
        return ["ip", "netns", "exec", self.netns, *args]

    def popen(self, args: Sequence[str], *, own_hostname: bool = False, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a process inside this host, in a session of its own (the host's faults reach it; so does close());
        ``own_hostname``: see ``wrap``."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.wrap(args, own_hostname=own_hostname), start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def run(self, args: Sequence[str], *, timeout: float = 120.0, check: bool = True,
            **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run a process inside this host until it exits (killed after ``timeout``); its output is captured."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.wrap(args), timeout=timeout, check=check, start_new_session=True, **kwargs)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread of this process that entered this host's network namespace: the
        sockets it opens (a TCP probe, a boto3 or psycopg client) are this host's and keep working from any thread."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                enter_namespace(self.netns_path)
                box["value"] = fn(*args, **kwargs)
            except BaseException as err:  # handed to the caller
                box["error"] = err

        thread = threading.Thread(target=target, name=f"in-{self.netns}", daemon=True)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    def pids(self) -> list[int]:
        """Every process in this host now."""
        return namespace_pids(self.netns)


class Fault:
    """A fault in force until ``heal()`` (idempotent), the end of its ``with`` block, ``seconds`` after its start
    when given, or the topology's end, whichever comes first."""

    def __init__(self, description: str, undo: Callable[[], None], seconds: float | None, topology: Topology) -> None:
        self.description = description
        self.started = time.monotonic()
        self.healed_after: float | None = None  # seconds in force, once healed
        self._undo = undo
        self._lock = threading.Lock()
        self._topology = topology
        self._timer: threading.Timer | None = None
        if seconds is not None:
            self._timer = threading.Timer(seconds, self.heal)
            self._timer.daemon = True
            self._timer.start()
        log.info("fault on: %s%s", description, f" for {seconds:.1f} s" if seconds is not None else "")

    @property
    def active(self) -> bool:
        return self.healed_after is None

    def heal(self) -> None:
        with self._lock:
            if self.healed_after is not None:
                return
            if self._timer is not None:
                self._timer.cancel()
            try:
                self._undo()
            finally:
                self.healed_after = time.monotonic() - self.started
                self._topology._faults.discard(self)
                log.info("fault healed after %.2f s: %s", self.healed_after, self.description)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a timed fault healed itself; True if it did."""
        if self._timer is not None:
            self._timer.join(timeout)
        return not self.active

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.heal()


HostRef = Host | str


class Topology:
    """The test hosts of ``roles`` (all of ``ROLES`` by default) on one bridge; servers and faults on them."""

    def __init__(self, roles: Iterable[str] = ROLES, *, run_id: str | None = None) -> None:
        roles = list(roles)
        unknown = [r for r in roles if r not in ROLES]
        if unknown or not roles:
            raise HostsError(f"Expected host roles among {sorted(ROLES)}, found {unknown or 'none'}")
        self.run_id = run_id or secrets.token_hex(2)
        self.name = f"{PREFIX}-{self.run_id}"
        self.bridge_netns = f"{self.name}-net"
        self.bridge = f"{self.name}-br"
        self.workdir = WORK_ROOT / self.name
        self.hosts: dict[str, Host] = {}
        for role in roles:
            code, octet = ROLES[role]
            self.hosts[role] = Host(role, f"{self.name}-{role}", f"{self.name}-{code}", f"{self.name}-{code}-b",
                                    str(SUBNET.network_address + octet), self.workdir / "hosts")
            assert len(self.hosts[role].bridge_port) <= 15, "Linux interface names have at most 15 characters"
        self.servers: list[EmbeddedS3 | EmbeddedKafka | PgServer] = []
        self.store: EmbeddedS3 | None = None
        self._faults: set[Fault] = set()
        self._delays: list[NfqDelay] = []
        self._next_queue = 1
        self._next_rule = 1
        self._started = False

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    def host(self, ref: HostRef) -> Host:
        return ref if isinstance(ref, Host) else self.hosts[ref]

    # -- make and remove ------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Remove dead runs' leftovers, check the address range, then make the bridge and the hosts."""
        _preflight()
        cleanup_leftovers()
        _check_range_free()
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "start": _start_ticks(os.getpid()), "namespaces": self.namespaces()}
        # Written before anything that needs removing, and whole (rename) so that no cleanup reads it half-written.
        partial = RECORD_DIR / f"{self.run_id}.json.partial"
        partial.write_text(json.dumps(record))
        partial.rename(RECORD_DIR / f"{self.run_id}.json")
        _open.add(self)
        self._started = True
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            names = "".join(f"{h.address}\t{h.hostname}\n" for h in self.hosts.values())
            (self.workdir / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{names}")
            _cmd(["ip", "netns", "add", self.bridge_netns])
            _cmd(["ip", "-n", self.bridge_netns, "link", "add", self.bridge, "type", "bridge"])
            _cmd(["ip", "-n", self.bridge_netns, "link", "set", self.bridge, "up"])
            for host in self.hosts.values():
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        log.info("topology %s up: %s", self.name, ", ".join(f"{h.role}={h.address}" for h in self.hosts.values()))
        return self

    def _add_host(self, host: Host) -> None:
        _cmd(["ip", "netns", "add", host.netns])
        # Both ends are made inside namespaces: no link of ours ever appears in the root namespace.
        _cmd(["ip", "-n", self.bridge_netns, "link", "add", host.bridge_port, "type", "veth",
              "peer", "name", host.link, "netns", host.netns])
        _cmd(["ip", "-n", self.bridge_netns, "link", "set", host.bridge_port, "master", self.bridge, "up"])
        _cmd(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        _cmd(["ip", "-n", host.netns, "addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev", host.link])
        _cmd(["ip", "-n", host.netns, "link", "set", host.link, "up"])

    def namespaces(self) -> list[str]:
        return [self.bridge_netns, *(h.netns for h in self.hosts.values())]

    def close(self) -> None:
        """Heal the faults, stop the servers, kill every process left in the hosts, delete the namespaces (the links
        go with them) and the work dir; idempotent, and it carries on past a step that failed."""
        if not self._started:
            return
        for fault in list(self._faults):
            with contextlib.suppress(Exception):
                fault.heal()
        for delay in self._delays:
            delay.close()
        for server in reversed(self.servers):  # Kafka before the S3 it writes to
            try:
                server.close()
            except Exception:
                log.exception("Cannot stop %s of topology %s", server.name, self.name)
        self.servers.clear()
        for host in self.hosts.values():  # also what left the namespace meanwhile (a stuck `ip netns exec`)
            for proc in host.started:
                if proc.poll() is None:  # not reaped yet: its pid is still its own
                    _signal([proc.pid], signal.SIGKILL)
        _remove_run(self.run_id, self.namespaces())
        for host in self.hosts.values():
            for proc in host.started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
            host.started.clear()
        self._started = False
        _open.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def leftovers(self) -> dict[str, list[str]]:
        """What of this topology exists now: namespaces, links in the root namespace, processes (all empty after
        close())."""
        existing = set(netns_names())
        namespaces = [n for n in self.namespaces() if n in existing]
        links = [name for name in _root_links() if name.startswith(f"{self.name}-")]
        processes = [str(pid) for ns in namespaces for pid in namespace_pids(ns)]
        return {"namespaces": namespaces, "links": links, "processes": processes}

    # -- servers, each bound to its host's address --------------------------------------------------------------

    def start_store(self, role: str = "store") -> EmbeddedS3:
        """SeaweedFS (`weed mini`) on ``role``'s address; its data under the topology's work dir."""
        host = self.hosts[role]
        server = _HostS3(host, self.workdir / role)
        self.servers.append(server)
        server.start()
        self.store = server
        return server

    def start_kafka(self, role: str = "kafka", *, on_s3: bool = True, bucket: str = "tansu") -> EmbeddedKafka:
        """tansu on ``role``'s address, advertising it; its log on the store's S3 (it survives kills) with
        ``on_s3`` (start_store first), in memory otherwise."""
        if on_s3 and self.store is None:
            raise HostsError("Expected a started store for tansu's S3 storage, found none. Call start_store() first.")
        server = _HostKafka(self.hosts[role], self.workdir / role, self.store if on_s3 else None, bucket)
        self.servers.append(server)
        server.start()
        return server

    def start_db(self, role: str = "db") -> PgServer:
        """PostgreSQL on ``role``'s address (trust auth for the topology's addresses); ``dsn`` reaches it from the
        other hosts."""
        server = _HostPg(self.hosts[role])
        self.servers.append(server)
        server.start()
        return server

    # -- faults -----------------------------------------------------------------------------------------------------

    def kill_host(self, ref: HostRef, *, seconds: float | None = None, silent: bool = True) -> Fault:
        """A lost host: its link down, then kill -9 every process of it, so that nothing it sends gets out (a power
        loss: its peers learn of it by their timeouts only). ``silent=False`` kills first: the host's kernel closes
        the dead processes' connections (FIN/RST reach the peers) before the link goes down, as when only its
        processes crash. Healing brings the link up again (the processes stay dead: restart what the test needs)."""
        host = self.host(ref)
        link = ["ip", "-n", host.netns, "link", "set", host.link, "down"]
        if silent:
            _cmd(link)
        _kill_all(host.netns)
        if not silent:
            _cmd(link)

        def undo() -> None:
            _cmd(["ip", "-n", host.netns, "link", "set", host.link, "up"])

        return self._fault(f"host {host.role} killed, link down", undo, seconds)

    def cut(self, a: HostRef, b: HostRef, *, one_way: bool = False, seconds: float | None = None) -> Fault:
        """Drop every packet from ``a`` to ``b`` and, unless ``one_way``, from ``b`` to ``a``: dropped on arrival,
        so the sender sees silence (timeouts), never an error. A cut wins over a delay on the same pair."""
        ha, hb = self.host(a), self.host(b)
        pairs = [(ha, hb)] if one_way else [(ha, hb), (hb, ha)]
        rules = [(dst, ["-s", src.address], ["DROP"]) for src, dst in pairs]
        undo = self._add_rules(rules, first=True)
        arrow = "->" if one_way else "<->"
        return self._fault(f"cut {ha.role} {arrow} {hb.role}", undo, seconds)

    def netem(self, a: HostRef, b: HostRef, *, delay_ms: float = 0.0, loss_pct: float = 0.0, one_way: bool = False,
              seconds: float | None = None) -> Fault:
        """Delay and lose packets from ``a`` to ``b`` and, unless ``one_way``, from ``b`` to ``a``: each direction
        gets ``delay_ms`` (a round trip takes twice that) and ``loss_pct`` percent loss."""
        if delay_ms < 0 or not 0 <= loss_pct <= 100 or (delay_ms == 0 and loss_pct == 0):
            raise HostsError(f"Expected delay_ms >= 0 and 0 <= loss_pct <= 100, not both 0; found {delay_ms}, "
                             f"{loss_pct}")
        ha, hb = self.host(a), self.host(b)
        pairs = [(ha, hb)] if one_way else [(ha, hb), (hb, ha)]
        rules: list[tuple[Host, list[str], list[str]]] = []
        delays: list[NfqDelay] = []
        try:
            for src, dst in pairs:
                if loss_pct > 0:
                    rules.append((dst, ["-s", src.address, "-m", "statistic", "--mode", "random", "--probability",
                                        f"{loss_pct / 100:.6f}"], ["DROP"]))
                if delay_ms > 0:
                    queue = self._next_queue
                    self._next_queue += 1
                    delay = NfqDelay(queue, delay_ms / 1000, functools.partial(enter_namespace, dst.netns_path))
                    delay.start()
                    delays.append(delay)
                    self._delays.append(delay)
                    rules.append((dst, ["-s", src.address], ["NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]))
            undo_rules = self._add_rules(rules, first=False)
        except BaseException:
            for delay in delays:
                delay.close()
            raise

        def undo() -> None:
            try:
                undo_rules()
            finally:
                for delay in delays:
                    delay.close()

        arrow = "->" if one_way else "<->"
        return self._fault(f"netem {ha.role} {arrow} {hb.role}: {delay_ms:g} ms, {loss_pct:g}% loss", undo, seconds)

    def pause(self, ref: HostRef, *, seconds: float | None = None) -> Fault:
        """SIGSTOP every process of the host (a GC-like stall: sockets stay open, nothing answers) and return once
        all are stopped; healing sends SIGCONT to the same processes."""
        host = self.host(ref)
        stopped = host.pids()
        _signal(stopped, signal.SIGSTOP)
        _wait_stopped(stopped)
        return self._fault(f"host {host.role} paused ({len(stopped)} processes)",
                           lambda: _signal(stopped, signal.SIGCONT), seconds)

    def _fault(self, description: str, undo: Callable[[], None], seconds: float | None) -> Fault:
        fault = Fault(description, undo, seconds, self)
        self._faults.add(fault)
        return fault

    def _add_rules(self, rules: list[tuple[Host, list[str], list[str]]], *, first: bool) -> Callable[[], None]:
        """Add iptables rules (host, match, target) to the INPUT chain of their hosts, each tagged with a comment
        (cuts ``first``, before any delay's NFQUEUE whose ACCEPT would end the chain); returns what removes them."""
        added: list[tuple[Host, list[str]]] = []
        tag = f"{self.name}-r{self._next_rule}"
        self._next_rule += 1

        def remove() -> None:
            for host, spec in reversed(added):
                _cmd(host.wrap(["iptables", "-w", "-D", "INPUT", *spec]), check=False)

        try:
            for host, match, target in rules:
                spec = [*match, "-m", "comment", "--comment", tag, "-j", *target]
                position = ["-I", "INPUT", "1"] if first else ["-A", "INPUT"]
                _cmd(host.wrap(["iptables", "-w", *position, *spec]))
                added.append((host, spec))
        except BaseException:
            remove()
            raise
        return remove


class _HostS3(EmbeddedS3):
    """EmbeddedS3 run inside ``host`` on its address; probed from inside too."""

    def __init__(self, host: Host, workdir: Path) -> None:
        super().__init__(workdir=workdir, host=host.address)
        self.test_host = host

    def _command(self) -> tuple[list[str], dict[str, str]]:
        args, env = super()._command()
        return self.test_host.wrap(args), env

    def _ready(self) -> bool:
        return self.test_host.call(super()._ready)


class _HostKafka(EmbeddedKafka):
    """EmbeddedKafka run inside ``host``, listening on and advertising its address; probed from inside too."""

    def __init__(self, host: Host, workdir: Path, s3: EmbeddedS3 | None, bucket: str) -> None:
        super().__init__(s3=s3, bucket=bucket, workdir=workdir, host=host.address)
        self.test_host = host

    def _command(self) -> tuple[list[str], dict[str, str]]:
        args, env = self.test_host.call(super()._command)  # creates its bucket on the store: from the kafka host
        return self.test_host.wrap(args), env

    def _ready(self) -> bool:
        return self.test_host.call(super()._ready)


#: PostgreSQL's bound on a session that holds a transaction open and sends nothing, on the test hosts.
IDLE_IN_TRANSACTION = "10s"


class _HostPg(PgServer):
    """PgServer (tests/support/pgserver.py) run inside ``host``, listening on its address only."""

    def __init__(self, host: Host) -> None:
        super().__init__()
        self.test_host = host

    @property
    def dsn(self) -> str:
        return f"host={self.test_host.address} port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def _initdb(self) -> None:
        super()._initdb()
        (self.data / "pg_hba.conf").write_text(f"host all all {SUBNET} trust\nlocal all all trust\n")

    def _command(self) -> tuple[list[str], dict[str, str]]:
        args, env = super()._command()
        args = [f"listen_addresses={self.test_host.address}" if a.startswith("listen_addresses=") else a
                for a in args]
        # The bound docs/sink-ledger.md recommends on a lost driver's locks: a session of a paused or dead host that
        # holds a transaction open is ended after this (scenario 5's ledger variant pauses one there).
        args += ["-c", f"idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION}"]
        return self.test_host.wrap(args), env

    def _ready(self) -> bool:
        return self.test_host.call(super()._ready)

    def _describe(self) -> str:
        return f"{self.test_host.address}:{self.port} in {self.test_host.netns}, data {self.data}"


# -- checks and cleanup -----------------------------------------------------------------------------------------------

def _preflight() -> None:
    if os.geteuid() != 0:
        raise HostsError("Expected to run as root (network namespaces, veth pairs, iptables), found uid "
                         f"{os.geteuid()}. Run the tests as root.")
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        raise HostsError(f"Expected {', '.join(missing)} on PATH, found none. Run scripts/bootstrap as root "
                         "(apt-get install iproute2 iptables).")


def available() -> str | None:
    """None if topologies can be made here, else why not (for a test's skip)."""
    try:
        _preflight()
    except HostsError as err:
        return str(err)
    return None


def _check_range_free() -> None:
    """Refuse when the root namespace has an address or a route (other than the default) in ``SUBNET``."""
    clashes = []
    for iface in json.loads(_cmd(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for addr in iface.get("addr_info", []):
            net = ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False)
            if net.overlaps(SUBNET):
                clashes.append(f"address {addr['local']}/{addr['prefixlen']} on {iface['ifname']}")
    for route in json.loads(_cmd(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst", "default")
        if dst == "default":
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(dst, strict=False).overlaps(SUBNET):
                clashes.append(f"route {dst} dev {route.get('dev', '?')}")
    if clashes:
        raise HostsError(f"Expected no address or route in {SUBNET} in the root namespace (the test hosts use it), "
                         f"found {'; '.join(clashes)}. Free the range or change SUBNET in tests/support/hosts.py.")


def netns_names() -> list[str]:
    """The named network namespaces (`ip netns list`, whose lines may end in "(id: N)")."""
    return [line.split()[0] for line in _cmd(["ip", "netns", "list"]).splitlines() if line.strip()]


def _root_links() -> list[str]:
    return [link["ifname"] for link in json.loads(_cmd(["ip", "-j", "link", "show"]) or "[]")]


def _owner_alive(run_id: str) -> bool:
    try:
        record = json.loads((RECORD_DIR / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(record.get("start")) and _start_ticks(int(record["pid"])) == record["start"]


def _remove_run(run_id: str, namespaces: Iterable[str]) -> None:
    """Kill every process in the run's namespaces, delete them, its root-namespace links, work dir and record."""
    for netns in namespaces:
        try:
            _kill_all(netns)
        except HostsError:
            log.exception("Cannot empty namespace %s", netns)
        if (NETNS_DIR / netns).exists():
            _cmd(["ip", "netns", "delete", netns], check=False)
    for link in _root_links():  # none is made there; one would be a crashed older harness's
        if link.startswith(f"{PREFIX}-{run_id}-"):
            _cmd(["ip", "link", "delete", link], check=False)
    shutil.rmtree(WORK_ROOT / f"{PREFIX}-{run_id}", ignore_errors=True)
    (RECORD_DIR / f"{run_id}.json").unlink(missing_ok=True)


def cleanup_leftovers(*, everything: bool = False) -> list[str]:
    """Remove the namespaces, links, processes and work dirs of runs whose owner process is gone (all runs with
    ``everything``); returns the run ids removed."""
    by_run: dict[str, set[str]] = {}
    for name in netns_names():
        if match := _RUN_ID.match(name):
            by_run.setdefault(match[1], set()).add(name)
    for link in _root_links():
        if match := _RUN_ID.match(link):
            by_run.setdefault(match[1], set())
    for path in [*RECORD_DIR.glob("*.json"), *WORK_ROOT.glob(f"{PREFIX}-*")]:  # glob of a missing dir: nothing
        if match := re.fullmatch(rf"(?:{PREFIX}-)?([0-9a-f]{{4}})(?:\.json)?", path.name):
            by_run.setdefault(match[1], set())
    removed = []
    for run_id, namespaces in sorted(by_run.items()):
        if everything or not _owner_alive(run_id):
            log.warning("removing leftovers of topology run %s: %s", run_id, sorted(namespaces) or "no namespace")
            _remove_run(run_id, sorted(namespaces))
            removed.append(run_id)
    return removed


@atexit.register
def _close_open() -> None:
    for topology in list(_open):
        try:
            topology.close()
        except Exception:  # best effort at exit: keep closing the others
            log.exception("Cannot close topology %s at exit", topology.name)


@contextlib.contextmanager
def topology(roles: Iterable[str] = ROLES) -> Iterator[Topology]:
    """``with topology([...]) as topo``: the same as ``with Topology([...])``."""
    with Topology(roles) as topo:
        yield topo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.hosts", description=__doc__.splitlines()[0])
    parser.add_argument("--cleanup", action="store_true", help="remove leftovers of runs whose owner is gone")
    parser.add_argument("--all", action="store_true", help="with --cleanup: also the topologies of live runs")
    parser.add_argument("--list", action="store_true", help="list the namespaces of test hosts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cleanup:
        removed = cleanup_leftovers(everything=args.all)
        sys.stdout.write(f"removed {len(removed)} run(s): {' '.join(removed)}\n")
    if args.list or not args.cleanup:
        names = [n for n in netns_names() if n.startswith(f"{PREFIX}-")]
        sys.stdout.write("".join(f"{n}\n" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
