"""The snapshot manifest: the one file that makes a snapshot exist, with a checksum of itself; small files inline.

Design notes: docs/concepts.md#design-notes-coresnapshotsmanifestpy."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

import msgspec

from airflow_ckpt_provider.core.errors import ConfigError, SnapshotError
from airflow_ckpt_provider.core.records.base import Record, Upgrade
from airflow_ckpt_provider.core.snapshots.statestore import state_partitions
from airflow_ckpt_provider.core.store.storage import check_key, check_keys

FORMAT_VERSION = 2
#: The formats this version reads (the format written: 2 if a file is inline, else 1).
READ_FORMATS = (1, 2)
#: Labels of a rescale's savepoint: the savepoint it was repartitioned from, and that one's partitions.
RESCALED_FROM = "rescaled_from"
PARTITIONS_BEFORE = "partitions_before"
#: Labels of a savepoint written by the State Processor (trigger manual, which every reader knows): the snapshot
#: it was rewritten from; the key deletion (``OPERATOR:PREDICATE``) and the state rows it removed, or the value
#: update (JSON: table, where, set) and the rows whose value it changed.
REWRITTEN_FROM = "rewritten_from"
KEYS_DELETED = "keys_deleted"
ROWS_REMOVED = "rows_removed"
VALUES_SET = "values_set"
ROWS_CHANGED = "rows_changed"
#: The label of how long the snapshot took until its manifest was written (seconds, as text): labels are the
#: manifest's open metadata, which readers of every format version check and keep.
TOOK_SECONDS = "took_seconds"


class NewerFormatError(SnapshotError):
    """A manifest of a format above ``READ_FORMATS``: a newer version of this package wrote it. Restoring "the
    latest" without it would silently go back in time (core/snapshots/catalog.list_snapshots, ``refuse_newer``)."""


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


class ManifestFile(msgspec.Struct, frozen=True, array_like=True):
    """One checkpoint file: its path relative to the checkpoint root, size and SHA-256, and for a file written
    into the manifest its content (``data``; None: the content is the object ``objects/<sha256>``). In the
    manifest: ``[path, size, sha256]``, or ``[path, size, sha256, content in base64]``."""

    path: str
    size: int
    sha256: Annotated[str, msgspec.Meta(min_length=64, max_length=64)]  # hex: checked after decoding
    data: bytes | None = None

    def __repr__(self) -> str:
        return (f"ManifestFile(path={self.path!r}, size={self.size}, sha256={self.sha256!r}"
                f"{', inline' if self.data is not None else ''})")

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
        """One entry checked on its own, saying what is wrong with it (the checks Manifest.from_bytes runs on
        all entries at once, for a manifest they refuse)."""
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


def _identity(body: dict[str, Any]) -> dict[str, Any]:
    return body


class Manifest(Record, frozen=True, kw_only=True):
    """The snapshot: the one file that makes it exist (written last, create-if-absent), everything needed to
    restore it and to judge it without reading its objects. Written by the snapshot's writer
    (core/snapshots/snapshotwrite.py: the driver, ``ckpt snapshot create``, a rescale); read by restores, listings,
    retention, gc, the job report and the health watch. ``files``: ``[path, size, sha256]``, or ``[path, size,
    sha256, content in base64]`` for a file written into the manifest; ``format`` is 2 only with such a file, else 1
    (the releases before inline files read it). Besides the fields below the file holds ``total_bytes`` (the
    files' sizes summed) and ``checksum`` (SHA-256 of the other keys as compact, sorted, ASCII JSON); a manifest
    whose checksum, entries or inline contents do not match is corrupt and never restored."""

    SCHEMA: ClassVar[int] = FORMAT_VERSION
    WHAT: ClassVar[str] = "manifest"
    KEY: ClassVar[str] = "snapshots/<snapshot id>/manifest.json"
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: _identity}  # format 2 only adds inline entries

    schema: int = msgspec.field(default=FORMAT_VERSION, name="format")  # written: written_schema()
    job: str
    snapshot_id: str
    kind: Kind
    trigger: Trigger
    batch_id: int
    created_at: str
    query_id: str
    checkpoint: str
    files: tuple[ManifestFile, ...]
    offsets: list[str | None] = msgspec.field(default_factory=list)
    next_offsets: list[str | None] | None = None
    operators: list[dict[str, Any]] = msgspec.field(default_factory=list)
    conf: dict[str, str] = msgspec.field(default_factory=dict)
    code_version: str | None = None
    spark_version: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)

    def written_schema(self) -> int:
        """Format 2 only with an inline file: the versions before inline files read the others."""
        return FORMAT_VERSION if any(f.data is not None for f in self.files) else 1

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
        """The manifest as JSON values, as it is written."""
        body: dict[str, Any] = json.loads(self.to_bytes())
        return body

    def _fields(self, fmt: int | None = None, total: int | None = None) -> dict[str, Any]:
        """Everything but the files and the checksum (``fmt``, ``total``: as a stored manifest says)."""
        return {
            "format": self.written_schema() if fmt is None else fmt,
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
            "total_bytes": self.total_bytes if total is None else total,
        }

    def _canonical(self, fmt: int | None = None, total: int | None = None) -> bytes:
        """The bytes the checksum is of: every key but the checksum, compact, sorted, as ``json.dumps`` writes
        them (msgspec writes the same for ASCII text without DEL and no floats; otherwise json.dumps does)."""
        body = self._fields(fmt, total)
        body["files"] = [(f.path, f.size, f.sha256) if f.data is None else (f.path, f.size, f.sha256, f.data)
                         for f in self.files]  # msgspec writes bytes as base64, as to_json does
        canonical = _SORTED.encode(body)
        if canonical.isascii() and b"\x7f" not in canonical and not _has_float(self.operators):
            return canonical
        return _canonical_json(json.loads(canonical))

    def to_bytes(self) -> bytes:
        """The canonical bytes with the checksum of them added last (so a reader can check the bytes as read)."""
        canonical = self._canonical()
        return b"%s%s%s\"}" % (canonical[:-1], _CHECKSUM_KEY, hashlib.sha256(canonical).hexdigest().encode())

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
        """Parse and check a manifest; SnapshotError says what is wrong with it.

        Decoded typed, then checked as a whole (format, checksum, digests, paths, inline contents); a manifest
        that fails any of these (or holds keys this release does not know, which its checksum covers) is read
        again key by key, which says what is wrong or accepts it."""
        try:
            manifest = cls._checked(data)
            return manifest if manifest is not None else cls._read_each(data, where)
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError, ConfigError) as err:
            raise SnapshotError(
                f"manifest {where} is corrupt ({err}); the snapshot cannot be trusted: restore another "
                "snapshot, and dispose of this one"
            ) from err

    @classmethod
    def _checked(cls, data: bytes) -> Manifest | None:
        """The manifest if every check passes at once, else None."""
        try:
            stored = _DECODER.decode(data)
        except msgspec.DecodeError:  # not JSON, or not a manifest's shape: _read_each says why
            return None
        files = stored.files
        inline = [f for f in files if f.data is not None]
        if (stored.schema not in READ_FORMATS or (inline and stored.schema < 2)
                or not stored._checksum_matches(data)
                or "".join([f.sha256 for f in files]).encode().translate(None, b"0123456789abcdef")  # not hex
                or any(len(f.data) != f.size or hashlib.sha256(f.data).hexdigest() != f.sha256
                       for f in inline if f.data is not None)):
            return None
        try:
            check_keys([f.path for f in files])
        except ConfigError:
            return None
        return cls(**{name: getattr(stored, name) for name in cls.__struct_fields__ if name != "schema"})

    @classmethod
    def _read_each(cls, data: bytes, where: str) -> Manifest:
        """The manifest read key by key and entry by entry, as the releases before the record base read it."""
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
        missing = [name for name in _WRITTEN if name not in d]  # required, as the releases before required them
        if missing:
            raise KeyError(missing[0])
        try:
            fields = msgspec.convert({**d, "files": [], "format": FORMAT_VERSION}, cls)
        except msgspec.ValidationError as err:
            raise ValueError(str(err)) from None
        return msgspec.structs.replace(fields, files=files)


class _Stored(Manifest, frozen=True, kw_only=True):
    """A manifest as stored: with its total and checksum (read, then checked)."""

    KEY: ClassVar[str] = ""  # the same file as Manifest's, not another record of the layout

    total: int = msgspec.field(default=0, name="total_bytes")
    checksum: str = ""

    def _checksum_matches(self, data: bytes) -> bool:
        """Of the bytes read, as this release writes them (the checksum last); else of the canonical JSON."""
        tail = _CHECKSUM_KEY + self.checksum.encode() + b'"}'
        if data.endswith(tail) and hashlib.sha256(data[:-len(tail)] + b"}").hexdigest() == self.checksum:
            return True
        return hashlib.sha256(self._canonical(self.schema, self.total)).hexdigest() == self.checksum


_DECODER = msgspec.json.Decoder(_Stored)
_SORTED = msgspec.json.Encoder(order="sorted")
_CHECKSUM_KEY = b',"checksum":"'
#: The keys every release writes (the entry-by-entry reading requires them all, as the releases before did).
_WRITTEN = ("job", "snapshot_id", "kind", "trigger", "batch_id", "created_at", "query_id", "checkpoint", "offsets",
            "next_offsets", "operators", "conf", "code_version", "spark_version", "labels")


def _has_float(value: object) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_float(v) for v in value)
    return False


def _hex64(value: object) -> str:
    text = str(value)
    if len(text) != 64 or text.strip("0123456789abcdef"):
        raise ValueError(f"{text!r} is not a SHA-256 hex digest")
    return text


def snapshot_order(m: Manifest) -> tuple[str, int]:
    """The one ordering of snapshots: by creation time (each writer's UTC clock), then batch id."""
    return (m.created_at, m.batch_id)


def _canonical_json(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _checksum(body: dict[str, Any]) -> str:
    """The checksum of a manifest's JSON object without its checksum key."""
    return hashlib.sha256(_canonical_json(body)).hexdigest()
