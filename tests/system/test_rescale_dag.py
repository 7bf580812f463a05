"""A rescale from the upgrade DAG's form under a real Airflow (``airflow dags test``), real Spark, tansu, SeaweedFS.

The module's job ``orders`` runs with RocksDB state (the ``ckpt_spark`` connection's conf; Spark's offline
repartition takes no other store) in 2 state partitions, submitted by the keep-alive DAG. The upgrade DAG with
``partitions`` 4 and the same code, while orders keep arriving: the check on a repartitioned copy, the stop with
savepoint S, the repartition step detached and awaited by its trigger, the start from the rescale savepoint R,
the verification. Afterwards the job runs from R on 4 partitions, its snapshots say so, spec/stable.json is the
new launch, and the totals equal the produced stream exactly. A second run with 4 is refused before anything
stops (the same count), the driver, its lease and the control requests untouched.
"""

from __future__ import annotations

import json
import re

import pytest

from airflow_ckpt_provider.core.records.control import CONTROL, Outcome, RequestAction, submit_request, wait_ack
from airflow_ckpt_provider.core.records.deployments import read_launch
from airflow_ckpt_provider.core.records.lease import read_lease
from airflow_ckpt_provider.core.records.status import JobState
from airflow_ckpt_provider.core.snapshots.catalog import latest_completed, list_snapshots, load_manifest
from airflow_ckpt_provider.core.snapshots.manifest import PARTITIONS_BEFORE, RESCALED_FROM, Kind, Trigger
from airflow_ckpt_provider.core.store.jobstore import SPEC_STABLE
from airflow_ckpt_provider.demo.world import EXAMPLES, AirflowHome, World
from tests.support.manifests import labels_timed
from tests.support.runtimejob import ROCKSDB

pytestmark = [pytest.mark.system, pytest.mark.timeout(900),
              pytest.mark.full(proven_by="integration/test_rescale.py::test_ckpt_job_rescale_moves_a_deployment_... "
                                         "(the same steps, launcher/upgradesteps.py, from the CLI, exact), "
                                         "test_example_dags.py (the upgrade DAG under real Airflow, and its refusal "
                                         "of a rescale of HDFS-backed state); the operator's part (it asks and waits): "
                                         "unit/operators/test_upgrade.py")]

UPGRADE = {"job_file": str(EXAMPLES / "orders_v1.py"), "code_version": "v1", "verify_batches": 1}


@pytest.fixture(scope="module")
def rocksdb_home(world: World) -> AirflowHome:
    """The module's Airflow home; its ckpt_spark connection runs the jobs with RocksDB state."""
    key, value = ROCKSDB.split("=", 1)
    h = AirflowHome(world, world.work / "airflow", watch_seconds=25, conf={key: value})
    h.migrate()
    return h


def control_requests(world: World) -> list[str]:
    return sorted(o.key for o in world.store.storage.list(CONTROL) if not o.key.endswith(".ack.json"))


def test_upgrade_dag_with_partitions_rescales_a_running_job_2_to_4_with_exact_totals_and_refuses_4_again(
        world: World, rocksdb_home: AirflowHome) -> None:
    world.produce(1000)
    submitted = rocksdb_home.dags_test("ckpt_keep_alive")
    assert submitted.returncode == 0, submitted.stdout[-5000:]
    before = world.wait_all_consumed()
    assert before.state is JobState.RUNNING

    with world.flowing():
        done = rocksdb_home.dags_test("ckpt_upgrade_job", {"job": world.job, **UPGRADE, "partitions": 4})
    assert done.returncode == 0, done.stdout[-8000:]
    # The actor's steps (a detached `ckpt job operate`), in the task's log once the operation ended.
    for step in ("1/5 compatible", "2/5 stopped with savepoint", "3/5 repartitioning savepoint", "3/5 saved savepoint",
                 "4/5 verified"):
        assert step in done.stdout, (step, done.stdout[-8000:])
    source_id = re.search(r"3/5 repartitioning savepoint (\S+) into 4 partitions on a copy", done.stdout)
    rescaled_id = re.search(r"3/5 saved savepoint (\S+) \(4 partitions\)", done.stdout)
    assert source_id and rescaled_id, done.stdout[-8000:]
    source, rescaled = load_manifest(world.store, source_id[1]), load_manifest(world.store, rescaled_id[1])
    assert (source.kind, source.trigger, source.state_partitions) == (Kind.SAVEPOINT, Trigger.STOP, 2), source
    assert (rescaled.trigger, rescaled.batch_id, rescaled.state_partitions) == (
        Trigger.RESCALE, source.batch_id + 1, 4), rescaled
    assert labels_timed(rescaled) == {RESCALED_FROM: source.snapshot_id, PARTITIONS_BEFORE: "2"}

    status = world.wait_all_consumed()
    assert status.state is JobState.RUNNING and status.epoch > before.epoch, status
    assert status.restored_from is not None and status.restored_from.endswith(rescaled.snapshot_id), status
    launch, stable = read_launch(world.store), json.loads(world.store.storage.read(SPEC_STABLE))
    assert launch is not None and stable["launch_id"] == launch.launch_id, stable  # verified: the stable deployment
    assert launch.restore.snapshot == rescaled.snapshot_id, launch.restore
    totals, expected = world.totals(), world.expected()
    assert totals == expected, {c: (totals.get(c), expected[c]) for c in expected if totals.get(c) != expected[c]}

    # The same count again: known from the newest snapshot's manifest, refused before anything stops.
    running = world.wait_all_consumed()
    ack = wait_ack(world.store, submit_request(world.store, RequestAction.SAVEPOINT, running.epoch).id, 180.0)
    assert ack is not None and ack.outcome is Outcome.COMPLETED, ack
    newest = latest_completed(list_snapshots(world.store))
    assert newest is not None and (newest.snapshot_id, newest.state_partitions) == (ack.snapshot_id, 4), newest
    lease, requests = read_lease(world.store), control_requests(world)
    again = rocksdb_home.dags_test("ckpt_upgrade_job", {"job": world.job, **UPGRADE, "partitions": 4})
    assert again.returncode != 0
    assert re.search(r"refused before anything was stopped: snapshot \S+: .*already has 4", again.stdout), \
        again.stdout[-5000:]
    after = world.status()
    assert after is not None and after.epoch == running.epoch and after.state is JobState.RUNNING, after
    assert read_lease(world.store) == lease and control_requests(world) == requests
    world.produce(300)
    status = world.wait_all_consumed()
    totals, expected = world.totals(), world.expected()
    assert totals == expected, {c: (totals.get(c), expected[c]) for c in expected if totals.get(c) != expected[c]}
