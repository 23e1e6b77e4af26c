"""Example: run a checkpointed PySpark streaming job under a Flink restart strategy.

Trigger it from the UI: the form validates ``restart_strategy`` against the restart
strategies' JSON schema, whose format checker runs the restart-strategy parser, so a
typo in an option name or an initial-backoff above max-backoff is refused before the run
starts, with the parser's message (the operator validates again, naming every bad key,
before it submits anything).

Defaults run on the embedded setup: ``local[2]`` Spark from the pip package and
checkpoints in ``$AIRFLOW_CKPT_STORAGE`` (default ``file:///tmp/airflow-ckpt/checkpoints``).
For S3, set the storage to ``s3://bucket/prefix`` and configure the ``aws_default``
connection (see docs/operators.md). The job is ``spark_jobs/odd_even_sums.py`` (beside
the DAGs folder, where ``airflow-ckpt examples`` copies it, or ``$AIRFLOW_CKPT_JOBS_DIR``):
running odd and even sums of the numbers in ``input_dir``, written exactly once to
``<storage>/_output/<job>``. It ends when the input is done (``availableNow``); the
example that streams until stopped is ``streaming_rate_counts``.

Fault injection for a demo of the restart strategy: ``crash_attempts=N`` with
``crash_after_batch=K`` kills the driver after batch K on the first N submissions; each
resubmission restores from the latest retained checkpoint.

The module does no work at import time beyond building the DAG (it parses in well under
a second): input files are written by the first task, at run time.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG, Param, task

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
    dag_id="checkpointed_streaming_job",
    description="Odd/even running sums with Flink-style checkpoints and restart strategy",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # one run per job: a second trigger queues until the first ends
    tags=["airflow-ckpt", "example"],
    render_template_as_native_obj=True,
    params={
        **job_params("odd-even-sums",
                     restore="latest | none | a checkpoint or savepoint path"),
        **checkpoint_params("2 s"),
        "restart_strategy": restart_param("1 s"),
        "input_dir": Param("/tmp/airflow-ckpt/input/odd-even-sums", type="string",
                           description="Directory of input files (one integer per line)."),
        "numbers": Param(1000, type="integer", minimum=1,
                         description="Numbers 1..N written to input_dir if it is empty."),
        "files": Param(10, type="integer", minimum=1,
                       description="Input files (one micro-batch each)."),
        "crash_attempts": Param(0, type="integer", minimum=0,
                                description="Fault injection: crash the first N submissions."),
        "crash_after_batch": Param(3, type="integer", minimum=0,
                                   description="Fault injection: ...after this batch."),
    },
) as dag:

    @task
    def prepare_input(input_dir: str, numbers: int, files: int) -> str:
        """Write the numbers 1..N into ``files`` files, unless the directory has input."""
        directory = Path(input_dir)
        directory.mkdir(parents=True, exist_ok=True)
        if not any(directory.iterdir()):
            per_file = -(-numbers // files)
            for index in range(files):
                chunk = range(index * per_file + 1, min((index + 1) * per_file, numbers) + 1)
                tmp = directory / f".part-{index:04d}.tmp"
                tmp.write_text("".join(f"{n}\n" for n in chunk))
                tmp.rename(directory / f"part-{index:04d}.txt")
        return str(directory)

    run_job = CheckpointedSparkSubmitOperator(
        task_id="run_job",
        application=str(jobs_dir(__file__) / "odd_even_sums.py"),
        conf={
            DEMO + "input": "{{ ti.xcom_pull(task_ids='prepare_input') }}",
            DEMO + "crash_attempts": "{{ params.crash_attempts }}",
            DEMO + "crash_after_batch": "{{ params.crash_after_batch }}",
            **SPARK_CONF,
        },
        **submit_args(),
    )

    prepare_input("{{ params.input_dir }}", "{{ params.numbers }}", "{{ params.files }}") \
        >> run_job
