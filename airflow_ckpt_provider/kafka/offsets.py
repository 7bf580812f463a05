"""Kafka offsets as Spark's Kafka source writes them: ``{"topic": {"partition": next_offset}}``.

The same JSON shape is the offset of the ``ckpt-kafka`` source in the Spark checkpoint and the
``endOffset`` of Spark's own Kafka source in query progress, so one parser serves the committer
and the lag API for both. An offset is always the NEXT offset to read (last processed + 1), which
is also what Kafka expects as a committed group offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_ckpt_provider.core.errors import CkptError, ConfigError
from airflow_ckpt_provider.core.policy.lineagenames import DatasetName, kafka_dataset

#: topic -> partition -> next offset to read
Offsets = dict[str, dict[int, int]]

class DataLossError(CkptError):
    """Records a query still had to read are gone from the broker (and failOnDataLoss is true)."""


#: In startingOffsets JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1


#: Keys starting with "$" are never Kafka topics (not a legal character): the source keeps its own
#: metadata under them next to the offsets, e.g. the commitGroupId of the query.
COMMIT_KEY = "$commit"


def parse_offsets(value: str | Mapping[str, Any], what: str = "offsets") -> Offsets:
    """Parse ``{"topic": {"0": 12}}`` (JSON text or a dict); ConfigError says what is wrong."""
    try:
        raw = json.loads(value) if isinstance(value, str) else value
        if not isinstance(raw, Mapping):
            raise TypeError("not a JSON object")
        out: Offsets = {}
        for topic, parts in raw.items():
            if str(topic).startswith("$"):
                continue
            if not isinstance(parts, Mapping):
                raise TypeError(f"topic {topic!r} maps to {type(parts).__name__}, expected an object")
            out[str(topic)] = {int(p): int(o) for p, o in parts.items()}
        return out
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"invalid {what} {value!r}: expected JSON like {{\"topic\": {{\"0\": 23, \"1\": -2}}}} "
            f"(partition -> offset; -2 earliest, -1 latest): {err}"
        ) from err


def to_json_dict(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The checkpoint form: partitions as strings, sorted, so equal offsets serialize equally."""
    return {t: {str(p): offsets[t][p] for p in sorted(offsets[t])} for t in sorted(offsets)}


def format_offsets(offsets: Offsets) -> str:
    return json.dumps(to_json_dict(offsets), separators=(",", ":"))


def total(offsets: Offsets) -> int:
    return sum(o for parts in offsets.values() for o in parts.values())


def flatten(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}


def kafka_offsets_or_none(value: str | None) -> Offsets | None:
    """Offsets if ``value`` (a source offset from query progress or the offsets log) is Kafka-shaped.

    Other sources' offsets (file source ``{"logOffset": 3}``, rate source ``"12"``, ``null``) give
    None, as do negative or empty offsets: a resolved Kafka end offset is a non-empty map of
    partitions to offsets >= 0.
    """
    if not value or value == "null":
        return None
    try:
        offsets = parse_offsets(value)
    except ConfigError:
        return None
    if not offsets or any(not parts for parts in offsets.values()):
        return None
    if any(p < 0 or o < 0 for parts in offsets.values() for p, o in parts.items()):
        return None
    return offsets


def commit_target(value: str | Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(group, bootstrap servers) a ckpt-kafka source with ``commitGroupId`` wrote into its offset."""
    try:
        raw = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    target = raw.get(COMMIT_KEY) if isinstance(raw, Mapping) else None
    if not isinstance(target, Mapping) or not target.get("group") or not target.get("servers"):
        return None
    return str(target["group"]), str(target["servers"])


def kafka_inputs(offsets: Mapping[str, Any]) -> tuple[list[DatasetName], list[str]]:
    """The Kafka topics of a driver's sources as OpenLineage datasets, from its status' end offsets (``{source:
    {topic: {partition: offset}, "$commit": {"group", "servers"}}}``), and the topics whose brokers are not known
    (a source without ``commitGroupId``: its end offsets name topics, not brokers). Other sources are skipped."""
    found: set[DatasetName] = set()
    unnamed: set[str] = set()
    for end in offsets.values():
        if not isinstance(end, Mapping):
            continue  # a file or rate source, or no batch yet
        try:
            topics = parse_offsets(end, "source offsets")
        except CkptError:
            continue  # not Kafka-shaped
        commit = end.get(COMMIT_KEY)
        servers = commit.get("servers") if isinstance(commit, Mapping) else None
        for topic in topics:
            if isinstance(servers, str) and servers.strip():
                found.add(kafka_dataset(servers, topic))
            else:
                unnamed.add(topic)
    return sorted(found), sorted(unnamed)
