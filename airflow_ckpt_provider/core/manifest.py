"""The snapshot manifest: the one file that makes a snapshot exist, with a checksum of itself.

Each checkpoint file is listed with its size and SHA-256; its content is either an object of the job store
(``objects/<sha256>``, shared by every snapshot that holds it) or, for a small file, written into the manifest
itself (base64), as Flink keeps state chunks under ``state.storage.fs.memory-threshold`` in its checkpoint
metadata: a RocksDB checkpoint's metadata, offsets, commits and per-partition archives are a few kB each, and
one PUT apiece made most of a small snapshot's requests. An inline file is never an object: gc does not keep one
for it, a writer never counts it as stored, a restore writes it from the manifest.

Format 1 has no inline files, format 2 may have them; a manifest without inline files is written as format 1,
so the versions before inline files still read it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError
from airflow_ckpt_provider.core.statestore import state_partitions
from airflow_ckpt_provider.core.storage import check_key

FORMAT_VERSION = 2
#: The formats this version reads (the format written: 2 if a file is inline, else 1).
READ_FORMATS = (1, 2)
#: A checkpoint file up to this size goes into the manifest instead of an object (Flink's default threshold is
#: 20 kb), as long as the manifest's inline bytes stay within INLINE_TOTAL_MAX; other files are objects.
INLINE_MAX = 20 * 1024
INLINE_TOTAL_MAX = 128 * 1024
#: Labels of a rescale's savepoint: the savepoint it was repartitioned from, and that one's partitions.
RESCALED_FROM = "rescaled_from"
PARTITIONS_BEFORE = "partitions_before"


class NewerFormatError(SnapshotError):
    """A manifest of a format above ``READ_FORMATS``: a newer version of this package wrote it. Restoring "the
    latest" without it would silently go back in time (core/snapshots.list_snapshots, ``refuse_newer``)."""


class Kind(StrEnum):
    """Flink's split: checkpoints are automatic and short-lived, savepoints are owned by the user."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class Trigger(StrEnum):
    """Why a snapshot was taken."""

    PERIODIC = "periodic"
    MANUAL = "manual"
    STOP = "stop"
    UPGRADE = "upgrade"
    RESCALE = "rescale"  # a savepoint's state repartitioned (labels: rescaled_from, partitions)


def parse_enum(enum: type[Kind] | type[Trigger], value: str) -> Any:
    try:
        return enum(value.lower())
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise ConfigError(f"invalid {enum.__name__.lower()} {value!r}: expected one of {allowed}") from None


def new_snapshot_id(kind: Kind, batch_id: int, now: datetime) -> str:
    """Sortable and readable: ``savepoint-42-20261122T074142Z-3f9a1c``."""
    return f"{kind.value}-{batch_id}-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class ManifestFile:
    """One checkpoint file: its path relative to the checkpoint root, size and SHA-256, and for a file written
    into the manifest its content (``data``; None: the content is the object ``objects/<sha256>``)."""

    path: str
    size: int
    sha256: str
    data: bytes | None = field(default=None, repr=False)

    @property
    def inline(self) -> bool:
        return self.data is not None

    def to_json(self) -> list[Any]:
        entry: list[Any] = [self.path, self.size, self.sha256]
        if self.data is not None:
            entry.append(base64.b64encode(self.data).decode("ascii"))
        return entry

    @classmethod
    def from_json(cls, entry: Any, inline_allowed: bool) -> ManifestFile:
        if isinstance(entry, list) and len(entry) == 4 and not inline_allowed:
            raise ValueError(f"file entry {str(entry)[:120]!r} has inline content, which needs format 2")
        if not isinstance(entry, list) or len(entry) not in (3, 4):
            raise ValueError(f"file entry {str(entry)[:120]!r} is not [path, size, sha256] or [path, size, sha256, "
                             "content]")
        path, size, digest = check_key(str(entry[0])), int(entry[1]), _hex64(entry[2])
        if len(entry) == 3:
            return cls(path, size, digest)
        try:
            data = base64.b64decode(str(entry[3]), validate=True)
        except binascii.Error as err:
            raise ValueError(f"inline content of {path} is not base64 ({err})") from None
        found = hashlib.sha256(data).hexdigest()
        if len(data) != size or found != digest:
            raise ValueError(f"inline content of {path} has {len(data)} bytes and SHA-256 {found}, its entry says "
                             f"{size} bytes and {digest}")
        return cls(path, size, digest, data)


@dataclass(frozen=True)
class Manifest:
    """Everything needed to restore and to judge a snapshot without reading its objects."""

    job: str
    snapshot_id: str
    kind: Kind
    trigger: Trigger
    batch_id: int
    created_at: str
    query_id: str
    checkpoint: str
    files: tuple[ManifestFile, ...]
    offsets: list[str | None] = field(default_factory=list)
    next_offsets: list[str | None] | None = None
    operators: list[dict[str, Any]] = field(default_factory=list)
    conf: dict[str, str] = field(default_factory=dict)
    code_version: str | None = None
    spark_version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stored_files(self) -> tuple[ManifestFile, ...]:
        """The files whose content is an object of the job store (not inline)."""
        return tuple(f for f in self.files if f.data is None)

    @property
    def inline_bytes(self) -> int:
        return sum(f.size for f in self.files if f.data is not None)

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)

    @property
    def resume_batch(self) -> int:
        """The batch Spark runs first after a restore."""
        return self.batch_id + 1

    def to_dict(self) -> dict[str, Any]:
        body = self._fields()
        body["files"] = [f.to_json() for f in self.files]
        body["checksum"] = _checksum(body)
        return body

    def _fields(self) -> dict[str, Any]:
        """Everything but the files and the checksum."""
        return {
            "format": FORMAT_VERSION if any(f.inline for f in self.files) else 1,
            "job": self.job,
            "snapshot_id": self.snapshot_id,
            "kind": self.kind.value,
            "trigger": self.trigger.value,
            "batch_id": self.batch_id,
            "created_at": self.created_at,
            "query_id": self.query_id,
            "checkpoint": self.checkpoint,
            "offsets": self.offsets,
            "next_offsets": self.next_offsets,
            "operators": self.operators,
            "conf": self.conf,
            "code_version": self.code_version,
            "spark_version": self.spark_version,
            "labels": self.labels,
            "total_bytes": self.total_bytes,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    def summary(self) -> dict[str, Any]:
        """The manifest without its file list, for listings."""
        d = self._fields()
        d["file_count"] = len(self.files)
        d["inline_files"] = sum(1 for f in self.files if f.inline)
        d["inline_bytes"] = self.inline_bytes
        d["state_partitions"] = self.state_partitions
        return d

    @property
    def state_partitions(self) -> int | None:
        """The stateful operators' partitions a restore of this snapshot runs with (None: stateless)."""
        if not self.operators:
            return None
        return state_partitions(self.conf) or max(int(o.get("partitions") or 0) for o in self.operators) or None

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Parse and check a manifest; SnapshotError says what is wrong with it."""
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            if d.get("format") not in READ_FORMATS:
                newer = isinstance(d.get("format"), int) and d["format"] > max(READ_FORMATS)
                raise (NewerFormatError if newer else SnapshotError)(
                    f"manifest {where} has format {d.get('format')!r}, this version reads formats "
                    f"{', '.join(map(str, READ_FORMATS))}; upgrade airflow-ckpt-provider"
                )
            expected = d.pop("checksum", None)
            if expected != _checksum(d):
                raise ValueError("its checksum does not match its content")
            files = tuple(ManifestFile.from_json(e, inline_allowed=d["format"] >= 2) for e in d["files"])
            return cls(
                job=d["job"],
                snapshot_id=d["snapshot_id"],
                kind=Kind(d["kind"]),
                trigger=Trigger(d["trigger"]),
                batch_id=int(d["batch_id"]),
                created_at=d["created_at"],
                query_id=d["query_id"],
                checkpoint=d["checkpoint"],
                files=files,
                offsets=d["offsets"],
                next_offsets=d["next_offsets"],
                operators=d["operators"],
                conf=d["conf"],
                code_version=d["code_version"],
                spark_version=d["spark_version"],
                labels=d["labels"],
            )
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError, ConfigError) as err:
            raise SnapshotError(
                f"manifest {where} is corrupt ({err}); the snapshot cannot be trusted: restore another "
                "snapshot, and dispose of this one"
            ) from err


def _hex64(value: object) -> str:
    text = str(value)
    if len(text) != 64 or text.strip("0123456789abcdef"):
        raise ValueError(f"{text!r} is not a SHA-256 hex digest")
    return text


def snapshot_order(m: Manifest) -> tuple[str, int]:
    """The one ordering of snapshots: by creation time (each writer's UTC clock), then batch id."""
    return (m.created_at, m.batch_id)


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()
