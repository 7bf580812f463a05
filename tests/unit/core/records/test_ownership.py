"""The supervision service's job ownership (core/records/ownership.py): one owner per job, a takeover only after the
owner fell silent for its lease, the old owner stopped before it, and no two hosts' clocks compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, StorageError
from airflow_ckpt_provider.core.records.ownership import (
    Membership,
    NotOwner,
    Observer,
    Timings,
    claim,
    confirm,
    read_owner,
    release,
)
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage, Storage

TIMINGS = Timings(renew_every=2.0, renew_deadline=8.0, lease_duration=12.0)


class Clock:
    """A monotonic clock of one host: the shared true time, with its own origin and rate."""

    def __init__(self, origin: float = 0.0, rate: float = 1.0) -> None:
        self.now = 0.0
        self.origin, self.rate = origin, rate

    def __call__(self) -> float:
        return self.origin + self.rate * self.now


class Down(LocalStorage):
    """A store that stops taking writes (the instance is cut from it)."""

    down = False

    def write(self, key: str, data: bytes) -> None:
        if self.down:
            raise StorageError(f"cannot write {key}: the store does not answer")
        super().write(key, data)


def _instance(root: Storage, name: str, clock: Clock) -> tuple[Membership, Observer]:
    me = Membership(root, TIMINGS, instance=name, clock=lambda: 1_800_000_000.0, monotonic=clock)
    me.renew()
    return me, Observer(root, monotonic=clock)


def test_timings_that_would_let_a_new_owner_start_before_the_old_one_stops_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"lease_duration >= renew_deadline \+ renew_every \+ 1 s \(11 s\), found "
                                          r"renew_every 2 s, renew_deadline 8 s, lease_duration 10 s"):
        Timings(renew_every=2.0, renew_deadline=8.0, lease_duration=10.0)
    with pytest.raises(ConfigError, match="renew_deadline >= 2 x renew_every"):
        Timings(renew_every=5.0, renew_deadline=8.0, lease_duration=20.0)


def test_the_first_claim_owns_the_job_and_a_live_owner_keeps_it_however_long_the_others_look(tmp_path: Path) -> None:
    root = LocalStorage(tmp_path)
    store = JobStore(root, "orders")
    clock = Clock()
    a, a_sees = _instance(root, "a", clock)
    b, b_sees = _instance(root, "b", clock)
    first = claim(store, a, a_sees)
    assert first.mine and first.owner is not None and (first.owner.instance, first.owner.epoch) == ("a", 1)
    for _ in range(30):  # a minute: a renews every 2 s, b looks every 2 s
        clock.now += 2.0
        a.renew()
        b.renew()
        seen = claim(store, b, b_sees)
        assert not seen.mine and seen.owner is not None and seen.owner.instance == "a"
    assert claim(store, a, a_sees).mine  # again: its own record, no new epoch
    owner = read_owner(store)
    assert owner is not None and (owner.instance, owner.epoch) == ("a", 1)


def test_a_silent_owner_is_taken_over_only_after_its_lease_duration_and_is_then_refused_every_step(
        tmp_path: Path) -> None:
    root = Down(tmp_path)
    store = JobStore(root, "orders")
    clock = Clock()
    a, a_sees = _instance(root, "a", clock)
    b, b_sees = _instance(root, "b", clock)
    owned = claim(store, a, a_sees).owner
    assert owned is not None
    assert not claim(store, b, b_sees).mine  # b notes a's renewal now
    root.down = True  # a is cut from the store: its renewals fail
    taken_at = None
    for step in range(1, 40):
        clock.now = step * 0.5
        with pytest.raises(StorageError):
            a.renew()
        if a.may_act():
            assert clock.now < TIMINGS.renew_deadline
        root.down = False  # b still reaches it (the writes that fail are a's; b writes between)
        b.renew()
        got = claim(store, b, b_sees)
        root.down = True
        if got.mine:
            taken_at = clock.now
            assert got.owner is not None and got.owner.epoch == 2
            assert got.took_from is not None and got.took_from.instance == "a"
            break
    assert taken_at == TIMINGS.lease_duration  # the first look at or after 12 s of silence
    root.down = False
    assert not a.may_act()
    with pytest.raises(NotOwner, match="expected a renewal of its lease within 8 s"):
        confirm(store, a, owned)
    a.renew()  # the store answers a again: it may act, but the job is no longer its
    with pytest.raises(NotOwner, match="no longer owns it: the owner record shows b at epoch 2"):
        confirm(store, a, owned)
    assert not release(store, a, owned)


def test_the_old_owner_stops_before_the_new_one_starts_whatever_the_hosts_clocks_say(tmp_path: Path) -> None:
    """Monotonic clocks with unrelated origins (a day apart) and rates 0.1% apart: only durations on each host's own
    clock decide, so the last moment the old owner may act comes before the new owner's takeover in every case."""
    for origin_a, origin_b, rate_b in [(0.0, 0.0, 1.0), (86_400.0, -3_600.0, 1.001), (-5.0, 1e6, 0.999)]:
        root = LocalStorage(tmp_path / f"{origin_a}-{origin_b}")
        store = JobStore(root, "orders")
        clock_a, clock_b = Clock(origin_a), Clock(origin_b, rate_b)
        a, a_sees = _instance(root, "a", clock_a)
        b, b_sees = _instance(root, "b", clock_b)
        assert claim(store, a, a_sees).mine
        last_act, taken = 0.0, None
        for step in range(1, 200):
            now = step * 0.25
            clock_a.now = clock_b.now = now
            if now <= 5.0 and step % 8 == 0:  # a renews every 2 s until 5 s, then the store stops taking its writes
                a.renew()
            if a.may_act():
                last_act = now
            if step % 8 == 4:
                b.renew()
                got = claim(store, b, b_sees)
                if got.mine:
                    taken = now
                    break
        assert taken is not None and last_act < taken, (origin_a, origin_b, rate_b, last_act, taken)


def test_a_released_or_stopped_owner_is_taken_over_at_once(tmp_path: Path) -> None:
    root = LocalStorage(tmp_path)
    orders, clicks = JobStore(root, "orders"), JobStore(root, "clicks")
    clock = Clock()
    a, a_sees = _instance(root, "a", clock)
    b, b_sees = _instance(root, "b", clock)
    owned = claim(store := orders, a, a_sees).owner
    assert owned is not None and claim(clicks, a, a_sees).mine
    assert release(store, a, owned)
    got = claim(store, b, b_sees)
    assert got.mine and got.owner is not None and got.owner.epoch == 2
    a.renew(stopped=True)  # a clean stop: its record says so
    assert not a.may_act()
    got = claim(clicks, b, b_sees)
    assert got.mine and got.took_from is not None and got.took_from.instance == "a"
