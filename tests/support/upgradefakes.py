"""A played upgrade or rescale driver (launcher/upgrade.py JobUpgrade) for the tests of what runs it: Spark's check
and repartition, the driver's answers to stop requests and the health of each launch are fakes, the steps and the
job store real."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, open_requests
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import upgrade
from airflow_ckpt_provider.launcher.upgrade import JobUpgrade, UpgradeOptions
from airflow_ckpt_provider.runtime.restore_check_verdict import RestoreCheck
from tests.support.operatorfakes import RESCALED_SID, SID, FakeLaunch


def rocksdb_savepoint(store: JobStore, snapshot_id: str, batch_id: int, partitions: int, **labels: str) -> None:
    """A stateful savepoint's manifest (RocksDB, ``partitions`` partitions), as the job store holds it."""
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    m = Manifest(job="orders", snapshot_id=snapshot_id, kind=Kind.SAVEPOINT,
                 trigger=Trigger.RESCALE if labels else Trigger.STOP, batch_id=batch_id,
                 created_at=f"2026-11-26T10:00:0{batch_id % 10}.000+00:00", query_id="q", checkpoint="/c", files=(),
                 operators=[{"operator_id": 0, "name": "stateStoreSave", "partitions": partitions,
                             "store_names": ["default"], "provider": "rocksdb", "changelog": False}],
                 conf={"spark.sql.shuffle.partitions": str(partitions),
                       "spark.sql.streaming.stateStore.providerClass": rocksdb}, labels=dict(labels))
    store.storage.write(store.manifest_key(snapshot_id), m.to_bytes())


class World:
    """The fakes: the check and the repartition (Spark), the driver's acks, the health of each launch."""

    def __init__(self, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store, self.launches = store, FakeLaunch()
        self.said: list[str] = []
        self.checks: list[tuple[str, bool]] = []
        self.check_envs: list[dict[str, str]] = []
        self.check_outcome = self.rescale_outcome = CheckOutcome.COMPATIBLE
        self.stop_answers = True
        self.healthy = [True]
        monkeypatch.setattr(upgrade, "check_restore", self.check_restore)
        monkeypatch.setattr(upgrade, "wait_ack", self.wait_ack)
        monkeypatch.setattr("airflow_ckpt_provider.launcher.service.launch", self.launches)  # under start_job
        monkeypatch.setattr(upgrade, "JobHealthWatch", self.watch)

    def check_restore(self, spec: Any, timeout: float, *, env: Any = None) -> RestoreCheck:
        save = bool(spec.config.save_rescaled)
        self.checks.append((str(spec.config.restore), save))
        self.check_envs.append(dict(env or {}))
        if not save:
            why = "ok" if self.check_outcome == "compatible" else "key schema differs"
            return RestoreCheck(self.check_outcome, why, snapshot_id=SID, batch_id=7, seconds=1.0)
        return RestoreCheck(self.rescale_outcome, "repartitioned", snapshot_id=SID, batch_id=7, seconds=2.0,
                            rescaled_snapshot_id=RESCALED_SID if self.rescale_outcome == "compatible" else None)

    def wait_ack(self, store: JobStore, request_id: str, timeout: float, *, poll: float) -> Ack | None:
        [request] = [r for r in open_requests(store) if r.id == request_id]
        if not self.stop_answers:
            return None
        snapshot = None if request.action is RequestAction.CANCEL else SID
        return Ack(request_id, request.action, Outcome.COMPLETED, "done", request.epoch, time.time(),
                   snapshot_id=snapshot, batch_id=7)

    def watch(self, store: JobStore, criteria: Any) -> Any:
        healthy = self.healthy.pop(0)

        class Watch:
            def poll(self) -> dict[str, Any]:
                return {"status": "healthy" if healthy else "unhealthy", "epoch": 4, "batch_id": 9,
                        "message": "job orders: RUNNING" if healthy else "job orders: expected it healthy, found "
                                                                         "FAILED"}

            def waiting_for(self) -> str:
                return "-"

        return Watch()

    def run(self, partitions: int | None = 5, s3: S3Options | None = None, **upgrade: Any) -> dict[str, Any]:
        options = UpgradeOptions(partitions, poll=0.01, verify_timeout=5, **upgrade)
        return JobUpgrade(self.store, str(self.store.storage.url), s3, options, say=self.said.append,
                          launched_by="test").run()
