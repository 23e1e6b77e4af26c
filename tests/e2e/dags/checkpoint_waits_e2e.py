"""E2E DAGs for the checkpoint sensor (tests/e2e/test_checkpoint_waits.py).

``checkpoint_sensor_e2e``: a deferrable ``CheckpointSensor`` waits for a new completed
checkpoint of ``params.job`` in ``params.storage`` (via the ``ckpt_s3`` connection), then
a downstream task receives its summary through XCom.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_ckpt.sensors.checkpoint import CheckpointSensor

with DAG(
    dag_id="checkpoint_sensor_e2e",
    schedule=None,
    catchup=False,
    params={"storage": Param("s3://unset/x", type="string"), "job": Param("j", type="string")},
    render_template_as_native_obj=True,
    tags=["airflow-ckpt", "e2e"],
):
    wait = CheckpointSensor(
        task_id="wait",
        job_name="{{ params.job }}",
        checkpoint_storage="{{ params.storage }}",
        storage_conn_id="ckpt_s3",
        kind="checkpoint",
        poke_interval=0.25,
        timeout=120,
    )

    @task
    def downstream(summary: dict[str, Any]) -> str:
        return f"{summary['kind']} {summary['id']} at {summary['path']}"

    downstream(wait.output)
