"""gc's generation token (``locks/gc-generation.json``), shared by gc (core/snapshots/gc.py) and snapshot writers
(core/snapshots/snapshotwrite.py).

The token changes whenever gc may have deleted objects: gc writes a new one before its first delete and again
after its last. ``held`` says gc is at work on the store: it is set after gc takes its lock and before it looks for
writers' pending markers, and cleared with the token written after the deletes. A writer that stored its marker
and then reads the token not held knows gc defers to that marker from then on; held, it waits for gc's lock.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from airflow_ckpt_provider.core.records.base import Record, RecordError
from airflow_ckpt_provider.core.store.jobstore import GC_GENERATION, JobStore


@dataclass(frozen=True)
class Generation:
    token: str
    held: bool = False

    @classmethod
    def parse(cls, body: bytes) -> Generation:
        """The token and flag of a stored body; a body that is not this record is its own token (never equal to
        a real one), not held."""
        try:
            record = GenerationRecord.from_bytes(body, GC_GENERATION)
        except RecordError:
            return cls("unparsed:" + body.hex())
        return cls(record.token, record.held)

    @staticmethod
    def new(*, held: bool) -> Generation:
        return Generation(secrets.token_hex(8), held)

    def body(self, by: str) -> bytes:
        """The stored form; ``by`` ("gc" or "writer") and the time are there for operators."""
        return GenerationRecord(token=self.token, held=self.held, by=by, at=time.time()).to_bytes()


class GenerationRecord(Record, frozen=True, kw_only=True):
    """gc's generation token: a new ``token`` whenever gc may have deleted objects, ``held`` while gc works on the
    store, who wrote it (``by``: gc, or the first writer of a new store) and when. Written by gc before its first
    delete and after its last, and created by the first snapshot writer of a store; read by every snapshot writer
    (``read_generation``): a token it saw change means its objects may be gone."""

    WHAT = "gc generation"
    KEY = "locks/gc-generation.json"

    token: str
    held: bool = False
    by: str = ""
    at: float = 0.0


def read_generation(store: JobStore, *, create_first: bool, by: str = "writer") -> tuple[Generation, bool]:
    """The store's generation and whether this call created it.

    A store without one gets one first (create if absent), so that a store wiped and made again (no token before,
    none after) never passes for the one a writer listed. ``create_first`` (a process's first look at the store,
    often a new store) tries the create first: one request for a new store, two for an old one; else one read.
    """
    new = Generation.new(held=False)
    if not create_first:
        try:
            return Generation.parse(store.storage.read(GC_GENERATION)), False
        except FileNotFoundError:
            pass
    if store.storage.create(GC_GENERATION, new.body(by)):
        return new, True
    return Generation.parse(store.storage.read(GC_GENERATION)), False  # another process or gc wrote it


def write_generation(store: JobStore, generation: Generation) -> None:
    """gc's writes of the token (core/snapshots/gc.py)."""
    store.storage.write(GC_GENERATION, generation.body("gc"))
