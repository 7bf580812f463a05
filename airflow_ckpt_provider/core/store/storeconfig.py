"""The job store as a connection describes it (a ``ckpt_store`` Airflow connection, the Dagster resource): its URL
and the S3 endpoint, region and keys, checked once for both, and the connection test (one listing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage

#: What the connection test lists: one request that needs the endpoint, the credentials and the bucket.
TEST_PREFIX = "ckpt-connection-test/"


@dataclass(frozen=True)
class StoreConfig:
    """``store_url`` (``s3://BUCKET/PREFIX``, ``file:///PATH`` or a local directory) and how to reach S3
    (None: boto3's usual chain, from the environment)."""

    store_url: str
    s3: S3Options | None = field(default=None)

    @classmethod
    def from_fields(cls, *, store_url: str | None, where: str, endpoint_url: str | None = None,
                    region: str | None = None, access_key_id: str | None = None,
                    secret_access_key: str | None = None, session_token: str | None = None) -> StoreConfig:
        """From a connection's fields ('' is unset); ConfigError naming ``where`` without a URL or with a bad one."""
        if not store_url:
            raise ConfigError(f"{where} has no store_url: set it to s3://BUCKET/PREFIX or a local directory")
        s3 = S3Options(endpoint_url=endpoint_url or None, region=region or None, access_key_id=access_key_id or None,
                       secret_access_key=secret_access_key or None, session_token=session_token or None)
        config = cls(str(store_url), s3)
        config.storage()  # an unsupported scheme or an S3 URL without a bucket fails here, before any IO
        return config

    def storage(self) -> Storage:
        return open_storage(self.store_url, self.s3)

    def job_store(self, job: str) -> JobStore:
        return JobStore(self.storage(), job)


def check_store(config: StoreConfig) -> tuple[bool, str]:
    """List the store root (one request): checks endpoint, credentials and bucket."""
    try:
        config.storage().list(TEST_PREFIX)
    except CkptError as err:
        return False, str(err)
    return True, f"job store {config.store_url} is reachable"
