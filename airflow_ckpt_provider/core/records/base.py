"""One base for every file the job store holds: typed fields, one serializer, one rule, one mechanism.
msgspec's JSON; unknown keys ignored; a ``schema`` version per file, upgraded by ``UPGRADES``, newer ones refused.

Design notes: docs/concepts.md#design-notes-corerecordsbasepy."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, Self

import msgspec

from airflow_ckpt_provider.core.errors import ConfigError, StorageError

#: A step from one version of a record type to the next, on the decoded JSON object.
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]

_ENCODER = msgspec.json.Encoder(order="sorted")


class RecordError(StorageError):
    """A file of the job store is not a valid record of its type."""


class NewerRecordError(RecordError):
    """A file was written by a newer release (a higher ``schema`` than this release knows)."""


class Record(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Base of the job store's records. A subclass sets ``SCHEMA`` (the version it writes), ``WHAT`` (what the
    file is, for errors), ``KEY`` (where it lives under the job's root, for the generated layout, e.g.
    ``deployments/<epoch>.json``), its docstring (what the file says, who writes and who reads it) and, from
    version 2 on, ``UPGRADES[v]`` (version v to v + 1)."""

    SCHEMA: ClassVar[int] = 1
    WHAT: ClassVar[str] = "record"
    KEY: ClassVar[str] = ""
    UPGRADES: ClassVar[dict[int, Upgrade]] = {}

    schema: int = 0  # the version that wrote a record read (0 in one made here); to_bytes writes written_schema()

    def __eq__(self, other: object) -> bool:
        """Equal records say the same: their fields but the version, so a record made here equals it read back."""
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__struct_fields__ if f != "schema")

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f) for f in self.__struct_fields__ if f != "schema"))

    def written_schema(self) -> int:
        """The version this record is written with: SCHEMA, or for a type that says so the lowest that holds it."""
        return type(self).SCHEMA

    def to_bytes(self) -> bytes:
        return _ENCODER.encode(msgspec.structs.replace(self, schema=self.written_schema()))

    def to_dict(self) -> dict[str, Any]:
        """The record as printed and sent (`ckpt ... --json`, the UI, a trigger's event): its fields as JSON
        values, without the file's schema version."""
        return record_fields(self)

    @classmethod
    def version_key(cls) -> str:
        """The version's key in the file: ``schema``, unless the type renamed its ``schema`` field."""
        return _version_key(cls)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Self:
        """Decode, upgrade an older version, check the fields; RecordError says what is wrong with the file."""
        try:
            record = msgspec.json.decode(data, type=cls, strict=False)
        except (msgspec.ValidationError, ConfigError):
            record = None  # an older version's shape, or a broken file: decide from the raw object
        except msgspec.DecodeError as err:
            raise RecordError(f"{cls.WHAT} {where} is not JSON ({err})") from err
        if record is not None and record.schema == cls.SCHEMA:
            return record
        return cls.from_object(msgspec.json.decode(data), where)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded object's values as the fields take them: a type whose field is written as text (a launch's
        restore) parses it here, and writes it in ``to_dict``."""
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        """The record of ``to_dict``'s output (carried in an upgrade's plan, an event), upgraded as a file is."""
        return cls.from_object(body, f"({cls.WHAT} given as a dict)")

    @classmethod
    def from_object(cls, body: Any, where: str) -> Self:
        """The record of a decoded JSON object, upgraded from its version."""
        if not isinstance(body, dict):
            raise RecordError(f"{cls.WHAT} {where}: expected a JSON object, found {type(body).__name__}")
        key = cls.version_key()
        version = body.get(key, 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise RecordError(f"{cls.WHAT} {where}: expected a {key} version (a whole number), found {version!r}")
        if version > cls.SCHEMA:
            raise NewerRecordError(
                f"{cls.WHAT} {where} was written with {key} {version}, this release reads up to {cls.SCHEMA}: "
                "upgrade airflow-ckpt-provider where it is read")
        for step in range(max(version, 1), cls.SCHEMA):  # version 0 is version 1 without the key
            body = cls.UPGRADES[step](dict(body))
        try:
            return msgspec.convert({**cls.from_wire(body), key: cls.SCHEMA}, cls, strict=False)
        except (msgspec.ValidationError, ConfigError) as err:
            raise RecordError(f"{cls.WHAT} {where} is not valid: {err}") from err


def record_fields(record: Record) -> dict[str, Any]:
    """A record's fields as JSON values, without the file's schema version: what the CLI prints and events carry."""
    body: dict[str, Any] = msgspec.to_builtins(record)
    del body[type(record).version_key()]
    return body


@cache
def _version_key(cls: type[Record]) -> str:
    return next(f.encode_name for f in msgspec.structs.fields(cls) if f.name == "schema")
