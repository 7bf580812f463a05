"""The health watch's memory across polls, as a value: ``remember`` makes the next one from this poll's observation
(since when nothing reported, from which batch batches count, since when the job is healthy, since when data
waits)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.watches.health_observe import Observation


@dataclass(frozen=True)
class Memory:
    """What the watch remembers between polls; ``remember`` makes the next one."""

    pending_since: float | None = None  # since when no status of the watched deployment exists
    baseline: int | None = None  # batches are counted after this batch id
    no_batch_yet: bool = False  # the watched driver reported no batch yet: its first one counts
    healthy_since: float | None = None  # RUNNING since then, in this epoch
    healthy_epoch: int | None = None
    progress_key: tuple[int, int | None] | None = None  # (epoch, batch id) at the last poll
    waiting_since: float = 0.0  # since when data waits with no new batch
    was_waiting: bool = False

    def batches(self, status: JobStatus) -> int:
        """Batches ``status``'s deployment completed since the baseline."""
        if status.batch_id is None or self.baseline is None:
            return 0
        return status.batch_id - self.baseline


def remember(memory: Memory, obs: Observation) -> Memory:
    """The memory after this poll's observation: pending since, the baseline, healthy since, data waiting since."""
    s, now = obs.status, obs.now
    if s is None:
        memory = replace(memory, pending_since=now if memory.pending_since is None else memory.pending_since)
    else:
        memory = _with_baseline(replace(memory, pending_since=None), s)
    return _with_progress(memory, s, now)


def _with_baseline(m: Memory, s: JobStatus) -> Memory:
    """The batch id batches are counted from. A driver that has not completed a batch since its start reports
    none: its first batch then counts as the first (not as ``id + 1`` batches)."""
    if s.batch_id is None:
        return replace(m, no_batch_yet=m.no_batch_yet or m.baseline is None)
    if m.no_batch_yet:
        return replace(m, baseline=s.batch_id - 1, no_batch_yet=False)
    if m.baseline is None or s.batch_id < m.baseline:  # first sight of a running job, or ids went back (a restore)
        return replace(m, baseline=s.batch_id)
    return m


def _with_progress(m: Memory, s: JobStatus | None, now: float) -> Memory:
    if s is None or s.state is not JobState.RUNNING:
        return replace(m, healthy_since=None, progress_key=None, was_waiting=False)
    if m.healthy_since is None or m.healthy_epoch != s.epoch:  # a restart is no continuity
        m = replace(m, healthy_since=now, healthy_epoch=s.epoch)
    key = (s.epoch, s.batch_id)
    if key != m.progress_key or not s.data_waiting or not m.was_waiting:
        m = replace(m, progress_key=key, waiting_since=now)  # a new batch, or data waits from now on
    return replace(m, was_waiting=s.data_waiting)
