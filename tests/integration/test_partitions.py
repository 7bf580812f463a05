"""Issue 41, scenario 1: the driver host cut from the store (S3) for longer than the fence grace, while it still
reaches Kafka, and a second driver started on another host as soon as the cut begins.

Topology (tests/support/hosts.py): ``store`` (SeaweedFS: the job store), ``kafka`` (tansu, memory storage: the
input topic and the ckpt-kafka sink's topic), ``driver`` (the first ``ckpt run``), ``launcher`` (the second
``ckpt run``, and the test's clients: the feed, the readers). Each driver runs tests/jobs/eo_job.py
(``dropDuplicates(["id"])`` over a 3-partition topic into one exactly-once sink) with local[2] bound to its host's
address, and a live checkpoint on its own host's disk: Spark's checkpoint on S3 needs hadoop-aws, which is not
available here (docs/runtime.md, Known limits), so the second driver starts from the newest snapshot in the job
store (``--restore latest-state`` on an empty live checkpoint), as a restart on another host does in client mode
(docs/airflow.md). The hosts share one file system (namespaces separate the network only): each driver gets a
checkpoint directory and a CKPT_HOME of its own.

The claim under test (docs/runtime.md, Fencing): a driver that cannot confirm its lease for longer than its outage
tolerance (``--fence-grace`` minus ``--poll-interval``) stops committing, and a newer driver waits at least that long
(plus a poll and a second) after taking the lease before it restores and commits. So: (a) the first driver commits
nothing to the sink once the second may commit; (b) every input id is in the sink's committed view exactly once;
(c) once the link heals, the first driver exits 3 (fenced) saying a newer driver holds the lease; (d) nothing is
left behind. Every output line of both drivers is stamped with its arrival time here (one wall clock: the hosts
share this machine's), which times the commits of each driver against the second driver's lease.

(b) fails with the ckpt-kafka sink when the first driver committed batches that never reached the store as a
snapshot (its live checkpoint is on its host) and the second plans them again with other offsets: Kafka cannot
unpublish, they are committed twice (docs/reliability.md, scenario 1, finding 2). When every duplicate is of such a
batch the test ends in ``pytest.xfail`` with that reason; imperatively, not ``xfail(strict=True)``, since a run is
exact when the second driver plans the one batch past the snapshot with the same offsets (its marker then skips it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from airflow_ckpt_provider.core.records.control import Outcome, RequestAction
from airflow_ckpt_provider.core.records.lease import LeaseRecord, read_lease
from airflow_ckpt_provider.core.records.status import JobState, JobStatus
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.exitcodes import EXIT_FENCED, EXIT_STOPPED
from tests.support import hosts
from tests.support.exactlyonce import EO_JOB, FilesSink, KafkaSink, expected_rows, new_sink_topic
from tests.support.hosts import Host, Topology
from tests.support.runtimejob import SPARK_CONF, JobEnv, produce

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts.available() is not None, reason=str(hosts.available())),
]

BUCKET = "ckpt"
POLL = 1.0  # --poll-interval: the driver looks at its lease every second
FENCE_GRACE = 4.0  # --fence-grace: outage tolerance 3 s; a newer driver waits max(4, 2*1+1, 3+1+1) = 5 s
CUT = 60.0  # seconds the driver host is cut from the store (well beyond tolerance + grace; bounded)
MAX_OFFSETS = 150  # records per batch at most: a driver keeps up with the feed (a batch takes 2.5-4 s here)
CHUNK = 10  # new ids per feed (plus the previous feed's second copies): one feed a second, 20 records/s
FEEDS = 150  # at most: the feed is bounded however long the drivers take
WAIT = 180.0

#: A ckpt-kafka task's commit line (kafka/writer.py) and the sink's driver-side commit line.
TASK_COMMIT = re.compile(r"batch (\d+) partition (\d+) of job \S+ \(query (\S+)\): (\d+) records committed by")
BATCH_COMMIT = re.compile(r"batch (\d+) of job \S+ \(query \S+\) committed: ")
#: The runtime's batch line (runtime/driver.py): Spark committed the batch.
COMPLETED = re.compile(r"job \S+ epoch (\d+) batch (\d+): completed, (\d+) rows")
#: The second driver's restore (core/snapshots/restore.py).
RESTORED = re.compile(r"snapshot \S+ \(batch (\d+)\): restored into")
#: The known limit of the ckpt-kafka sink in this scenario (docs/reliability.md, scenario 1): the first driver's live
#: checkpoint is on its own host, so the second resumes from the newest snapshot the store has; the batches the
#: first committed to Kafka after that snapshot (at least the ones inside its outage tolerance) are written again.
KAFKA_LIMIT = ("ckpt-kafka with the live checkpoint on the cut host: the second driver resumes from the newest "
               "snapshot in the store and writes again the batches the first committed to Kafka after it (Kafka "
               "cannot unpublish them; docs/reliability.md, scenario 1)")


class Stamped:
    """A process on a test host whose output lines are read here and stamped with their arrival time (written to
    ``log`` as ``<time> <line>``)."""

    def __init__(self, name: str, host: Host, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.proc = host.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, out: IO[bytes]) -> None:
        with open(self.log, "a") as file:
            for raw in iter(out.readline, b""):
                now = time.time()
                line = raw.decode(errors="replace").rstrip("\n")
                with self._lock:
                    self.lines.append((now, line))
                file.write(f"{now:.3f} {line}\n")
                file.flush()

    def matching(self, pattern: re.Pattern[str]) -> list[tuple[float, re.Match[str]]]:
        with self._lock:
            lines = list(self.lines)
        return [(t, m) for t, line in lines if (m := pattern.search(line))]

    def first(self, text: str) -> float | None:
        with self._lock:
            return next((t for t, line in self.lines if text in line), None)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:.0f} s\n{self.tail()}") from None
        self._reader.join(10)
        return code

    def tail(self, count: int = 40) -> str:
        with self._lock:
            lines = [line for _, line in self.lines]
        ours = [ln for ln in lines if "airflow_ckpt_provider" in ln or "rror" in ln]
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join((ours or lines)[-count:])

    def stop(self) -> None:
        """Teardown: kill the whole process group (ckpt run, spark-submit's JVM, the Python driver, its workers)."""
        if self.proc.poll() is None:
            for pid in _group_members(self.proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, 9)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait(30)


def _group_members(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


class Feed:
    """The known stream, produced from the launcher host: each feed CHUNK new ids and the previous feed's second
    copies (dropDuplicates keeps the first), one a second on a thread, until ``finish()``; FEEDS at most."""

    def __init__(self, launcher: Host, bootstrap: str, topic: str) -> None:
        self.launcher = launcher
        self.bootstrap = bootstrap
        self.topic = topic
        self.next_id = 0
        self.records = 0
        self.pending: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feed", daemon=True)
        self.error: BaseException | None = None

    def _produce(self, start: int, count: int) -> None:
        self.launcher.call(produce, self.bootstrap, self.topic, start, count)
        self.records += count

    def feed(self) -> None:
        self._produce(self.next_id, CHUNK)
        if self.pending:
            self._produce(*self.pending)
        self.pending = (self.next_id, CHUNK)
        self.next_id += CHUNK

    def _loop(self) -> None:
        try:
            for _ in range(FEEDS):
                if self._stop.wait(1.0):
                    return
                self.feed()
        except BaseException as err:  # reported by finish()
            self.error = err

    def start(self) -> None:
        self.feed()
        self._thread.start()

    def finish(self) -> None:
        """Stop feeding; produce the last feed's second copies: every id has been produced twice."""
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, f"the feed failed: {self.error!r}"
        if self.pending:
            self._produce(*self.pending)
        self.pending = None


@dataclass
class Scenario:
    """One run of scenario 1 with one sink: the topology, the job, both drivers and what the test measured."""

    topo: Topology
    env: JobEnv
    sink: Any
    work: Path
    drivers: list[Stamped] = field(default_factory=list)
    times: dict[str, Any] = field(default_factory=dict)

    @property
    def launcher(self) -> Host:
        return self.topo["launcher"]

    def in_launcher(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.launcher.call(fn, *args, **kwargs)

    def status(self) -> JobStatus | None:
        return self.in_launcher(self.env.status)  # type: ignore[no-any-return]

    def lease(self) -> LeaseRecord | None:
        return self.in_launcher(lambda: read_lease(self.env.store()))  # type: ignore[no-any-return]

    def start_driver(self, name: str, host: Host, *args: str) -> Stamped:
        env = self.env.env(MAX_OFFSETS, {**self.sink.env()})
        env.update(SPARK_LOCAL_IP=host.address, CKPT_HOME=str(self.work / f"home-{name}"))
        argv = [sys.executable, "-m", "airflow_ckpt_provider.cli", "run", str(EO_JOB), "--job", self.env.job,
                "--store", self.env.store_url, "--checkpoint", str(self.work / f"checkpoint-{name}"),
                "--master", "local[2]", "-v", "--poll-interval", str(POLL), "--fence-grace", str(FENCE_GRACE),
                *args]
        conf = [*SPARK_CONF, *(f"{k}={v}" for k, v in self.sink.conf().items()),
                f"spark.driver.host={host.address}", f"spark.driver.bindAddress={host.address}"]
        for setting in conf:
            argv += ["--conf", setting]
        driver = Stamped(name, host, argv, env, self.work / f"{name}.log")
        self.drivers.append(driver)
        return driver

    def wait_status(self, what: str, ok: Any, timeout: float, *watch: Stamped) -> JobStatus:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.status()
            except Exception:  # the store answers again on the next look
                status = None
            if status is not None and ok(status):
                return status
            for driver in watch:
                if driver.proc.poll() is not None:
                    raise AssertionError(f"{driver.name} exited with {driver.proc.returncode} while waiting for "
                                         f"{what}; status {status}\n{driver.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; status {status}\n"
                                     + "\n".join(d.tail() for d in watch))
            time.sleep(0.3)

    def consumed(self, status: JobStatus) -> int:
        return self.env.consumed(status)


def _kafka_sink(topo: Topology, kafka: Any) -> KafkaSink:
    topic = topo["kafka"].call(new_sink_topic, kafka)
    return KafkaSink(kafka.bootstrap_servers, topic)


def _files_sink(topo: Topology, s3: Any) -> FilesSink:
    return FilesSink(f"s3://{BUCKET}/out", S3Options(endpoint_url=s3.endpoint_url, region=s3.region,
                                                     access_key_id=s3.access_key, secret_access_key=s3.secret_key))


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sink_name", [
    # The Kafka variant ends in its expected failure (a local live checkpoint: docs/reliability.md, finding 2); the
    # fencing guarantee it shares with the files variant is proven by that one in the default run.
    pytest.param("kafka", marks=pytest.mark.full(
        proven_by="integration/test_partitions.py::test_driver_cut_from_the_store_is_fenced_and_a_driver_elsewhere_"
                  "takes_over[files] (the cut driver stops committing before the new one may commit)")),
    "files",
])
def test_driver_cut_from_the_store_is_fenced_and_a_driver_elsewhere_takes_over(sink_name: str,
                                                                               tmp_path: Path) -> None:
    pids: list[int] = []
    with Topology(["store", "kafka", "launcher", "driver"]) as topo:
        try:
            known_limit = _scenario(topo, sink_name, tmp_path)
        finally:
            pids = [p for role in topo.hosts for p in topo[role].pids()]
    assert topo.leftovers() == {"namespaces": [], "links": [], "processes": []}, "(d) something left behind"
    assert not [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"], "(d) a process left behind"
    if known_limit:
        pytest.xfail(known_limit)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _scenario(topo: Topology, sink_name: str, work: Path) -> str:
    """Run the scenario; '' if every claim held, the known limit's description if only it failed."""
    s3 = topo.start_store()
    kafka = topo.start_kafka(on_s3=False)  # memory storage: the scenario cuts the driver from the store, not tansu
    launcher = topo["launcher"]
    launcher.call(s3.create_bucket, BUCKET)
    topic = f"t-{uuid.uuid4().hex[:10]}"
    topo["kafka"].call(kafka.create_topic, topic, 3)
    sink = _kafka_sink(topo, kafka) if sink_name == "kafka" else _files_sink(topo, s3)
    env = JobEnv(s3, kafka, work, BUCKET, topic, job=f"p1-{sink_name}-{uuid.uuid4().hex[:6]}")
    sc = Scenario(topo, env, sink, work)
    feed = Feed(launcher, kafka.bootstrap_servers, topic)
    try:
        return _run(sc, feed)
    finally:
        feed._stop.set()
        for driver in sc.drivers:
            driver.stop()
        (work / "report.json").write_text(json.dumps(sc.times, indent=1))
        print(f"scenario 1 ({sink_name}): {json.dumps(sc.times)}")


def _run(sc: Scenario, feed: Feed) -> str:
    topo = sc.topo
    first = sc.start_driver("first", topo["driver"])
    started = time.time()
    feed.start()

    # A few batches on the first driver, and a snapshot of one of them in the store.
    status = sc.wait_status("three batches and a snapshot of the first driver",
                            lambda s: s.batch_id is not None and s.batch_id >= 3 and s.last_snapshot is not None
                            and s.state is JobState.RUNNING, WAIT, first)
    first_epoch = status.epoch
    sc.times["first driver: first batch after start, s"] = round(
        (first.matching(COMPLETED)[0][0] if first.matching(COMPLETED) else time.time()) - started, 1)

    # The cut, and at once a second driver on the launcher: it must wait for the grace by itself.
    cut = topo.cut("driver", "store", seconds=CUT)
    t_cut = time.time()
    sc.times["cut at"] = t_cut
    second = sc.start_driver("second", topo["launcher"], "--restore", "latest-state")
    lease = None
    deadline = time.monotonic() + WAIT
    while lease is None or lease.epoch <= first_epoch:
        assert time.monotonic() < deadline, f"the second driver took no lease in {WAIT} s\n{second.tail()}"
        assert second.proc.poll() is None, f"the second driver exited with {second.proc.returncode}\n{second.tail()}"
        time.sleep(0.3)
        lease = sc.lease()
    t_lease = lease.acquired_at
    sc.times["second driver: lease taken after the cut, s"] = round(t_lease - t_cut, 1)

    # The cut heals by itself; the first driver must then see the newer epoch and exit 3.
    cut.wait(CUT + 10)
    t_heal = time.time()
    sc.times["cut lasted, s"] = round(cut.healed_after or 0.0, 1)
    code = first.wait(WAIT)
    t_first_exit = time.time()
    sc.times["first driver: exit after the heal, s"] = round(t_first_exit - t_heal, 1)
    sc.times["first driver: exit code"] = code
    _assert_stopped_in_time(sc, first, first_epoch, lease, t_cut)  # (a), before the second's long catch-up

    # The second driver finishes the feed, then stops with a savepoint.
    feed.finish()
    final = sc.wait_status(f"all {feed.records} records consumed by the second driver",
                           lambda s: s.epoch == lease.epoch and sc.consumed(s) == feed.records
                           and s.state is JobState.RUNNING, WAIT, second)
    ack = sc.in_launcher(sc.env.request, RequestAction.STOP, final.epoch)
    assert ack.outcome is Outcome.COMPLETED, ack
    assert second.wait(WAIT) == EXIT_STOPPED, second.tail()

    return _assert(sc, feed, first, second, first_epoch, lease, t_cut, code)


def _assert_stopped_in_time(sc: Scenario, first: Stamped, first_epoch: int, lease: LeaseRecord, t_cut: float) -> None:
    """(a) No sink commit of the first driver once the second may commit: its lease time plus the grace it waits."""
    grace_end = lease.acquired_at + max(FENCE_GRACE, 2 * POLL + 1.0, (FENCE_GRACE - POLL) + POLL + 1.0)
    commits = _commit_times(first)
    late = [(round(t - t_cut, 1), what) for t, what in commits if t >= grace_end]
    sc.times["first driver: commits after the second's lease + grace"] = len(late)
    after = [t for t, _ in commits if t > t_cut]
    sc.times["first driver: last commit after the cut, s"] = round(after[-1] - t_cut, 1) if after else None
    assert not late, (f"(a) the first driver (epoch {first_epoch}) committed after the second took the lease at "
                      f"{lease.acquired_at - t_cut:.1f} s after the cut and its grace ended at "
                      f"{grace_end - t_cut:.1f} s: {len(late)} commits until {late[-1][0]} s after the cut, first "
                      f"{late[:6]}; timeline: {json.dumps(sc.times)}")


def _commit_times(driver: Stamped) -> list[tuple[float, str]]:
    """Every sink commit the driver's log shows: (time, what)."""
    found = [(t, f"task commit batch {m[1]} partition {m[2]}") for t, m in driver.matching(TASK_COMMIT)]
    found += [(t, f"batch {m[1]} committed (sink's driver commit)") for t, m in driver.matching(BATCH_COMMIT)]
    found += [(t, f"batch {m[2]} completed (Spark commit)") for t, m in driver.matching(COMPLETED)]
    return sorted(found)


def _assert(sc: Scenario, feed: Feed, first: Stamped, second: Stamped, first_epoch: int, lease: LeaseRecord,
            t_cut: float, code: int) -> str:
    times = sc.times
    first_commits = _commit_times(first)
    second_commits = _commit_times(second)
    after_cut = [(round(t - t_cut, 1), what) for t, what in first_commits if t > t_cut]
    times["first driver: commits after the cut"] = len(after_cut)
    times["first driver: last commit after the cut, s"] = after_cut[-1][0] if after_cut else None
    times["second driver: lease taken at, s after cut"] = round(lease.acquired_at - t_cut, 1)
    times["second driver: first commit after the cut, s"] = (round(second_commits[0][0] - t_cut, 1)
                                                            if second_commits else None)
    completed = second.matching(COMPLETED)
    times["second driver: first completed batch after the cut, s"] = (round(completed[0][0] - t_cut, 1)
                                                                     if completed else None)
    stop_line = first.first("stopping the query now") or first.first("the lease cannot be confirmed")
    times["first driver: stopped its query (lease unconfirmed) after the cut, s"] = (
        round(stop_line - t_cut, 1) if stop_line else None)
    times["ids"] = feed.next_id
    times["records"] = feed.records

    # (b) every id exactly once in the committed view.
    rows = sc.in_launcher(sc.sink.committed)
    counts = Counter(r[0] for r in rows)
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(range(feed.next_id)) - set(counts))
    times["committed rows"] = len(rows)
    times["duplicated ids"] = len(duplicated)
    times["missing ids"] = len(missing)
    log = "\n".join(line for d in (first, second) for _, line in d.lines)
    twice: list[tuple[str, str, str]] = []
    if isinstance(sc.sink, KafkaSink):
        # The last-attempt view above hides a (batch, partition) committed by both drivers (a consumer of Apache
        # Kafka sees both transactions): count the commits themselves.
        commits = Counter((m[1], m[2], m[3]) for m in TASK_COMMIT.finditer(log))
        twice = sorted(k for k, n in commits.items() if n > 1)
        times["(batch, partition) committed by two transactions"] = len(twice)
        times["records in the first driver's transactions committed again"] = sum(
            int(m[4]) for _, m in first.matching(TASK_COMMIT) if (m[1], m[2], m[3]) in set(twice))
        times["rewrites after a restore (task warnings)"] = log.count("of another timeline")

    print(f"scenario 1: {json.dumps(times, indent=1)}")
    print("first driver's commits after the cut (s after the cut):", after_cut)

    # (a) again, against the second's first commit.
    _assert_stopped_in_time(sc, first, first_epoch, lease, t_cut)
    if second_commits:
        overlap = [(round(t - t_cut, 1), what) for t, what in first_commits if t >= second_commits[0][0]]
        assert not overlap, f"(a) the first driver committed after the second's first commit: {overlap[:10]}"
    # (c) the first driver exits 3, saying it was fenced by the newer epoch.
    assert code == EXIT_FENCED, f"(c) the first driver exited {code}, expected {EXIT_FENCED}\n{first.tail()}"
    fenced = f"was fenced: the lease now shows epoch {lease.epoch}"
    assert first.first(fenced) is not None, f"(c) no '{fenced}' line\n{first.tail()}"

    # (b) every id once in the sink's committed view.
    failures = []
    if duplicated or missing:
        failures.append(f"{len(duplicated)} ids duplicated (first {duplicated[:10]}), {len(missing)} missing (first "
                        f"{missing[:10]})")
    elif sorted(rows) != expected_rows(feed.next_id):
        failures.append("every id once, but some content differs")
    if twice:
        failures.append(f"(batch, partition, query) committed by both drivers: {twice[:10]}")
    if not failures:
        times["uncommitted"] = sc.in_launcher(sc.sink.check_nothing_uncommitted)
        return ""
    if isinstance(sc.sink, KafkaSink) and not missing and _only_after_snapshot(sc, first, second, duplicated, twice):
        return f"{KAFKA_LIMIT}: {'; '.join(failures)}"
    raise AssertionError("(b) " + "; ".join(failures))


def _only_after_snapshot(sc: Scenario, first: Stamped, second: Stamped, duplicated: list[int],
                         twice: list[tuple[str, str, str]]) -> bool:
    """Whether every duplicate is of a batch the first driver committed after the snapshot the second restored (the
    known limit), from the records' ``ckpt`` headers and the drivers' lines; the numbers go to ``sc.times``."""
    from tests.support.kafkasink import read_all

    restored = [int(m[1]) for _, m in second.matching(RESTORED)]
    first_batches = [int(m[1]) for _, m in first.matching(BATCH_COMMIT)]
    if not restored or not first_batches:
        return False
    low, high = restored[0], max(first_batches)
    records = sc.in_launcher(read_all, sc.sink.bootstrap, sc.sink.topic)
    batches_of: dict[int, set[int]] = {}
    for record in records:
        batches_of.setdefault(int(json.loads(record.value)["id"]), set()).add(record.batch_id)
    outside = [i for i in duplicated if not batches_of.get(i, set()) <= set(range(low + 1, high + 1))]
    twice_outside = [k for k in twice if not low < int(k[0]) <= high]
    sc.times["second driver restored batch"] = low
    sc.times["first driver: last committed batch"] = high
    sc.times["batches written again"] = high - low
    print(f"known limit check: restored batch {low}, first driver's last batch {high}, duplicated ids outside "
          f"({low}, {high}]: {outside[:10]}, twice outside: {twice_outside[:10]}")
    return not outside and not twice_outside
