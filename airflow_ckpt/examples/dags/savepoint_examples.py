"""Example DAGs: savepoints as tasks, restore from a savepoint, scheduling on new snapshots.

* ``savepoint_manual``: take a savepoint of a running job (trigger with
  ``stop=true`` for stop-with-savepoint: the job stops cleanly after the savepoint and
  its supervisor task ends successfully). The task returns the savepoint's URI (XCom).
* ``savepoint_restore``: start the odd/even example job (``checkpointed_streaming_job``)
  from a chosen savepoint, under the same or a new job name, optionally with a different
  number of state partitions (rescaling). The main example restores with its own DAG:
  ``streaming_rate_counts`` with ``restore`` set to the savepoint's URI.
* ``savepoint_consumer``: scheduled by an ``AssetWatcher`` on "a new savepoint of job X
  completed" (``CheckpointEventTrigger``); it prints the savepoint it was woken for.
* ``checkpoint_health``: a deferrable ``CheckpointSensor`` used as a health check: it
  waits for the job's next checkpoint and fails if none completed within the window.

Defaults match the main example, ``streaming_rate_counts``: job ``rate-counts``
(``$AIRFLOW_CKPT_EXAMPLE_JOB``) and the storage in ``$AIRFLOW_CKPT_STORAGE`` (default
``file:///tmp/airflow-ckpt/checkpoints``), reached with the ``aws_default`` connection
(``$AIRFLOW_CKPT_CONN_ID``). The module does no I/O at import time.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param, task

from airflow_ckpt.examples.dag_params import (
    CONN_ID,
    DEMO,
    JOB_NAME_PATTERN,
    STORAGE,
    jobs_dir,
)
from airflow_ckpt.operators.checkpointed_spark_submit import CheckpointedSparkSubmitOperator
from airflow_ckpt.operators.savepoint import TriggerSavepointOperator
from airflow_ckpt.runtime.sparkconf import MAX_STATE_PARTITIONS, RESCALE_PARTITIONS
from airflow_ckpt.sensors.checkpoint import CheckpointSensor
from airflow_ckpt.triggers.checkpoint import CheckpointEventTrigger

JOB = os.environ.get("AIRFLOW_CKPT_EXAMPLE_JOB", "rate-counts")
ODD_EVEN_JOB = "odd-even-sums"  # the job savepoint_restore runs



def restore_hint(job: str, path: str) -> str:
    """How to restore ``job`` from the savepoint at ``path``, with the DAG that runs it."""
    if job == ODD_EVEN_JOB:
        return f"restore it with the savepoint_restore DAG: savepoint={path}"
    return (f"restore it with the DAG that runs job {job!r} (for the main example "
            f"streaming_rate_counts): restore={path}, with the same rows_per_second")


# ----------------------------------------------------------------------------- savepoint

with DAG(
    dag_id="savepoint_manual",
    description="Take a savepoint of a running job (optionally stop-with-savepoint)",
    schedule=None,
    catchup=False,
    tags=["airflow-ckpt", "example", "savepoint"],
    render_template_as_native_obj=True,
    params={
        "job_name": Param(JOB, type="string", pattern=JOB_NAME_PATTERN,
                          description="The running job."),
        "storage": Param(STORAGE, type="string", pattern=r"^(s3a?|file)://",
                         description="Its checkpoint storage."),
        "stop": Param(False, type="boolean",
                      description="Stop-with-savepoint: stop the job after the savepoint."),
        "savepoint_id": Param("", type="string", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$",
                              description="Savepoint id (sp-<id>); empty: the job picks one."),
    },
):
    savepoint = TriggerSavepointOperator(
        task_id="savepoint",
        deferrable=True,  # explicit: the default follows [operators] default_deferrable
        job_name="{{ params.job_name }}",
        checkpoint_storage="{{ params.storage }}",
        storage_conn_id=CONN_ID,
        stop="{{ params.stop }}",
        savepoint_id="{{ params.savepoint_id }}",
        timeout="10 min",
    )

    @task
    def report(path: str, **context: Any) -> str:
        """Log where the savepoint is and how to restore the job from it: with the DAG
        that runs that job (the main example restores with its own DAG)."""
        info = context["ti"].xcom_pull(task_ids="savepoint", key="savepoint") or {}
        print(f"savepoint {path} (checkpoint {info.get('id')}, batch {info.get('batch_id')})")
        print(restore_hint(str(context["params"]["job_name"]), path))
        return path

    report(savepoint.output)

# ----------------------------------------------------------------------------- restore

with DAG(
    dag_id="savepoint_restore",
    description="Start the odd/even job from a savepoint (same or new name, optional rescaling)",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # one run per job: a second trigger queues until the first ends
    tags=["airflow-ckpt", "example", "savepoint"],
    render_template_as_native_obj=True,
    params={
        "savepoint": Param(type="string", minLength=1, pattern=r"^(s3a?|file)://.+/sp-[^/]+/?$",
                           description="Full URI of the savepoint (the XCom of "
                                       "savepoint_manual, or `airflow-ckpt savepoints <job>`)."),
        "job_name": Param(ODD_EVEN_JOB, type="string", pattern=JOB_NAME_PATTERN,
                          description="Job to start: the savepoint's job or a new name."),
        "storage": Param(STORAGE, type="string", pattern=r"^(s3a?|file)://",
                         description="Checkpoint storage (must hold the savepoint)."),
        "state_partitions": Param(0, type="integer", minimum=0,
                                  maximum=MAX_STATE_PARTITIONS,
                                  description="Rescale the state to N partitions on restore "
                                              "(0: keep the savepoint's)."),
        "input_dir": Param("/tmp/airflow-ckpt/input/odd-even-sums", type="string",
                           description="The job's input directory."),
        "master": Param("local[2]", type="string", description="Spark master."),
    },
):
    CheckpointedSparkSubmitOperator(
        task_id="run_from_savepoint",
        application=str(jobs_dir(__file__) / "odd_even_sums.py"),
        job_name="{{ params.job_name }}",
        checkpoint_storage="{{ params.storage }}",
        storage_conn_id=CONN_ID,
        restore="{{ params.savepoint }}",
        master="{{ params.master }}",
        conf={
            DEMO + "input": "{{ params.input_dir }}",
            # empty (state_partitions 0) keeps the savepoint's number of state partitions
            RESCALE_PARTITIONS: "{{ params.state_partitions or '' }}",
            "spark.ui.enabled": "false",
        },
        driver_memory="1g",
    )

# ----------------------------------------------------------------------------- AssetWatcher

NEW_SAVEPOINT = Asset(
    name=f"airflow-ckpt/{JOB}/savepoints",
    uri=f"{STORAGE.rstrip('/')}/{JOB}/savepoints",
    watchers=[
        AssetWatcher(
            name=f"{JOB}-new-savepoint",
            trigger=CheckpointEventTrigger(
                storage_uri=STORAGE, job=JOB, kind="savepoint", conn_id=CONN_ID,
                poll_interval=30,
            ),
        )
    ],
)

with DAG(
    dag_id="savepoint_consumer",
    description="Runs once per new savepoint of the job (event-driven via AssetWatcher)",
    schedule=[NEW_SAVEPOINT],
    catchup=False,
    tags=["airflow-ckpt", "example", "savepoint"],
):

    @task
    def on_new_savepoint(**context: Any) -> list[str]:
        """The snapshot summaries arrive as the asset events' ``extra["payload"]``."""
        paths = []
        for events in context["triggering_asset_events"].values():
            for event in events:
                summary = (event.extra or {}).get("payload") or {}
                print(f"new {summary.get('kind')} {summary.get('path')} "
                      f"(batch {summary.get('batch_id')})")
                paths.append(str(summary.get("path")))
        return paths

    on_new_savepoint()

# ----------------------------------------------------------------------------- health check

with DAG(
    dag_id="checkpoint_health",
    description="Fail when the job stops completing checkpoints (deferrable sensor)",
    schedule="*/15 * * * *",
    catchup=False,
    max_active_runs=1,
    tags=["airflow-ckpt", "example", "sensor"],
    params={
        "job_name": Param(JOB, type="string", pattern=JOB_NAME_PATTERN),
        "storage": Param(STORAGE, type="string", pattern=r"^(s3a?|file)://"),
    },
):
    CheckpointSensor(
        task_id="next_checkpoint",
        deferrable=True,  # explicit: the default follows [operators] default_deferrable
        job_name="{{ params.job_name }}",
        checkpoint_storage="{{ params.storage }}",
        storage_conn_id=CONN_ID,
        kind="checkpoint",
        max_checkpoint_age="10 min",
        timeout=15 * 60,
        poke_interval=10,
    )
