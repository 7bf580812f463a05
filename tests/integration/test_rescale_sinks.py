"""The three exactly-once sinks across rescales: every id once, nothing uncommitted, a kill after each rescale.

tests/jobs/eo_job.py (``dropDuplicates(["id"])`` over a topic where every id arrives twice, RocksDB state in 2
partitions) into ckpt-files, the transactional ckpt-kafka sink and the Ledger: one job per sink, the three side by
side, each under ``ckpt run --supervise``. Each job stops with a savepoint; the rescale step (as a rescale runs it:
restore on a copy, Spark's offline repartition, the job's empty batch, saved as a savepoint of its own) moves its
state to 5 partitions in a batch N+1 that no sink sees; the job restarts from that savepoint on a fresh checkpoint
location; once it ran there, its driver is killed at the sink's last commit step and the supervisor restarts it from
the repartitioned live checkpoint; more ids; stop; 5 -> 3 the same way; the last ids. Each sink's committed output
is then exactly one row per id (dropDuplicates' state was moved, not lost: a lost id would come back as a second
row), nothing uncommitted is visible, the Kafka sink committed each (batch, partition) once, and the ckpt-files
sink's batch ids skip exactly the two repartition batches. docs/rescaling.md argues why each sink holds; this runs
it.
"""

from __future__ import annotations

import random
import time
from functools import partial

import pytest

from airflow_ckpt_provider.core.snapshots.catalog import load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import Kind, Trigger
from airflow_ckpt_provider.core.store.storage import S3Options
from airflow_ckpt_provider.runtime.restore_check_verdict import CheckOutcome
from airflow_ckpt_provider.sinks.filelayout import committed_batches
from tests.support.exactlyonce import (
    EO_JOB,
    MAX_OFFSETS,
    Chaos,
    EoSink,
    FilesSink,
    KafkaSink,
    LedgerSink,
    Proof,
    all_at_once,
    job_of_its_own,
    new_sink_topic,
)
from tests.support.manifests import labels_timed, rescaled_from
from tests.support.runtimejob import ROCKSDB, JobEnv, Run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800), pytest.mark.usefixtures("launcher_env"),
              pytest.mark.full(proven_by="partly: integration/test_rescale.py::test_ckpt_job_rescale_moves_a_"
                                         "deployment_... (a rescale through a kill, totals exact) and "
                                         "test_exactly_once.py (the sinks through kills and a savepoint restore); "
                                         "the sinks across a repartition batch are run here only")]

CHECK_TIMEOUT = 240.0
RESCALES = (5, 3)


def rescale_twice(chaos: Chaos, files_sink: FilesSink | None) -> str:
    """One job's whole run (the module docstring); a summary line."""
    env, sink = chaos.env, chaos.sink
    started = time.monotonic()
    chaos.feeder.feed()
    run = chaos.start("on-2", env.work / "checkpoint-2", "--conf", ROCKSDB, restarts=1)
    chaos.next_driver(run)
    chaos.feeder.feed()
    ack = chaos.drain_and_stop(run)
    assert ack.snapshot_id is not None
    source = load_manifest(env.store(), ack.snapshot_id)
    assert source.state_partitions == 2, source
    logs, checkpoint = run.log.read_text(), env.work / "checkpoint-2"
    repartitions: list[int] = []
    for partitions in RESCALES:
        verdict = env.rescale_step(EO_JOB, checkpoint, source.snapshot_id, partitions,
                                   env=env.env(MAX_OFFSETS, sink.env()), timeout=CHECK_TIMEOUT)
        assert verdict.outcome is CheckOutcome.COMPATIBLE and verdict.rescaled_snapshot_id, verdict
        rescaled = load_manifest(env.store(), verdict.rescaled_snapshot_id)
        assert (rescaled.kind, rescaled.trigger, rescaled.batch_id, rescaled.state_partitions) == (
            Kind.SAVEPOINT, Trigger.RESCALE, source.batch_id + 1, partitions), rescaled
        assert labels_timed(rescaled) == rescaled_from(source)
        repartitions.append(rescaled.batch_id)
        chaos.feeder.feed()  # arrived while the job was stopped
        checkpoint = env.work / f"checkpoint-{partitions}"  # another machine: a fresh location
        run = chaos.start(f"on-{partitions}", checkpoint, "--conf", ROCKSDB, "--restore", rescaled.snapshot_id,
                          restarts=3)
        chaos.crash_after_restore(run, rescaled.snapshot_id)
        chaos.feeder.feed()
        if partitions == RESCALES[-1]:
            chaos.feeder.finish()
        ack = chaos.drain_and_stop(run)
        assert ack.snapshot_id is not None
        source = load_manifest(env.store(), ack.snapshot_id)
        assert source.state_partitions == partitions and source.batch_id > rescaled.batch_id, source
        log = run.log.read_text()
        assert log.count("restore latest-state") == 1, run.tail()  # the restart after the kill
        logs += log
    assert not list(chaos.faults.iterdir()), "a crash point did not fire"
    chaos.check_output(logs)
    if files_sink is not None:  # every batch Spark ran but the repartitions', one query, one timeline
        shown = committed_batches(files_sink.url, files_sink.s3)
        assert len({m.query_id for m in shown}) == 1, [(m.query_id, m.batch_id) for m in shown]
        assert [m.batch_id for m in shown] == [b for b in range(source.batch_id + 1) if b not in repartitions], \
            [m.batch_id for m in shown]
    return (f"{sink.name}: {chaos.feeder.next_id} ids, repartition batches {repartitions}, "
            f"{time.monotonic() - started:.0f} s; {chaos.proof.uncommitted[sink.name]}")


def test_files_kafka_and_ledger_sinks_keep_every_id_once_across_rescales_2_to_5_to_3_with_a_kill_after_each(
        env: JobEnv, runs: list[Run], s3_options: S3Options) -> None:
    files, kafka, ledger = job_of_its_own(env, "files"), job_of_its_own(env, "kafka"), job_of_its_own(env, "ledger")
    out = new_sink_topic(env.kafka)
    files_sink = FilesSink(f"s3://{env.bucket}/eo-out", s3_options)
    jobs: list[tuple[JobEnv, EoSink]] = [
        (files, files_sink),
        (kafka, KafkaSink(env.kafka.bootstrap_servers, out, sink_partitions=2)),  # the state's 2 partitions
        (ledger, LedgerSink(ledger.work / "out.db", ledger.job)),
    ]
    proof = Proof(seed=0, sinks=tuple(s.name for _, s in jobs))  # no random kills: the rng is never drawn from
    summaries: dict[str, str] = {}

    def one(job: JobEnv, sink: EoSink) -> None:
        chaos = Chaos(job, sink, proof, random.Random(0), runs)
        summaries[sink.name] = rescale_twice(chaos, files_sink if sink is files_sink else None)

    all_at_once([partial(one, job, sink) for job, sink in jobs], runs)
    assert sorted(summaries) == ["files", "kafka", "ledger"]
    print("\n".join(summaries.values()))
