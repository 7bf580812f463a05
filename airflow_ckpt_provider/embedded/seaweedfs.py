"""SeaweedFS as an embedded S3 server on 127.0.0.1 (``weed server -s3``), with a fresh access key."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ckpt_provider.embedded.process import (
    GRPC_OFFSET,
    HOST,
    PORT_TAKEN,
    REGION,
    WEED_SOCKET_DIR,
    EmbeddedProcess,
    EmbeddedServiceError,
    child_env,
    find_binary,
    free_ports_with_grpc,
    port_accepts,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)


#: The services of `weed mini` that listen, each on a port of its own (and gRPC on port + 10000).
PORT_ROLES = ("master", "volume", "filer", "s3", "admin")


class EmbeddedS3(EmbeddedProcess):
    """SeaweedFS `weed mini`: an S3 gateway with on-disk data and one random admin identity."""

    name = "seaweedfs"
    #: weed exits with "Port allocation failed" when a port it was given is taken, or its services cannot reach each
    #: other (one of them reached another process's port) and it never gets ready.
    _port_taken = re.compile(rf"{PORT_TAKEN.pattern}|Port allocation failed|to be ready within")

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        binary: str | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        host: str = HOST,
    ) -> None:
        super().__init__(workdir, start_timeout, stop_timeout)
        self.host = host  # the address every service binds and advertises (a test host's, tests/support/hosts.py)
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
        return f"http://{self.host}:{self.port}"

    def _fresh_ports(self) -> str:
        gave_up, self.ports = str(self.ports), {}  # the next _command picks new ones; the data dir is kept
        return gave_up

    def _command(self) -> tuple[list[str], dict[str, str]]:
        binary = self._binary or find_binary("weed")
        if not self.ports:
            self.ports = dict(zip(PORT_ROLES, free_ports_with_grpc(len(PORT_ROLES)), strict=True))
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
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
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
        return args, child_env(("WEED_", "S3_"), {})

    def _kill_process(self, proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
        super()._kill_process(proc, sig, timeout)
        # weed hardcodes /tmp/seaweedfs-<role>-grpc-<port>.sock and leaves them behind on SIGKILL.
        for port in self.ports.values():
            for path in WEED_SOCKET_DIR.glob(f"seaweedfs-*-grpc-{port + GRPC_OFFSET}.sock"):
                path.unlink(missing_ok=True)

    def _ready(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        if not port_accepts(self.port, self.host):
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
        return f"{self.endpoint_url} ({ports}, gRPC +{GRPC_OFFSET}) data={self.data_dir}"

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


