"""Which library should serialize the job store's records (issue 40)? Encode and decode the two hot records,
side by side in one run: a snapshot manifest (written after every batch by default, read by every restore,
listing and retention pass) and the driver's status (written every heartbeat and batch, read by every health
poll), each with today's code and with msgspec and pydantic models of the same JSON. Today's manifest is the
record base's (msgspec, since issue 40; docs/benchmarks.md has the hand-written code's numbers before it); to
measure an older commit's code, run this file with that commit's package first on PYTHONPATH.

Prints the time per record of each and the ratios to today's code (higher is faster); nothing is asserted.
The models check what today's parsers check (types, enums, required fields) and keep the same JSON, so the
comparison is the library's cost, not a different format.

    .venv/bin/python bench/record_codec_bench.py [--files 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pydantic

from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, ManifestFile, Trigger


def sample_manifest(files: int) -> Manifest:
    entries = []
    for i in range(files):
        body = f"state file {i}".encode()
        inline = i % 10 == 0  # a tenth small enough to go inline
        entries.append(ManifestFile(f"state/0/{i % 4}/{i}.delta", len(body), hashlib.sha256(body).hexdigest(),
                                    body if inline else None))
    return Manifest(job="orders", snapshot_id="checkpoint-41-20261128T090000Z-abcdef", kind=Kind.CHECKPOINT,
                    trigger=Trigger.PERIODIC, batch_id=41, created_at="2026-11-28T09:00:00+00:00",
                    query_id="8d916c80-f52c-4df4-aa47-742d8b654d13", checkpoint="s3://bucket/live",
                    files=tuple(entries), offsets=['{"orders":{"0":100,"1":90,"2":95}}'],
                    operators=[{"id": 0, "name": "stateStoreSave", "partitions": 4}],
                    conf={"spark.sql.shuffle.partitions": "4"}, code_version="v2", spark_version="4.3.0",
                    labels={"epoch": "3"})


def sample_status() -> JobStatus:
    return JobStatus(job="orders", state=JobState.RUNNING, epoch=3, updated_at=1795857000.5, started_at=1795850000.0,
                     reason="running", batch_id=41, batch_at=1795856999.0,
                     offsets={"ckpt-kafka": {"orders": {"0": 100, "1": 90, "2": 95}}}, lag=0, idle=True,
                     last_snapshot={"snapshot_id": "checkpoint-41-20261128T090000Z-abcdef", "batch_id": 41},
                     pid=4242, host="worker-1", app_id="local-1795850000", code_version="v2",
                     restarts=[{"attempt": 1, "cause": "a task failed", "from_batch": 30}], restart_count=1)


# -- msgspec models of the same JSON ------------------------------------------------------------

class MsgspecManifest(msgspec.Struct, kw_only=True):
    format: int
    job: str
    snapshot_id: str
    kind: str
    trigger: str
    batch_id: int
    created_at: str
    query_id: str
    checkpoint: str
    files: list[list[str | int]]  # [path, size, sha256] or [path, size, sha256, base64 content]
    offsets: list[str | None]
    next_offsets: list[str | None] | None
    operators: list[dict[str, Any]]
    conf: dict[str, str]
    code_version: str | None
    spark_version: str | None
    labels: dict[str, str]
    total_bytes: int
    checksum: str


class MsgspecStatus(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    job: str
    state: JobState
    epoch: int
    updated_at: float
    started_at: float
    reason: str = ""
    batch_id: int | None = None
    batch_at: float | None = None
    offsets: dict[str, Any] = msgspec.field(default_factory=dict)
    lag: int | None = None
    data_waiting: bool = False
    idle: bool = False
    last_snapshot: dict[str, Any] | None = None
    restored_from: str | None = None
    pid: int | None = None
    host: str | None = None
    app_id: str | None = None
    ui_url: str | None = None
    code_version: str | None = None
    heartbeat_interval: float = 5.0
    restart: dict[str, Any] | None = None
    restarts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    restart_count: int = 0


# -- pydantic models of the same JSON -----------------------------------------------------------

class PydanticManifest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    format: int
    job: str
    snapshot_id: str
    kind: str
    trigger: str
    batch_id: int
    created_at: str
    query_id: str
    checkpoint: str
    files: list[list[str | int]]  # [path, size, sha256] or [path, size, sha256, base64 content]
    offsets: list[str | None]
    next_offsets: list[str | None] | None
    operators: list[dict[str, Any]]
    conf: dict[str, str]
    code_version: str | None
    spark_version: str | None
    labels: dict[str, str]
    total_bytes: int
    checksum: str


class PydanticStatus(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    job: str
    state: JobState
    epoch: int
    updated_at: float
    started_at: float
    reason: str = ""
    batch_id: int | None = None
    batch_at: float | None = None
    offsets: dict[str, Any] = pydantic.Field(default_factory=dict)
    lag: int | None = None
    data_waiting: bool = False
    idle: bool = False
    last_snapshot: dict[str, Any] | None = None
    restored_from: str | None = None
    pid: int | None = None
    host: str | None = None
    app_id: str | None = None
    ui_url: str | None = None
    code_version: str | None = None
    heartbeat_interval: float = 5.0
    restart: dict[str, Any] | None = None
    restarts: list[dict[str, Any]] = pydantic.Field(default_factory=list)
    restart_count: int = 0


def per_call(fn: Callable[[], object], rounds: int, min_time: float = 0.2) -> float:
    """Median seconds per call over ``rounds`` rounds of at least ``min_time`` each."""
    times = []
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_time:
            fn()
            n += 1
        times.append(elapsed / n)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="files in the sample manifest (default 2000)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    manifest = sample_manifest(args.files)
    manifest_json = manifest.to_bytes()
    status = sample_status()
    status_json = status.to_bytes()
    m_dec = msgspec.json.Decoder(MsgspecManifest)
    s_dec = msgspec.json.Decoder(MsgspecStatus)
    m_enc = msgspec.json.Encoder()
    m_obj, s_obj = m_dec.decode(manifest_json), s_dec.decode(status_json)
    p_m_obj = PydanticManifest.model_validate_json(manifest_json)
    p_s_obj = PydanticStatus.model_validate_json(status_json)
    assert json.loads(m_enc.encode(m_obj)) == json.loads(manifest_json)  # the same JSON, field for field
    assert json.loads(p_m_obj.model_dump_json()) == json.loads(manifest_json)

    m_dict, s_dict = json.loads(manifest_json), json.loads(status_json)
    cases: list[tuple[str, dict[str, Callable[[], object]]]] = [
        (f"manifest decode ({args.files} files, {len(manifest_json):,} B)", {
            "today": lambda: Manifest.from_bytes(manifest_json, "bench"),
            "json": lambda: json.loads(manifest_json),
            "msgspec": lambda: m_dec.decode(manifest_json),
            "pydantic": lambda: PydanticManifest.model_validate_json(manifest_json)}),
        ("manifest encode", {
            "today": manifest.to_bytes,
            "json": lambda: json.dumps(m_dict).encode(),
            "msgspec": lambda: m_enc.encode(m_obj),
            "pydantic": p_m_obj.model_dump_json}),
        (f"status decode ({len(status_json):,} B)", {
            "today": lambda: JobStatus.from_bytes(status_json, "bench"),
            "json": lambda: json.loads(status_json),
            "msgspec": lambda: s_dec.decode(status_json),
            "pydantic": lambda: PydanticStatus.model_validate_json(status_json)}),
        ("status encode", {
            "today": status.to_bytes,
            "json": lambda: json.dumps(s_dict).encode(),
            "msgspec": lambda: m_enc.encode(s_obj),
            "pydantic": p_s_obj.model_dump_json}),
    ]
    print(f"record codecs, medians of {args.rounds} rounds (msgspec {msgspec.__version__}, "
          f"pydantic {pydantic.VERSION}); ratio = today's time / the library's (higher is faster)")
    for title, fns in cases:
        times = {name: per_call(fn, args.rounds) for name, fn in fns.items()}
        base = times["today"]
        row = "  ".join(f"{name} {t * 1e6:9.1f} us ({base / t:5.2f}x)" for name, t in times.items())
        print(f"{title:45s} {row}")
    print("today: the package's code (the manifest's also computes or checks its checksum, a SHA-256 of the whole "
          "file, checks each inline file's SHA-256, the digests and the paths); json: the stdlib on the same dict, "
          "untyped (no checks at all); msgspec and pydantic: typed models of the same JSON (types, enums, "
          "required fields checked), without the checksum and those checks")


if __name__ == "__main__":
    main()
