"""The spark-submit entry point: ``entrypoint.py JOB_FILE --job NAME --store URL [runtime options]``.

``ckpt run`` builds that command; the exit code tells a supervisor what to do (runtime/exitcodes.py).
With ``--check-restore`` it runs the restore check (runtime/restore_check.py) instead of the job.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_ckpt_provider.runtime.config import RuntimeConfig


def main(argv: Sequence[str] | None = None) -> int:
    # One line per event for operators: our INFO, everyone else's warnings.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)
    logging.getLogger("airflow_ckpt_provider").setLevel(logging.INFO)
    from airflow_ckpt_provider.core.errors import CkptError
    from airflow_ckpt_provider.runtime.config import RuntimeConfig
    from airflow_ckpt_provider.runtime.driver import JobDriver
    from airflow_ckpt_provider.runtime.exitcodes import EXIT_CONFIG
    from airflow_ckpt_provider.runtime.jobfile import load_builder

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: entrypoint.py JOB_FILE --job NAME --store URL [options]", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = RuntimeConfig.from_args(args[1:])
    except CkptError as err:
        logging.getLogger("airflow_ckpt_provider.runtime").error("cannot start: %s", err)
        return EXIT_CONFIG
    checker = None
    try:
        if config.check_restore:  # ckpt run --check-restore: only ask Spark whether the state restores
            from airflow_ckpt_provider.runtime.restore_check import RestoreChecker

            checker = RestoreChecker(config, args[0])
            run: Callable[[], int] = checker.run
        else:
            run = JobDriver(config, load_builder(args[0])).run
    except CkptError as err:
        logging.getLogger("airflow_ckpt_provider.runtime").error("cannot start: %s", err)
        code = EXIT_CONFIG
    except Exception as err:  # the job file itself is broken (SyntaxError, ImportError): a restart fails the same way
        logging.getLogger("airflow_ckpt_provider.runtime").exception("cannot start: loading %s failed%s", args[0],
                                                                     _missing_module(err))
        code = EXIT_CONFIG
    else:
        code = run()
    report = checker.report.to_dict() if checker is not None and checker.report is not None else None
    _report_end(config, code, report)
    return code


def _report_end(config: RuntimeConfig, code: int, report: dict[str, Any] | None = None) -> None:
    """Write how this driver ended (core/records/supervision.py DriverEnd) when its supervisor named the run: in
    cluster mode spark-submit's exit code says nothing of it, nor brings back a restore check's ``report``. A failed
    write is logged; the supervisor then takes the silence for a crash and restarts, as the restart strategy
    allows."""
    from airflow_ckpt_provider.core.records.supervision import DRIVER_RUN_ENV

    run = os.environ.get(DRIVER_RUN_ENV)
    if not run:
        return
    from airflow_ckpt_provider.core.errors import StorageError
    from airflow_ckpt_provider.core.records.supervision import DriverEnd, write_driver_end
    from airflow_ckpt_provider.core.store.jobstore import JobStore
    from airflow_ckpt_provider.core.store.storage import S3Options

    log = logging.getLogger("airflow_ckpt_provider.runtime")
    try:
        store = JobStore.open(config.store, config.job, S3Options.from_env(config.endpoint_url, config.region))
        write_driver_end(store, DriverEnd(job=config.job, run=run, code=code, at=time.time(),
                                          host=socket.gethostname(), pid=os.getpid(), report=report))
    except (StorageError, OSError) as err:
        log.warning("job %s: cannot record how driver run %s ended (exit %d): %s", config.job, run, code, err)
    else:
        log.info("job %s: driver run %s ends with exit code %d", config.job, run, code)


def _missing_module(err: BaseException) -> str:
    """``: No module named 'M' in the driver, loading the job file: how to ship it`` for a module the job file
    imports and the driver lacks, else ''."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return ""
    from airflow_ckpt_provider.runtime.failures import missing_module_message

    return f": {missing_module_message(err.name, 'in the driver, loading the job file')}"


if __name__ == "__main__":
    code = main()
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    finally:
        sys.exit(code)
