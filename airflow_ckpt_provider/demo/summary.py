"""What the demo proves, with the numbers behind each claim: records produced and counted, customers whose totals
equal, the batch each restarted or restored driver resumed from, how the job ended. Pure values and text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Totals = Mapping[str, tuple[int, int]]  # customer -> (orders, revenue)


@dataclass(frozen=True)
class Proof:
    """The job's totals against the totals of the produced stream: exact iff every customer's (orders, revenue)
    equal, customers missing on either side counted as unequal."""

    produced: int
    counted: int
    produced_revenue: int
    counted_revenue: int
    customers: int
    equal: int

    @classmethod
    def of(cls, expected: Totals, totals: Totals) -> Proof:
        customers = expected.keys() | totals.keys()
        return cls(produced=sum(o for o, _ in expected.values()), counted=sum(o for o, _ in totals.values()),
                   produced_revenue=sum(r for _, r in expected.values()),
                   counted_revenue=sum(r for _, r in totals.values()), customers=len(customers),
                   equal=sum(1 for c in customers if expected.get(c) == totals.get(c)))

    @property
    def exact(self) -> bool:
        return self.equal == self.customers

    def line(self) -> str:
        return (f"final state equals the produced stream: {'YES' if self.exact else 'NO'} — "
                f"{self.produced:,} orders produced, {self.counted:,} counted; revenue {self.produced_revenue:,} "
                f"produced, {self.counted_revenue:,} counted; {self.equal} of {self.customers} customers' totals equal")


@dataclass(frozen=True)
class Resumed:
    """A driver that started from a snapshot (None: from the live checkpoint): the snapshot, the batch it was taken
    at, the driver's epoch and the batch it has reached."""

    snapshot_id: str | None
    snapshot_batch: int | None
    epoch: int
    batch: int | None

    def line(self) -> str:
        source = (f"restored from {self.snapshot_id} (taken at batch {self.snapshot_batch}, so it resumed at batch "
                  f"{self.snapshot_batch + 1})" if self.snapshot_id and self.snapshot_batch is not None else
                  f"restored from {self.snapshot_id}" if self.snapshot_id else "started from the live checkpoint")
        now = "no batch since (no new orders yet)" if self.batch is None else f"now at batch {self.batch}"
        return f"epoch {self.epoch} {source}; {now}"


@dataclass(frozen=True)
class Summary:
    """The demo's closing block. ``final``: how the job ended (stopped with a savepoint, or left running)."""

    proof: Proof
    lag: int
    restart: str
    restored: Resumed
    upgraded: Resumed
    code_version: str | None
    final: str
    store_url: str
    snapshots: int
    savepoints: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.proof.exact and self.lag == 0

    def lines(self) -> list[str]:
        return [
            "=== airflow-ckpt-provider demo (through Airflow) ===",
            f"1. keep-alive: {self.restart}",
            f"2. savepoint and restore: {self.restored.line()}",
            f"3. upgrade to code {self.code_version or '-'}: {self.upgraded.line()}",
            f"4. {self.final}",
            f"snapshots in the job store {self.store_url}: {self.snapshots} ({self.savepoints} savepoints)",
            f"consumer group lag after the last batch: {self.lag:,} records",
            self.proof.line(),
            f"total {self.seconds:.1f} s",
        ]

