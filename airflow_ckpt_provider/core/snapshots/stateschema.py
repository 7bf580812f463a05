"""transformWithState's state schema files, and what an upgrade changed in them. Pure; no pyspark import.

Spark writes ``state/<op>/_stateSchema/default/<batch>_<uuid>`` when a transformWithState operator's state
schemas are first known or change (schema file v3: per column family, i.e. per state variable and timer, its key
and value schemas as Spark's JSON with a schema id that an Avro-encoded evolution increments). The restore check
reads the newest file before and after the new code's batch and says, per state variable, what changed.
Design notes: docs/spark-checkpoint-internals.md#design-notes-coresnapshotsstateschemapy.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: A schema file: ``state/<op>/_stateSchema/<store>/<batch>_<uuid>``.
SCHEMA_FILE = re.compile(r"^state/(\d+)/_stateSchema/[^/]+/(\d+)_[0-9a-f-]+$")
#: Spark's setting for how state rows are encoded; only ``avro`` lets transformWithState schemas evolve.
ENCODING_CONF = "spark.sql.streaming.stateStore.encodingFormat"


@dataclass(frozen=True)
class ColumnFamily:
    """One state variable's (or timer's) schemas: fields as (name, type) in Spark's JSON type names."""

    name: str
    key_schema_id: int
    key: tuple[tuple[str, str], ...]
    value_schema_id: int
    value: tuple[tuple[str, str], ...]


class _Reader:
    """Java's DataOutputStream as Spark writes schema files: writeUTF, writeInt, writeShort."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError(f"truncated at byte {self.at}: {n} more bytes expected, {len(self.data) - self.at} left")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def short(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def utf(self) -> str:
        return self.take(struct.unpack(">H", self.take(2))[0]).decode("utf-8")

    def chunked(self) -> str:
        """A string longer than writeUTF's 65,535 bytes: a count of chunks, then each chunk."""
        return "".join(self.utf() for _ in range(self.int()))


def parse_schema_file(data: bytes) -> dict[str, ColumnFamily]:
    """A schema file of format v3 (Spark 4.x transformWithState); ValueError says what is wrong."""
    reader = _Reader(data)
    version = reader.utf()
    if version != "v3":
        raise ValueError(f"state schema file format {version!r}; this provider reads v3 (Spark 4.x transformWithState)")
    families: dict[str, ColumnFamily] = {}
    for _ in range(reader.int()):
        name = reader.utf()
        key_id, key = reader.short(), _fields(reader.chunked())
        value_id, value = reader.short(), _fields(reader.chunked())
        reader.chunked()  # the key encoder (prefix or range scan), fixed by the state variable's kind
        reader.chunked()  # a MapState's user key schema, "{    }" for others: part of the key above
        families[name] = ColumnFamily(name, key_id, key, value_id, value)
    return families


def _fields(text: str) -> tuple[tuple[str, str], ...]:
    schema = json.loads(text)
    return tuple((str(f["name"]), _type(f["type"])) for f in schema.get("fields", []))


def _type(t: Any) -> str:
    return t if isinstance(t, str) else str(t.get("type", "struct"))


def newest_schema_files(keys: Iterable[str]) -> dict[int, str]:
    """Per operator, its newest schema file (highest batch) among ``keys``."""
    newest: dict[int, tuple[int, str]] = {}
    for key in keys:
        m = SCHEMA_FILE.match(key)
        if m and (int(m[1]) not in newest or int(m[2]) > newest[int(m[1])][0]):
            newest[int(m[1])] = (int(m[2]), key)
    return {op: key for op, (_, key) in newest.items()}


def describe_changes(op: int, before: dict[str, ColumnFamily], after: dict[str, ColumnFamily]) -> list[str]:
    """One line per state variable of operator ``op`` whose schema the new code changed (added, dropped, a field
    added, removed or retyped), user-facing names only (Spark's internal timer and TTL families are skipped)."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if name.startswith(("$", "_")):
            continue
        old, new = before.get(name), after.get(name)
        if old is None:
            lines.append(f"operator {op}: new state variable {name!r}, starting empty")
        elif new is None:
            lines.append(f"operator {op}: state variable {name!r} is no longer declared")
        else:
            for part, was, now in (("key", old.key, new.key), ("value", old.value, new.value)):
                change = _field_changes(dict(was), dict(now))
                if change:
                    ids = (old.key_schema_id, new.key_schema_id) if part == "key" else (
                        old.value_schema_id, new.value_schema_id)
                    lines.append(f"operator {op}: state variable {name!r} {part} schema {ids[0]} -> {ids[1]}: "
                                 + "; ".join(change))
    return lines


def _field_changes(was: dict[str, str], now: dict[str, str]) -> list[str]:
    out = [f"added field {n} ({t})" for n, t in now.items() if n not in was]
    out += [f"removed field {n} ({t})" for n, t in was.items() if n not in now]
    out += [f"field {n}: {was[n]} -> {t}" for n, t in now.items() if n in was and was[n] != t]
    return out


Schemas = dict[int, tuple[str, dict[str, ColumnFamily]]]  # operator -> (its newest schema file, what it holds)


def schema_changes(before: Schemas, after: Schemas) -> list[str]:
    """What the new code changed in the state schemas of each transformWithState operator: compared where Spark
    wrote a newer schema file (it writes one only when a schema changes)."""
    lines: list[str] = []
    for op in sorted(after):
        if op in before and before[op][0] != after[op][0]:
            lines += describe_changes(op, before[op][1], after[op][1])
    return lines


def evolution_hint(schemas: Schemas, encoding: str | None) -> str | None:
    """For a state schema Spark refused: when the query has transformWithState operators and its state is not
    Avro-encoded, why their schemas cannot evolve and what to do."""
    if not schemas or (encoding or "unsaferow") == "avro":
        return None
    ops = ", ".join(str(op) for op in sorted(schemas))
    return (f"if the refused schema is a transformWithState state variable's (operator {ops}): such schemas evolve "
            f"(fields added, removed, widened) only with Avro encoding, and this state is encoded as "
            f"{encoding or 'unsaferow'} ({ENCODING_CONF}, fixed when the checkpoint was created). Keep the state "
            f"variable's schema, declare a new variable for the new shape, or start a new checkpoint with "
            f"{ENCODING_CONF}=avro")
