"""E2E: the supervisor submitting to a Spark standalone master in client mode."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "flaky_job.py")

with DAG(
    dag_id="standalone_e2e",
    schedule=None,
    render_template_as_native_obj=True,
    params={"storage": "file:///tmp/unset", "job_name": "standalone", "master": "local[1]"},
):
    # the first attempt fails, the resubmission computes on the cluster's executor
    CheckpointedSparkSubmitOperator(
        task_id="on_standalone",
        application=JOB,
        job_name="{{ params.job_name }}",
        checkpoint_storage="{{ params.storage }}",
        master="{{ params.master }}",
        deploy_mode="client",
        restore="none",
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 1,
                          "fixed-delay.delay": "100 ms"},
        conf={"spark.test.fail_attempts": "1", "spark.test.compute": "true",
              "spark.ui.enabled": "false",
              "spark.cores.max": "1", "spark.executor.memory": "512m",
              "spark.driver.host": "127.0.0.1"},
        total_executor_cores=1,
    )
