"""The test hosts of tests/support/hosts.py: namespaces that reach each other and nothing else, each fault made and
undone, the servers on their hosts used from another host, and nothing left behind (issue 41)."""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import hosts
from tests.support.hosts import Host, Topology

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

REPO = Path(__file__).resolve().parents[2]
PORT = 7000  # every host has its own ports: one fixed port is free on each
ECHO = """
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(16)
def serve(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {what} within {timeout:.0f} s")
        time.sleep(0.05)


def echo_server(host: Host) -> subprocess.Popen[bytes]:
    return host.popen([sys.executable, "-c", ECHO, host.address, str(PORT)])


def exchange(client: Host, server: Host, payload: bytes, timeout: float = 2.0) -> bytes:
    """Connect from ``client`` to the echo server of ``server``, send ``payload``, return what came back."""

    def go() -> bytes:
        with socket.create_connection((server.address, PORT), timeout=timeout) as conn:
            conn.sendall(payload)
            return conn.recv(4096)

    return client.call(go)


def reaches(client: Host, server: Host) -> bool:
    token = secrets.token_bytes(8)
    try:
        return exchange(client, server, token, timeout=1.0) == token
    except OSError:
        return False


def udp_received(src: Host, dst: Host, count: int = 20) -> int:
    """Datagrams of ``count`` sent from ``src`` that ``dst`` received (a one-way probe: no answer needed)."""
    rx = dst.call(socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
    tx = src.call(socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((dst.address, 0))
        target = rx.getsockname()
        token = secrets.token_bytes(8)
        for i in range(count):
            tx.sendto(token + i.to_bytes(4, "big"), target)
        rx.settimeout(1.0)
        seen: set[bytes] = set()
        try:
            while len(seen) < count:
                data = rx.recv(64)
                if data[:8] == token:
                    seen.add(data[8:])
        except TimeoutError:
            pass
        return len(seen)


def alive(pid: int) -> bool:
    """Running or stopped; False once gone or a zombie (dead, waiting for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_nothing_left(topo: Topology, pids: Sequence[int] = ()) -> None:
    assert topo.leftovers() == {"namespaces": [], "links": [], "processes": []}
    assert not [n for n in hosts.netns_names() if n.startswith(f"{topo.name}-")]
    wait_until(lambda: not [p for p in pids if alive(p)], 10, f"no process left of {list(pids)}")
    assert not (hosts.RECORD_DIR / f"{topo.run_id}.json").exists()
    assert not topo.workdir.exists()


@pytest.fixture
def pair() -> Iterator[Topology]:
    """launcher and driver, an echo server on each; checked empty after."""
    with Topology(["launcher", "driver"]) as topo:
        for host in topo.hosts.values():
            echo_server(host)
        for client, server in (("launcher", "driver"), ("driver", "launcher")):
            wait_until(functools.partial(reaches, topo[client], topo[server]), 15, f"{server}'s echo server")
        yield topo
    assert_nothing_left(topo)


@pytest.mark.timeout(60)
def test_hosts_reach_each_other_and_the_root_namespace_does_not(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    token = secrets.token_bytes(16)
    assert exchange(launcher, driver, token) == token
    assert exchange(driver, launcher, token) == token
    assert launcher.address != driver.address
    # No address, link or route of ours in the root namespace: its packets to a test host go to its default route
    # (here a gateway that may answer anything itself), never to our echo server.
    route = subprocess.run(["ip", "-j", "route", "get", driver.address], capture_output=True, text=True, check=False)
    assert not route.stdout or not json.loads(route.stdout)[0].get("dev", "").startswith(hosts.PREFIX)
    assert not [link for link in hosts._root_links() if link.startswith(hosts.PREFIX)]
    try:
        with socket.create_connection((driver.address, PORT), timeout=1.5) as conn:
            conn.sendall(token)
            conn.settimeout(1.5)
            answer = conn.recv(4096)
    except OSError:
        answer = b""
    assert answer != token


@pytest.mark.timeout(60)
def test_cut_drops_both_ways_and_heals(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    with pair.cut("launcher", "driver") as fault:
        assert not reaches(launcher, driver)
        assert not reaches(driver, launcher)
        assert udp_received(launcher, driver) == 0
        assert udp_received(driver, launcher) == 0
    assert not fault.active
    assert reaches(launcher, driver) and reaches(driver, launcher)
    assert udp_received(launcher, driver) == 20 and udp_received(driver, launcher) == 20


@pytest.mark.timeout(60)
def test_one_way_cut_drops_one_direction_only(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    with pair.cut(launcher, driver, one_way=True):
        assert udp_received(launcher, driver) == 0
        assert udp_received(driver, launcher) == 20
        assert not reaches(launcher, driver)  # TCP needs both directions
    assert udp_received(launcher, driver) == 20


@pytest.mark.timeout(60)
def test_timed_cut_heals_by_itself(pair: Topology) -> None:
    fault = pair.cut("launcher", "driver", seconds=1.0)
    assert not reaches(pair["launcher"], pair["driver"])
    assert fault.wait(10)
    assert fault.healed_after is not None and fault.healed_after >= 1.0
    assert reaches(pair["launcher"], pair["driver"])


@pytest.mark.timeout(60)
def test_netem_delay_is_a_lower_bound_on_connect_and_round_trip(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    delay = 0.15

    def timed() -> tuple[float, float]:
        started = time.monotonic()
        with socket.create_connection((driver.address, PORT), timeout=5) as conn:
            connected = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            return connected - started, time.monotonic() - connected

    with pair.netem(launcher, driver, delay_ms=delay * 1000):
        connect, round_trip = launcher.call(timed)
    # SYN out and SYN-ACK back each wait `delay`; so do the request and its echo.
    assert connect >= 2 * delay
    assert round_trip >= 2 * delay


@pytest.mark.timeout(60)
def test_netem_loss_drops_some_datagrams(pair: Topology) -> None:
    with pair.netem("launcher", "driver", loss_pct=50, one_way=True):
        received = udp_received(pair["launcher"], pair["driver"], count=200)
    assert 0 < received < 200  # P(200 of 200 at 50% loss) = 2**-200
    assert udp_received(pair["launcher"], pair["driver"], count=200) == 200


@pytest.mark.timeout(60)
def test_pause_stops_a_server_and_resumes_it(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    conn = launcher.call(socket.create_connection, (driver.address, PORT), 5)
    with conn:
        fault = pair.pause(driver, seconds=2.0)
        states = {pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in driver.pids()}
        assert states and set(states.values()) == {"T"}
        conn.sendall(b"ping")
        conn.settimeout(1.0)
        with pytest.raises(TimeoutError):
            conn.recv(4)  # the kernel took the bytes, the stopped server does not answer
        conn.settimeout(15)
        assert conn.recv(4) == b"ping"  # answered once the pause ended by itself
        assert fault.healed_after is not None and fault.healed_after >= 2.0
    assert reaches(launcher, driver)


@pytest.mark.timeout(60)
def test_kill_host_leaves_no_process_and_heals_the_link(pair: Topology) -> None:
    launcher, driver = pair["launcher"], pair["driver"]
    sleeper = driver.popen(["sleep", "600"])
    wait_until(lambda: sleeper.pid in driver.pids(), 10, "sleep inside the driver host")  # once `ip` entered it
    with pair.kill_host(driver):
        assert driver.pids() == []
        assert sleeper.wait(10) == -signal.SIGKILL
        link = driver.run(["ip", "-j", "link", "show", "dev", pair.hosts["driver"].link])
        assert json.loads(link.stdout)[0]["operstate"] == "DOWN"
        assert not reaches(launcher, driver)
    echo_server(driver)  # the host is back, empty: the test restarts what it needs
    wait_until(lambda: reaches(launcher, driver), 15, "a new echo server on the driver host")


def listeners(host: Host) -> set[str]:
    out = host.run(["ss", "-ltnH"]).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


CLIENT = """
import json, os, sys
import boto3, psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
step, bucket, topic = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], config=boto3.session.Config(
    s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=10, retries={"total_max_attempts": 2}))
bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
if step == "write":
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="from/launcher", Body=b"hello from the launcher")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce(topic, key=b"k", value=b"record from the launcher")
    assert producer.flush(30) == 0
body = s3.get_object(Bucket=bucket, Key="from/launcher")["Body"].read().decode()
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
consumer.assign([TopicPartition(topic, 0, 0)])
records = []
while not records:
    msg = consumer.poll(20)
    assert msg is not None, "no record within 20 s"
    assert msg.error() is None, msg.error()
    records.append(msg.value().decode())
consumer.close()
with psycopg.connect(os.environ["PG_DSN"]) as db:
    server = db.execute("select host(inet_server_addr())").fetchone()[0]
print(json.dumps({"object": body, "records": records, "db": server}))
"""


@pytest.mark.timeout(180)
def test_servers_on_their_hosts_serve_a_client_on_the_launcher() -> None:
    with Topology(["store", "kafka", "db", "launcher"]) as topo:
        s3 = topo.start_store()
        kafka = topo.start_kafka()
        pg = topo.start_db()
        assert s3.endpoint_url.startswith(f"http://{topo['store'].address}:")
        assert kafka.bootstrap_servers.startswith(f"{topo['kafka'].address}:")
        topo["kafka"].call(kafka.create_topic, "t")
        # Every listener on the host's address or its own namespace's loopback, none on 0.0.0.0 / [::].
        for role in ("store", "kafka", "db"):
            assert listeners(topo[role]) <= {topo[role].address, "127.0.0.1"}, role
        env = {**os.environ, **s3.env(), "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "PG_DSN": pg.dsn,
               "PYTHONPATH": str(REPO)}

        def client(step: str) -> dict[str, object]:
            done = topo["launcher"].run([sys.executable, "-c", CLIENT, step, "hosts-test", "t"], env=env, check=False,
                                        timeout=90)
            assert done.returncode == 0, done.stderr[-3000:]
            return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]

        expected = {"object": "hello from the launcher", "records": ["record from the launcher"],
                    "db": topo["db"].address}
        assert client("write") == expected
        # tansu keeps its log on the store host's S3: the kafka host killed and its broker restarted, the record is
        # still there.
        server_pids = topo["kafka"].pids()
        with topo.kill_host("kafka"):
            assert topo["kafka"].pids() == []
        kafka.start()
        assert not set(server_pids) & set(topo["kafka"].pids())
        assert client("read") == expected
        pids = [p for role in topo.hosts for p in topo[role].pids()]
        assert pids
    assert_nothing_left(topo, pids)


@pytest.mark.timeout(60)
def test_nothing_left_after_an_exception_in_the_block() -> None:
    made: dict[str, Any] = {}

    def fail_inside() -> None:
        with Topology(["launcher", "driver"]) as topo:
            made["topo"] = topo
            made["sleeper"] = topo["driver"].popen(["sleep", "600"])
            assert topo.pause("driver").active  # faults still on at the end
            topo.cut("launcher", "driver")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert made["sleeper"].wait(10) == -signal.SIGKILL
    assert_nothing_left(made["topo"], [made["sleeper"].pid])


CRASH = """
import os, signal, subprocess
from tests.support.hosts import Topology
topo = Topology(["launcher", "driver"]).start()
sleeper = topo["driver"].popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(topo.run_id, sleeper.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: what a killed test run leaves
"""


@pytest.mark.timeout(60)
def test_cleanup_removes_what_a_killed_run_left() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    crashed = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, env=env, timeout=30,
                             check=False, cwd=REPO)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    run_id, pid = crashed.stdout.split()
    left = [n for n in hosts.netns_names() if n.startswith(f"{hosts.PREFIX}-{run_id}-")]
    assert len(left) == 3 and alive(int(pid))
    done = subprocess.run([sys.executable, "-m", "tests.support.hosts", "--cleanup"], capture_output=True,
                          text=True, env=env, timeout=30, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run_id in done.stdout
    assert not [n for n in hosts.netns_names() if n.startswith(f"{hosts.PREFIX}-{run_id}-")]
    wait_until(lambda: not alive(int(pid)), 10, f"the crashed run's sleep (pid {pid}) gone")
    assert not (hosts.RECORD_DIR / f"{run_id}.json").exists()
    assert not (hosts.WORK_ROOT / f"{hosts.PREFIX}-{run_id}").exists()
