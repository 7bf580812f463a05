"""JobHealthWatch: waits until a job is healthy, or until it is not, and says why (``Unhealthy``).

Each poll observes the job store once (health_observe.py), judges purely (health_judge.py), remembers what the
next poll needs, and tells the verdict from one table of messages (health_messages.py).
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt_provider.core.errors import StorageError
from airflow_ckpt_provider.core.policy.health import HealthCriteria
from airflow_ckpt_provider.core.policy.outage import ReadableAgain
from airflow_ckpt_provider.core.policy.restart import Health
from airflow_ckpt_provider.core.store.jobstore import JobStore
from airflow_ckpt_provider.core.watches.base import current_time
from airflow_ckpt_provider.core.watches.health_judge import Unhealthy, Verdict, judge
from airflow_ckpt_provider.core.watches.health_memory import Memory, remember
from airflow_ckpt_provider.core.watches.health_messages import Context, event, seen
from airflow_ckpt_provider.core.watches.health_observe import Observation, StartRecords, observe

__all__ = ["JobHealthWatch", "Unhealthy"]


class JobHealthWatch:
    """Waits until the job is healthy, or unhealthy (``criteria.expect``), by ``criteria`` (core/policy/health.py).

    Statuses of an epoch below ``min_epoch``, or that started before ``started_after``, belong to an
    older deployment: the watched driver has "not started yet", and so has one whose lease a newer
    driver took before reporting. Unhealthy (first match): FAILED; STOPPED; ``max_restarts`` driver
    restarts within ``health_window`` s (the deployments/ records: every start of the watched
    deployment but its first); no heartbeat for ``heartbeat_timeout`` s (default: core/records/status.heartbeat_limit's
    three intervals + 5 s; STARTING and STOPPING drivers, which restore or take a final savepoint
    without reporting, get ``start_timeout`` at least); data waiting and the batch id unchanged for
    ``progress_timeout`` s; no status of the watched deployment within ``start_timeout`` s of the
    first poll (or of a newer driver taking the lease). Healthy: RUNNING, ``min_batches`` batches
    committed since the watch first saw the deployment (or caught up: Spark found no new data in its
    sources, so there is nothing to make progress on), continuously for ``healthy_for`` s.

    A restart in progress is not a dead job: a RESTARTING status is waited on while its owner is live
    (the supervisor's record in supervisors/, core/records/supervision.py) until its ``expected_by`` plus the
    heartbeat limit; and a driver that stopped reporting while its supervisor is live is the supervisor's
    to restart (for the driver's heartbeat limit plus the supervisor's reaction time). NO_HEARTBEAT then
    says why nobody restarts it: the supervisor is gone, gave up, or its restart is overdue.
    """

    def __init__(self, store: JobStore, criteria: HealthCriteria | None = None) -> None:
        self.store = store
        self.criteria = HealthCriteria() if criteria is None else criteria
        self.memory = Memory()  # what the judgement remembers between polls
        self.verdict: Verdict | None = None  # the last poll's
        self._last: Observation | None = None  # the last poll's observation (a steady poll keeps its lease, starts)
        self._records = StartRecords()  # deployments/ records, immutable: read once
        self._reads = ReadableAgain()  # of the store, on the polls' clock
        self._seen = "nothing polled yet"

    def poll(self, now: float | None = None) -> dict[str, Any] | None:
        now = current_time(now)
        try:
            obs = observe(self.store, self.criteria, now, records=self._records, reads=self._reads, last=self._last)
        except StorageError:  # the poller logs it and polls again
            self._reads.failed()
            self._last = None  # the next poll looks at everything
            raise
        self._last = obs
        self.memory = remember(self.memory, obs)
        self.verdict = judge(obs, self.criteria, self.memory)
        context = Context(self.store.job, self.store.url, self.criteria)
        self._seen = seen(self.verdict, context)
        return event(self.verdict, context)

    def progress(self) -> tuple[int, bool]:
        """As of the last poll: the batches the watched deployment completed since the watch began, and whether it
        was caught up with no new input (idle), which counts as progress for ``min_batches``."""
        last = self.verdict.status if self.verdict is not None else None
        return (0, False) if last is None else (max(0, self.memory.batches(last)), last.idle)

    def waiting_for(self) -> str:
        if self.criteria.expect is Health.UNHEALTHY:  # a watch for faults, not a wait for them
            return f"job {self.store.job}: watching for a fault; last seen: {self._seen}"
        return f"job {self.store.job}: expected it {self.criteria.expect.value}; last seen: {self._seen}"
