"""The demo: a stateful PySpark streaming job survives losing its checkpoint, thanks to a savepoint on S3.

Starts SeaweedFS on 127.0.0.1, runs a streaming aggregation for a few batches, takes a savepoint,
deletes the live checkpoint, restores the savepoint into a fresh location, processes more data, and
checks that the final counts equal what an uninterrupted run gives.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_ckpt_provider.core.jobstore import JobStore
from airflow_ckpt_provider.core.manifest import Kind, Trigger
from airflow_ckpt_provider.core.progress import human_bytes
from airflow_ckpt_provider.core.restore import restore_snapshot
from airflow_ckpt_provider.core.snapshots import create_snapshot, list_snapshots, verify_snapshot
from airflow_ckpt_provider.core.storage import LocalStorage, S3Options, open_storage
from airflow_ckpt_provider.embedded import EmbeddedS3, local_spark

log = logging.getLogger("airflow_ckpt_provider.demo")

CUSTOMERS = 50
EVENTS_PER_FILE = 2000


def write_events(input_dir: Path, index: int) -> list[dict[str, Any]]:
    """One input file = one micro-batch: deterministic orders (customer, amount)."""
    rows = [{"customer": f"c{(index * 7919 + i * 31) % CUSTOMERS:03d}", "amount": (index * 13 + i) % 100}
            for i in range(EVENTS_PER_FILE)]
    tmp = input_dir / f".{index:04d}.json.tmp"
    tmp.write_text("\n".join(json.dumps(r) for r in rows))
    tmp.rename(input_dir / f"{index:04d}.json")  # the file source must never see a half-written file
    return rows


def run_batches(spark: Any, input_dir: Path, checkpoint: Path, table: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """Run the streaming aggregation over all input files; return the batches run and the totals."""
    from pyspark.sql import functions as F

    orders = (spark.readStream.schema("customer STRING, amount INT")
              .option("maxFilesPerTrigger", 1).json(str(input_dir)))
    totals = orders.groupBy("customer").agg(F.count("*").alias("orders"), F.sum("amount").alias("revenue"))
    query = (totals.writeStream.outputMode("complete").format("memory").queryName(table)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    batches = len([p for p in query.recentProgress if p["numInputRows"] > 0])
    result = {r["customer"]: (r["orders"], r["revenue"]) for r in spark.table(table).collect()}
    return batches, result


def expected_state(all_rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    counts: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    for r in all_rows:
        counts[r["customer"]] += 1
        sums[r["customer"]] += r["amount"]
    return {k: (counts[k], sums[k]) for k in counts}


def spark_session() -> Any:
    return local_spark("ckpt-demo", **{
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=3, help="micro-batches before and after the restore")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("py4j", "botocore", "airflow_ckpt_provider.embedded"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    work = Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    input_dir, checkpoint = work / "input", work / "checkpoint"
    input_dir.mkdir()
    started = time.monotonic()
    try:
        with EmbeddedS3(workdir=work / "seaweedfs") as s3:
            s3.create_bucket("ckpt-demo")
            opts = S3Options(endpoint_url=s3.endpoint_url, region=s3.region,
                             access_key_id=s3.access_key, secret_access_key=s3.secret_key)
            store = JobStore(open_storage("s3://ckpt-demo/jobs", opts), "demo-orders")
            spark = spark_session()
            try:
                rows: list[dict[str, Any]] = []
                for i in range(args.batches):
                    rows += write_events(input_dir, i)
                ran1, _ = run_batches(spark, input_dir, checkpoint, "totals_before")
                log.info("ran %d batches on %s", ran1, checkpoint)

                snap = create_snapshot(store, LocalStorage(checkpoint), kind=Kind.SAVEPOINT, trigger=Trigger.MANUAL,
                                       code_version="demo-v1", spark_version=spark.version)
                shutil.rmtree(checkpoint)
                log.info("deleted the live checkpoint %s", checkpoint)

                restored_at = work / "checkpoint-restored"
                restored = restore_snapshot(store, snap.manifest.snapshot_id, LocalStorage(restored_at))
                for i in range(args.batches, 2 * args.batches):
                    rows += write_events(input_dir, i)
                ran2, state = run_batches(spark, input_dir, restored_at, "totals_after")
                expected = expected_state(rows)
                final = create_snapshot(store, LocalStorage(restored_at), kind=Kind.SAVEPOINT, trigger=Trigger.STOP)
                verified = verify_snapshot(store, final.manifest.snapshot_id)
            finally:
                spark.stop()
            exact = state == expected
            report(store, snap.to_dict(), restored.to_dict(), final.to_dict(),
                   {"ran1": ran1, "ran2": ran2, "events": len(rows), "exact": exact and verified.ok,
                    "seconds": time.monotonic() - started})
            return 0 if exact and verified.ok else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(store: JobStore, snap: dict[str, Any], restored: dict[str, Any], final: dict[str, Any],
           run: dict[str, Any]) -> None:
    print("\n=== airflow-ckpt-provider demo ===")
    print(f"batches before the savepoint: {run['ran1']}, after the restore: {run['ran2']}; events: {run['events']}")
    print(f"savepoint {snap['snapshot_id']} at batch {snap['batch_id']}: {snap['files']} files, "
          f"{human_bytes(snap['bytes'])}, taken in {snap['seconds']} s")
    print(f"live checkpoint deleted; restored into {restored['target']} in {restored['seconds']} s, "
          f"Spark resumed at batch {restored['resume_batch']}")
    print(f"final savepoint {final['snapshot_id']} at batch {final['batch_id']}: uploaded "
          f"{final['uploaded_files']} new files, reused {final['reused_files']} (incremental)")
    print(f"snapshots in {store.url}: {len(list_snapshots(store))}")
    print(f"final state equals an uninterrupted run: {'YES' if run['exact'] else 'NO'}")
    print(f"total {run['seconds']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
