"""`ckpt kafka lag`: per-partition lag of a consumer group or a checkpoint (Kafka imported on use)."""

from __future__ import annotations

import argparse
import os

from airflow_ckpt_provider.cli.common import emit, s3_options, table
from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.core.store.storage import open_storage


def _kafka_conf(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka settings from --config FILE (``key=value`` lines), e.g. SASL: secrets stay off argv."""
    if not args.config:
        return {}
    conf: dict[str, str] = {}
    with open(args.config, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text.startswith(("#", "!")):
                continue
            key, sep, value = text.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"{args.config} line {number}: expected key=value (a librdkafka setting), found {text!r}"
                )
            conf[key.strip()] = value.strip()
    return conf


def cmd_kafka_lag(args: argparse.Namespace) -> int:
    from airflow_ckpt_provider.kafka.lag import checkpoint_lag, consumer_group_lag

    if not args.bootstrap_servers:
        raise ConfigError("no Kafka cluster given: pass --bootstrap-servers HOST:PORT or set KAFKA_BOOTSTRAP_SERVERS")
    topics = args.topic or None
    if args.group:
        report = consumer_group_lag(args.bootstrap_servers, args.group, topics, _kafka_conf(args), args.timeout)
    else:
        report = checkpoint_lag(args.bootstrap_servers, open_storage(args.checkpoint, s3_options(args)),
                                topics=topics, conf=_kafka_conf(args), timeout=args.timeout)
    d = report.to_dict()

    def human() -> str:
        if not report.partitions:
            return f"no committed offsets for {report.kind} {report.name}"
        rows = [[p.topic, str(p.partition), "-" if p.offset is None else str(p.offset), str(p.high), str(p.lag)]
                for p in report.partitions]
        at = f" at batch {report.batch_id}" if report.batch_id is not None else ""
        return (table(rows, ["TOPIC", "PARTITION", "OFFSET", "HIGH", "LAG"])
                + f"\ntotal lag of {report.kind} {report.name}{at}: {report.total_lag}")

    emit(args, d, human)
    return 0


def add_kafka_commands(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ckpt kafka ...`: offsets and lag (the Kafka client is imported only when a command runs)."""
    kafka = groups.add_parser("kafka", help="Kafka offsets of consumer groups and checkpoints")
    ksub = kafka.add_subparsers(dest="command", required=True)
    p = ksub.add_parser("lag", help="per-partition and total lag of a consumer group or a checkpoint")
    p.set_defaults(fn=cmd_kafka_lag)
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="HOST:PORT[,HOST:PORT] (env KAFKA_BOOTSTRAP_SERVERS)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--group", help="a consumer group: its committed offsets")
    which.add_argument("--checkpoint", help="a Spark checkpoint (directory or s3://): its latest completed batch")
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: all the group or "
                   "checkpoint has offsets for)")
    p.add_argument("--config", help="a file of librdkafka settings, one key=value a line (e.g. SASL)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per broker request (default 10)")
    p.add_argument("--endpoint-url", help="S3 endpoint URL for an s3:// checkpoint (env AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="S3 region (env AWS_REGION)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
