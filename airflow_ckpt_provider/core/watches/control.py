"""RequestWatch: waits for the driver's answer to a control request (savepoint, stop, cancel)."""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.core.policy.outcomes import RequestOutcome
from airflow_ckpt_provider.core.records.control import read_ack
from airflow_ckpt_provider.core.records.status import TERMINAL_STATES, RestartOwner, driver_live
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.views.jobview import JobView, when
from airflow_ckpt_provider.core.watches.base import current_time, look, why


class RequestWatch:
    """Waits for the driver's answer to control request ``request_id`` written for epoch ``epoch``.

    Fails (without an ack) when that driver is gone: ended, silent (core/records/status.driver_live; ``busy_timeout``
    covers a final savepoint), or replaced by a newer one. It polls once more after noticing, so an
    ack written just after the final status (the driver's order) is not missed.
    """

    def __init__(self, store: JobStore, request_id: str, epoch: int, *, busy_timeout: float = 900.0) -> None:
        self.store = store
        self.request_id = request_id
        self.epoch = int(epoch)
        self.busy_timeout = busy_timeout
        self._gone: str | None = None
        self._seen = "nothing polled yet"

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = current_time(now)
        ack = read_ack(self.store, self.request_id)
        if ack is not None:
            action = ack.action.value if ack.action else "unreadable request"
            verb = {"completed": "completed", "failed": "failed", "rejected": "was rejected"}[ack.outcome.value]
            message = f"job {self.store.job}: request {self.request_id} ({action}) {verb} by the driver of " \
                      f"epoch {ack.epoch}: {ack.message}"
            return self._event(RequestOutcome(ack.outcome.value), message, ack.to_dict())
        view = look(self.store, now)
        gone = self._gone_reason(view, now)
        if gone is not None and self._gone is not None:  # gone on two polls in a row, no ack in between
            return self._event(RequestOutcome.FAILED, gone, None)
        self._gone = gone
        self._seen = gone or (f"{view.status.state} at epoch {view.status.epoch}" if view.status else "no status.json")
        return None

    def _gone_reason(self, view: JobView, now: float) -> str | None:
        job, rid, epoch = self.store.job, self.request_id, self.epoch
        s, lease = view.status, view.lease
        newer = max((x for x in (s.epoch if s else None, lease.epoch if lease else None) if x is not None),
                    default=None)
        if newer is not None and newer > epoch:
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found a newer "
                    f"driver (epoch {newer}) running the job, which rejects requests for another epoch; nothing "
                    "was done. Send the request again for the current epoch")
        if s is None or s.epoch != epoch:
            return None  # that driver has not reported yet
        if s.state in TERMINAL_STATES:
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found it "
                    f"{s.state} since {when(s.updated_at)}{why(s)} without answering; check `ckpt job status`")
        restart = s.current_restart()
        if restart is not None and restart.by is RestartOwner.SUPERVISOR:
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found it dead "
                    f"({restart.cause}) and its supervisor restarting the job (attempt {restart.attempt}); the new "
                    "driver rejects requests for another epoch: send the request again once it runs")
        if not driver_live(s, now, busy_timeout=self.busy_timeout):  # active: terminal states answered above
            return (f"job {job}: request {rid} expected an answer from the driver of epoch {epoch}, found it "
                    f"{s.state} with no heartbeat for {s.age(now):.0f} s: it probably died without answering. "
                    "Restart the job (it resumes from its latest checkpoint)")
        return None

    def waiting_for(self) -> str:
        return (f"job {self.store.job}: expected an answer to request {self.request_id} from the driver of epoch "
                f"{self.epoch}; last seen: {self._seen}")

    def _event(self, outcome: RequestOutcome, message: str, ack: dict[str, Any] | None) -> dict[str, Any]:
        return {"status": outcome.value, "ack": ack, "message": message, "job": self.store.job,
                "request_id": self.request_id}


def request_result(job: str, event: dict[str, Any]) -> dict[str, Any]:
    """What a completed request returns (the operators' XCom, the Dagster ops' output): ``{"job", "outcome",
    "action", "snapshot_id", "snapshot_uri", "batch_id"}`` from the driver's ack in the event."""
    ack = event.get("ack") or {}
    return {"job": job, "outcome": "completed", "action": ack.get("action"), "snapshot_id": ack.get("snapshot_id"),
            "snapshot_uri": ack.get("snapshot_uri"), "batch_id": ack.get("batch_id")}


def request_failure(job: str, event: dict[str, Any]) -> str:
    """Why a request did not complete ('' when it did): the driver's answer, or the watch's message."""
    if event.get("status") == RequestOutcome.COMPLETED.value:
        return ""
    ack = event.get("ack") or {}
    why = event.get("message") or ack.get("message")
    return f"job {job}: {ack.get('action') or 'request'} {event.get('status')}: {why}"
