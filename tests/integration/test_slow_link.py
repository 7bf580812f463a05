"""Issue 41, scenario 6: 200 ms of delay and 5% loss on the link between the driver host and the store (SeaweedFS: the
job store, and the files sink's bucket) for a minute (--full: two) while a supervised job runs: it keeps committing,
its lease is never given up (no false fencing), and the counts are exact.

Topology and job as scenario 2 (tests/integration/test_partitions.py, tests/support/hostjobs.py): ``store``,
``kafka`` (tansu, memory storage), ``driver`` (``ckpt run --supervise`` with the product's lease settings: poll 1 s,
fence grace 10 s, so an outage tolerance of 9 s; with 3 s, the default before, finding 9), ``launcher`` (the feed, 20
records/s, and the readers). The fault
(``Topology.netem``: each direction's packets held 200 ms, so a round trip takes 400 ms more, and 5% of them dropped;
tests/support/nfqdelay.py) starts once the driver has completed three batches and stored a snapshot, and ends by
itself after ``SLOW`` seconds (--full: ``SLOW_FULL``).

The claims: (a) the same driver throughout (pid, epoch; no query restart; one driver started by the supervisor; its
lease watch never stopped the query and it was never fenced); (b) it kept committing: batches completed in each third
of the fault; (c) every id once in the sink's committed view, nothing uncommitted visible; (d) nothing left behind.
The ``files-standalone`` variant runs the driver in client mode on the Spark standalone cluster of the hosts.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.records.status import JobState
from tests.support import hosts
from tests.support.exactlyonce import expected_rows
from tests.support.hostjobs import (
    COMPLETED,
    WAIT,
    WATCH_STOP,
    Feed,
    Scenario,
    finish_and_count,
    run_scenario,
    watch_status,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

SLOW = 60.0  # seconds of delay and loss (bounded: the fault ends by itself); --full: twice as long
SLOW_FULL = 120.0
DELAY_MS = 200.0
LOSS_PCT = 5.0


SAME_LINK = pytest.mark.full(
    proven_by="integration/test_slow_link.py::test_a_slow_lossy_link_to_the_store_is_ridden_out_without_false_"
              "fencing_and_counts_exactly[files] (the same lease and job store over the same slow link)")


@pytest.mark.timeout(720)
@pytest.mark.parametrize(("sink_name", "spark"), [
    pytest.param("files", "local", id="files"),
    pytest.param("ledger", "local", id="ledger", marks=SAME_LINK),
    pytest.param("kafka", "local", id="kafka", marks=SAME_LINK),
    # On the standalone cluster the executors write the sink's files over their own links: only the driver's (the
    # lease, status, snapshots, the manifest commits) is slow.
    pytest.param("files", "standalone", id="files-standalone", marks=SAME_LINK),
])
def test_a_slow_lossy_link_to_the_store_is_ridden_out_without_false_fencing_and_counts_exactly(
        sink_name: str, spark: str, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    slow = SLOW_FULL if pytestconfig.getoption("--full", default=False) else SLOW
    run_scenario("scenario 6", sink_name, tmp_path, "p6", lambda sc, feed: _run(sc, feed, slow), spark=spark)


def _run(sc: Scenario, feed: Feed, slow_s: float) -> None:
    topo, times = sc.topo, sc.times
    driver = sc.start_driver("driver", topo["driver"], "--supervise", lease_defaults=True)
    started = time.time()
    feed.start()
    before = sc.wait_status("three batches and a snapshot", lambda s: s.batch_id is not None and s.batch_id >= 3
                            and s.last_snapshot is not None and s.state is JobState.RUNNING, WAIT, driver)
    completed = driver.matching(COMPLETED)
    times["first batch after start, s"] = round((completed[0][0] if completed else time.time()) - started, 1)

    slow = topo.netem("driver", "store", delay_ms=DELAY_MS, loss_pct=LOSS_PCT, seconds=slow_s)
    t_slow = time.time()
    seen = watch_status(sc, driver, lambda: not slow.active, slow_s + 30)
    t_heal = t_slow + (slow.healed_after or slow_s)
    times["fault"] = f"{DELAY_MS:g} ms each way, {LOSS_PCT:g}% loss, driver <-> store"
    times["fault lasted, s"] = round(slow.healed_after or 0.0, 1)
    batches = [(t, int(m[2])) for t, m in driver.matching(COMPLETED)]
    during = [(round(t - t_slow, 1), b) for t, b in batches if t_slow < t <= t_heal]
    times["batches completed during the fault"] = len(during)
    thirds = [len([1 for dt, _ in during if i * slow_s / 3 < dt <= (i + 1) * slow_s / 3]) for i in range(3)]
    times["batches completed in each third of the fault"] = thirds
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(during)]
    times["longest time between two batches during the fault, s"] = round(max(gaps), 1) if gaps else None
    healed = sc.status()
    times["last snapshot before the fault, at the heal"] = [before.last_snapshot,
                                                           healed.last_snapshot if healed else None]
    times["states seen during the fault"] = sorted({s for _, s, *_ in seen})
    watch_stops = [round(t - t_slow, 1) for t, _ in driver.containing(WATCH_STOP)]
    fenced = [round(t - t_slow, 1) for t, _ in driver.containing("was fenced")]
    outage = [(round(t - t_slow, 1), line[24:200]) for t, line in driver.containing("job store") if t > t_slow
              and ("unreachable" in line or "not answer" in line or "outage" in line)]
    times["lease watch stops (s after the fault began)"] = watch_stops
    times["fenced lines"] = fenced
    times["job store outage lines (s after the fault began)"] = outage[:10]

    # The rest of the feed on the same driver, then a stop with a savepoint.
    final, rows, starts = finish_and_count(sc, feed, driver)
    print(f"scenario 6: {json.dumps(times, indent=1)}")

    # (a) the same driver, never fenced, never stopped by its lease watch.
    assert (final.pid, final.epoch) == (before.pid, before.epoch), (
        f"the driver changed: pid {before.pid} -> {final.pid}, epoch {before.epoch} -> {final.epoch}")
    assert not watch_stops and not fenced, f"false fencing: watch stops {watch_stops}, fenced lines {fenced}"
    assert len(starts) == 1, f"the supervisor started {len(starts)} drivers: {starts}"
    assert final.restart_count == 0 and not final.restarts, f"the query was restarted: {final.restarts}"
    # (b) it kept committing.
    assert all(thirds), f"a third of the fault without a completed batch: {thirds} ({during})"
    # (c) exact.
    assert sorted(rows) == expected_rows(feed.next_id), (
        f"{times['duplicated ids']} ids duplicated, {times['missing ids']} missing of {feed.next_id}")
    times["uncommitted"] = sc.in_launcher(sc.sink.check_nothing_uncommitted)
    return
