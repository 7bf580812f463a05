"""The Flink side of bench/flink_side_by_side.py: the keyed job on a local mini-cluster (run with PyFlink's Python).

    python keys_ids_job.py SETTINGS.json

Reads CSV lines ``key,id`` from a directory (the filesystem connector, monitored every 200 ms: an unbounded
source of the files the bench writes), keeps per key a count and the collection of ids seen (``COUNT(*)``,
``COLLECT(id)``: ids are unique in the bench's input, so it holds the set of seen ids), runs the aggregate's output
rows through ``Mark`` (Mark.java: the probe and fault hook) into a blackhole sink. RocksDB state backend with
incremental checkpoints, retained on cancellation; fixed-delay restarts. SETTINGS: input, checkpoints, savepoints,
rest_port, parallelism, interval_ms, restart_delay_ms, jar, faults, mini_batch_ms (0: off),
restore (a checkpoint or savepoint path, or null).
Prints ``JOB <id>`` once submitted, then waits for the job (it runs until killed).
"""

from __future__ import annotations

import json
import sys

from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment


def main(path: str) -> None:
    with open(path) as f:
        s = json.load(f)
    conf = Configuration()
    for key, value in {
        "parallelism.default": str(s["parallelism"]),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.interval": f"{s['interval_ms']} ms",
        "execution.checkpointing.dir": "file://" + s["checkpoints"],
        "execution.checkpointing.savepoint-dir": "file://" + s["savepoints"],
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "2",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "20",
        "restart-strategy.fixed-delay.delay": f"{s['restart_delay_ms']} ms",
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": str(s["rest_port"]),
        "jobmanager.bind-host": "127.0.0.1",
        "jobmanager.rpc.address": "127.0.0.1",
        "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.host": "127.0.0.1",
        "pipeline.jars": "file://" + s["jar"],
        "pipeline.name": "keys-ids",
        "pipeline.global-job-parameters": f"bench.fault.dir:{s['faults']}",
    }.items():
        conf.set_string(key, value)
    if s.get("mini_batch_ms"):  # Flink's buffering of group-aggregate updates (off by default)
        for key, value in {"table.exec.mini-batch.enabled": "true",
                           "table.exec.mini-batch.allow-latency": f"{s['mini_batch_ms']} ms",
                           "table.exec.mini-batch.size": "5000"}.items():
            conf.set_string(key, value)
    if s.get("restore"):
        conf.set_string("execution.state-recovery.path", "file://" + s["restore"])
    env = TableEnvironment.create(EnvironmentSettings.new_instance().in_streaming_mode()
                                  .with_configuration(conf).build())
    env.execute_sql(f"""
        CREATE TABLE src (k STRING, id BIGINT) WITH (
          'connector' = 'filesystem', 'path' = 'file://{s["input"]}', 'format' = 'csv',
          'source.monitor-interval' = '200 ms')""")
    env.execute_sql("CREATE TABLE sink (k STRING, cnt BIGINT, ids MULTISET<BIGINT>) WITH ('connector' = 'blackhole')")
    env.execute_sql("CREATE TEMPORARY FUNCTION mark AS 'Mark' LANGUAGE JAVA")
    result = env.execute_sql("""
        INSERT INTO sink SELECT mark(k), cnt, ids
        FROM (SELECT k, COUNT(*) AS cnt, COLLECT(id) AS ids FROM src GROUP BY k)""")
    client = result.get_job_client()
    print(f"JOB {client.get_job_id()}", flush=True)
    result.wait()


if __name__ == "__main__":
    main(sys.argv[1])
