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

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator
from airflow_ckpt.restart import restart_params_json_schema

STORAGE = os.environ.get("AIRFLOW_CKPT_STORAGE", "file:///tmp/airflow-ckpt/checkpoints")
CONN_ID = os.environ.get("AIRFLOW_CKPT_CONN_ID", "aws_default")
JOBS_DIR = Path(
    os.environ.get("AIRFLOW_CKPT_JOBS_DIR", Path(__file__).resolve().parent.parent / "spark_jobs")
)
DEMO = "spark.airflow_ckpt.demo."

with DAG(
    dag_id="streaming_rate_counts",
    description="Streams (Spark's rate source) with checkpoints until stopped with a savepoint",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # one run per job: a second trigger queues until the first ends
    tags=["airflow-ckpt", "example"],
    render_template_as_native_obj=True,
    params={
        "job_name": Param("rate-counts", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                          description="Job name: the job's directory in the storage."),
        "storage": Param(STORAGE, type="string", pattern=r"^(s3a?|file)://",
                         description="Checkpoint storage: s3://bucket/prefix or file:///path."),
        "rows_per_second": Param(10, type="integer", minimum=1,
                                 description="Rate of the source (Spark's rowsPerSecond); "
                                             "keep it across a restore (the source numbers "
                                             "its rows by elapsed seconds x rate)."),
        "trigger_interval": Param("2 seconds", type="string", minLength=1,
                                  description="Processing-time trigger: a micro-batch every..."),
        "checkpoint_interval": Param("5 s", type="string",
                                     description="execution.checkpointing.interval"),
        "num_retained": Param(3, type="integer", minimum=1,
                              description="execution.checkpointing.num-retained"),
        "restore": Param("latest", type="string", minLength=1,
                         description="latest | none | a savepoint URI (the XCom of "
                                     "savepoint_manual) or checkpoint path"),
        "restart_strategy": Param(
            {"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "5 s"},
            description="Flink restart-strategy options (Flink option names; "
                        "'restart-strategy.' prefix optional).",
            schema=restart_params_json_schema(),
        ),
        "master": Param("local[2]", type="string",
                        description="Spark master; empty = the spark_default connection's"),
    },
):
    CheckpointedSparkSubmitOperator(
        task_id="run_job",
        application=str(JOBS_DIR / "rate_counts.py"),
        job_name="{{ params.job_name }}",
        checkpoint_storage="{{ params.storage }}",
        storage_conn_id=CONN_ID,
        checkpoint_config={
            "execution.checkpointing.interval": "{{ params.checkpoint_interval }}",
            "execution.checkpointing.num-retained": "{{ params.num_retained }}",
        },
        restart_strategy="{{ params.restart_strategy }}",
        restore="{{ params.restore }}",
        master="{{ params.master }}",
        conf={
            DEMO + "rows_per_second": "{{ params.rows_per_second }}",
            DEMO + "trigger_interval": "{{ params.trigger_interval }}",
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
        },
        driver_memory="1g",
    )
