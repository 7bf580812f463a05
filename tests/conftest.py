"""Shared fixtures: a SeaweedFS S3 server for the session, a fresh bucket per test, both storage backends."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt_provider.core.store.storage import LocalStorage, S3Options, Storage, open_storage
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3
from tests.support import fullpass

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after pytest
# closed its capture streams, which prints a "Logging error" traceback under the summary.
logging.getLogger("py4j").setLevel(logging.WARNING)


#: Iterations of each stress test with ``--full`` (``scripts/test --full``); one otherwise.
STRESS_RUNS_FULL = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help=f"the longer variants: each stress test runs {STRESS_RUNS_FULL} iterations, not 1; the "
                          "exactly-once proof takes more kills (tests/integration/test_exactly_once.py)")
    parser.addoption("--stress-runs", type=int, default=None,
                     help="iterations of each stress test (overrides --full; or the CKPT_STRESS_RUNS variable)")


#: The JVM options of every Spark driver the tests start (pyspark sessions, drivers under ``ckpt run``, the example
#: DAGs' jobs): the client-tier JIT only and one GC thread. The tests' drivers live seconds to minutes with tiny
#: batches, so C2 compilation and parallel GC threads only cost CPU: on two cores a driver's start to its first
#: batch takes 11 CPU-s with these instead of 19-21, and most integration and system tests are driver starts.
#: Benchmarks and the demo run Spark's defaults. A session (or worker) whose tests start drivers adds a class archive
#: of Spark's driver classes (tests/support/jvmarchive.py): a driver's start to its first job, 9.1-9.6 s -> 5.3-5.5 s.
TEST_DRIVER_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
#: Where spark-submit takes extra options of the driver JVM (client mode) from: inherited by every spark-submit
#: the tests start, directly or through Airflow, Dagster and the launcher; one of your own wins.
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
#: The tiers whose tests start Spark drivers: only a session that collects one of them makes the archive.
SPARK_TIERS = ("tests/integration/", "tests/system/")

#: The order in which xdist's workers take modules (scripts/test: ``--dist loadfile --no-loadscope-reorder``):
#: the tiers whose modules take minutes first, so that the unit tests' many short modules fill the end and both
#: workers finish together; the example DAGs' module (the longest: 8-10 min on the slower VM; its tests share one
#: job) before the others. (Putting the two multi-JVM proofs one after the other on the other worker was tried:
#: they then slowed the example DAGs' tests instead, 32 min against 27 and 30.) The state matrix's two modules (about
#: 4 min each) next: one module went to one worker, which then finished 3 min after the other.
LONGEST_FIRST = ("tests/system/test_example_dags.py", "tests/integration/test_state_matrix_v1.py",
                 "tests/integration/test_state_matrix_v2.py", "tests/system/", "tests/integration/")

#: This session set SPARK_SUBMIT_OPTS (it was unset) and removes it at the end.
_SET_OPTS = pytest.StashKey[bool]()
#: This session set CKPT_HOME (it was unset) to a directory of its own, removed at the end.
_SET_HOME = pytest.StashKey[Path]()
#: This session set SPARK_LOCAL_DIRS (it was unset) to a directory of its own, removed at the end: a driver killed
#: with kill -9 leaves its spark-*/userFiles (a shipped environment: 324 MB) there; under /tmp they filled the disk.
_SET_SPARK_DIRS = pytest.StashKey[Path]()


def _xdist_controller(config: pytest.Config) -> bool:
    """The process that hands tests to pytest-xdist's workers (``-n N``, or ``--dist`` with ``--tx``): it runs
    none itself."""
    if hasattr(config, "workerinput"):
        return False
    return bool(getattr(config.option, "numprocesses", None)) or (
        getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None)))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stress(base, per_run): repeated under load, once by default, more with --full or --stress-runs N")
    config.addinivalue_line(
        "markers", "full(proven_by): runs only with --full; the test named proven_by proves the same guarantee "
        "in the default suite (the 30-minute budget)")
    if _xdist_controller(config):  # each worker sets its own (it would take the controller's for the user's)
        return
    # Records and logs of detached processes: never the user's ~/.ckpt, and one home per xdist worker.
    if "CKPT_HOME" not in os.environ:
        home = Path(tempfile.mkdtemp(prefix="ckpt-tests-home-"))
        os.environ["CKPT_HOME"] = str(home)
        config.stash[_SET_HOME] = home
    if SUBMIT_OPTS not in os.environ:
        config.stash[_SET_OPTS] = True
        os.environ[SUBMIT_OPTS] = TEST_DRIVER_JVM
    if "SPARK_LOCAL_DIRS" not in os.environ:
        spark_dirs = Path(tempfile.mkdtemp(prefix="ckpt-tests-spark-"))
        os.environ["SPARK_LOCAL_DIRS"] = str(spark_dirs)
        config.stash[_SET_SPARK_DIRS] = spark_dirs


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_SET_OPTS, False):
        os.environ.pop(SUBMIT_OPTS, None)
    home = config.stash.get(_SET_HOME, None)
    if home is not None:
        os.environ.pop("CKPT_HOME", None)
        shutil.rmtree(home, ignore_errors=True)
    spark_dirs = config.stash.get(_SET_SPARK_DIRS, None)
    if spark_dirs is not None:
        os.environ.pop("SPARK_LOCAL_DIRS", None)
        shutil.rmtree(spark_dirs, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the first test, in a session (or xdist worker) whose tests start Spark drivers: the class archive
    into the drivers' options. One process makes it once per machine; a second worker waits for it."""
    config = session.config
    if not config.stash.get(_SET_OPTS, False) or config.option.collectonly or not any(
            i.nodeid.startswith(SPARK_TIERS) and not i.get_closest_marker("skip") for i in session.items):
        return
    from tests.support.jvmarchive import QUIET, driver_archive

    archive, how = driver_archive(TEST_DRIVER_JVM)
    if archive is not None:
        os.environ[SUBMIT_OPTS] = f"{TEST_DRIVER_JVM} -XX:SharedArchiveFile={archive} {QUIET}"
    line = f"Spark drivers: {TEST_DRIVER_JVM}; {how}"
    worker = getattr(config, "workeroutput", None)
    if worker is not None:  # shown by the controller at the end (pytest_testnodedown)
        worker[_ARCHIVE_LINE] = line
    elif (reporter := config.pluginmanager.get_plugin("terminalreporter")) is not None:
        reporter.write_line(line)


#: The workers' lines on the class archive, for the controller's summary.
_ARCHIVE_LINE = "ckpt_class_archive"
_WORKER_LINES: list[str] = []


@pytest.hookimpl(optionalhook=True)  # an xdist hook: called only where xdist runs
def pytest_testnodedown(node: Any, error: object) -> None:
    line = getattr(node, "workeroutput", {}).get(_ARCHIVE_LINE)
    if line:
        _WORKER_LINES.append(f"{node.gateway.id}: {line}")


def stress_runs(config: pytest.Config) -> int:
    """How many iterations each stress test runs: --stress-runs, CKPT_STRESS_RUNS, --full, or 1."""
    explicit = config.getoption("--stress-runs") or os.environ.get("CKPT_STRESS_RUNS")
    if explicit:
        return max(1, int(explicit))
    return STRESS_RUNS_FULL if config.getoption("--full") else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A stress test's time limit grows with its iterations: ``@pytest.mark.stress(base=S, per_run=S)``; a test
    marked ``full`` is skipped without --full. On xdist's workers, the longest modules first (``LONGEST_FIRST``)."""
    if hasattr(config, "workerinput"):  # every worker sorts alike: xdist checks that they collected the same order
        items.sort(key=lambda item: next((i for i, t in enumerate(LONGEST_FIRST) if item.nodeid.startswith(t)),
                                         len(LONGEST_FIRST)))
    runs = stress_runs(config)
    full = config.getoption("--full")
    for item in items:
        only_full = item.get_closest_marker("full")
        if only_full is not None and not full:
            item.add_marker(pytest.mark.skip(reason=f"with --full only; {only_full.kwargs['proven_by']} proves the "
                                                    "same guarantee in the default suite"))
        marker = item.get_closest_marker("stress")
        if marker is not None:
            limit = marker.kwargs.get("base", 300) + marker.kwargs.get("per_run", 600) * runs
            item.add_marker(pytest.mark.timeout(limit))


#: Seconds and tests per tier (tests/<tier>/...): setup, call and teardown, servers started by fixtures included.
_TIER_SECONDS: defaultdict[str, float] = defaultdict(float)
_TIER_TESTS: defaultdict[str, int] = defaultdict(int)
#: Seconds per module and per xdist worker: a worker's sum is about the run's wall time, so the budget is the
#: larger of the two workers' sums, and the longest modules are where time can come out.
_MODULE_SECONDS: defaultdict[str, float] = defaultdict(float)
_WORKER_SECONDS: defaultdict[str, float] = defaultdict(float)
_SHOWN_MODULES = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] += report.duration
    _TIER_TESTS[tier] += report.when == "call"
    _MODULE_SECONDS[report.nodeid.split("::")[0]] += report.duration
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker that ran the test
    if node is not None:
        _WORKER_SECONDS[node.gateway.id] += report.duration


#: A --full session's clone (HEAD, uncommitted changes) and start, for its record (tests/support/fullpass.py).
_FULL_TREE = pytest.StashKey[fullpass.Tree]()
_FULL_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """A --full session notes the commit it tests before any test runs (the controller only, under xdist)."""
    config = session.config
    if config.getoption("--full") and not hasattr(config, "workerinput") and not config.option.collectonly:
        config.stash[_FULL_TREE] = fullpass.tree_state()
        config.stash[_FULL_STARTED] = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    for line in _WORKER_LINES:
        terminalreporter.write_line(line)
    _time_summary(terminalreporter, config)
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        terminalreporter.section("the --full tier")
        terminalreporter.write_line(_full_pass_line(terminalreporter, exitstatus, config))


def _full_pass_line(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> str:
    """A --full run of the whole suite with no failures records its commit in tests/full-pass.json (a tracked
    file: committed, it reaches every clone) and says so, or says why not; every other run says which commit
    the tier last passed on and how many commits ago that is (docs/development.md, "Tests")."""
    if not config.getoption("--full"):
        return fullpass.summary_line(fullpass.read_record(), fullpass.distance)
    counts = fullpass.counts_of(terminalreporter.stats)
    from_testpaths = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    narrowed = fullpass.narrowing(
        config.args, base=config.rootpath if from_testpaths else config.invocation_params.dir, root=config.rootpath,
        testpaths=config.getini("testpaths"), keyword=config.option.keyword, markexpr=config.option.markexpr,
        deselect=config.getoption("deselect") or ())
    why = fullpass.why_not_record(exitstatus=int(exitstatus), counts=counts, narrowed=narrowed,
                                  stress_runs=stress_runs(config), stress_runs_full=STRESS_RUNS_FULL)
    if why is not None:
        return fullpass.not_recorded_line(why)
    rec = fullpass.record(config.stash[_FULL_TREE], counts, time.monotonic() - config.stash[_FULL_STARTED],
                          datetime.now(UTC))
    fullpass.write_record(rec)
    return fullpass.recorded_line(rec)


def _time_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Time per tier, per xdist worker and of the longest modules, for the table in docs/development.md (the
    slowest tests come from --durations): the tests' own time, so the tiers' sums exceed the run's wall time on
    two workers, and the larger worker's sum is about that wall time."""
    if not _TIER_SECONDS:
        return
    workers = getattr(config.option, "numprocesses", None)
    terminalreporter.section(f"time per tier (summed over {workers} workers)" if workers else "time per tier")
    for tier, seconds in sorted(_TIER_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{tier:<12} {seconds / 60:6.1f} min  {_TIER_TESTS[tier]:5d} tests")
    for worker, seconds in sorted(_WORKER_SECONDS.items()):
        terminalreporter.write_line(f"worker {worker:<5} {seconds / 60:6.1f} min")
    terminalreporter.section(f"the {_SHOWN_MODULES} longest modules")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:_SHOWN_MODULES]:
        terminalreporter.write_line(f"{seconds:7.1f} s  {module}")


@pytest.fixture(scope="session")
def stress_run_count(pytestconfig: pytest.Config) -> int:
    return stress_runs(pytestconfig)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    with EmbeddedS3(workdir=tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A tansu broker (in memory) for the session; tests create their own uniquely named topics."""
    with EmbeddedKafka(workdir=tmp_path_factory.mktemp("tansu")) as server:
        yield server
        # Destroy Kafka clients that tests left to the garbage collector while the broker still runs:
        # a client that outlives the broker logs connection errors at interpreter exit.
        gc.collect()


@pytest.fixture
def topic(kafka_server: EmbeddedKafka) -> str:
    """A fresh 3-partition topic."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kafka_server.create_topic(name, partitions=3)
    return name


@pytest.fixture
def s3_options(s3_server: EmbeddedS3) -> S3Options:
    return S3Options(
        endpoint_url=s3_server.endpoint_url,
        region=s3_server.region,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
    )


@pytest.fixture
def bucket(s3_server: EmbeddedS3) -> Iterator[str]:
    """A fresh bucket, emptied and deleted afterwards: SeaweedFS gives every bucket its own volumes,
    and a session that keeps hundreds of buckets runs out of writable volumes ("No writable volumes")."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    yield name
    client = s3_server.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    client.delete_bucket(Bucket=name)


@pytest.fixture
def s3_root(bucket: str, s3_options: S3Options) -> Storage:
    return open_storage(f"s3://{bucket}/jobs", s3_options)


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A job store root on each backend (the S3 one starts the session's SeaweedFS)."""
    if request.param == "local":
        return LocalStorage(tmp_path / "store")
    # ignore[no-any-return] below: getfixturevalue is Any: the s3_root fixture's Storage
    return request.getfixturevalue("s3_root")  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A throwaway PostgreSQL server (Debian's binaries) for the session; FAILS if none is installed."""
    from tests.support.pgserver import PgServer, find_bin_dir

    try:
        find_bin_dir()
    except RuntimeError as err:
        pytest.fail(str(err))
    with PgServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server: object) -> str:
    """A libpq DSN (trust auth, 127.0.0.1) of the session's PostgreSQL server."""
    # ignore[attr-defined] below: the session's PgServer, typed object: imported lazily
    return str(postgres_server.dsn)  # type: ignore[attr-defined]
