"""dags/savepoint_examples.py parses, serialises, and wires the right pieces together."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import Asset
from airflow.serialization.serialized_objects import DagSerialization

from airflow_ckpt.operators.checkpointed_spark_submit import CheckpointedSparkSubmitOperator
from airflow_ckpt.operators.savepoint import TriggerSavepointOperator
from airflow_ckpt.runtime.sparkconf import RESCALE_PARTITIONS
from airflow_ckpt.sensors.checkpoint import CheckpointSensor
from airflow_ckpt.triggers.checkpoint import CheckpointEventTrigger

EXAMPLES = Path(__file__).resolve().parents[2] / "dags" / "savepoint_examples.py"


@pytest.fixture(scope="module")
def bag() -> DagBag:
    return DagBag(dag_folder=str(EXAMPLES))


def test_parses_without_errors(bag: DagBag) -> None:
    assert bag.import_errors == {}
    assert set(bag.dags) == {"savepoint_manual", "savepoint_restore", "savepoint_consumer",
                             "checkpoint_health"}


def test_every_dag_serialises(bag: DagBag) -> None:
    for dag in bag.dags.values():
        restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        assert restored.dag_id == dag.dag_id


def test_manual_savepoint_dag(bag: DagBag) -> None:
    dag = bag.dags["savepoint_manual"]
    savepoint = dag.task_dict["savepoint"]
    assert isinstance(savepoint, TriggerSavepointOperator)
    assert savepoint.stop == "{{ params.stop }}" and dag.params["stop"] is False
    assert savepoint.deferrable
    assert dag.render_template_as_native_obj  # stop renders to a bool


def test_restore_dag_uses_the_supervisor(bag: DagBag) -> None:
    op = bag.dags["savepoint_restore"].task_dict["run_from_savepoint"]
    assert isinstance(op, CheckpointedSparkSubmitOperator)
    assert op.restore == "{{ params.savepoint }}"
    # the runtime refuses state_partitions < 1: the default 0 must render as "unset"
    assert op.conf[RESCALE_PARTITIONS] == "{{ params.state_partitions or '' }}"


def test_consumer_is_scheduled_by_the_watcher(bag: DagBag) -> None:
    [asset] = bag.dags["savepoint_consumer"].timetable.asset_condition.objects
    assert isinstance(asset, Asset)
    [watcher] = asset.watchers
    assert isinstance(watcher.trigger, CheckpointEventTrigger)
    assert watcher.trigger.base_condition.kind == "savepoint"


def test_health_check_sensor(bag: DagBag) -> None:
    sensor = bag.dags["checkpoint_health"].task_dict["next_checkpoint"]
    assert isinstance(sensor, CheckpointSensor)
    assert sensor.max_checkpoint_age_s == 600 and sensor.deferrable


def test_the_report_points_to_the_dag_that_runs_the_job() -> None:
    """Issue 27: the report of a savepoint of the main example's job pointed at
    savepoint_restore, which runs the odd/even job."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("savepoint_examples", EXAMPLES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = "s3://b/ckpt/rate-counts/savepoints/sp-final"
    main = module.restore_hint("rate-counts", path)
    assert "streaming_rate_counts" in main and f"restore={path}" in main
    assert "savepoint_restore" not in main and "rows_per_second" in main
    assert module.restore_hint("odd-even-sums", path) == (
        f"restore it with the savepoint_restore DAG: savepoint={path}")
