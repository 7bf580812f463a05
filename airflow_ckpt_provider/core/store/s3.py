"""S3 storage via boto3: transient errors retried with tenacity at each call, others translated."""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore.session
from boto3.exceptions import Boto3Error, S3TransferFailedError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.credentials import CredentialProvider, RefreshableCredentials
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectTimeoutError as BotoConnectTimeout
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from airflow_ckpt_provider.core.errors import CkptError, CredentialsError, StorageError, UnreachableError
from airflow_ckpt_provider.core.store import requestcount
from airflow_ckpt_provider.core.store.storage import (
    BytesCallback,
    ObjectInfo,
    S3Options,
    Storage,
    Versioned,
    check_key,
    join,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "ConditionalRequestConflict",  # a concurrent conditional write: retry decides the winner
    "500",
    "502",
    "503",
    "504",
}
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _unwrap(exc: BaseException) -> BaseException:
    """boto3's upload_file hides the ClientError inside an S3UploadFailedError's context."""
    if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
        return exc.__context__
    return exc


def _is_transient(exc: BaseException) -> bool:
    exc = _unwrap(exc)
    if isinstance(exc, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, BotoConnectTimeout)):
        return True
    return isinstance(exc, ClientError) and _code(exc) in _TRANSIENT_CODES


ATTEMPTS = 5


def _retrying(what: str) -> Retrying:
    """Retry one S3 request on network errors and 5xx: 5 attempts over ~3 s, then the error goes up."""

    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        # Debug only: an outage fails many requests; the caller's Outage logs its start and its end once.
        log.debug("S3 %s: attempt %d of %d failed (%s), retrying in %.1f s",
                    what, state.attempt_number, ATTEMPTS, type(err).__name__, wait)

    return Retrying(
        retry=retry_if_exception(_is_transient),
        stop=stop_after_attempt(ATTEMPTS),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        reraise=True,
        before_sleep=before_sleep,
    )

_clients: dict[tuple[Any, ...], S3Client] = {}
_roles: dict[tuple[Any, ...], AssumedRole] = {}
_clients_lock = threading.Lock()

#: botocore's windows before an expiry (RefreshableCredentials): from the first, one request refreshes while the
#: others go on with the old credentials; in the second, every request waits for new ones.
_ADVISORY_REFRESH_S = 15 * 60
_MANDATORY_REFRESH_S = 10 * 60


class AssumedRole:
    """The temporary credentials of ``opts.role_arn`` for one S3 client: assumed with STS AssumeRole (with the
    options' credentials, else boto3's chain) when the client is made, and again whenever they near their expiry,
    for as long as the process runs (a driver, a supervisor): botocore's RefreshableCredentials refreshes them
    a quarter of their lifetime (at most 15 minutes) before it, and from a sixth (at most 10 minutes) before it
    every request waits for the new ones. Credentials are never logged, only the first 4 characters of a key id."""

    def __init__(self, opts: S3Options) -> None:
        assert opts.role_arn
        self.arn = opts.role_arn
        self.opts = opts
        self.refreshes = 0  # successful AssumeRole calls
        self.last_refresh: float | None = None  # time.time() of the last one
        self.key_id = ""  # the first 4 characters of the last access key id
        self._sts: Any = None
        self._lock = threading.Lock()

    @property
    def sts_endpoint(self) -> str:
        return self.opts.sts_endpoint_url or "AWS STS"

    def _client(self) -> Any:
        with self._lock:
            if self._sts is None:
                o = self.opts
                self._sts = boto3.session.Session().client(
                    "sts", endpoint_url=o.sts_endpoint_url, region_name=o.region, aws_access_key_id=o.access_key_id,
                    aws_secret_access_key=o.secret_access_key, aws_session_token=o.session_token,
                    config=Config(connect_timeout=o.connect_timeout, read_timeout=o.read_timeout,
                                  retries={"max_attempts": 3, "mode": "standard"}),
                )
            return self._sts

    def fetch(self) -> dict[str, Any]:
        """AssumeRole once: botocore's credential metadata, or CredentialsError (refused) or UnreachableError."""
        o = self.opts
        args: dict[str, Any] = {"RoleArn": self.arn, "RoleSessionName": o.role_session_name or _session_name()}
        if o.role_external_id:
            args["ExternalId"] = o.role_external_id
        if o.role_duration_s:
            args["DurationSeconds"] = o.role_duration_s
        what = f"refreshing the credentials of role {self.arn} (refresh {self.refreshes + 1})"
        try:
            answer = self._client().assume_role(**args)
        except ClientError as err:
            raise CredentialsError(
                f"{what}: {self.sts_endpoint} refused AssumeRole ({_code(err)}: "
                f"{err.response.get('Error', {}).get('Message', '')}); check the role's trust policy, the external "
                "id and the credentials it is assumed with"
            ) from err
        except NoCredentialsError as err:
            raise CredentialsError(f"{what}: no credentials to assume it with; set them in the connection, or "
                                   "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment") from err
        except (EndpointConnectionError, BotoConnectTimeout, ConnectionClosedError, ReadTimeoutError) as err:
            raise UnreachableError(f"{what}: cannot reach {self.sts_endpoint} ({err})") from err
        except BotoCoreError as err:
            raise StorageError(f"{what}: AssumeRole failed: {err}") from err
        creds = answer["Credentials"]
        expiry = creds["Expiration"]
        if expiry.tzinfo is None:
            expiry = expiry.replace(tzinfo=UTC)
        with self._lock:
            self.refreshes += 1
            self.last_refresh = time.time()
            self.key_id = str(creds["AccessKeyId"])[:4]
        log.info("S3: assumed role %s (refresh %d), credentials valid until %s", self.arn, self.refreshes,
                 expiry.isoformat(timespec="seconds"))
        return {"access_key": creds["AccessKeyId"], "secret_key": creds["SecretAccessKey"],
                "token": creds.get("SessionToken") or None, "expiry_time": expiry.isoformat()}

    def credentials(self) -> RefreshableCredentials:
        """Credentials that assume the role again before they expire (now once, then from botocore's signer)."""
        first = self.fetch()
        lifetime = (datetime.fromisoformat(first["expiry_time"]) - datetime.now(UTC)).total_seconds()
        return RefreshableCredentials.create_from_metadata(
            first, self.fetch, "ckpt-assume-role",
            advisory_timeout=min(_ADVISORY_REFRESH_S, math.ceil(max(lifetime, 0) / 4)),
            mandatory_timeout=min(_MANDATORY_REFRESH_S, math.ceil(max(lifetime, 0) / 6)),
        )

    def describe(self) -> str:
        """For error messages: which role, which refresh, which key id (4 characters)."""
        when = (datetime.fromtimestamp(self.last_refresh, UTC).strftime("%H:%M:%S UTC") if self.last_refresh
                else "never")
        return (f"temporary credentials of role {self.arn}, access key id {self.key_id or '?'}… from its refresh "
                f"{self.refreshes} at {when} through {self.sts_endpoint}")


class _RoleProvider(CredentialProvider):
    """First in the session's chain: the assumed role's refreshing credentials."""

    METHOD = "ckpt-assume-role"

    def __init__(self, role: AssumedRole) -> None:
        super().__init__()
        self.role = role

    def load(self) -> RefreshableCredentials:
        return self.role.credentials()


def _session_name() -> str:
    """AssumeRole's RoleSessionName (in CloudTrail): this host and process, in its alphabet and 64 characters."""
    host = "".join(c if c.isalnum() or c in "=,.@-" else "-" for c in socket.gethostname())
    return f"ckpt-{host}"[:52] + f"-{os.getpid()}"


def assumed_role(opts: S3Options) -> AssumedRole | None:
    """The role whose credentials the client for these options uses, once it was made."""
    with _clients_lock:
        return _roles.get(_client_key(opts))


def _client_key(opts: S3Options) -> tuple[Any, ...]:
    return (opts.endpoint_url, opts.region, opts.access_key_id, opts.secret_access_key,
            opts.session_token, opts.max_concurrency, opts.connect_timeout, opts.read_timeout,
            opts.role_arn, opts.role_external_id, opts.role_session_name, opts.role_duration_s, opts.sts_endpoint_url)


def client_config(max_concurrency: int, connect_timeout: float, read_timeout: float) -> Config:
    """The botocore settings of every client this package makes (benchmarks give their plain clients the same)."""
    return Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        # tenacity retries at our call sites; keep botocore's own retries short.
        retries={"max_attempts": 2, "mode": "standard"},
        max_pool_connections=max(10, max_concurrency * 2),
        # No CRC32 of every body (0.5 of a small PUT's 1.4 ms of client CPU): snapshot objects are sent with
        # the SHA-256 they are named by, which the server checks (write_object), other PUTs with theirs; large
        # files get a CRC32 per part (upload); every read of an object is checked against its SHA-256 (restore,
        # verify).
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # The signature covers that checksum header instead of a second SHA-256 of the body, as botocore does by
        # itself over https; over http it would hash every body again (measured: ~1 ms of client CPU per
        # 160 KB PUT, and the server's check of it).
        s3={"payload_signing_enabled": False},
    )


def _checksum(sha256: str) -> str:
    """The x-amz-checksum-sha256 header value of a body with this hex SHA-256."""
    return base64.b64encode(bytes.fromhex(sha256)).decode("ascii")


def make_client(opts: S3Options) -> S3Client:
    """A shared, thread-safe boto3 client for these options."""
    key = _client_key(opts)
    with _clients_lock:
        client = _clients.get(key)
        if client is None and opts.role_arn:
            return _role_client(opts, key)
        if client is None:
            config = client_config(opts.max_concurrency, opts.connect_timeout, opts.read_timeout)
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=opts.endpoint_url,
                region_name=opts.region,
                aws_access_key_id=opts.access_key_id,
                aws_secret_access_key=opts.secret_access_key,
                aws_session_token=opts.session_token,
                config=config,
            )
            requestcount.register(client)
            _clients[key] = client
        return client


def _role_client(opts: S3Options, key: tuple[Any, ...]) -> S3Client:
    """The client of options with a role_arn (holding _clients_lock): its session's credentials are the role's,
    refreshing (the options' own credentials only assume it). Assumes the role now: CredentialsError if STS
    refuses, and nothing is kept, so the next request tries again."""
    role = _roles.get(key) or AssumedRole(opts)
    _roles[key] = role
    core = botocore.session.Session()
    core.get_component("credential_provider").insert_before("env", _RoleProvider(role))
    client = boto3.session.Session(botocore_session=core).client(
        "s3", endpoint_url=opts.endpoint_url, region_name=opts.region,
        config=client_config(opts.max_concurrency, opts.connect_timeout, opts.read_timeout),
    )
    requestcount.register(client)
    _clients[key] = client
    return client


def _store_age(answer: Mapping[str, Any]) -> float | None:
    """Seconds since the object of a GET answer was written, by the store's clock: its Date minus Last-Modified
    (both whole seconds); None when either is missing or unreadable."""
    modified = answer.get("LastModified")
    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if modified is None or not date:
        return None
    try:
        return float(parsedate_to_datetime(date).timestamp() - modified.timestamp())
    except (TypeError, ValueError):
        return None


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix``."""

    def __init__(self, bucket: str, prefix: str, opts: S3Options, scheme: str = "s3") -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.opts = opts
        self.scheme = scheme  # "s3a" when named as Spark's Hadoop connector names it: kept in URLs
        self.url = f"{scheme}://{bucket}/{self.prefix}".rstrip("/")
        self._transfer = TransferConfig(
            multipart_threshold=16 * 1024 * 1024,
            multipart_chunksize=16 * 1024 * 1024,
            max_concurrency=opts.max_concurrency,
        )

    @property
    def client(self) -> S3Client:
        return make_client(self.opts)

    def _key(self, key: str) -> str:
        return join(self.prefix, check_key(key))

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one request with retries and turn botocore errors into StorageError."""
        try:
            try:
                return _retrying(what)(fn)
            except (S3UploadFailedError, S3TransferFailedError) as wrapped:
                raise _unwrap(wrapped) from None
        except ClientError as err:
            raise self._translate(what, err) from err
        except CkptError as err:  # from AssumedRole.fetch, refreshing a role's credentials at this request
            raise type(err)(f"{what}: {err}") from err
        except NoCredentialsError as err:
            raise CredentialsError(
                f"{what}: no S3 credentials found; set them in the connection, or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY in the environment"
            ) from err
        except (EndpointConnectionError, BotoConnectTimeout, ConnectionClosedError, ReadTimeoutError) as err:
            raise UnreachableError(
                f"{what}: cannot reach S3 endpoint {self.opts.endpoint_url or 'AWS default'} "
                f"after {ATTEMPTS} attempts ({err}); check the endpoint URL and that the server is up"
            ) from err
        except (BotoCoreError, Boto3Error) as err:
            raise StorageError(f"{what}: S3 request failed: {err}") from err

    def _translate(self, what: str, err: ClientError) -> Exception:
        code = _code(err)
        if code in _MISSING_CODES:
            return FileNotFoundError(what)
        if code == "NoSuchBucket":
            return StorageError(
                f"{what}: bucket {self.bucket!r} does not exist at {self.opts.endpoint_url or 'AWS'}; "
                "create it or fix the store URL"
            )
        if code == "RequestTimeTooSkewed":
            return StorageError(
                f"{what}: the local clock is more than 15 minutes off the S3 server's; sync the clock (NTP)"
            )
        if code in _AUTH_CODES and self.opts.role_arn:
            role = assumed_role(self.opts)
            return CredentialsError(
                f"{what}: S3 refused the credentials ({code}) for bucket {self.bucket!r} at "
                f"{self.opts.endpoint_url or 'AWS'}: the "
                f"{role.describe() if role else f'temporary credentials of role {self.opts.role_arn}'}; check the "
                "role's permissions on the bucket, and what STS gives for it"
            )
        if code in _AUTH_CODES:
            creds = self.opts.redacted()
            return CredentialsError(
                f"{what}: S3 refused the credentials ({code}) for bucket {self.bucket!r} "
                f"(access key id {creds['access_key_id'] or 'from the environment'}, endpoint "
                f"{creds['endpoint_url'] or 'AWS'}); check the access key, secret and permissions"
            )
        return StorageError(f"{what}: S3 error {code}: {err}")

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        full = join(self.prefix, prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        if prefix.endswith("/") and not full.endswith("/"):
            full += "/"
        strip = len(self.prefix) + 1 if self.prefix else 0

        def pages() -> list[ObjectInfo]:
            found = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    key = obj["Key"][strip:]
                    if key and not key.endswith("/"):
                        found.append(ObjectInfo(key, int(obj["Size"]), obj["LastModified"].timestamp(),
                                                obj.get("ETag", "")))
            return found

        return sorted(self._call(f"list {self.uri(prefix)}", pages), key=lambda o: o.key)

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        base = prefix.strip("/")
        full = join(self.prefix, base) + "/" if base else (self.prefix + "/" if self.prefix else "")

        def pages() -> list[str]:
            found = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
                found += [p["Prefix"][len(full):].rstrip("/") for p in page.get("CommonPrefixes", [])]
            return found

        return tuple(sorted(f for f in self._call(f"list folders {self.uri(base)}", pages) if f))

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self._call(
                f"stat {self.uri(key)}", lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            )
        except FileNotFoundError:
            return None
        return ObjectInfo(key, int(head["ContentLength"]), head["LastModified"].timestamp(), head.get("ETag", ""))

    def read(self, key: str) -> bytes:
        def get() -> bytes:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

        return self._call(f"read {self.uri(key)}", get)

    def write(self, key: str, data: bytes) -> None:
        self.write_object(key, data, hashlib.sha256(data).hexdigest())

    def write_object(self, key: str, data: bytes, sha256: str) -> None:
        checksum = _checksum(sha256)  # checked by the server; the signature covers it (client_config)
        self._call(
            f"write {self.uri(key)}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ChecksumSHA256=checksum),
        )

    def create(self, key: str, data: bytes) -> bool:
        return self.create_tagged(key, data) is not None

    def create_tagged(self, key: str, data: bytes) -> str | None:
        checksum = _checksum(hashlib.sha256(data).hexdigest())

        def put() -> str | None:
            try:
                answer = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*",
                                                ChecksumSHA256=checksum)
            except ClientError as err:
                if _code(err) in ("PreconditionFailed", "412"):
                    return None
                raise
            return str(answer.get("ETag", ""))

        tag = self._call(f"create {self.uri(key)}", put)
        if tag is not None:
            return tag
        # A 412 after a retried PUT may answer our own first attempt, whose response was lost: the
        # bytes we write are unique (ids, timestamps, tokens), so equal bytes mean we created it.
        found = self.read_versioned(key)
        return found.tag if found is not None and found.data == data else None

    def read_versioned(self, key: str) -> Versioned | None:
        def get() -> Versioned:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return Versioned(answer["Body"].read(), answer["ETag"], _store_age(answer))

        try:
            return self._call(f"read {self.uri(key)}", get)
        except FileNotFoundError:
            return None

    def write_if(self, key: str, data: bytes, tag: str | None) -> bool:
        return self.swap(key, data, tag) is not None

    def swap(self, key: str, data: bytes, tag: str | None) -> str | None:
        if tag is None:
            return self.create_tagged(key, data)

        checksum = _checksum(hashlib.sha256(data).hexdigest())

        def put() -> str | None:
            try:
                answer = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfMatch=tag,
                                                ChecksumSHA256=checksum)
            except ClientError as err:
                # 412: someone else wrote first; 409: a concurrent conditional write is in progress;
                # 404: the object is gone since we read it (AWS may answer IfMatch on a missing key with
                # 404 NoSuchKey, which would otherwise surface as FileNotFoundError; SeaweedFS answers 412).
                if _code(err) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", *_MISSING_CODES):
                    return None
                raise
            return str(answer.get("ETag", ""))

        written = self._call(f"conditional write {self.uri(key)}", put)
        if written:
            return written
        # As in create(): a lost response to our own successful first attempt also reads as a 412 (and a store that
        # answers no ETag is read back for it).
        current = self.read_versioned(key)
        return current.tag if current is not None and current.data == data else None

    def delete(self, keys: Iterable[str]) -> None:
        batch = [{"Key": self._key(k)} for k in keys]
        for i in range(0, len(batch), 1000):
            chunk = batch[i : i + 1000]
            result = self._call(
                f"delete {len(chunk)} objects under {self.url}",
                # ignore[misc] below: mypy cannot infer a lambda with a default argument; c binds this chunk
                lambda c=chunk: self.client.delete_objects(  # type: ignore[misc]
                    Bucket=self.bucket, Delete={"Objects": c, "Quiet": True}
                ),
            )
            errors = [e for e in result.get("Errors", []) if e.get("Code") not in _MISSING_CODES]
            if errors:
                first = errors[0]
                raise StorageError(
                    f"delete under {self.url}: {len(errors)} objects were not deleted, first "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    def upload(self, path: Path, key: str, callback: BytesCallback | None = None) -> None:
        size = path.stat().st_size
        if size < self._transfer.multipart_threshold:
            # One PUT: for the many small files of a checkpoint this avoids the transfer manager's
            # extra threads and requests.
            self.write(key, path.read_bytes())
            if callback:
                callback(size)
            return
        self._call(
            f"upload {path} to {self.uri(key)}",
            # ExtraArgs: a CRC32 per part, checked by the server (the client's own checksums are off, make_client)
            lambda: self.client.upload_file(
                str(path), self.bucket, self._key(key), Config=self._transfer, Callback=callback,
                ExtraArgs={"ChecksumAlgorithm": "CRC32"},
            ),
        )

    def download(self, key: str, path: Path, callback: BytesCallback | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._call(
            f"download {self.uri(key)}",
            lambda: self.client.download_file(
                self.bucket, self._key(key), str(path), Config=self._transfer, Callback=callback
            ),
        )

    def child(self, prefix: str) -> S3Storage:
        return S3Storage(self.bucket, join(self.prefix, check_key(prefix)), self.opts, self.scheme)
