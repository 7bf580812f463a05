"""The job store layout: one prefix per job holding objects, snapshots, status, control, lease.

Design notes: docs/concepts.md#design-notes-corestorejobstorepy."""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.store.storage import S3Options, Storage, open_storage

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SNAPSHOT_ID = re.compile(r"^[a-z]+-\d+-\d{8}T\d{6}Z-[0-9a-f]{6}$")

OBJECTS = "objects/"
SNAPSHOTS = "snapshots/"
PENDING = "pending/"
GC_LOCK = "locks/gc.json"
GC_GENERATION = "locks/gc-generation.json"
LEASE = "lease.json"
STATUS = "status.json"
CONTROL = "control/"
DEPLOYMENTS = "deployments/"
SPEC_LAST = "spec/last.json"
SPEC_STABLE = "spec/stable.json"
SUPERVISORS = "supervisors/"
DRIVER_ENDS = "ends/"
CHECKS = "checks/"


def is_job_name(name: str) -> bool:
    return bool(_JOB_NAME.match(name))


def check_job_name(job: str) -> str:
    if not is_job_name(job):
        raise ConfigError(
            f"invalid job name {job!r}: expected 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return job


def check_snapshot_id(snapshot_id: str) -> str:
    if not _SNAPSHOT_ID.match(snapshot_id):
        raise ConfigError(
            f"invalid snapshot id {snapshot_id!r}: expected KIND-BATCH-YYYYMMDDTHHMMSSZ-XXXXXX "
            "as printed by `ckpt snapshot list`"
        )
    return snapshot_id


def split_snapshot_ref(ref: str) -> tuple[str | None, str | None, str]:
    """``(root, job, snapshot_id)`` of a snapshot reference; ``(None, None, id)`` for a bare id.

    A reference naming ``<root>/<job>/snapshots/<id>`` (optionally ``/manifest.json``) is normalised:
    a local path becomes absolute with ``.``/``..`` resolved (``../../jobs/orders/snapshots/<id>``),
    and ``file://``, ``s3://`` and ``s3a://`` URIs lose their dot segments and duplicate slashes.
    """
    text = ref.strip().rstrip("/").removesuffix("/manifest.json").rstrip("/")
    if "/snapshots/" not in f"/{text}":
        return None, None, text
    parsed = urlparse(text)
    if parsed.scheme in ("s3", "s3a"):
        prefix, path = f"{parsed.scheme}://", posixpath.normpath(f"/{parsed.netloc}/{parsed.path}").lstrip("/")
    elif parsed.scheme in ("", "file"):
        prefix, path = "", os.path.abspath(parsed.path if parsed.scheme else text)
    else:
        raise ConfigError(
            f"unsupported snapshot reference {ref!r}: expected a snapshot id, or ROOT/JOB/snapshots/ID with ROOT "
            "s3://BUCKET/PREFIX, s3a://..., file:///PATH or a local path"
        )
    parts = path.split("/")
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3]:
        raise ConfigError(
            f"snapshot reference {ref!r} does not end in JOB/snapshots/ID (normalised: {prefix}{path}); pass the "
            "URI `ckpt snapshot create` printed, or the id with --store and --job"
        )
    root = "/".join(parts[:-3])
    if not root.strip("/"):
        raise ConfigError(
            f"snapshot reference {ref} names no job store: expected ROOT/JOB/snapshots/ID (e.g. "
            f"s3://BUCKET/PREFIX/JOB/snapshots/ID or a directory), found no ROOT before job {parts[-3]!r}; pass "
            "the full URI `ckpt snapshot create` printed, or the id with --store and --job"
        )
    return prefix + root, parts[-3], parts[-1]


class JobStore:
    """The store of one job: a Storage rooted at ``<root>/<job>``."""

    def __init__(self, root: Storage, job: str) -> None:
        self.job = check_job_name(job)
        self.root = root
        self.storage = root.child(job)

    @classmethod
    def open(cls, url: str, job: str, s3: S3Options | None = None) -> JobStore:
        return cls(open_storage(url, s3), job)

    @property
    def url(self) -> str:
        return self.storage.url

    @staticmethod
    def object_key(sha256: str) -> str:
        return OBJECTS + sha256

    @staticmethod
    def manifest_key(snapshot_id: str) -> str:
        return f"{SNAPSHOTS}{snapshot_id}/manifest.json"

    @staticmethod
    def pending_key(snapshot_id: str) -> str:
        return f"{PENDING}{snapshot_id}.json"

    def snapshot_uri(self, snapshot_id: str) -> str:
        return self.storage.uri(f"{SNAPSHOTS}{snapshot_id}")

    def __repr__(self) -> str:
        return f"JobStore({self.url!r})"
