"""An assumed role's credentials refresh while a process runs (core/store/s3.py AssumedRole), against real SeaweedFS.

SeaweedFS has no STS: a fake one here answers AssumeRole with SeaweedFS's keys (no session token, which SeaweedFS
would take for its own) and an expiry a few seconds away, so a store used for ten seconds outlives several."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from airflow_ckpt_provider.core.errors import CredentialsError
from airflow_ckpt_provider.core.store.s3 import assumed_role
from airflow_ckpt_provider.core.store.storage import S3Options, open_storage
from airflow_ckpt_provider.embedded import EmbeddedS3
from airflow_ckpt_provider.hooks.job_store import JobStoreHook

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::123456789012:role/ckpt-store"
SOURCE_KEY = "AKIASOURCEKEY0001"


class FakeSts:
    """AssumeRole: ``answer(n)`` (n from 1) gives the n-th call's keys, or None for AccessDenied."""

    def __init__(self, answer: Callable[[int], tuple[str, str] | None], lifetime_s: float) -> None:
        self.answer, self.lifetime_s = answer, lifetime_s
        self.calls: list[dict[str, list[str]]] = []
        self.signed_with: list[str] = []
        sts = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                sts.calls.append(form)
                sts.signed_with.append(self.headers.get("Authorization", ""))
                keys = sts.answer(len(sts.calls))
                if keys is None:
                    self._send(403, "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
                                    "<Message>not allowed to assume it</Message></Error>"
                                    "<RequestId>1</RequestId></ErrorResponse>")
                    return
                expiry = (datetime.now(UTC) + timedelta(seconds=sts.lifetime_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                self._send(200, f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult><Credentials><AccessKeyId>{keys[0]}</AccessKeyId><SecretAccessKey>{keys[1]}</SecretAccessKey>
  <Expiration>{expiry}</Expiration></Credentials>
  <AssumedRoleUser><AssumedRoleId>AROA:x</AssumedRoleId><Arn>{ROLE}/x</Arn></AssumedRoleUser></AssumeRoleResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>""")

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake_sts() -> Iterator[list[FakeSts]]:
    made: list[FakeSts] = []
    yield made
    for sts in made:
        sts.server.shutdown()
        sts.server.server_close()


def role_options(s3: EmbeddedS3, sts: FakeSts) -> S3Options:
    return S3Options(endpoint_url=s3.endpoint_url, region=s3.region, access_key_id=SOURCE_KEY,
                     secret_access_key="source-secret", role_arn=ROLE, role_external_id="ext-1",
                     role_session_name="ckpt-test", sts_endpoint_url=sts.url)


def test_the_store_keeps_working_across_several_expiries(s3_server: EmbeddedS3, bucket: str,
                                                         fake_sts: list[FakeSts],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="airflow_ckpt_provider")
    sts = FakeSts(lambda n: (s3_server.access_key, s3_server.secret_key), lifetime_s=4)
    fake_sts.append(sts)
    opts = role_options(s3_server, sts)
    storage = open_storage(f"s3://{bucket}/jobs", opts)
    requests, deadline = 0, time.monotonic() + 10
    while time.monotonic() < deadline:
        storage.write(f"k{requests}", b"v%d" % requests)
        assert storage.read(f"k{requests}") == b"v%d" % requests
        requests += 1
        time.sleep(0.2)
    assert len(sts.calls) >= 3, f"{len(sts.calls)} AssumeRole calls in 10 s of credentials that last 4 s"
    role = assumed_role(opts)
    assert role is not None and role.refreshes == len(sts.calls)
    first = sts.calls[0]
    assert (first["Action"], first["RoleArn"], first["ExternalId"], first["RoleSessionName"]) == (
        ["AssumeRole"], [ROLE], ["ext-1"], ["ckpt-test"])
    assert all(f"Credential={SOURCE_KEY}/" in auth for auth in sts.signed_with)  # assumed with the source keys
    assert "refresh 3" in caplog.text and s3_server.secret_key not in caplog.text


def test_wrong_keys_from_a_refresh_are_a_refusal_naming_it(s3_server: EmbeddedS3, bucket: str,
                                                            fake_sts: list[FakeSts]) -> None:
    sts = FakeSts(lambda n: (s3_server.access_key, s3_server.secret_key) if n == 1 else ("AKIAWRONG0000", "bad"),
                  lifetime_s=3)
    fake_sts.append(sts)
    storage = open_storage(f"s3://{bucket}/jobs", role_options(s3_server, sts))
    storage.write("before", b"1")
    time.sleep(3.2)
    with pytest.raises(CredentialsError) as info:
        storage.write("after", b"2")
    message = str(info.value)
    assert f"temporary credentials of role {ROLE}, access key id AKIA… from its refresh 2 at" in message, message
    assert "bad" not in message


def test_sts_refusing_the_role_at_a_refresh_is_a_refusal(s3_server: EmbeddedS3, bucket: str,
                                                         fake_sts: list[FakeSts]) -> None:
    sts = FakeSts(lambda n: (s3_server.access_key, s3_server.secret_key) if n == 1 else None, lifetime_s=3)
    fake_sts.append(sts)
    storage = open_storage(f"s3://{bucket}/jobs", role_options(s3_server, sts))
    storage.write("before", b"1")
    time.sleep(3.2)
    with pytest.raises(CredentialsError) as info:
        storage.read("before")
    assert f"refreshing the credentials of role {ROLE} (refresh 2): {sts.url} refused AssumeRole (AccessDenied: " \
           "not allowed to assume it)" in str(info.value)


def test_a_process_given_the_role_in_its_environment_refreshes_it(s3_server: EmbeddedS3, bucket: str,
                                                                  fake_sts: list[FakeSts]) -> None:
    """What a job's supervisor and driver get from the launcher (credentials_env): the role as CKPT_S3_ROLE_*,
    read back by S3Options.from_env; the process uses the store across several expiries."""
    sts = FakeSts(lambda n: (s3_server.access_key, s3_server.secret_key), lifetime_s=4)
    fake_sts.append(sts)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CKPT_S3_"))}
    env.update(role_options(s3_server, sts).env())
    program = textwrap.dedent(f"""
        import time
        from airflow_ckpt_provider.core.store.storage import S3Options, open_storage
        storage = open_storage("s3://{bucket}/proc", S3Options.from_env())
        deadline, n = time.monotonic() + 9, 0
        while time.monotonic() < deadline:
            storage.write("k", str(n).encode()); assert storage.read("k") == str(n).encode(); n += 1
            time.sleep(0.3)
        print(n)
    """)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip()) > 10
    assert len(sts.calls) >= 3


def test_an_aws_connection_with_a_role_arn_gives_refreshing_options(s3_server: EmbeddedS3, bucket: str,
                                                                    fake_sts: list[FakeSts],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Amazon provider's real AwsConnectionWrapper: role_arn, assume_role_kwargs and the STS endpoint of
    its service_config become the options' role (nothing assumed and frozen by the hook)."""
    sts = FakeSts(lambda n: (s3_server.access_key, s3_server.secret_key), lifetime_s=3600)
    fake_sts.append(sts)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_ROLE", json.dumps({
        "conn_type": "aws", "login": SOURCE_KEY, "password": "source-secret", "extra": {
            "role_arn": ROLE, "assume_role_kwargs": {"ExternalId": "ext-1", "DurationSeconds": 900},
            "region_name": s3_server.region, "service_config": {"s3": {"endpoint_url": s3_server.endpoint_url},
                                                                "sts": {"endpoint_url": sts.url}}}}))
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_ROLE", json.dumps({"conn_type": "ckpt_store", "extra": {
        "store_url": f"s3://{bucket}/jobs", "aws_conn_id": "aws_role"}}))
    hook = JobStoreHook("ckpt_store_role")
    assert hook.s3_options == S3Options(
        endpoint_url=s3_server.endpoint_url, region=s3_server.region, access_key_id=SOURCE_KEY,
        secret_access_key="source-secret", role_arn=ROLE, role_external_id="ext-1", role_duration_s=900,
        sts_endpoint_url=sts.url)
    assert sts.calls == []
    assert hook.test_connection() == (True, f"job store s3://{bucket}/jobs is reachable")
    assert [c["DurationSeconds"] for c in sts.calls] == [["900"]]
