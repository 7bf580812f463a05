"""The asset watchers' triggers as the example DAGs declare them: every argument survives serialize(), the hash
Airflow identifies a watcher by is stable across parses, and bad arguments fail the DAG's parse."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from airflow.triggers.base import BaseEventTrigger

from airflow_ckpt_provider.triggers.events import KafkaLagEventTrigger, SnapshotEventTrigger

DAGS = Path(__file__).resolve().parents[3] / "dags"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DAGS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("dag_file", "asset", "cls"), [
    ("example_ckpt_on_savepoint", "savepoints", SnapshotEventTrigger),
    ("example_ckpt_on_lag", "lagging", KafkaLagEventTrigger),
])
def test_the_example_dags_watchers_round_trip_with_a_stable_hash(dag_file: str, asset: str, cls: type) -> None:
    first, second = load(dag_file), load(dag_file)  # two parses
    (watcher,) = getattr(first, asset).watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == f"airflow_ckpt_provider.triggers.events.{cls.__name__}"
    assert cls(**kwargs).serialize() == (classpath, kwargs)
    assert first.dag.timetable.asset_condition == second.dag.timetable.asset_condition
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(
        *getattr(second, asset).watchers[0].trigger.serialize())


def test_bad_arguments_fail_when_the_dag_is_parsed() -> None:
    with pytest.raises(ValueError, match="invalid kind 'savepoints': expected one of checkpoint, savepoint"):
        SnapshotEventTrigger(job="orders", kinds=["savepoints"])
    with pytest.raises(ValueError, match="expected rearm_below <= threshold, found 20 > 10"):
        KafkaLagEventTrigger(group="g", threshold=10, rearm_below=20, bootstrap_servers="b:9092")
    with pytest.raises(ValueError, match="no Kafka brokers"):
        KafkaLagEventTrigger(group="g", threshold=10)
