"""A played upgrade, rescale or restart actor (launcher/upgrade.py JobUpgrade, through run_operation) for the tests of
what runs it: Spark's check and repartition, the driver's answers to stop requests and the health of each launch are
fakes; the steps, the operation record and the job store are real."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_ckpt_provider.core.policy.outcomes import CheckOutcome
from airflow_ckpt_provider.core.policy.stepsettings import UpgradeSettings
from airflow_ckpt_provider.core.records.control import Ack, Outcome, RequestAction, open_requests
from airflow_ckpt_provider.core.records.operations import read_operation
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Manifest, Trigger
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.launcher import upgrade
from airflow_ckpt_provider.launcher.upgrade import JobUpgrade, run_operation
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
        self.check_s3: list[S3Options | None] = []
        self.check_outcome = self.rescale_outcome = CheckOutcome.COMPATIBLE
        self.stop_answers = True
        self.healthy = [True]
        self.verdicts: dict[str, dict[str, Any]] = {}
        self.criteria: list[Any] = []  # what each health wait waited for (HealthCriteria)
        self.lost_watches = 0  # health watches that fail (a connection lost) before any gives a verdict
        monkeypatch.setattr(upgrade, "start_check", self.start_check)
        monkeypatch.setattr(upgrade, "RestoreCheckWatch", self.check_watch)
        monkeypatch.setattr(upgrade, "read_ack", self.read_ack)
        monkeypatch.setattr("airflow_ckpt_provider.launcher.handover.launch", self.launches)  # under start_job
        monkeypatch.setattr(upgrade, "JobHealthWatch", self.watch)

    def start_check(self, store: JobStore, deployment: Any, *, restore: Any, save_rescaled: bool, s3: Any,
                    **_: Any) -> Any:
        """Spark's check (or repartition) of ``restore``, its verdict at once."""
        check_id = f"check-{len(self.checks)}"
        self.checks.append((str(restore), save_rescaled))
        self.check_s3.append(s3)
        if not save_rescaled:
            why = "ok" if self.check_outcome == "compatible" else "key schema differs"
            self.verdicts[check_id] = {"status": str(self.check_outcome), "reason": why, "snapshot_id": SID,
                                       "batch_id": 7, "seconds": 1.0}
        else:
            self.verdicts[check_id] = {
                "status": str(self.rescale_outcome), "reason": "repartitioned", "snapshot_id": SID, "batch_id": 7,
                "seconds": 2.0,
                "rescaled_snapshot_id": RESCALED_SID if self.rescale_outcome == "compatible" else None}

        class Started:
            pass

        started = Started()
        started.check_id = check_id  # type: ignore[attr-defined]  # what the actor reads of CheckStarted
        return started

    def check_watch(self, store: JobStore, check_id: str) -> Any:
        verdict = self.verdicts[check_id]

        class Watch:
            def poll(self) -> dict[str, Any]:
                return verdict

        return Watch()

    def read_ack(self, store: JobStore, request_id: str) -> Ack | None:
        [request] = [r for r in open_requests(store) if r.id == request_id]
        if not self.stop_answers:
            return None
        snapshot = None if request.action is RequestAction.CANCEL else SID
        return Ack(request_id, request.action, Outcome.COMPLETED, "done", request.epoch, time.time(),
                   snapshot_id=snapshot, batch_id=7)

    def watch(self, store: JobStore, criteria: Any) -> Any:
        self.criteria.append(criteria)
        if self.lost_watches:
            self.lost_watches -= 1
            raise OSError("connection reset")  # not the store's error: the actor's process gives up, as if killed
        healthy = self.healthy.pop(0)

        class Watch:
            def poll(self) -> dict[str, Any]:
                return {"status": "healthy" if healthy else "unhealthy", "epoch": 4, "batch_id": 9,
                        "message": "job orders: RUNNING" if healthy else "job orders: expected it healthy, found "
                                                                         "FAILED"}

            def waiting_for(self) -> str:
                return "-"

        return Watch()

    def run(self, partitions: int | None = 5, s3: S3Options | None = None, *, requested_by: str = "test",
            **upgrade: Any) -> dict[str, Any]:
        """``requested_by`` names the actor too: a re-run by another name is another actor, as a new process is."""
        settings = UpgradeSettings(partitions=partitions, verify_timeout=5, stop_timeout=0.3, **upgrade)
        return run_operation(self.store, str(self.store.storage.url), s3, settings, say=self.said.append,
                           requested_by=requested_by, poll=0.01)


class Actors:
    """Stands in for start_actor (the detached ``ckpt job operate`` an Airflow task starts): records each start;
    with ``act``, runs the actor to its end in this process."""

    def __init__(self, world: World) -> None:
        self.world, self.started, self.act = world, [], False

    def __call__(self, store: JobStore, store_url: str, s3: S3Options | None, operation_id: str, *,
                 env: dict[str, str] | None = None) -> int:
        self.started.append(operation_id)
        if self.act:
            found = read_operation(store)
            assert found is not None and found.operation.id == operation_id
            JobUpgrade(store, store_url, s3, say=self.world.said.append, actor="test actor", poll=0.01).run(found)
        return 4242


class TI:
    """A task instance of one run: its tries share the run id."""

    def __init__(self, try_number: int = 1, run_id: str = "manual__1") -> None:
        self.run_id, self.try_number, self.map_index, self.xcoms = run_id, try_number, -1, {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value
