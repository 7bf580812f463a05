"""Which failures a restart fixes: runtime/failures.classify on the texts Spark and S3 really produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError, CredentialsError, UnreachableError
from airflow_ckpt_provider.runtime import entrypoint
from airflow_ckpt_provider.runtime.exitcodes import (
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_INCOMPATIBLE,
    EXIT_REFUSED,
    NOT_RESTARTABLE,
)
from airflow_ckpt_provider.runtime.failures import Recovery, classify, root_message
from airflow_ckpt_provider.runtime.jobfile import load_builder
from airflow_ckpt_provider.sinks.timelines import REFUSED

#: How a foreachBatch function's exception reaches the driver: py4j's proxy wraps the Python traceback.
PROXY = """[STREAM_FAILED] Query [id = 6d4, runId = c35] terminated with exception: An exception was raised by \
the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/x/pyspark/sql/utils.py", line 166, in call
    raise e
pyspark.errors.exceptions.captured.PythonException:
  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/jobs/count.py", line 41, in write_and_log
{error}

=== Streaming Query ===
Identifier: orders [id = 6d4, runId = c35]"""


def spark(error: str) -> Exception:
    return RuntimeError(PROXY.format(error=error))


def test_a_python_error_in_a_task_or_sink_restarts_the_query_and_names_the_innermost_exception() -> None:
    failure = classify(spark("RuntimeError: injected sink failure at 29"))
    assert (failure.recovery, failure.exit_code) == (Recovery.QUERY, EXIT_FAILED)
    assert failure.message == "RuntimeError: injected sink failure at 29"
    assert failure.restartable


@pytest.mark.parametrize(("error", "code", "what"), [
    ("ModuleNotFoundError: No module named 'ckpt_test_missing_module'", EXIT_CONFIG,
     "a module is missing where Spark runs the job's Python"),
    ("NameError: name 'totl' is not defined", EXIT_CONFIG, "the job's code is broken"),
    ("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match existing state key schema.",
     EXIT_INCOMPATIBLE, "the state does not fit the query"),
    ("[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful operator name does not match",
     EXIT_INCOMPATIBLE, "the state does not fit the query"),
    ("AnalysisException: Append output mode not supported when there are streaming aggregations on streaming "
     "DataFrames/DataSets without watermark", EXIT_REFUSED, "the sink refuses the output mode"),
    ("java.lang.IllegalArgumentException: requirement failed: ckpt-files does not support Update mode",
     EXIT_REFUSED, "the sink refuses the output mode"),
    ("botocore.exceptions.ClientError: An error occurred (SignatureDoesNotMatch) when calling PutObject",
     EXIT_DENIED, "the storage refused the credentials"),
])
def test_failures_no_restart_fixes_fail_fast_with_their_own_exit_code(error: str, code: int, what: str) -> None:
    failure = classify(spark(error))
    assert (failure.recovery, failure.exit_code, failure.what) == (Recovery.NONE, code, what)
    assert code in NOT_RESTARTABLE


#: An executor whose Python lacks a module: the task's traceback as the driver receives it (trimmed).
EXECUTOR_LACKS = """[STREAM_FAILED] Query [id = 8c4, runId = 96a] terminated with exception: Job aborted due to \
stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: Lost task 0.3 in stage 1.0 (TID 7) \
(127.0.0.1 executor 1): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/w/app-1/1/ckpt-provider.zip/airflow_ckpt_provider/kafka/reader.py", line 12, in <module>
ModuleNotFoundError: No module named 'confluent_kafka'
"""


def test_a_module_missing_on_an_executor_fails_fast_naming_the_module_the_executor_and_how_to_ship_it() -> None:
    failure = classify(RuntimeError(EXECUTOR_LACKS))
    assert (failure.recovery, failure.exit_code) == (Recovery.NONE, EXIT_CONFIG)
    assert failure.message.startswith("No module named 'confluent_kafka' on executor 1 (127.0.0.1): ship the job's "
                                      "Python environment (ckpt run --python-env ship")


def test_a_python_spark_cannot_start_on_a_node_fails_fast_instead_of_restarting_forever() -> None:
    failure = classify(RuntimeError('Lost task 0.0 in stage 0.0 (TID 0) (10.0.0.7 executor 2): java.io.IOException: '
                                    'Cannot run program "/home/me/.venv/bin/python": error=2, No such file'))
    assert (failure.recovery, failure.exit_code) == (Recovery.NONE, EXIT_CONFIG)
    assert failure.message.startswith('Cannot run program "/home/me/.venv/bin/python": error=2 on executor 2 '
                                      "(10.0.0.7): ship")
    busy = classify(RuntimeError('java.io.IOException: Cannot run program "python3": error=11, Resource temporarily '
                                 "unavailable"))
    assert busy.recovery is Recovery.QUERY  # a fork that failed for now: a restart may well work


def test_a_batch_refused_for_its_timeline_fails_fast_with_the_sink_s_own_words() -> None:
    failure = classify(spark(f"ValueError: {REFUSED} batch 7 belongs to timeline 2, the sink is at timeline 3"))
    assert (failure.recovery, failure.exit_code) == (Recovery.NONE, EXIT_REFUSED)
    assert failure.message == "batch 7 belongs to timeline 2, the sink is at timeline 3"


def test_refused_credentials_and_a_refused_output_mode_from_our_own_checks() -> None:
    denied = classify(CredentialsError("read lease.json: S3 refused the credentials (InvalidAccessKeyId)"))
    assert (denied.recovery, denied.exit_code) == (Recovery.NONE, EXIT_DENIED)
    mode = classify(ConfigError("the ckpt-files sink supports the append output mode only, found outputMode('update')"))
    assert mode.exit_code == EXIT_REFUSED


def test_an_unreachable_store_is_an_outage_the_query_restart_waits_out() -> None:
    failure = classify(UnreachableError("read lease.json: cannot reach S3 endpoint http://127.0.0.1:9"))
    assert (failure.recovery, failure.exit_code) == (Recovery.QUERY, EXIT_FAILED)


@pytest.mark.parametrize("error", [
    "org.apache.spark.SparkException: Job 12 cancelled because SparkContext was shut down",
    "java.lang.OutOfMemoryError: Java heap space",
    "py4j.protocol.Py4JNetworkError: Answer from Java side is empty",
])
def test_a_broken_session_needs_a_new_driver_process(error: str) -> None:
    failure = classify(spark(error))
    assert (failure.recovery, failure.exit_code) == (Recovery.PROCESS, EXIT_FAILED)
    assert failure.restartable


def test_a_query_that_stopped_without_an_exception_is_restarted() -> None:
    assert classify(None).recovery is Recovery.QUERY


def test_root_message_is_the_exception_line_without_the_query_dump() -> None:
    err = RuntimeError("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: disk full\n"
                       "=== Streaming Query ===\nIdentifier: x")
    assert root_message(err) == ("RuntimeError: [STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
                                 "disk full")


#: A job's helper module imported in its foreachBatch function, which runs in the driver: no task, no executor.
DRIVER_LACKS = PROXY.format(error="ModuleNotFoundError: No module named 'job_common'")


def test_a_job_s_own_module_missing_in_the_driver_names_the_driver_and_the_py_files_first() -> None:
    failure = classify(RuntimeError(DRIVER_LACKS))
    assert (failure.recovery, failure.exit_code) == (Recovery.NONE, EXIT_CONFIG)
    assert failure.message.startswith(
        "No module named 'job_common' in the driver (the job's code that runs there: its build function, a "
        "foreachBatch function): if job_common is a module of the job (a helper file next to the job file), pass it "
        "with the job's py files, which ship to the driver and every executor: ckpt run --py-files, "
        "SubmitStreamingJobOperator(py_files=[...])")
    assert failure.message.endswith("if it is a package, install it into the job's Python environment and ship the "
                                    "job's Python environment (ckpt run --python-env ship, automatic on spark://, "
                                    "yarn and k8s:// masters; see docs/cluster.md) or install the module on every node")


def test_a_job_s_module_the_driver_has_but_an_executor_lacks_is_named_a_module_of_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver finds job_common outside its packages (e.g. its working directory in client mode): the executor
    needs it shipped as a py file, and shipping the environment would not help."""
    (tmp_path / "job_common.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    failure = classify(RuntimeError(EXECUTOR_LACKS.replace("confluent_kafka", "job_common.orders")))
    assert failure.message.startswith(
        "No module named 'job_common.orders' on executor 1 (127.0.0.1): job_common is not an installed package (this "
        "driver finds it outside its Python's packages) but a module of the job: pass it with the job's py files")
    assert "--python-env" not in failure.message


def test_a_module_missing_in_a_local_task_is_in_a_task_on_the_driver() -> None:
    local = EXECUTOR_LACKS.replace("(127.0.0.1 executor 1)", "(10.0.0.5 executor driver)")
    assert classify(RuntimeError(local)).message.startswith(
        "No module named 'confluent_kafka' in a task on the driver (10.0.0.5): ship the job's Python environment")


def test_a_missing_module_of_the_job_file_names_the_driver_loading_it(tmp_path: Path) -> None:
    """entrypoint.py's line when the job file's own import fails (exit 2, before Spark starts): the module, where,
    and the advice."""
    job = tmp_path / "orders.py"
    job.write_text("import job_common_not_here\n")
    with pytest.raises(ModuleNotFoundError) as raised:
        load_builder(str(job))
    assert entrypoint._missing_module(raised.value).startswith(
        ": No module named 'job_common_not_here' in the driver, loading the job file: if job_common_not_here is a "
        "module of the job (a helper file next to the job file), pass it with the job's py files")
    assert entrypoint._missing_module(SyntaxError("bad")) == ""
