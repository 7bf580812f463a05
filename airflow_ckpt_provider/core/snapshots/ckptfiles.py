"""File formats of a Spark checkpoint: metadata log entries, LZ4 block streams, zips, SST files.

Each check says why a file's bytes are not a complete file of its kind; ``relocate`` rewrites the
absolute paths that transformWithState's operator metadata holds. Pure Python, no pyspark.
"""

from __future__ import annotations

import io
import json
import re
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

# HDFSBackedStateStoreProvider.fetchFiles / RocksDBFileManager: "<version>.<kind>" in a store dir.
STATE_FILE = re.compile(r"^(\d+)\.(delta|snapshot|zip|changelog)$")



@dataclass(frozen=True)
class LogEntry:
    """One offsets/ or commits/ entry: format version, metadata JSON, and (offsets) source lines."""

    version: int
    metadata: dict[str, Any]
    offsets: list[str | None]
    source_ids: list[str] | None = None  # offsets log v2 (OffsetMap): "sourceId:offset" lines


def parse_log_entry(data: bytes, *, kind: str) -> LogEntry:
    """Parse an offsets/ or commits/ file; ValueError says what is wrong (truncated, bad version)."""
    lines = data.decode("utf-8").split("\n")
    version = _log_version(lines[0])
    if len(lines) < 2 or not lines[1].strip():
        if kind == "offsets":
            raise ValueError("the metadata line is missing (file truncated?)")
        return LogEntry(version, {}, [])
    metadata = json_object(lines[1], "metadata line")
    offsets: list[str | None] = []
    ids: list[str] | None = [] if kind == "offsets" and version == 2 else None
    for n, line in enumerate(lines[2:], start=3):
        text = line
        if ids is not None:
            source_id, sep, text = line.partition(":")
            if not sep:
                raise ValueError(f"line {n} is not 'sourceId:offset'")
            ids.append(source_id)
        offsets.append(_offset_text(text, n))
    return LogEntry(version, metadata, offsets, ids)


def _log_version(line: str) -> int:
    # MetadataVersionUtil.validateVersion: "v<int>"
    if not re.fullmatch(r"v[1-9]\d*", line.strip()):
        raise ValueError(f"first line is {line[:20]!r}, expected a version such as 'v1'")
    return int(line.strip()[1:])


def _offset_text(line: str, n: int) -> str | None:
    if line == "-":  # OffsetSeqLog.SERIALIZED_VOID_OFFSET: the source has no offset yet
        return None
    try:
        json.loads(line)
    except ValueError:
        raise ValueError(f"line {n} is not valid JSON (file truncated?)") from None
    return line


def json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"the {what} is not valid JSON (file truncated?)") from None
    if not isinstance(value, dict):
        raise ValueError(f"the {what} is not a JSON object")
    return value


_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = 21  # magic(8) + token(1) + compressed length, original length, checksum (3 x LE int32)
_SST_MAGIC = struct.pack("<Q", 0x88E241B785F4CFF7)  # RocksDB kBlockBasedTableMagicNumber footer


def lz4_stream_problem(data: bytes) -> str | None:
    """Why ``data`` is not a complete lz4-java LZ4BlockOutputStream, or None if it is complete.

    Each block has a 21-byte header; close() writes an end mark (a header with both lengths 0).
    A file cut short lacks the end mark or ends inside a block.
    """
    pos, size, problem = 0, len(data), "the file is empty"
    while pos < size:
        problem = "truncated: no LZ4 end mark (the writer never closed the file)"
        if pos + _LZ4_HEADER > size:
            return f"truncated: the LZ4 block header at byte {pos} is incomplete ({size} bytes)"
        compressed, original, _checksum = struct.unpack_from("<iii", data, pos + 9)
        if data[pos : pos + 8] != _LZ4_MAGIC or compressed < 0 or original < 0:
            return f"corrupt: no valid LZ4Block header at byte {pos}"
        pos += _LZ4_HEADER + compressed
        if compressed == 0 and original == 0 and pos == size:
            return None  # the end mark, at the end (lz4-java also reads concatenated streams)
        if pos > size:
            return f"truncated: the LZ4 block at byte {pos - compressed - _LZ4_HEADER} needs {compressed} bytes"
    return problem


def lz4_stream_head(data: bytes, want: int) -> bytes:
    """The first ``want`` bytes (or all, if fewer) an lz4-java LZ4BlockOutputStream holds, decoded block by block.

    Spark's ``lz4`` codec (LZ4CompressionCodec) writes these streams: blocks of at most
    ``spark.io.compression.lz4.blockSize`` bytes, each stored raw (method 0x10) or LZ4-compressed (0x20). Only what
    is asked for is decoded: a changelog's header (its lineage) is in its first block. ValueError on a stream that
    is no LZ4 block stream."""
    pos, out = 0, bytearray()
    while len(out) < want and pos + _LZ4_HEADER <= len(data):
        if data[pos : pos + 8] != _LZ4_MAGIC:
            raise ValueError(f"no LZ4Block header at byte {pos}")
        method = data[pos + 8] & 0xF0
        compressed, original, _checksum = struct.unpack_from("<iii", data, pos + 9)
        if compressed == 0 and original == 0:
            break  # the end mark
        body = data[pos + _LZ4_HEADER : pos + _LZ4_HEADER + compressed]
        if len(body) < compressed or method not in (0x10, 0x20):
            raise ValueError(f"the LZ4 block at byte {pos} is cut short or of an unknown method {method:#x}")
        out += body if method == 0x10 else _lz4_block(body, original)
        pos += _LZ4_HEADER + compressed
    return bytes(out[:want])


def _lz4_block(src: bytes, size: int) -> bytes:
    """One LZ4 block (the format lz4-java's compressors write) decoded: literals, then matches into the output."""
    out, i, n = bytearray(), 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        literals, i = _length(src, i, token >> 4)
        out += src[i : i + literals]
        i += literals
        if i >= n:
            break  # the last sequence has literals only
        offset = src[i] | src[i + 1] << 8
        i += 2
        length, i = _length(src, i, token & 15)
        length += 4
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise ValueError(f"an LZ4 match reaches {offset} bytes back from byte {len(out)}")
        for k in range(length):  # byte by byte: a match may overlap what it writes
            out.append(out[start + k])
    if len(out) != size:
        raise ValueError(f"an LZ4 block decoded to {len(out)} bytes, its header says {size}")
    return bytes(out)


def _length(src: bytes, i: int, nibble: int) -> tuple[int, int]:
    """An LZ4 sequence's literal or match length: the token's nibble, and while it is 15 the bytes after it (each
    255 says one more follows); with where they end."""
    length = nibble
    if nibble == 15:
        while True:
            more = src[i]
            i += 1
            length += more
            if more != 255:
                break
    return length, i


#: How much of a changelog the lineage may take: its header is two writeUTF strings (at most 64 KiB each).
_LINEAGE_HEAD = 2 * (2 + 65535)


def changelog_lineage(data: bytes) -> list[tuple[int, str]] | None:
    """The lineage a state checkpoint format v2 changelog starts with (Spark's StateStoreChangelogWriterV3/V4:
    ``writeUTF("v3" | "v4")`` then ``writeUTF(json)`` of ``[{"version", "checkpointUniqueId"}]``, inside the lz4
    stream): the (version, unique id) of the versions before it back to the snapshot it builds on, oldest first.
    None for a changelog without one (format v1). ValueError on a stream or header that cannot be read."""
    head = lz4_stream_head(data, _LINEAGE_HEAD)
    if head[:4] not in (b"\x00\x02v3", b"\x00\x02v4"):  # writeUTF("v3"): a v1 changelog starts with a record
        return None
    tag = head[2:4].decode()
    text, _ = _utf(head, 4)
    try:
        return [(int(e["version"]), str(e["checkpointUniqueId"])) for e in json.loads(text)]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"a {tag} changelog's lineage is not a list of versions and unique ids: {err}") from None


def _utf(data: bytes, pos: int) -> tuple[str, int]:
    """A Java DataOutputStream.writeUTF string at ``pos`` (a big-endian length, then the bytes) and where it ends."""
    if pos + 2 > len(data):
        raise ValueError(f"no string at byte {pos} of the changelog's header")
    (length,) = struct.unpack_from(">H", data, pos)
    if pos + 2 + length > len(data):
        raise ValueError(f"the changelog's header string at byte {pos} is cut short")
    return data[pos + 2 : pos + 2 + length].decode("utf-8", errors="replace"), pos + 2 + length


def zip_problem(data: bytes, *, deep: bool = False) -> str | None:
    """Why ``data`` is not a complete RocksDB checkpoint zip (central directory, ``metadata``)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            if "metadata" not in zf.namelist():
                return "the zip has no 'metadata' entry"
            bad = zf.testzip() if deep else None
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        return f"not a complete zip file ({err}); its central directory is missing or damaged"
    return f"corrupt: CRC mismatch in zip entry {bad!r}" if bad else None


def sst_problem(data: bytes) -> str | None:
    """Why ``data`` is not a complete RocksDB block-based SST file (footer magic number)."""
    if data[-8:] != _SST_MAGIC:
        return "truncated or corrupt: the SST footer magic number is missing"
    return None


def verify_file(path: str, data: bytes, *, codec: str = "lz4") -> str | None:
    """Check one checkpoint file's bytes by its kind; a problem description, or None if it is fine.

    The snapshot engine can call this on the bytes it uploads. State files compressed with another
    codec than lz4 are not checked (None).
    """
    name = path.rsplit("/", 1)[-1]
    top = path.split("/", 1)[0]
    try:
        if top in ("offsets", "commits") and name.isdigit():
            parse_log_entry(data, kind=top)
        elif path == "metadata":
            json_object(data.decode("utf-8"), "metadata file")
        elif STATE_FILE.match(name):
            if name.endswith(".zip"):
                return zip_problem(data, deep=True)
            return lz4_stream_problem(data) if codec == "lz4" else None
        elif name.endswith(".sst"):
            return sst_problem(data)
    except (ValueError, UnicodeDecodeError) as err:
        return f"corrupt: {err}"
    return None


def relocate(path: str, data: bytes, root_uri: str) -> bytes:
    """Rewrite absolute paths a file holds so they point into the checkpoint at ``root_uri``.

    Only the operator metadata v2 files (``state/<op>/_metadata/v2/<batch>``, transformWithState)
    hold absolute paths: ``stateSchemaFilePaths``. Other files are returned unchanged.
    """
    if not re.fullmatch(r"state/\d+/_metadata/v2/\d+", path):
        return data
    head, _, body = data.decode("utf-8").partition("\n")
    meta = json_object(body, f"{path} body")
    root = root_uri.rstrip("/")
    for store in meta.get("stateStoreInfo", []):
        paths = store.get("stateSchemaFilePaths") or []
        store["stateSchemaFilePaths"] = [_relocated_schema_path(p, root) for p in paths]
    return (head + "\n" + json.dumps(meta, separators=(",", ":"), ensure_ascii=False)).encode("utf-8")


def _relocated_schema_path(path: str, root: str) -> str:
    key = schema_key(path)
    return f"{root}/{key}" if key else path


def schema_key(absolute: str) -> str | None:
    """The checkpoint-relative key of an absolute state schema path (``.../state/<op>/_stateSchema/...``)."""
    match = re.search(r"(?:^|/)(state/\d+/_stateSchema/.+)$", absolute)
    return match.group(1) if match else None
