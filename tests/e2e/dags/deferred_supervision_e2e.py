"""E2E: deferrable supervision of a real PySpark driver (fails once, then succeeds).

``airflow dags test`` runs the supervision trigger inline; the driver is submitted
detached, dies on attempt 1 (exit file), the strategy restarts it after a deferred delay.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "flaky_job.py")
FAST = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"}

with DAG(
    dag_id="deferred_supervision_e2e",
    schedule=None,
    render_template_as_native_obj=True,
    params={"storage": "file:///tmp/unset", "prefix": "e2e", "master": "local[1]"},
):
    CheckpointedSparkSubmitOperator(
        task_id="deferred",
        application=JOB,
        job_name="{{ params.prefix }}-deferred",
        checkpoint_storage="{{ params.storage }}",
        master="{{ params.master }}",
        restore="none",
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 2,
                          "fixed-delay.delay": "1 s"},
        conf={**FAST, "spark.test.fail_attempts": "1"},
        deferrable=True,
        poll_interval=0.5,
    )
