"""Pending snapshot markers: who writes them, when gc may clear them, and what a failed write leaves."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_ckpt_provider.cli import main as cli
from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.records.lease import LeaseRecord
from airflow_ckpt_provider.core.records.pending import FENCED_GRACE_S, PendingMarker, writer_gone
from airflow_ckpt_provider.core.snapshots.catalog import create_snapshot, pending_markers
from airflow_ckpt_provider.core.snapshots.gc import collect_garbage
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.snapshots.retention import RetentionPolicy
from airflow_ckpt_provider.core.store.jobstore import PENDING, JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime.snapshotter import SnapshotJob, Snapshotter
from tests.support.ckptfactory import make_checkpoint

SID = "checkpoint-4-20261122T000000Z-abcdef"
HOUR = 3600.0


def marker(*, host: str | None = "h1", pid: int | None = 4242, epoch: int | None = None,
           mtime: float = 1000.0) -> PendingMarker:
    return PendingMarker(SID, mtime, host=host, pid=pid, epoch=epoch, created_at="2026-11-22T00:00:00+00:00")


def lease(epoch: int) -> LeaseRecord:
    return LeaseRecord(job="orders", epoch=epoch, owner="h2:7:ab", host="h2", pid=7, acquired_at=0.0)


def gone(m: PendingMarker, *, now: float = 1010.0, lease_at: LeaseRecord | None = None,
         lease_mtime: float | None = None, alive: Iterable[int] = ()) -> str | None:
    living = set(alive)
    return writer_gone(m, now=now, stale_after=6 * HOUR, lease=lease_at, lease_mtime=lease_mtime, host="h1",
                       alive=lambda pid: pid in living)


def test_a_writer_on_this_host_whose_pid_is_gone_is_provably_gone() -> None:
    assert gone(marker()) == "its writer, pid 4242 on this host (h1), no longer exists"
    assert gone(marker(), alive=[4242]) is None


def test_a_writer_on_another_host_is_gone_only_by_age_or_a_newer_epoch() -> None:
    other = marker(host="h9")
    assert gone(other) is None
    assert gone(other, now=1000.0 + 6 * HOUR) == "the marker is 6 h 0 min old (older than 6 h 0 min)"


def test_a_newer_lease_epoch_proves_a_fenced_writer_gone_only_after_the_fencing_grace() -> None:
    fenced = marker(host="h9", epoch=3)
    assert gone(fenced, now=2000.0, lease_at=lease(4), lease_mtime=2000.0 - FENCED_GRACE_S) == (
        "its writer's lease epoch 3 was fenced by epoch 4 60 s ago")
    assert gone(fenced, now=2000.0, lease_at=lease(4), lease_mtime=2000.0 - FENCED_GRACE_S + 1) is None
    assert gone(fenced, now=2000.0, lease_at=lease(3), lease_mtime=0.0) is None  # still its own epoch
    assert gone(marker(host="h9"), now=2000.0, lease_at=lease(4), lease_mtime=0.0) is None  # no epoch: a CLI writer


def test_marker_records_host_pid_epoch_and_start_and_old_markers_have_an_unknown_owner() -> None:
    body = PendingMarker.body(SID, datetime(2026, 11, 22, 8, 0, tzinfo=UTC), 7)
    assert json.loads(body) == {"snapshot_id": SID, "started_at": "2026-11-22T08:00:00+00:00",
                                "host": socket.gethostname(), "pid": os.getpid(), "epoch": 7, "schema": 1}
    parsed = PendingMarker.parse(SID, 5.0, body)
    assert parsed.owner() == f"pid {os.getpid()} on host {socket.gethostname()} (lease epoch 7)"
    written_before = json.dumps({"epoch": None, "host": "h", "pid": 42, "snapshot_id": SID,
                                 "started_at": "2026-11-22T08:00:00+00:00"}, sort_keys=True).encode()
    assert PendingMarker.parse(SID, 5.0, written_before).owner() == "pid 42 on host h"  # the release before's
    for old in (b"{}", b"not json", b"[1]", None, b'{"host": "h", "pid": true}'):
        assert PendingMarker.parse(SID, 5.0, old).owner() == "an unknown writer (the marker does not name its owner)"


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(LocalStorage(tmp_path / "store"), "orders")


def test_snapshot_marker_names_its_writer_before_it_commits(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    seen: list[list[PendingMarker]] = []
    create_snapshot(store, LocalStorage(ckpt), epoch=5,
                    on_step=lambda step: seen.append(pending_markers(store)) if step == "pending" else None)
    [[m]] = seen
    assert (m.host, m.pid, m.epoch) == (socket.gethostname(), os.getpid(), 5)
    assert pending_markers(store) == []  # dropped after the commit


class _RefusingPending(LocalStorage):
    """A store that refuses every write and delete under pending/ (e.g. a policy denying the prefix)."""

    def write(self, key: str, data: bytes) -> None:
        if key.startswith(PENDING):
            raise StorageError(f"access denied writing {key}")
        super().write(key, data)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if any(k.startswith(PENDING) for k in keys):
            raise StorageError("access denied deleting pending/")
        super().delete(keys)


def test_snapshot_create_does_not_warn_about_a_pending_marker_it_never_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    store.storage = _RefusingPending(tmp_path / "store" / "orders")
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    with caplog.at_level(logging.INFO), pytest.raises(StorageError, match="access denied writing pending/"):
        create_snapshot(store, LocalStorage(ckpt))
    assert [r.getMessage() for r in caplog.records if "pending marker" in r.getMessage()] == []


def _write_marker(store: JobStore, **body: object) -> None:
    store.storage.write(store.pending_key(SID), json.dumps({"snapshot_id": SID, **body}).encode())


def test_gc_deferral_names_the_markers_owner_and_age_and_how_to_clear_it(store: JobStore) -> None:
    _write_marker(store, host="elsewhere", pid=31337, epoch=2, started_at="2026-11-22T00:00:00+00:00")
    result = collect_garbage(store, min_age_s=0)
    assert result.deferred == (
        f"snapshot {SID} is being written by pid 31337 on host elsewhere (lease epoch 2): its pending marker "
        f"{store.storage.uri(store.pending_key(SID))} is 0 s old. gc clears it by itself once that writer is "
        "provably gone (its pid gone on the host it ran on, a newer lease epoch, or the marker 6 h 0 min old). "
        f"If you know the writer is dead, clear it now: `ckpt snapshot gc --clear-pending {SID}`")


def test_gc_clears_the_marker_of_a_dead_writer_on_this_host_at_once(store: JobStore) -> None:
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # reaped: the pid no longer exists
    _write_marker(store, host=socket.gethostname(), pid=dead, epoch=None)
    result = collect_garbage(store, min_age_s=0)
    assert result.deferred is None
    assert pending_markers(store) == []


def test_ckpt_snapshot_gc_clear_pending_clears_a_stale_marker_and_refuses_a_live_writer(
    store: JobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["snapshot", "gc", "--store", str(store.root.url.removeprefix("file://")), "--job", "orders",
            "--min-age", "0"]
    _write_marker(store, host=socket.gethostname(), pid=os.getpid())  # this very process: alive
    assert cli.main([*base, "--clear-pending", SID]) == 1
    assert f"snapshot {SID} is being written by pid {os.getpid()}" in capsys.readouterr().err
    assert [m.snapshot_id for m in pending_markers(store)] == [SID]

    _write_marker(store, host="elsewhere", pid=1)
    assert cli.main(base) == 0
    assert capsys.readouterr().out.startswith(f"gc deferred: snapshot {SID} is being written by pid 1 on host")
    assert cli.main([*base, "--clear-pending", "checkpoint-5-20261122T000000Z-000000"]) == 1
    assert f"no pending marker for snapshot 'checkpoint-5-20261122T000000Z-000000' to clear (pending markers: {SID})" \
        in capsys.readouterr().err
    assert cli.main([*base, "--clear-pending", SID]) == 0
    assert capsys.readouterr().out == (
        f"deleted 0 objects (0 B), kept 0; cleared 1 pending marker:\n"
        f"  {SID}, written by pid 1 on host elsewhere: cleared on request (--clear-pending)\n")
    assert pending_markers(store) == []


def test_ckpt_snapshot_gc_says_which_pending_markers_it_cleared_without_verbose(
    store: JobStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["snapshot", "gc", "--store", str(store.root.url.removeprefix("file://")), "--job", "orders",
            "--min-age", "0"]
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # reaped: the pid no longer exists
    _write_marker(store, host=socket.gethostname(), pid=dead)
    done = create_snapshot(store, LocalStorage(make_checkpoint(tmp_path / "ckpt", 2))).manifest.snapshot_id
    store.storage.write(store.pending_key(done), json.dumps({"snapshot_id": done}).encode())  # left behind
    host = socket.gethostname()
    cleared = (f"1 pending marker:\n  {SID}, written by pid {dead} on host {host}: its writer, pid {dead} on this "
               f"host ({host}), no longer exists")
    both = (f"2 pending markers:\n  {SID}, written by pid {dead} on host {host}: its writer, pid {dead} on this "
            f"host ({host}), no longer exists\n  {done}, written by an unknown writer (the marker does not name its "
            "owner): its snapshot is complete (the writer left its marker behind)")
    assert sorted(m.snapshot_id for m in pending_markers(store)) == sorted([SID, done])
    assert cli.main([*base, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would delete 0 objects (0 B), kept ") and "; would clear " in out
    assert sorted(out.split("; would clear ")[1].splitlines()[1:]) == sorted(both.splitlines()[1:])
    assert len(pending_markers(store)) == 2  # a dry run clears nothing
    store.storage.delete([store.pending_key(done)])
    assert cli.main(base) == 0
    assert capsys.readouterr().out.endswith(f"; cleared {cleared}\n")
    assert pending_markers(store) == []
    assert cli.main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared_pending"] == []
    assert cli.main(base) == 0
    assert "pending marker" not in capsys.readouterr().out


def test_a_drivers_snapshot_marker_carries_its_lease_epoch(store: JobStore, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", 2)
    seen: list[list[PendingMarker]] = []
    snapshotter = Snapshotter(store, LocalStorage(ckpt), retention=RetentionPolicy(), labels={"epoch": "7"},
                              fence=lambda: seen.append(pending_markers(store)), on_done=lambda _outcome: None)
    try:
        snapshotter.take(SnapshotJob(Kind.SAVEPOINT, Trigger.MANUAL))
    finally:
        snapshotter.close()
    assert [[(m.pid, m.epoch) for m in markers] for markers in seen] == [[], [(os.getpid(), 7)], []]
