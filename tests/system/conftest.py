"""Fixtures of the system tests: one job World per module on the session's SeaweedFS and tansu, and a throwaway
Airflow home whose connections point at it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from airflow_ckpt_provider.demo.world import AirflowHome, World
from airflow_ckpt_provider.embedded import EmbeddedKafka, EmbeddedS3


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest, s3_server: EmbeddedS3, kafka_server: EmbeddedKafka,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The module's job ``orders`` in a bucket and on a topic of its own; whatever it left running is killed."""
    services = SimpleNamespace(s3=s3_server, kafka=kafka_server)
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    work = tmp_path_factory.mktemp(module)
    # ignore[arg-type] below: a namespace with the two servers World uses
    w = World(services, work, job="orders", bucket=f"{module[:40]}-{time.monotonic_ns() % 10**9}",  # type: ignore[arg-type]
              topic=f"orders-{module}")
    try:
        yield w
    finally:
        w.stop_everything()
        client = s3_server.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=w.bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=w.bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=w.bucket)


@pytest.fixture(scope="module")
def home(world: World) -> AirflowHome:
    """The module's Airflow home (sqlite, migrated); the keep-alive DAG watches the job 25 s per run."""
    h = AirflowHome(world, world.work / "airflow", watch_seconds=25)
    h.migrate()
    return h
