"""An ``aws_conn_id`` on the job store connection resolves through the Amazon provider's AwsBaseHook, against real
SeaweedFS. The provider (the 'aws' extra) is in requirements.lock: imported, never skipped."""

from __future__ import annotations

import json
from pathlib import Path

import airflow.providers.amazon.aws.hooks.base_aws  # noqa: F401  # in the lock ('aws' extra): fails, never skips
import pytest

from airflow_ckpt_provider.embedded import EmbeddedS3
from airflow_ckpt_provider.hooks.job_store import JobStoreHook

pytestmark = pytest.mark.integration


def test_an_aws_connection_with_a_profile_reaches_the_store(s3_server: EmbeddedS3, bucket: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The aws connection names only a profile (no keys): AwsBaseHook's session reads it from the shared credentials
    file, which the connection-keys path would never see (the profile is not the default one)."""
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[seaweed]\naws_access_key_id = {s3_server.access_key}\n"
                           f"aws_secret_access_key = {s3_server.secret_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_SEAWEED", json.dumps({"conn_type": "aws", "extra": {
        "profile_name": "seaweed", "endpoint_url": s3_server.endpoint_url, "region_name": s3_server.region}}))
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT", json.dumps({"conn_type": "ckpt_store", "extra": {
        "store_url": f"s3://{bucket}/jobs", "aws_conn_id": "aws_seaweed"}}))

    hook = JobStoreHook()
    options = hook.s3_options
    assert (options.endpoint_url, options.region, options.access_key_id, options.secret_access_key,
            options.session_token) == (s3_server.endpoint_url, s3_server.region, s3_server.access_key,
                                       s3_server.secret_key, None)
    assert hook.test_connection() == (True, f"job store s3://{bucket}/jobs is reachable")
    hook.storage().write("probe.txt", b"through the Amazon provider")
    stored = s3_server.client().get_object(Bucket=bucket, Key="jobs/probe.txt")["Body"].read()
    assert stored == b"through the Amazon provider"
