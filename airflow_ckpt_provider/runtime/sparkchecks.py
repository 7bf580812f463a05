"""The job's SparkSession, and what the job needs from Spark, checked before the lease: a Python with its
modules, and an executor.

Design notes: docs/cluster.md#design-notes-runtimesparkcheckspy."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_ckpt_provider.core.store.storage import S3Options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_ckpt_provider.runtime.config import RuntimeConfig

#: What every job's Python workers import here: PySpark's Arrow exchange with Python data sources.
REQUIRED = ("pyarrow", "pandas")
#: How to give Spark's Python what it lacks; failures.py says the same for executors.
SHIP_ADVICE = ("ship the job's Python environment (ckpt run --python-env ship, automatic on spark://, yarn and "
               "k8s:// masters; see docs/cluster.md) or install the module on every node")
#: How to give the driver and every executor a module of the job's own (a helper next to the job file).
PY_FILES_ADVICE = ("pass it with the job's py files, which ship to the driver and every executor: ckpt run --py-files, "
                   "SubmitStreamingJobOperator(py_files=[...]) or Deployment(py_files=...), the Dagster resource's or "
                   "submit op's py_files (docs/runtime.md)")


def missing_module(python: str, modules: tuple[str, ...] = REQUIRED, timeout: float = 60.0) -> str | None:
    """The first of ``modules`` that ``python`` cannot import (run from this directory, as Spark does), else None;
    a Python that cannot be run at all is reported the same way."""
    code = ("import importlib.util,sys\nfor m in sys.argv[1:]:\n"
            "    if importlib.util.find_spec(m) is None: print(m); break")
    try:
        done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"anything: the interpreter does not run ({err})"
    if done.returncode != 0:
        return f"anything: the interpreter exited with {done.returncode} ({done.stderr.strip()[-200:]})"
    return done.stdout.strip() or None


def check_spark_python(spark: SparkSession) -> str | None:
    """A message naming what Spark's Python for this job lacks, or None when it has what the job needs."""
    python = str(spark.sparkContext.pythonExec)
    missing = missing_module(python)
    if missing is None:
        return None
    return (f"Spark's Python for this job ({python}, from spark.pyspark.python or PYSPARK_PYTHON) cannot import "
            f"{missing}: expected {', '.join(REQUIRED)} and the job's own modules there; {SHIP_ADVICE}")


def check_executors(spark: SparkSession, timeout: float, *, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> str | None:
    """None once an executor registered (at once on local masters), else after ``timeout`` s why none did."""
    sc = spark.sparkContext
    dynamic = sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true"
    if str(sc.master).startswith("local") or dynamic:  # dynamic allocation may start none until tasks wait
        return None
    tracker = sc._jsc.sc().statusTracker()  # the public Scala status API, reached through py4j
    deadline = clock() + timeout
    while len(tracker.getExecutorInfos()) < 2:  # the driver counts as one
        if clock() >= deadline:
            conf = sc.getConf()
            asks = ", ".join(f"{k}={conf.get(k, default)}" for k, default in
                             (("spark.executor.memory", "1g"), ("spark.executor.cores", "all of a worker's")))
            return (f"no executor registered with {sc.master} within {timeout:g} s: expected at least one; the "
                    f"workers may be too small for what one executor asks ({asks}) or busy with other "
                    "applications. Check the master's UI, lower spark.executor.memory or spark.executor.cores, "
                    "add workers, or raise --executor-timeout")
        sleep(0.5)
    return None


#: How long a running query waits before it asks its sources again after they had no new data. Spark's 10 ms asks
#: an idle ckpt-kafka source (a Python process and a broker request) 100 times a second: an idle local job took 14.2
#: CPU-s in 40 s and its broker 2.6; at 100 ms 2.3 and 0.3 (docs/configuration.md). The first batch after a quiet
#: spell starts up to 0.1 s later. A value the job's conf gives wins.
IDLE_POLL = ("spark.sql.streaming.pollingDelay", "100ms")

#: On a cluster, the driver declares an executor lost once it has not heard its heartbeat (every 10 s,
#: spark.executor.heartbeatInterval) for 40 s, checked every 5 s, and runs its tasks elsewhere; a shuffle fetch from
#: a host that went silent fails after 40 s without traffic, and the lost map output is computed again. Spark's
#: defaults (120 s, checked every 60 s; fetches 120 s) left the standalone master's worker timeout (60 s, checked
#: every 60 s) to notice a worker host lost without a word, and a fetch already waiting on it waited 120 s: a batch
#: stalled 68-133 s (docs/reliability.md, finding 4). A job's conf that sets any of these, or spark.network.timeout,
#: keeps Spark's rules.
EXECUTOR_LOSS = (("spark.storage.blockManagerHeartbeatTimeoutMs", "40s"), ("spark.network.timeoutInterval", "5s"),
                 ("spark.shuffle.io.connectionTimeout", "40s"))
_EXECUTOR_LOSS_KEYS = (*(key for key, _ in EXECUTOR_LOSS), "spark.network.timeout", "spark.executor.heartbeatInterval")


def executor_loss_defaults(master: str, given: Callable[[str], bool]) -> tuple[tuple[str, str], ...]:
    """EXECUTOR_LOSS for a cluster ``master`` whose conf (``given``: whether it sets a key) leaves them all unset."""
    if master.startswith("local") or any(given(key) for key in _EXECUTOR_LOSS_KEYS):
        return ()
    return EXECUTOR_LOSS


#: Spark's default spark.redaction.regex, and the access key id, which this project never shows whole.
REDACTION = r"(?i)secret|password|token|access[.]?key|credential|access_key_id"


class _OnlyWithNumpy:
    """One of pyspark's numpy input converters for py4j, asked only about numpy objects.

    pyspark's NumpyArrayConverter and NumpyScalarConverter import ``pyspark.testing.utils`` in every
    ``can_convert`` to learn whether numpy is installed; that module imports pandas, pyarrow and Google's protobuf
    messages. py4j asks every converter about every argument of every call into the JVM, so a driver's first call
    (its SparkConf) paid that import: 2.4 CPU-s on the slower 2-core VM, on the path of every start and restart,
    in a driver that has no other use for pandas. An object can only be a numpy array or scalar once numpy is
    imported, and then it is an instance of numpy's base classes: only such an object goes on to the converter,
    which answers as before."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def can_convert(self, obj: object) -> bool:
        numpy = sys.modules.get("numpy")
        return (numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic))
                and bool(self.inner.can_convert(obj)))

    def convert(self, obj: object, gateway_client: Any) -> Any:
        return self.inner.convert(obj, gateway_client)


def defer_numpy_converters() -> int:
    """Wrap pyspark's numpy converters in py4j's list (which every gateway shares) in :class:`_OnlyWithNumpy`;
    the number wrapped now (0 once done)."""
    import pyspark.sql.types  # noqa: F401  # registers pyspark's converters with py4j
    from py4j import protocol

    wrapped = 0
    for i, converter in enumerate(protocol.INPUT_CONVERTER):
        kind = type(converter)
        if kind.__module__ == "pyspark.sql.types" and kind.__name__ in ("NumpyArrayConverter", "NumpyScalarConverter"):
            protocol.INPUT_CONVERTER[i] = _OnlyWithNumpy(converter)
            wrapped += 1
    return wrapped


def job_session(config: RuntimeConfig) -> SparkSession:
    """The job's session, polling idle sources every ``IDLE_POLL`` unless the job's conf says otherwise. On a
    standalone or YARN cluster, its executors get the job store's S3 settings (the
    sinks write from tasks, and executors there do not inherit the driver's environment) through
    ``spark.executorEnv.*`` in the SparkConf, never on a command line, with Spark's UI redacting them; a value
    the user gave with ``--conf`` is kept. Local executors inherit them; on Kubernetes use secrets."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    defer_numpy_converters()  # before the first call into the JVM
    SparkContext._ensure_initialized()  # the JVM spark-submit started: SparkConf() then holds its settings
    given, builder = SparkConf(), SparkSession.builder
    if not given.contains(IDLE_POLL[0]):
        builder = builder.config(*IDLE_POLL)
    master = given.get("spark.master", "local")
    for key, value in executor_loss_defaults(master, given.contains):
        builder = builder.config(key, value)
    if not master.startswith(("local", "k8s://")):
        for name, value in S3Options.from_env(config.endpoint_url, config.region).env().items():
            if not given.contains(f"spark.executorEnv.{name}"):
                builder = builder.config(f"spark.executorEnv.{name}", value)
        if not given.contains("spark.redaction.regex"):
            builder = builder.config("spark.redaction.regex", REDACTION)
    return builder.getOrCreate()
