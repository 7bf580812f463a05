"""JobStoreHook: the job store (S3 or local) described by an Airflow connection."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cached_property
from typing import Any, NamedTuple, Protocol

from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_ckpt_provider.core.errors import CkptError, ConfigError, CredentialsError
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, Storage
from airflow_ckpt_provider.core.store.storeconfig import StoreConfig, check_store

log = logging.getLogger(__name__)


class JobStoreHook(BaseHook):
    """Opens job stores; credentials come from this connection or from a referenced AWS connection."""

    conn_name_attr = "ckpt_store_conn_id"
    default_conn_name = "ckpt_store_default"
    conn_type = "ckpt_store"
    hook_name = "Checkpoint job store (S3 or local)"

    def __init__(self, ckpt_store_conn_id: str = default_conn_name, store_url: str | None = None) -> None:
        super().__init__()
        self.ckpt_store_conn_id = ckpt_store_conn_id
        self._store_url = store_url

    @cached_property
    def _conn(self) -> Connection | None:
        """The connection; None when it does not exist but ``store_url`` was given (credentials from the env)."""
        try:
            return self.get_connection(self.ckpt_store_conn_id)
        except AirflowNotFoundException:
            if self._store_url:
                return None
            raise

    @cached_property
    def _extra(self) -> dict[str, Any]:
        return dict(self._conn.extra_dejson) if self._conn else {}

    @property
    def store_url(self) -> str:
        url = self._store_url or self._extra.get("store_url")
        if not url:
            raise ConfigError(
                f"connection {self.ckpt_store_conn_id!r} has no store_url: set it to s3://BUCKET/PREFIX "
                "or a local directory, or pass store_url to the hook"
            )
        return str(url)

    @cached_property
    def s3_options(self) -> S3Options:
        conn = self._conn
        if conn is None:
            return S3Options.from_env()
        aws_conn_id = self._extra.get("aws_conn_id")
        if aws_conn_id:
            return self._aws_options(str(aws_conn_id), conn)
        return S3Options(
            endpoint_url=conn.host or None,
            region=self._extra.get("region_name"),
            access_key_id=conn.login or None,
            secret_access_key=conn.password or None,
            **role_options(self._extra),
        )

    def _aws_options(self, aws_conn_id: str, conn: Connection) -> S3Options:
        """An AWS connection's S3 options: through the Amazon provider's AwsBaseHook when it is installed (so
        role_arn, profile_name, web identity and the rest of its extra work as for Airflow's AWS operators), else
        its login, password and extra aws_session_token, endpoint_url and region_name only."""
        try:
            from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
        except ImportError:
            aws = self.get_connection(aws_conn_id)
            aws_extra = aws.extra_dejson
            return S3Options(
                endpoint_url=aws_extra.get("endpoint_url") or conn.host or None,
                region=aws_extra.get("region_name") or self._extra.get("region_name"),
                access_key_id=aws.login or None,
                secret_access_key=aws.password or None,
                session_token=aws_extra.get("aws_session_token"),
                **role_options(aws_extra),
            )
        return options_from_aws_hook(AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3"), aws_conn_id,
                                     endpoint_url=conn.host or None, region=self._extra.get("region_name"))

    @property
    def config(self) -> StoreConfig:
        """The store URL and S3 options (core/store/storeconfig.py, shared with the Dagster resource)."""
        return StoreConfig(self.store_url, self.s3_options)

    def storage(self) -> Storage:
        return self.config.storage()

    def job_store(self, job: str) -> JobStore:
        return self.config.job_store(job)

    def test_connection(self) -> tuple[bool, str]:
        """List the store root (one request): checks endpoint, credentials and bucket."""
        try:
            config = self.config
        except CkptError as err:
            return False, str(err)
        return check_store(config)


def role_options(extra: Mapping[str, Any]) -> dict[str, Any]:
    """S3Options' role fields from a connection's extra, named as an AWS connection names them: ``role_arn``,
    ``assume_role_kwargs`` (``ExternalId``, ``RoleSessionName``, ``DurationSeconds``) and ``sts_endpoint_url``."""
    if not extra.get("role_arn"):
        return {}
    kwargs = extra.get("assume_role_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"invalid assume_role_kwargs {kwargs!r}: expected an object such as "
                          '{"ExternalId": "...", "DurationSeconds": 3600}')
    duration = kwargs.get("DurationSeconds")
    return {"role_arn": str(extra["role_arn"]), "role_external_id": kwargs.get("ExternalId"),
            "role_session_name": kwargs.get("RoleSessionName"),
            "role_duration_s": int(duration) if duration is not None else None,
            "sts_endpoint_url": extra.get("sts_endpoint_url") or None}


class _Credentials(NamedTuple):
    """botocore's ReadOnlyCredentials."""

    access_key: str
    secret_key: str
    token: str | None


class _AwsConnectionConfig(Protocol):
    """What is read of the Amazon provider's AwsConnectionWrapper."""

    @property
    def region_name(self) -> str | None: ...

    @property
    def aws_access_key_id(self) -> str | None: ...

    @property
    def aws_secret_access_key(self) -> str | None: ...

    @property
    def aws_session_token(self) -> str | None: ...

    @property
    def profile_name(self) -> str | None: ...

    @property
    def role_arn(self) -> str | None: ...

    @property
    def assume_role_method(self) -> str | None: ...

    @property
    def assume_role_kwargs(self) -> dict[str, Any]: ...

    def get_service_endpoint_url(self, service_name: str) -> str | None: ...


class _CredentialsLike(Protocol):
    @property
    def access_key(self) -> str | None: ...

    @property
    def secret_key(self) -> str | None: ...

    @property
    def token(self) -> str | None: ...


class AwsHook(Protocol):
    """What is read of the Amazon provider's AwsBaseHook."""

    @property
    def conn_config(self) -> _AwsConnectionConfig: ...

    def get_credentials(self, region_name: str | None = None) -> _CredentialsLike: ...


def options_from_aws_hook(hook: AwsHook, aws_conn_id: str, *, endpoint_url: str | None,
                          region: str | None) -> S3Options:
    """S3 options from the Amazon provider's hook on ``aws_conn_id``: its S3 endpoint and region, else the store
    connection's ``endpoint_url`` and ``region``; and its credentials.

    A ``role_arn`` assumed with the connection's keys (or, without keys, boto3's chain where the job runs) becomes
    the options' role: every process that opens the store with them (the task, a job's supervisor and driver)
    assumes the role itself and again before its credentials expire (core/store/s3.py). Otherwise the credentials its
    session resolves (keys, a profile, web identity, a role through a profile or SAML) are frozen now: temporary
    ones are not renewed for what runs longer on them, e.g. a job's driver."""
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3; not imported while DAGs are parsed

    config = hook.conn_config
    endpoint = config.get_service_endpoint_url("s3") or endpoint_url
    if config.role_arn and (config.assume_role_method or "assume_role") == "assume_role" and not config.profile_name:
        kwargs = config.assume_role_kwargs or {}
        duration = kwargs.get("DurationSeconds")
        return S3Options(
            endpoint_url=endpoint, region=config.region_name or region,
            access_key_id=config.aws_access_key_id or None, secret_access_key=config.aws_secret_access_key or None,
            session_token=config.aws_session_token or None, role_arn=config.role_arn,
            role_external_id=kwargs.get("ExternalId"), role_session_name=kwargs.get("RoleSessionName"),
            role_duration_s=int(duration) if duration is not None else None,
            sts_endpoint_url=config.get_service_endpoint_url("sts") or None,
        )
    try:
        credentials = hook.get_credentials()
    except (BotoCoreError, ClientError, AttributeError) as err:  # AttributeError: no credentials at all (None)
        raise CredentialsError(
            f"AWS connection {aws_conn_id!r}: expected credentials from its keys, role_arn, profile_name or the "
            f"environment, found none usable ({type(err).__name__}: {err}); check the connection's login, "
            "password and extra"
        ) from err
    if config.role_arn:
        log.warning("AWS connection %r: the credentials of role %s (assume_role_method %s%s) are taken once and not "
                    "renewed in a job's driver and supervisor; set the role with assume_role and the connection's "
                    "keys to have them refreshed", aws_conn_id, config.role_arn, config.assume_role_method,
                    ", through profile " + repr(config.profile_name) if config.profile_name else "")
    return S3Options(
        endpoint_url=endpoint,
        region=config.region_name or region,
        access_key_id=credentials.access_key,
        secret_access_key=credentials.secret_key,
        session_token=credentials.token or None,
    )
