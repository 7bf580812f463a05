"""Which failures of a running query a restart can fix, and who restarts it.

The driver restarts a failed query inside its own SparkSession (runtime/driver.py) unless this module says
the failure is one no restart fixes (the same code fails the same way on the same state and credentials)
or one only a new driver process fixes (the SparkContext or its JVM is broken). docs/runtime.md has the
table of failure kinds, who restarts, how it is detected and what the user sees.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from enum import StrEnum

from airflow_ckpt_provider.core.errors import CredentialsError
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_INCOMPATIBLE,
    EXIT_REFUSED,
)
from airflow_ckpt_provider.runtime.restore_check_verdict import OPERATORS_MISMATCH, spark_error
from airflow_ckpt_provider.runtime.sparkchecks import PY_FILES_ADVICE, SHIP_ADVICE
from airflow_ckpt_provider.sinks.timelines import REFUSED


class Recovery(StrEnum):
    """Who can recover from a failure."""

    QUERY = "query"  # restart the query in this driver, from the latest completed checkpoint
    PROCESS = "process"  # the session or its JVM is broken: a new driver process (the supervisor's restart)
    NONE = "none"  # no restart helps: fail fast with the message and the exit code


@dataclass(frozen=True)
class Failure:
    """A classified failure: ``what`` names the kind in a few words, ``message`` is Spark's (or ours)."""

    recovery: Recovery
    exit_code: int
    what: str
    message: str
    condition: str | None = None

    @property
    def restartable(self) -> bool:
        return self.recovery is not Recovery.NONE


# (what, exit code, pattern over Spark's message): first match wins. Conditions are Spark's error classes.
# A missing module's message is the module, where it was missing and how to ship it (``_MISSING``).
_MISSING = "a module is missing where Spark runs the job's Python"
_FATAL: tuple[tuple[str, int, re.Pattern[str]], ...] = (
    ("the sink refuses the output mode", EXIT_REFUSED, re.compile(
        r"does not support (Update|Complete) mode|(Complete|Append|Update) output mode not supported"
        r"|STREAMING_OUTPUT_MODE|supports the append output mode only", re.I)),
    ("the state does not fit the query", EXIT_INCOMPATIBLE, re.compile(
        r"STATE_STORE_[A-Z_]*(SCHEMA|NOT_COMPATIBLE|INCOMPATIBLE)[A-Z_]*|" + OPERATORS_MISMATCH
        + r"|StateSchemaNotCompatible|Provided schema doesn't match to the schema for existing state")),
    ("the storage refused the credentials", EXIT_DENIED, re.compile(
        r"SignatureDoesNotMatch|InvalidAccessKeyId|refused the credentials|InvalidClientTokenId")),
    (_MISSING, EXIT_CONFIG, re.compile(  # error=2 no such file, 13 permission: not a fork that may pass
        r"No module named '[^']+'|No module named|Cannot run program \"[^\"]*python[^\"]*\": error=(?:2|13)\b")),
    ("the job's code is broken", EXIT_CONFIG, re.compile(
        r"\b(ModuleNotFoundError|ImportError|SyntaxError|NameError)\b")),
)

_PROCESS = re.compile(
    r"SparkContext was shut down|Cannot call methods on a stopped SparkContext|java\.lang\.OutOfMemoryError"
    r"|Py4JNetworkError|Answer from Java side is empty|Error while receiving")


#: A Python exception's own line in a traceback ("RuntimeError: bad record"), not a Java class's.
_PYTHON_ERROR = re.compile(r"^\s*([A-Z]\w*(?:Error|Exception)): (.+)$")


def root_message(err: BaseException) -> str:
    """The line that says what went wrong: the innermost Python exception of a traceback Spark wraps (a
    foreachBatch function's, a UDF's), else Spark's own message without the query dump."""
    found = [m for line in f"{type(err).__name__}: {err}".splitlines() if (m := _PYTHON_ERROR.match(line))]
    if found:
        name, text = found[-1].groups()
        return f"{name}: {text.strip()}"
    return spark_error(err)[0]


#: The driver, where a module is missing outside any task: the job's code that runs there.
IN_DRIVER = "in the driver (the job's code that runs there: its build function, a foreachBatch function)"


def _missing(text: str, first: str) -> str:
    """The missing module, where it was missing (an executor's task, or the driver) and how to ship it, from Spark's
    error text (``first``: what the pattern matched)."""
    found = re.search(r"Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \(([^ ]+) executor (\w+)\)", text)
    if found is None:
        where = IN_DRIVER
    elif found.group(2) == "driver":  # a local master: the tasks run in the driver's JVM
        where = f"in a task on the driver ({found.group(1)})"
    else:
        where = f"on executor {found.group(2)} ({found.group(1)})"
    module = re.match(r"No module named '([^']+)'", first)
    if module is None:  # Spark cannot start the Python at all: the environment, not a module, is missing
        return f"{first} {where}: {SHIP_ADVICE}"
    return missing_module_message(module.group(1), where)


def missing_module_message(module: str, where: str) -> str:
    """``No module named 'M' WHERE: how to ship it``: a package installed in this driver's Python (so the executor's
    Python is not the driver's) → ship the environment; a module this driver finds outside its packages, or none
    at all → the job's own module, to pass with its py files (for none, the package advice too)."""
    top = module.split(".", maxsplit=1)[0]
    head = f"No module named '{module}' {where}"
    kind = _module_kind(top)
    if kind == "package":
        return f"{head}: {SHIP_ADVICE}"
    if kind == "job":
        return (f"{head}: {top} is not an installed package (this driver finds it outside its Python's packages) but "
                f"a module of the job: {PY_FILES_ADVICE}")
    return (f"{head}: if {top} is a module of the job (a helper file next to the job file), {PY_FILES_ADVICE}; if it "
            f"is a package, install it into the job's Python environment and {SHIP_ADVICE}")


def _module_kind(top: str) -> str | None:
    """``package`` if this Python imports ``top`` from its installed packages, ``job`` if from elsewhere (a
    directory on sys.path, a py file Spark shipped), None if it cannot import it."""
    if top == __name__.split(".")[0]:  # this provider: shipped with the Python environment (its code zip)
        return "package"
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = spec.origin or next(iter(spec.submodule_search_locations or ()), "")
    return "package" if re.search(r"[/\\](site|dist)-packages[/\\]", origin or "") else "job"


def classify(err: BaseException | None) -> Failure:
    """Who can recover from ``err`` (a query's exception, or an error from starting one), and its exit code."""
    if err is None:
        return Failure(Recovery.QUERY, EXIT_FAILED, "the query stopped", "the query stopped without an exception")
    if isinstance(err, CredentialsError):
        return Failure(Recovery.NONE, EXIT_DENIED, "the storage refused the credentials", str(err))
    condition = spark_error(err)[1]
    message = root_message(err)
    text = f"{type(err).__name__}: {err}"
    if REFUSED in text:  # the sink's own words after the marker
        line = next(ln for ln in text.splitlines() if REFUSED in ln)
        return Failure(Recovery.NONE, EXIT_REFUSED, "a sink refused the batch",
                       line[line.index(REFUSED) + len(REFUSED):].strip(), condition)
    for what, code, pattern in _FATAL:
        if found := pattern.search(text):
            if what == _MISSING:
                message = _missing(text, found.group(0))
            return Failure(Recovery.NONE, code, what, message, condition)
    if _PROCESS.search(text) or type(err).__name__.startswith("Py4J"):
        return Failure(Recovery.PROCESS, EXIT_FAILED, "the Spark session is broken", message, condition)
    return Failure(Recovery.QUERY, EXIT_FAILED, "the query failed", message, condition)
