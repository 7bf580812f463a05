"""The record base: one serializer, unknown keys ignored, old versions upgraded step by step, newer refused."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import msgspec
import pytest

from airflow_ckpt_provider.core.records.base import NewerRecordError, Record, RecordError, Upgrade


def _v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    body["count"] = int(body.pop("n"))  # version 1 named it n
    return body


def _v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
    body.setdefault("unit", "records")  # version 3 says what it counts
    return body


class Counter(Record, frozen=True, kw_only=True):
    SCHEMA: ClassVar[int] = 3
    WHAT: ClassVar[str] = "counter"
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: _v1_to_v2, 2: _v2_to_v3}

    name: str
    count: int
    unit: str = "records"


def test_a_record_round_trips_with_its_schema_version_and_sorted_keys() -> None:
    data = Counter(name="orders", count=3, unit="rows").to_bytes()
    assert json.loads(data) == {"schema": 3, "name": "orders", "count": 3, "unit": "rows"}
    assert list(json.loads(data)) == sorted(json.loads(data))
    assert Counter.from_bytes(data, "x") == Counter(name="orders", count=3, unit="rows", schema=3)


def test_unknown_keys_are_ignored() -> None:
    data = b'{"schema": 3, "name": "orders", "count": 3, "unit": "rows", "added_later": [1, 2]}'
    assert Counter.from_bytes(data, "x").count == 3


def test_old_versions_are_upgraded_one_step_at_a_time_and_a_file_without_a_version_is_version_1() -> None:
    assert Counter.from_bytes(b'{"name": "a", "n": "7"}', "x") == Counter(name="a", count=7, schema=3)
    assert Counter.from_bytes(b'{"schema": 1, "name": "a", "n": 7}', "x").count == 7
    assert Counter.from_bytes(b'{"schema": 2, "name": "a", "count": 7}', "x").unit == "records"


def test_a_newer_version_is_refused_with_what_to_do() -> None:
    with pytest.raises(NewerRecordError, match=r"counter f was written with schema 4, this release reads up to 3: "
                                               "upgrade airflow-ckpt-provider"):
        Counter.from_bytes(b'{"schema": 4, "name": "a", "count": 1}', "f")


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json", r"counter f is not JSON"),
    (b"[1, 2]", r"counter f: expected a JSON object, found list"),
    (b'{"schema": "two", "name": "a", "count": 1}', r"expected a schema version \(a whole number\), found 'two'"),
    (b'{"schema": 3, "name": "a", "count": "many"}', r"counter f is not valid: Expected `int`, got `str` - at "
                                                     r"`\$.count`"),
    (b'{"schema": 3, "count": 1}', r"counter f is not valid: Object missing required field `name`"),
])
def test_a_broken_file_says_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        Counter.from_bytes(data, "f")


class Legacy(Record, frozen=True, kw_only=True):
    """A type whose files predate the base: its version key is ``format``; it writes the lowest format that holds
    a record (format 2 only for a record with ``extra``), so that older releases still read the rest."""

    SCHEMA: ClassVar[int] = 2
    WHAT: ClassVar[str] = "legacy"
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: lambda body: body}  # format 2 only adds a field

    schema: int = msgspec.field(default=0, name="format")
    name: str
    extra: str | None = None

    def written_schema(self) -> int:
        return 2 if self.extra is not None else 1


def test_a_type_may_name_its_version_key_and_write_the_lowest_version_that_holds_a_record() -> None:
    assert Legacy.version_key() == "format" and Counter.version_key() == "schema"
    assert json.loads(Legacy(name="a").to_bytes()) == {"format": 1, "name": "a", "extra": None}
    assert json.loads(Legacy(name="a", extra="x").to_bytes())["format"] == 2
    assert Legacy.from_bytes(b'{"format": 1, "name": "a", "extra": null}', "x") == Legacy(name="a", schema=2)
    assert Legacy.from_bytes(b'{"name": "a"}', "x").schema == 2  # no key: version 1
    assert Legacy.from_bytes(b'{"format": 2, "name": "a", "schema": 9}', "x").name == "a"  # not its key: ignored
    with pytest.raises(NewerRecordError, match=r"legacy f was written with format 3, this release reads up to 2"):
        Legacy.from_bytes(b'{"format": 3, "name": "a"}', "f")
    with pytest.raises(RecordError, match=r"expected a format version \(a whole number\), found True"):
        Legacy.from_bytes(b'{"format": true, "name": "a"}', "f")
