"""entrypoint.py's last word: with a named run (CKPT_DRIVER_RUN, set by a supervisor or a restore check's launcher in
cluster mode) it records its exit code, and a restore check's verdict, in the job store; without one it writes
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.supervision import DRIVER_ENDS, DRIVER_RUN_ENV, take_driver_end
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.store.storage import LocalStorage
from airflow_ckpt_provider.runtime import entrypoint
from airflow_ckpt_provider.runtime.config import RuntimeConfig
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome, RestoreCheck


def test_a_named_run_records_its_code_and_a_checks_verdict_and_an_unnamed_one_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = RuntimeConfig(job="orders", store=str(tmp_path / "store"), checkpoint=str(tmp_path / "ckpt"))
    store = JobStore(LocalStorage(tmp_path / "store"), "orders")
    monkeypatch.delenv(DRIVER_RUN_ENV, raising=False)
    entrypoint._report_end(config, 0)
    assert store.storage.list(DRIVER_ENDS) == []

    monkeypatch.setenv(DRIVER_RUN_ENV, "check-20261129T120000Z-abc123")
    verdict = RestoreCheck(CheckOutcome.INCOMPATIBLE, "the key schema changed", snapshot_id="sp-1", batch_id=7)
    entrypoint._report_end(config, 5, verdict.to_dict())
    end = take_driver_end(store, "check-20261129T120000Z-abc123")
    assert end is not None and (end.job, end.code) == ("orders", 5)
    assert end.report is not None and RestoreCheck.from_dict(end.report) == verdict
    assert store.storage.list(DRIVER_ENDS) == []  # taken: read once, deleted
