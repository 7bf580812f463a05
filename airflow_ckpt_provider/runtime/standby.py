"""A warm standby driver's side of the go: started by its supervisor beside the running driver, it builds its
SparkSession and the job, says it is ready, and waits for the supervisor's go before it touches the lease, the
checkpoint or the sinks (launcher/spare.py is the supervisor's side).

Design notes: docs/runtime.md#design-notes-runtimestandbypy."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_ckpt_provider.core.records.lease import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: In a standby's environment only: the path of the file whose appearance is its go.
STANDBY_ENV = "CKPT_STANDBY_GO"
#: The supervisor's pid, in a standby's environment: a standby whose supervisor is gone exits.
SUPERVISOR_ENV = "CKPT_SUPERVISOR_PID"
#: Rows of the warm-up query's one batch (``warm_up``).
WARM_ROWS = 200
#: Seconds the warm-up query may take; past it, it is stopped and the standby waits all the same.
WARM_TIMEOUT = 120
#: Seconds between a waiting standby's looks at its go file and its supervisor (a look is a stat and a kill(pid, 0)).
TICK = 0.02


@dataclass(frozen=True)
class StandbySlot:
    """The files a standby and its supervisor share: ``go`` (the supervisor creates it: take over now) and
    ``ready`` beside it (the standby creates it once its session and job are built)."""

    go: Path
    supervisor_pid: int

    @property
    def ready(self) -> Path:
        return self.go.with_suffix(".ready")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StandbySlot | None:
        """This process's slot when it was started as a standby, else None."""
        env = os.environ if env is None else env
        go = env.get(STANDBY_ENV)
        return cls(Path(go), int(env.get(SUPERVISOR_ENV) or 0)) if go else None

    def env(self) -> dict[str, str]:
        return {STANDBY_ENV: str(self.go), SUPERVISOR_ENV: str(self.supervisor_pid)}

    def clear(self) -> None:
        for path in (self.go, self.ready):
            path.unlink(missing_ok=True)


def await_go(slot: StandbySlot, *, alive: Callable[[int], bool] = pid_alive,
             sleep: Callable[[float], object] = time.sleep) -> str:
    """Say ready, then wait for the go: '' once given, else why not (the supervisor is gone). Either way the slot's
    files are removed (a supervisor killed with kill -9 leaves none behind)."""
    slot.ready.touch()
    try:
        while not slot.go.exists():
            if slot.supervisor_pid and not alive(slot.supervisor_pid):
                return f"its supervisor (pid {slot.supervisor_pid}) is gone"
            sleep(TICK)
        return ""
    finally:
        slot.clear()


def warm_up(spark: SparkSession) -> str:
    """Run a throwaway stateful query once in this session, so that the taken-over job's first batch is not also the
    JVM's first: a file source, a keyed aggregation in the session's state store (RocksDB's native library loaded,
    the state store's code compiled), a foreachBatch sink, in a temporary checkpoint removed after. What it did, for
    the log; a warm-up that fails is logged and changes nothing (the standby is only colder)."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    where = Path(tempfile.mkdtemp(prefix="ckpt-standby-warm-up-"))
    try:
        source = where / "in"
        source.mkdir()
        (source / "rows.csv").write_text("".join(f"k{i % 17},{i}\n" for i in range(WARM_ROWS)))

        def count(batch: DataFrame, _batch_id: int) -> None:
            batch.count()

        query = (spark.readStream.schema("k STRING, id LONG").csv(str(source)).groupBy("k")
                 .agg(F.count("*").alias("n"), F.collect_set("id").alias("ids")).writeStream.outputMode("update")
                 .foreachBatch(count).option("checkpointLocation", str(where / "checkpoint"))
                 .trigger(availableNow=True).queryName("ckpt-standby-warm-up").start())
        if not query.awaitTermination(WARM_TIMEOUT):
            query.stop()
            return f"warm-up query stopped after {WARM_TIMEOUT:g} s"
        return f"warm-up query of {WARM_ROWS} rows in {time.monotonic() - started:.1f} s"
    except Exception as err:  # a colder standby is still a standby
        log.warning("standby: the warm-up query failed (%s: %s); waiting without it", type(err).__name__, err)
        return "no warm-up"
    finally:
        shutil.rmtree(where, ignore_errors=True)
