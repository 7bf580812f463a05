"""StreamingJobNotifier (notifications/job.py) and the alert's text (core/views/alerting.py): the job, its state,
its latest completed snapshot and savepoint and what to run, sent through another real Airflow notifier."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.bases.notifier import BaseNotifier

from airflow_ckpt_provider.core.records.status import JobState, JobStatus, write_status
from airflow_ckpt_provider.core.snapshots.manifest import Kind
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.views.alerting import alert_text
from airflow_ckpt_provider.notifications.job import StreamingJobNotifier
from tests.support.operatorfakes import make_snapshots

SENT: list[str] = []  # what Collect sent (a callback may run on a copy of the notifier)


class Collect(BaseNotifier):
    """A notifier like Slack's: one templated text field, sent to SENT."""

    template_fields = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def notify(self, context: Any) -> None:
        SENT.append(self.text)

    async def async_notify(self, context: Any) -> None:
        SENT.append(self.text)  # rendered with ckpt_alert before it is awaited


def running(store: JobStore) -> None:
    now = time.time()
    write_status(store, JobStatus(job="orders", state=JobState.RUNNING, epoch=4, updated_at=now - 3,
                                  started_at=now - 600, batch_id=120))


def test_the_text_names_the_job_its_state_latest_snapshots_and_what_to_run(store: JobStore, tmp_path: Path) -> None:
    running(store)
    ids = make_snapshots(store, tmp_path, [Kind.SAVEPOINT, Kind.CHECKPOINT])
    text = alert_text(store, "task restart of DAG ckpt_keep_alive failed: boom")
    where = f"--job orders --store {store.root.url}"
    assert re.fullmatch(
        rf"job orders: task restart of DAG ckpt_keep_alive failed: boom; RUNNING at epoch 4, heartbeat [34] s ago, "
        rf"batch 120; latest completed snapshot {ids[1]} \(batch 1, \d+ s old\); latest savepoint {ids[0]} \(batch 0, "
        rf"\d+ s old\); run `ckpt job status {re.escape(where)}`; to restart it from its latest state: "
        rf"`ckpt job restart {re.escape(where)}` \(or the DAG's restart task\)", text), text


def test_a_job_without_a_driver_or_snapshots_says_so(store: JobStore) -> None:
    text = alert_text(store, "deadline missed")
    assert "job orders: deadline missed; no driver has reported yet; no completed snapshot; no savepoint; " in text


def test_as_a_deadline_callback_it_is_awaited_in_the_triggerer_with_its_kwargs(store: JobStore) -> None:
    then = Collect("{{ ckpt_alert }}")
    SENT.clear()

    async def as_the_triggerer_does() -> None:  # AsyncCallback: await callback(**kwargs, context=context)
        await StreamingJobNotifier(job="orders", what="the keep-alive run missed its deadline", then=then,
                                   context={"dag_run": SimpleNamespace(run_id="r1")})

    asyncio.run(as_the_triggerer_does())
    assert len(SENT) == 1 and SENT[0].startswith("job orders: the keep-alive run missed its deadline; ")


def test_without_a_next_notifier_the_text_is_logged(store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    StreamingJobNotifier(job="orders", what="watch failed")({})
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [m for m in logged if m.startswith("job orders: watch failed; ")], logged


def test_as_a_deadline_callback_the_next_notifier_is_made_from_its_class_path_and_renders_the_alert(
        store: JobStore) -> None:
    SENT.clear()

    async def as_the_triggerer_does() -> None:
        await StreamingJobNotifier(job="orders", what="missed", context={}, then={
            "classpath": "tests.unit.notifications.test_job.Collect", "kwargs": {"text": "ckpt: {{ ckpt_alert }}"}})

    asyncio.run(as_the_triggerer_does())
    assert len(SENT) == 1 and SENT[0].startswith("ckpt: job orders: missed; "), SENT


@pytest.mark.parametrize("then", [{"kwargs": {}}, {"classpath": "tests.unit.notifications.test_job.Collect",
                                                   "kwargs": [1]}, {"classpath": "x.Y", "args": []}])
def test_a_next_notifier_that_is_no_class_path_and_arguments_is_refused_saying_what_to_give(
        then: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"then: expected a notifier or \{'classpath': .* found .* give the next "):
        StreamingJobNotifier(job="orders", then=then)


def test_a_class_path_that_makes_no_notifier_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected the class path of an Airflow notifier .* found "
                                         r"types.SimpleNamespace that made a SimpleNamespace"):
        StreamingJobNotifier(job="orders", then={"classpath": "types.SimpleNamespace", "kwargs": {}})
