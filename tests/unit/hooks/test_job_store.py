"""JobStoreHook's S3 options from an ``aws_conn_id``: through the Amazon provider's AwsBaseHook when it is importable
(here a fake of it; tests/integration/test_aws_connection.py uses the real one), else the connection's keys."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import NoCredentialsError

from airflow_ckpt_provider.core.errors import CredentialsError
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.hooks.job_store import JobStoreHook, _Credentials, options_from_aws_hook

PROVIDER = "airflow.providers.amazon.aws.hooks.base_aws"


@dataclass
class FakeConfig:
    endpoints: dict[str, str] = field(default_factory=dict)
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    profile_name: str | None = None
    role_arn: str | None = None
    assume_role_method: str | None = None
    assume_role_kwargs: dict[str, Any] = field(default_factory=dict)

    def get_service_endpoint_url(self, service_name: str) -> str | None:
        return self.endpoints.get(service_name)


class FakeAwsHook:
    """AwsBaseHook as options_from_aws_hook reads it: what its session resolved (e.g. an assumed role's keys)."""

    made: list[dict[str, Any]] = []  # noqa: RUF012 -- the constructor calls of one test, reset by the fixture

    def __init__(self, credentials: _Credentials | Exception | None = None, config: FakeConfig | None = None,
                 **kwargs: Any) -> None:
        FakeAwsHook.made.append(kwargs)
        self.credentials = credentials or _Credentials("ASIA-ROLE", "role-secret", "role-token")
        self.conn_config = config or FakeConfig({"s3": "http://aws-endpoint:8333"}, "eu-west-1")

    def get_credentials(self) -> _Credentials:
        if isinstance(self.credentials, Exception):
            raise self.credentials
        return self.credentials


def test_the_hooks_credentials_endpoint_and_region_become_the_s3_options() -> None:
    options = options_from_aws_hook(FakeAwsHook(), "aws_x", endpoint_url="http://store-host:1", region="us-east-1")
    assert options == S3Options(endpoint_url="http://aws-endpoint:8333", region="eu-west-1", access_key_id="ASIA-ROLE",
                                secret_access_key="role-secret", session_token="role-token")


def test_without_an_endpoint_or_region_the_store_connections_count() -> None:
    hook = FakeAwsHook(_Credentials("AKIA", "secret", ""), FakeConfig())  # keys without a session token
    options = options_from_aws_hook(hook, "aws_x", endpoint_url="http://store-host:1", region="us-east-1")
    assert options == S3Options(endpoint_url="http://store-host:1", region="us-east-1", access_key_id="AKIA",
                                secret_access_key="secret", session_token=None)


def test_a_role_assumed_with_the_connections_keys_is_passed_on_to_be_refreshed_not_frozen() -> None:
    """The role's credentials expire; the options carry the role and its source keys, so every process that opens
    the store (a job's supervisor and driver) assumes it again before they do (core/store/s3.py)."""
    config = FakeConfig({"s3": "http://aws-endpoint:8333", "sts": "http://sts:1"}, "eu-west-1", "AKIA-SRC",
                        "src-secret", role_arn="arn:aws:iam::1:role/ckpt", assume_role_method="assume_role",
                        assume_role_kwargs={"ExternalId": "x-1", "DurationSeconds": 7200})
    hook = FakeAwsHook(NoCredentialsError(), config)  # never asked: nothing is frozen
    options = options_from_aws_hook(hook, "aws_x", endpoint_url=None, region=None)
    assert options == S3Options(endpoint_url="http://aws-endpoint:8333", region="eu-west-1", access_key_id="AKIA-SRC",
                                secret_access_key="src-secret", role_arn="arn:aws:iam::1:role/ckpt",
                                role_external_id="x-1", role_duration_s=7200, sts_endpoint_url="http://sts:1")
    env = options.env()
    assert (env["CKPT_S3_ROLE_ARN"], env["CKPT_S3_ROLE_EXTERNAL_ID"], env["CKPT_S3_ROLE_DURATION_S"]) == (
        "arn:aws:iam::1:role/ckpt", "x-1", "7200")


def test_a_role_through_a_profile_is_frozen_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = FakeConfig(region_name="eu-west-1", profile_name="p", role_arn="arn:aws:iam::1:role/ckpt")
    options = options_from_aws_hook(FakeAwsHook(config=config), "aws_x", endpoint_url=None, region=None)
    assert (options.role_arn, options.access_key_id) == (None, "ASIA-ROLE")
    assert "not renewed" in caplog.text


@pytest.mark.parametrize("error", [NoCredentialsError(), AttributeError("'NoneType' has no get_frozen_credentials")])
def test_no_usable_credentials_is_a_credentials_error_naming_the_connection(error: Exception) -> None:
    with pytest.raises(CredentialsError) as info:
        options_from_aws_hook(FakeAwsHook(error), "aws_x", endpoint_url=None, region=None)
    assert str(info.value).startswith(
        "AWS connection 'aws_x': expected credentials from its keys, role_arn, profile_name or the environment, "
        f"found none usable ({type(error).__name__}: ")
    assert str(info.value).endswith("check the connection's login, password and extra")


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job store connection on aws connection ``aws_x``, which has keys, a session token, endpoint and region."""
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORE_DEFAULT", json.dumps({
        "conn_type": "ckpt_store", "host": "http://store-host:1",
        "extra": {"store_url": "s3://b/jobs", "aws_conn_id": "aws_x", "region_name": "us-east-1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_X", json.dumps({
        "conn_type": "aws", "login": "AKIA-KEYS", "password": "keys-secret",
        "extra": {"aws_session_token": "keys-token", "endpoint_url": "http://keys-endpoint:2", "region_name": "r2"}}))
    FakeAwsHook.made = []


@pytest.mark.usefixtures("connections")
def test_with_the_amazon_provider_the_aws_connection_goes_through_its_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, PROVIDER, types.SimpleNamespace(AwsBaseHook=FakeAwsHook))
    assert JobStoreHook().s3_options == S3Options(
        endpoint_url="http://aws-endpoint:8333", region="eu-west-1", access_key_id="ASIA-ROLE",
        secret_access_key="role-secret", session_token="role-token")
    assert FakeAwsHook.made == [{"aws_conn_id": "aws_x", "client_type": "s3"}]


@pytest.mark.usefixtures("connections")
def test_without_the_amazon_provider_the_connections_keys_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, PROVIDER, None)  # import fails: not installed
    assert JobStoreHook().s3_options == S3Options(
        endpoint_url="http://keys-endpoint:2", region="r2", access_key_id="AKIA-KEYS",
        secret_access_key="keys-secret", session_token="keys-token")
    assert FakeAwsHook.made == []
