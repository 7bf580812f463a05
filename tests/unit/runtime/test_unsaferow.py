"""Spark's UnsafeRow encoding read and written in Python (runtime/unsaferow.py): the layout Spark's UnsafeRowWriter
produces, byte for byte, and every supported type through a round trip. Real state's bytes are checked against it
by tests/integration/test_checkpoint_spark.py (a value change refuses rows it cannot write back exactly)."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.runtime.unsaferow import decode, encode, unsupported


def test_a_long_and_a_string_are_laid_out_as_sparks_writer_does() -> None:
    schema = StructType([StructField("count", LongType()), StructField("name", StringType())])
    row = encode(schema, (5, "ab"))
    # 8 bytes of null bits, two 8-byte slots, then "ab" padded to a word; the string's slot: offset 24, size 2.
    assert row == bytes(8) + struct.pack("<q", 5) + struct.pack("<q", (24 << 32) | 2) + b"ab" + bytes(6)
    assert decode(schema, row) == (5, "ab")


def test_nulls_set_their_bit_and_leave_a_zero_slot() -> None:
    schema = StructType([StructField(f"f{i}", LongType()) for i in range(66)])
    values = [None if i in (0, 65) else i for i in range(66)]
    row = encode(schema, values)
    assert len(row) == 16 + 66 * 8  # two words of null bits for 66 fields
    assert struct.unpack_from("<q", row, 0)[0] == 1 and struct.unpack_from("<q", row, 8)[0] == 2
    assert row[16:24] == bytes(8)
    assert list(decode(schema, row)) == values


def test_every_supported_type_round_trips_nested_structs_included() -> None:
    window = StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
    schema = StructType([
        StructField("b", BooleanType()), StructField("y", ByteType()), StructField("s", ShortType()),
        StructField("i", IntegerType()), StructField("d", DateType()), StructField("f", FloatType()),
        StructField("x", DoubleType()), StructField("m", DecimalType(10, 2)), StructField("bin", BinaryType()),
        StructField("window", window), StructField("name", StringType()),
    ])
    values = (True, -3, 300, -70000, 20_000, 1.5, -2.25, Decimal("12345.67"), bytearray(b"\x00\xff" * 5),
              (1_700_000_000_000_000, 1_700_000_060_000_000), "zürich")
    row = encode(schema, values)
    assert len(row) % 8 == 0
    assert decode(schema, row) == values
    assert encode(schema, decode(schema, row)) == row


def test_types_it_cannot_write_are_named_and_a_short_row_refused() -> None:
    schema = StructType([StructField("ok", LongType()), StructField("tags", ArrayType(StringType())),
                         StructField("inner", StructType([StructField("wide", DecimalType(30, 2))]))])
    assert unsupported(schema) == ["tags (array<string>)", "inner.wide (decimal(30,2))"]
    with pytest.raises(ConfigError, match=r"expected 3 values, found 2"):
        encode(schema, (1, None))
