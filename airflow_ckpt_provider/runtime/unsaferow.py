"""Spark's UnsafeRow encoding of a struct, read and written in Python: how Spark's state stores hand over and take
each key and value (``key_bytes``, ``value_bytes`` of its state rewriter), so the State Processor can change values.
Values are Spark's internal ones (``StructType.toInternal``: timestamps as microseconds, dates as days).

Design notes: docs/state-processor.md#design-notes-runtimeunsaferowpy.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

#: struct formats of the fixed-width types (by pyspark's class name), little-endian as Spark writes them on every
#: platform it runs on.
FIXED: dict[str, str] = {
    "BooleanType": "<?", "ByteType": "<b", "ShortType": "<h", "IntegerType": "<i", "DateType": "<i",
    "YearMonthIntervalType": "<i", "LongType": "<q", "TimestampType": "<q", "TimestampNTZType": "<q",
    "DayTimeIntervalType": "<q", "FloatType": "<f", "DoubleType": "<d",
}
VARIABLE = ("StringType", "BinaryType")
#: Decimals of at most this precision are a long of their unscaled value; wider ones are not handled.
COMPACT_DECIMAL = 18


def _kind(t: DataType) -> str:
    return type(t).__name__


def unsupported(schema: StructType) -> list[str]:
    """The fields of ``schema`` (dotted paths) of types this codec does not handle (arrays, maps, wide decimals)."""
    out: list[str] = []
    for f in schema.fields:
        t, kind = f.dataType, _kind(f.dataType)
        if kind == "StructType":
            out += [f"{f.name}.{inner}" for inner in unsupported(t)]  # type: ignore[arg-type]  # a StructType
        elif kind == "DecimalType":
            if t.precision > COMPACT_DECIMAL:  # type: ignore[attr-defined]  # a DecimalType
                out.append(f"{f.name} ({t.simpleString()})")
        elif kind not in FIXED and kind not in VARIABLE:
            out.append(f"{f.name} ({t.simpleString()})")
    return out


def _bitset(fields: int) -> int:
    return ((fields + 63) // 64) * 8


def decode(schema: StructType, data: bytes, base: int = 0) -> tuple[Any, ...]:
    """The internal values of the row at ``data[base:]`` of ``schema``."""
    n = len(schema.fields)
    width = _bitset(n)
    out: list[Any] = []
    for i, f in enumerate(schema.fields):
        if data[base + i // 8] >> (i % 8) & 1:  # the null bits: little-endian words, bit i of the whole set
            out.append(None)
            continue
        slot = base + width + 8 * i
        t, kind = f.dataType, _kind(f.dataType)
        fmt = FIXED.get(kind)
        if fmt is not None:
            out.append(struct.unpack_from(fmt, data, slot)[0])
            continue
        if kind == "DecimalType":
            out.append(Decimal(struct.unpack_from("<q", data, slot)[0]).scaleb(-t.scale))  # type: ignore[attr-defined]  # a DecimalType
            continue
        (word,) = struct.unpack_from("<q", data, slot)
        offset, size = word >> 32, word & 0xFFFFFFFF
        start = base + offset
        if kind == "StringType":
            out.append(data[start:start + size].decode("utf-8"))
        elif kind == "BinaryType":
            out.append(bytearray(data[start:start + size]))
        else:  # a struct: unsupported() refuses the rest first
            out.append(decode(t, data[start:start + size]))  # type: ignore[arg-type]  # a StructType
    return tuple(out)


def encode(schema: StructType, values: Sequence[Any]) -> bytes:
    """The UnsafeRow of ``values`` (internal values of ``schema``), as Spark's UnsafeRowWriter writes it: the null
    bits, an 8-byte slot per field (zeroed, then the value), variable-length data word-aligned after them."""
    n = len(schema.fields)
    if len(values) != n:
        raise ConfigError(f"a row of {schema.simpleString()}: expected {n} values, found {len(values)}")
    width = _bitset(n)
    row = bytearray(width + 8 * n)
    for i, (f, v) in enumerate(zip(schema.fields, values, strict=True)):
        if v is None:
            row[i // 8] |= 1 << (i % 8)
            continue
        slot = width + 8 * i
        t, kind = f.dataType, _kind(f.dataType)
        fmt = FIXED.get(kind)
        if fmt is not None:
            struct.pack_into(fmt, row, slot, v)
            continue
        if kind == "DecimalType":
            struct.pack_into("<q", row, slot, int(Decimal(v).scaleb(t.scale)))  # type: ignore[attr-defined]  # a DecimalType
            continue
        if kind == "StringType":
            data = v.encode("utf-8")
        elif kind == "BinaryType":
            data = bytes(v)
        elif kind == "StructType":
            data = encode(t, v)  # type: ignore[arg-type]  # a StructType
        else:
            raise ConfigError(f"field {f.name} of {t.simpleString()}: expected a type the State Processor can "
                              "write (numbers, strings, binary, dates, timestamps, structs of them)")
        struct.pack_into("<q", row, slot, (len(row) << 32) | len(data))
        row += data + bytes(-len(data) % 8)
    return bytes(row)
