"""The supervision service's job ownership on both backends (a directory, SeaweedFS S3), between real processes:
two instances claiming the same jobs at the same moment get one owner per job, 50 tries in a row; an owner killed
with kill -9 is taken over at the next epoch, and only once its lease ran out on the taker's clock."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest

from airflow_ckpt_provider.core.records.ownership import Membership, Observer, Timings, claim, read_owner
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.s3 import S3Storage
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage

pytestmark = pytest.mark.integration

TRIES = 50
#: Short timings for the takeover test (the product's: 2 s, 8 s, 12 s).
FAST = Timings(renew_every=0.3, renew_deadline=0.9, lease_duration=2.5)


def _spec(root: Storage) -> dict[str, Any]:
    """What a spawned process needs to open the same store."""
    if isinstance(root, LocalStorage):
        return {"url": str(root.root)}
    assert isinstance(root, S3Storage)
    return {"url": root.url, "s3": root.opts}


def _open(spec: dict[str, Any]) -> Storage:
    from airflow_ckpt_provider.core.store.storage import open_storage

    return open_storage(spec["url"], spec.get("s3"))


def _racer(spec: dict[str, Any], name: str, barrier: Barrier, prefix: str, results: Any) -> None:
    """One instance: its lease, then at each barrier a claim of the try's job; what it got goes to ``results``."""
    root = _open(spec)
    me = Membership(root, Timings(), instance=name)
    me.renew()
    seen = Observer(root)
    for i in range(TRIES):
        barrier.wait(60)
        got = claim(JobStore(root, f"{prefix}-{i}"), me, seen)
        results.put((i, name, got.mine, got.owner.instance if got.owner else None))
        if i % 5 == 4:
            me.renew()


def test_two_instances_claiming_at_the_same_moment_get_one_owner_per_job_50_tries(store_root: Storage) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    prefix = f"race{os.getpid()}{int(time.time())}"
    procs = [ctx.Process(target=_racer, args=(_spec(store_root), name, barrier, prefix, results))
             for name in ("svc-a", "svc-b")]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=120) for _ in range(2 * TRIES)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    by_try: dict[int, list[tuple[str, bool, str | None]]] = {}
    for i, name, mine, owner in got:
        by_try.setdefault(i, []).append((name, mine, owner))
    wins = {"svc-a": 0, "svc-b": 0}
    for i in range(TRIES):
        answers = by_try[i]
        winners = [name for name, mine, _ in answers if mine]
        assert len(winners) == 1, f"try {i}: {answers}"
        assert {owner for _, _, owner in answers} == {winners[0]}, f"try {i}: both must see one owner: {answers}"
        record = read_owner(JobStore(store_root, f"{prefix}-{i}"))
        assert record is not None and (record.instance, record.epoch) == (winners[0], 1)
        wins[winners[0]] += 1
    print(f"wins over {TRIES} tries: {wins}")


def _owner(spec: dict[str, Any], job: str, ready: Any) -> None:
    """An instance that owns ``job`` and renews its lease until it is killed."""
    root = _open(spec)
    me = Membership(root, FAST, instance="svc-a")
    me.renew()
    assert claim(JobStore(root, job), me, Observer(root)).mine
    ready.set()
    while True:
        time.sleep(FAST.renew_every)
        me.renew()


def test_an_owner_killed_with_kill_9_is_taken_over_at_the_next_epoch_once_its_lease_ran_out(
        store_root: Storage) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    job = f"taken{os.getpid()}{int(time.time())}"
    owner = ctx.Process(target=_owner, args=(_spec(store_root), job, ready))
    owner.start()
    try:
        assert ready.wait(60), "the first instance did not claim the job"
        store = JobStore(store_root, job)
        b = Membership(store_root, FAST, instance="svc-b")
        b.renew()
        seen = Observer(store_root)
        for _ in range(10):  # while the owner lives and renews, it keeps the job
            time.sleep(FAST.renew_every)
            b.renew()
            assert not claim(store, b, seen).mine
        assert owner.pid is not None
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(10)
        killed = time.monotonic()
        got = None
        while got is None or not got.mine:
            assert time.monotonic() - killed < 60, "no takeover within a minute"
            time.sleep(FAST.renew_every)
            b.renew()
            got = claim(store, b, seen)
        waited = time.monotonic() - killed
    finally:
        if owner.is_alive():
            owner.kill()
            owner.join(10)
    assert got.owner is not None and (got.owner.instance, got.owner.epoch) == ("svc-b", 2)
    assert got.took_from is not None and got.took_from.instance == "svc-a"
    # The order, not a speed: the taker waited at least the lease since it last saw the owner's renewal change.
    assert waited >= FAST.lease_duration - FAST.renew_every, waited
    print(f"taken over {waited:.2f} s after the kill (lease {FAST.lease_duration:g} s)")
