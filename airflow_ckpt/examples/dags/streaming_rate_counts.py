"""The main example: a checkpointed streaming job that runs until it is stopped.

The job is ``spark_jobs/rate_counts.py``: Spark's ``rate`` source (``rows_per_second``
rows a second), running count, sum and max per ``value % 10`` in Spark's state store,
written exactly once to ``<storage>/_output/<job>``, a micro-batch every
``trigger_interval``. It never runs out of input: the run's one task supervises the
driver until a stop-with-savepoint (``savepoint_manual`` with ``stop=true``) ends it
cleanly - the task then succeeds - or until the task is stopped.

The walkthrough in the README ("Use it from Airflow"): start this DAG, watch its
checkpoints (``airflow-ckpt checkpoints rate-counts``), take a savepoint with
``savepoint_manual``, stop it with ``savepoint_manual`` and ``stop=true``, and start it
again with ``restore`` set to that savepoint's URI.

Settings (``airflow-ckpt examples`` prints them): ``$AIRFLOW_CKPT_STORAGE`` (default
``file:///tmp/airflow-ckpt/checkpoints``), the storage connection
``$AIRFLOW_CKPT_CONN_ID`` (default ``aws_default``) and ``$AIRFLOW_CKPT_JOBS_DIR`` (default:
``spark_jobs`` beside this file's folder). The module does no I/O at import time.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_ckpt.examples.dag_params import (
    DEMO,
    SPARK_CONF,
    checkpoint_params,
    job_params,
    jobs_dir,
    restart_param,
    submit_args,
)
from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

with DAG(
    dag_id="streaming_rate_counts",
    description="Streams (Spark's rate source) with checkpoints until stopped with a savepoint",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # one run per job: a second trigger queues until the first ends
    tags=["airflow-ckpt", "example"],
    render_template_as_native_obj=True,
    params={
        **job_params("rate-counts"),
        "rows_per_second": Param(10, type="integer", minimum=1,
                                 description="Rate of the source (Spark's rowsPerSecond); "
                                             "keep it across a restore (the source numbers "
                                             "its rows by elapsed seconds x rate)."),
        "trigger_interval": Param("2 seconds", type="string", minLength=1,
                                  description="Processing-time trigger: a micro-batch every..."),
        **checkpoint_params("5 s"),
        "restart_strategy": restart_param("5 s"),
    },
):
    CheckpointedSparkSubmitOperator(
        task_id="run_job",
        application=str(jobs_dir(__file__) / "rate_counts.py"),
        conf={
            DEMO + "rows_per_second": "{{ params.rows_per_second }}",
            DEMO + "trigger_interval": "{{ params.trigger_interval }}",
            **SPARK_CONF,
        },
        **submit_args(),
    )
