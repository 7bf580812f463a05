"""One small storage interface for job stores and checkpoints: a local directory or an S3 prefix.

Keys are relative POSIX paths ("snapshots/x/manifest.json"), never starting with "/" and never
containing empty or "." segments (SeaweedFS maps keys to file paths and rejects those).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import stat
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow_ckpt_provider.core.errors import ConfigError, StorageError

log = logging.getLogger(__name__)

#: Called with the number of bytes just transferred (boto3's callback convention).
BytesCallback = Callable[[int], None]

_TMP_MARK = ".ckpt-tmp-"
#: Files of this size or more are hashed and transferred as files (multipart), never through memory.
LARGE_FILE = 16 * 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key relative to the storage root, size in bytes, modification time, and a tag
    that changes whenever its content does (S3: the ETag; a directory: the modification time in ns and the inode,
    new with each write; '' when unknown)."""

    key: str
    size: int
    mtime: float
    version: str = ""


@dataclass(frozen=True)
class Versioned:
    """An object's bytes, the version tag a conditional write compares against, and its age: seconds since it was
    written, measured by the store's own clock when it was read (S3: the answer's Date minus Last-Modified, whole
    seconds), None when the store has no clock of its own (a directory: a file's mtime is its writer's clock)."""

    data: bytes
    tag: str
    age: float | None = None


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative key, else raise ConfigError saying why."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"invalid storage key {key!r}: expected a relative path without empty, '.' or '..' "
            "segments (S3 servers such as SeaweedFS reject them)"
        )
    if any(len(p.encode()) > 255 for p in parts):
        raise ConfigError(f"invalid storage key {key!r}: a path segment is longer than 255 bytes")
    return key


def check_keys(keys: list[str]) -> None:
    """check_key for many keys at once (a manifest's thousands of paths): substring scans of the keys joined by
    '/' instead of a call per key (an empty key, or one that starts or ends with '/', makes '//' there too); a key
    that may have a segment over 255 bytes, and a refused one, go through check_key, which says why."""
    joined = f"/{'/'.join(keys)}/"
    longest = max(map(len, keys), default=0)
    if "//" in joined or "/./" in joined or "/../" in joined or longest > (255 if joined.isascii() else 255 // 4):
        for key in keys:
            check_key(key)


def join(*parts: str) -> str:
    """Join key fragments with '/', ignoring empty fragments and stray slashes."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a local file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Storage(ABC):
    """A flat key space under a root: list, read, write, create-if-absent, delete, transfer files."""

    url: str

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """All objects whose key starts with ``prefix`` (recursive), sorted by key."""

    @abstractmethod
    def folders(self, prefix: str = "") -> tuple[str, ...]:
        """The names of the "folders" directly below ``prefix`` (a key prefix ending in "/"), sorted: the
        first path segment of every key below it that has more segments. One listing call, not recursive."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's info, or None if it does not exist."""

    @abstractmethod
    def read(self, key: str) -> bytes:
        """The object's bytes; raises FileNotFoundError if it does not exist."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Create or replace the object atomically (readers see the old or the new bytes)."""

    def write_object(self, key: str, data: bytes, sha256: str) -> None:
        """``write`` for content-addressed bytes whose SHA-256 (hex) is known: a store that can check it on arrival
        (S3's x-amz-checksum-sha256) refuses a body corrupted on the way, before any snapshot can reuse it."""
        self.write(key, data)

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Create the object only if absent, atomically; True if created, False if it existed."""

    def create_tagged(self, key: str, data: bytes) -> str | None:
        """``create`` that returns the new object's version tag (as ``list`` and ``stat`` report it; '' if the
        store tells none), or None if the object existed."""
        if not self.create(key, data):
            return None
        info = self.stat(key)
        return info.version if info is not None and info.size == len(data) else ""

    @abstractmethod
    def read_versioned(self, key: str) -> Versioned | None:
        """The object's bytes and version tag, or None if it does not exist."""

    @abstractmethod
    def write_if(self, key: str, data: bytes, tag: str | None) -> bool:
        """Compare-and-swap: replace the object only if its tag is still ``tag`` (``None``: only if
        absent). True if written, False if someone else wrote first."""

    def swap(self, key: str, data: bytes, tag: str | None) -> str | None:
        """``write_if`` that returns the object's new version tag (None: someone else wrote first), so the writer's
        next compare-and-swap needs no read first. This default reads it back; the stores know it from the write."""
        if not self.write_if(key, data, tag):
            return None
        found = self.read_versioned(key)
        return found.tag if found is not None and found.data == data else None

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; missing keys are ignored."""

    @abstractmethod
    def upload(self, path: Path, key: str, callback: BytesCallback | None = None) -> None:
        """Store a local file under ``key`` (multipart and parallel for large files on S3)."""

    @abstractmethod
    def download(self, key: str, path: Path, callback: BytesCallback | None = None) -> None:
        """Copy the object to a local file (created with its parent directories)."""

    @abstractmethod
    def child(self, prefix: str) -> Storage:
        """A storage rooted at ``prefix`` below this one."""

    def local_path(self, key: str) -> Path | None:
        """The object's path on the local file system, when the storage is local."""
        return None

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def uri(self, key: str = "") -> str:
        """A URL naming ``key`` in this storage, for messages and results."""
        return self.url.rstrip("/") + ("/" + key if key else "")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class LocalStorage(Storage):
    """A directory on the local file system; writes go through a temp file and a rename or link."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        if prefix:
            check_key(prefix.rstrip("/") or "x")
        # Walk only the deepest directory the prefix names, then filter by the rest of the prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        if not top.is_dir():
            return []
        found: list[ObjectInfo] = []
        # os.scandir with string keys, not pathlib: a driver lists its checkpoint (hundreds of files) before every
        # snapshot, and Path objects made that listing the largest share of a snapshot's CPU.
        stack = [(str(top), f"{base}/" if base else "")]
        while stack:
            directory, key_prefix = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):  # deleted while we walked
                continue
            except PermissionError as err:  # a listing that skipped it would miss files (a snapshot, a restore)
                raise StorageError(f"cannot list {directory}: expected a directory this process (uid {os.getuid()}) "
                                   f"can read, found {err.strerror}; make it readable (the Spark driver's user "
                                   "writes the checkpoint) and try again") from err
            for entry in entries:
                key = key_prefix + entry.name
                try:
                    if entry.is_dir():  # a link to a directory is not followed, as os.walk does not
                        if not entry.is_symlink():
                            stack.append((entry.path, key + "/"))
                        continue
                    if _TMP_MARK in entry.name or not key.startswith(prefix):
                        continue
                    st = entry.stat()
                except FileNotFoundError:  # deleted while we walked
                    continue
                found.append(ObjectInfo(key, st.st_size, st.st_mtime, _tag(st)))
        return sorted(found, key=lambda o: o.key)

    def folders(self, prefix: str = "") -> tuple[str, ...]:
        top = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not top.is_dir():
            return ()
        return tuple(sorted(p.name for p in top.iterdir() if p.is_dir() and _TMP_MARK not in p.name))

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime, _tag(st)) if not _is_dir(st.st_mode) else None

    def read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (IsADirectoryError, NotADirectoryError):
            raise FileNotFoundError(self.uri(key)) from None

    def _temp_with(self, path: Path, data: bytes | Path) -> Path:
        """A durable temp file next to ``path`` holding ``data`` (bytes, or a file's content)."""
        tmp = path.with_name(f".{path.name}{_TMP_MARK}{uuid.uuid4().hex[:8]}")
        for attempt in range(5):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(tmp, "xb") as f:
                    if isinstance(data, Path):
                        with open(data, "rb") as src:
                            shutil.copyfileobj(src, f, 1 << 20)
                    else:
                        f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                return tmp
            except (FileNotFoundError, FileExistsError):
                # A concurrent delete() pruned the empty parent while we created it or wrote into it.
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(self._temp_with(path, data), path)

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._temp_with(path, data)
        try:
            os.link(tmp, path)  # atomic create-if-absent with the full content already in place
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def read_versioned(self, key: str) -> Versioned | None:
        try:
            data = self.read(key)
        except FileNotFoundError:
            return None
        return Versioned(data, hashlib.sha256(data).hexdigest())  # no age: a file's mtime is its writer's clock

    def swap(self, key: str, data: bytes, tag: str | None) -> str | None:
        return hashlib.sha256(data).hexdigest() if self.write_if(key, data, tag) else None  # read_versioned's tag

    def write_if(self, key: str, data: bytes, tag: str | None) -> bool:
        if tag is None:
            return self.create(key, data)
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # An advisory lock next to the object serializes compare-and-swap between processes of this host.
        with open(path.with_name(f".{path.name}{_TMP_MARK}lock"), "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.read_versioned(key)
            if current is None or current.tag != tag:
                return False
            self.write(key, data)
            return True

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            _prune_empty_dirs(path.parent, self.root)

    def upload(self, path: Path, key: str, callback: BytesCallback | None = None) -> None:
        dest = self._path(key)
        os.replace(self._temp_with(dest, path), dest)
        if callback:
            callback(dest.stat().st_size)

    def download(self, key: str, path: Path, callback: BytesCallback | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(key), path)
        if callback:
            callback(path.stat().st_size)

    def child(self, prefix: str) -> LocalStorage:
        return LocalStorage(self.root / check_key(prefix))


def _is_dir(mode: int) -> bool:
    return stat.S_ISDIR(mode)


def _tag(st: os.stat_result) -> str:
    """A file's version tag: every write replaces the file (a new inode), and two writes within one tick of the
    file system's clock have the same modification time."""
    return f"{st.st_mtime_ns}.{st.st_ino}"


def _prune_empty_dirs(directory: Path, root: Path) -> None:
    while directory != root and root in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


#: S3Options' role settings in the environment (``from_env``/``env``): not AWS_ROLE_ARN, which botocore reads as
#: part of a web identity (AWS_WEB_IDENTITY_TOKEN_FILE) and which a host may set for that.
ROLE_ENV = {"role_arn": "CKPT_S3_ROLE_ARN", "role_external_id": "CKPT_S3_ROLE_EXTERNAL_ID",
            "role_session_name": "CKPT_S3_ROLE_SESSION_NAME", "role_duration_s": "CKPT_S3_ROLE_DURATION_S",
            "sts_endpoint_url": "CKPT_S3_STS_ENDPOINT_URL"}


@dataclass(frozen=True)
class S3Options:
    """Where and how to reach S3; unset fields fall back to boto3's usual chain (env, profile).

    ``role_arn``: the requests are made with the temporary credentials of this role, assumed (STS AssumeRole,
    at ``sts_endpoint_url`` or AWS's) with the other credentials here or, without them, boto3's chain, and assumed
    again before they expire, for as long as the process runs (core/store/s3.py)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    max_concurrency: int = 8
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    role_arn: str | None = None
    role_external_id: str | None = field(default=None, repr=False)
    role_session_name: str | None = None
    role_duration_s: int | None = None
    sts_endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url and urlparse(self.endpoint_url).scheme not in ("http", "https"):
            raise ConfigError(
                f"invalid S3 endpoint URL {self.endpoint_url!r}: expected http://HOST:PORT or https://HOST"
            )
        if self.sts_endpoint_url and urlparse(self.sts_endpoint_url).scheme not in ("http", "https"):
            raise ConfigError(
                f"invalid STS endpoint URL {self.sts_endpoint_url!r}: expected http://HOST:PORT or https://HOST"
            )
        if self.role_duration_s is not None and not 900 <= self.role_duration_s <= 43200:
            raise ConfigError(f"invalid role duration {self.role_duration_s!r}: expected seconds from 900 "
                              "(STS's minimum) to 43200")

    def __repr__(self) -> str:
        return f"S3Options({self.redacted()})"

    @classmethod
    def from_env(cls, endpoint_url: str | None = None, region: str | None = None) -> S3Options:
        """Endpoint and region as given or from AWS_ENDPOINT_URL/AWS_REGION; credentials from the
        environment only (AWS_ACCESS_KEY_ID, ...), never from argv, where ``ps`` would show them."""
        env = os.environ.get
        duration = env(ROLE_ENV["role_duration_s"]) or None
        if duration is not None and not duration.isdigit():
            raise ConfigError(f"invalid {ROLE_ENV['role_duration_s']}={duration!r}: expected a number of seconds")
        return cls(
            endpoint_url=endpoint_url or env("AWS_ENDPOINT_URL") or None,
            region=region or env("AWS_REGION") or env("AWS_DEFAULT_REGION") or None,
            access_key_id=env("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env("AWS_SESSION_TOKEN") or None,
            role_arn=env(ROLE_ENV["role_arn"]) or None,
            role_external_id=env(ROLE_ENV["role_external_id"]) or None,
            role_session_name=env(ROLE_ENV["role_session_name"]) or None,
            role_duration_s=int(duration) if duration else None,
            sts_endpoint_url=env(ROLE_ENV["sts_endpoint_url"]) or None,
        )

    def env(self) -> dict[str, str]:
        """The AWS_* (and CKPT_S3_ROLE_*) variables ``from_env`` reads back into these options (the unset ones
        left out)."""
        env = {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_REGION": self.region,
               "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
               "AWS_SESSION_TOKEN": self.session_token,
               **{name: getattr(self, attr) for attr, name in ROLE_ENV.items()}}
        return {k: str(v) for k, v in env.items() if v}

    def redacted(self) -> dict[str, Any]:
        """For logs and messages: the key id shortened, secrets never shown."""
        key = self.access_key_id
        return {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key_id": f"{key[:4]}…" if key else None,
            **({"role_arn": self.role_arn} if self.role_arn else {}),
        }


def open_storage(url: str | os.PathLike[str], s3: S3Options | None = None) -> Storage:
    """Storage for ``s3://bucket/prefix``, ``file:///path`` or a plain local path."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ConfigError(f"invalid S3 URL {text!r}: expected s3://BUCKET/PREFIX")
        from airflow_ckpt_provider.core.store.s3 import S3Storage

        return S3Storage(parsed.netloc, parsed.path.strip("/"), s3 or S3Options(), parsed.scheme)
    if parsed.scheme == "file":
        return LocalStorage(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return LocalStorage(text)
    raise ConfigError(
        f"unsupported storage URL {text!r}: expected s3://BUCKET/PREFIX, s3a://..., file:///PATH "
        "or a local path"
    )

